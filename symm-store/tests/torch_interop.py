#!/usr/bin/env python3
"""Interop between symm-store's TcpStore and PyTorch's torch.distributed.TCPStore.

Part 1: torch clients against OUR server (every query type torch's Python API exposes).
Part 2: OUR client (the Rust binary) against a TORCH server (libuv backend, then the
        legacy backend where torch still has it).

    SYMM_STORE_INTEROP_BIN=/path/to/symm-store-interop python3 torch_interop.py

Prints "skipped: torch not installed" and exits 0 when torch cannot be imported
(exit 1 instead when SYMM_REQUIRE_TORCH=1). Exits non-zero on any failed check.
"""
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

TIMEOUT = timedelta(seconds=20)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def raises(fn):
    try:
        fn()
    except Exception as e:  # torch raises DistStoreError / RuntimeError subclasses
        return e
    return None


def part1_torch_clients_on_our_server(dist, binary):
    print("== part 1: torch clients -> symm-store server", flush=True)
    proc = subprocess.Popen([binary, "server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(line.split()[1])
        s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT, wait_for_workers=False)
        # A client that takes part in PyTorch's worker counting (adds 1 to "init/").
        w = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=TIMEOUT, wait_for_workers=True)
        s.set("k", "v")
        check(s.get("k") == b"v", "set/get")
        s.set("bin", bytes([0, 255, 1, 128]))
        check(s.get("bin") == bytes([0, 255, 1, 128]), "binary value")
        big = os.urandom(4 << 20)
        s.set("big", big)
        check(s.get("big") == big, "4 MiB value")
        check(s.add("cnt", 3) == 3 and s.add("cnt", -5) == -2, "add")
        check(s.get("cnt") == b"-2", "add stores ASCII decimal")
        check(s.compare_set("cs", "", "first") == b"first", "compare_set missing/empty expected")
        check(s.compare_set("cs", "nope", "x") == b"first", "compare_set mismatch")
        check(s.compare_set("cs", "first", "second") == b"second", "compare_set match")
        check(s.compare_set("cs_missing", "exp", "x") == b"exp", "compare_set missing/non-empty expected")
        check(s.check(["k", "cnt"]) is True, "check present")
        check(s.check(["k", "never"]) is False, "check missing")
        s.wait(["k"])
        s.wait(["k", "cnt"], timedelta(seconds=5))
        t0 = time.time()
        err = raises(lambda: s.wait(["never"], timedelta(milliseconds=300)))
        check(err is not None and time.time() - t0 < 5, "wait timeout (CANCEL_WAIT) raises: %r" % (err,))
        check(s.add("after_cancel", 1) == 1, "client usable after CANCEL_WAIT")
        err = raises(lambda: w.wait(["never2"], timedelta(milliseconds=200)))
        check(err is not None, "second client wait timeout")
        # A blocking get, woken by another client's set (deferred WAIT reply).
        def late():
            time.sleep(0.3)
            w.set("late", "here")
        th = threading.Thread(target=late)
        th.start()
        check(s.get("late") == b"here", "blocking get woken by another client")
        th.join()
        n0 = s.num_keys()
        s.set("extra", "1")
        check(s.num_keys() == n0 + 1, "num_keys")
        check(s.delete_key("extra") is True, "delete existing")
        check(s.delete_key("extra") is False, "delete missing")
        s.append("ap", "ab")
        s.append("ap", "cd")
        check(s.get("ap") == b"abcd", "append")
        if hasattr(s, "multi_set"):
            s.multi_set(["m1", "m2"], ["1", "22"])
            check(s.multi_get(["m1", "m2", "k"]) == [b"1", b"22", b"v"], "multi_set/multi_get")
        else:
            print("skip multi_set/multi_get: not in this torch", flush=True)
        if hasattr(s, "queue_push"):
            s.queue_push("q", "a")
            s.queue_push("q", b"b")
            check(s.queue_len("q") == 2, "queue_len")
            check(s.queue_pop("q") == b"a", "queue_pop 1")
            check(s.queue_pop("q", False) == b"b", "queue_pop 2 (non-blocking)")
            check(s.queue_len("q") == 0, "queue_len after pops")
            def push_later():
                time.sleep(0.2)
                w.queue_push("q2", "later")
            th = threading.Thread(target=push_later)
            th.start()
            check(s.queue_pop("q2") == b"later", "blocking queue_pop woken by push")
            th.join()
        else:
            print("skip queue ops: not in this torch", flush=True)
        p = dist.PrefixStore("grp", s)
        p.set("pk", "pv")
        check(s.get("grp/pk") == b"pv", "PrefixStore layout prefix/key")
        check(p.get("pk") == b"pv", "PrefixStore get")
        if hasattr(s, "set_timeout"):
            s.set_timeout(timedelta(seconds=30))
        del p, s, w
    finally:
        proc.stdin.close()
        rc = proc.wait(timeout=30)
        check(rc == 0, "our server exited cleanly")


