#!/usr/bin/env python3
"""torch.distributed.TCPStore side of symm-store's set/get benchmark.

    torch_store_bench.py --clients N --seconds S [--value-bytes B]           # torch server + torch clients
    torch_store_bench.py --clients N --seconds S --connect 127.0.0.1:PORT    # torch clients, another server
    torch_store_bench.py --serve                                             # torch server only: prints "PORT n",
                                                                             # runs until stdin closes
Client mode prints one JSON line: {"clients": N, "pairs": total set+get pairs, "seconds": elapsed}.
Each client is a thread with its own TCPStore connection (the store calls release the GIL).
"""
import argparse
import json
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)


def run_clients(host, port, n, seconds, value_bytes):
    clients = [dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT, wait_for_workers=False) for _ in range(n)]
    value = b"x" * value_bytes
    counts = [0] * n
    start = threading.Barrier(n + 1)
    stop_at = [0.0]

    def work(i):
        s = clients[i]
        k = 0
        start.wait()
        while time.perf_counter() < stop_at[0]:
            key = "bench/%d/%d" % (i, k % 128)
            s.set(key, value)
            if s.get(key) != value:
                raise RuntimeError("bad value")
            k += 1
        counts[i] = k

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--value-bytes", type=int, default=64)
    ap.add_argument("--connect", default=None)
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()
    if args.serve:
        srv = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
        print("PORT %d" % srv.port, flush=True)
        sys.stdin.read()
        return 0
    if args.connect:
        host, port = args.connect.rsplit(":", 1)
        server = None
        port = int(port)
    else:
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
        host, port = "127.0.0.1", server.port
    pairs, secs = run_clients(host, port, args.clients, args.seconds, args.value_bytes)
    print(json.dumps({"clients": args.clients, "pairs": pairs, "seconds": secs}), flush=True)
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