def part2_our_client_on_torch_server(dist, binary, use_libuv):
    name = "libuv" if use_libuv else "legacy"
    print("== part 2: symm-store client -> torch server (%s backend)" % name, flush=True)
    try:
        srv = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False, use_libuv=use_libuv)
    except Exception as e:  # the legacy backend may be gone
        print("skip %s backend: %r" % (name, e), flush=True)
        return
    port = srv.port
    srv.set("from_torch", "hello from torch")
    srv.add("counter", 10)
    dist.PrefixStore("grp", srv).set("pk", "pv")
    queues = hasattr(srv, "queue_push")
    if queues:
        try:
            srv.queue_push("torch_q", "q1")
        except Exception as e:
            print("no queue support in the %s backend: %r" % (name, e), flush=True)
            queues = False
    helper = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT, wait_for_workers=False)

    def wake_rust():
        helper.wait(["rust_waiting"])
        time.sleep(0.2)
        helper.set("late_from_torch", "late")

    th = threading.Thread(target=wake_rust)
    th.start()
    args = [binary, "client", str(port)] + ([] if queues else ["--no-queues"])
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    th.join()
    check(out.returncode == 0, "rust client checks on the torch %s server" % name)
    check(srv.get("from_rust") == b"hello from rust", "torch reads rust's set")
    check(srv.get("binary") == bytes([0, 159, 146, 150, 255]), "torch reads rust's binary value")
    check(srv.add("rust_add", 0) == 3, "torch reads rust's add")
    check(srv.get("rust_cas") == b"second", "torch reads rust's compare_set")
    check(srv.get("rust_append") == b"abcd", "torch reads rust's append")
    check(srv.get("counter") == b"15", "shared counter")
    check(dist.PrefixStore("grp", srv).get("rust_pk") == b"rust_pv", "torch PrefixStore reads rust's PrefixStore")
    if queues:
        check(srv.queue_len("rust_q") == 2, "torch sees rust's queue")
        check(srv.queue_pop("rust_q") == b"r1", "torch pops rust's push")
    check(srv.get("rust_done") == b"1", "rust client finished")


def main():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        if os.environ.get("SYMM_REQUIRE_TORCH") == "1":
            print("torch not installed but SYMM_REQUIRE_TORCH=1", flush=True)
            return 1
        print("skipped: torch not installed", flush=True)
        return 0
    binary = os.environ.get("SYMM_STORE_INTEROP_BIN") or (sys.argv[1] if len(sys.argv) > 1 else None)
    if not binary or not os.path.exists(binary):
        print("set SYMM_STORE_INTEROP_BIN to the symm-store-interop binary", flush=True)
        return 2
    print("torch %s, interop binary %s" % (torch.__version__, binary), flush=True)
    part1_torch_clients_on_our_server(dist, binary)
    part2_our_client_on_torch_server(dist, binary, True)
    part2_our_client_on_torch_server(dist, binary, False)
    if failures:
        print("INTEROP FAILED: %d check(s): %s" % (len(failures), failures), flush=True)
        return 1
    print("INTEROP PASSED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
