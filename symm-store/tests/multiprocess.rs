//! Multi-process tests: real processes (this test binary re-executed with a role).

mod common;

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_all_ok, role, spawn, wait_all};
use symm_store::{FdChannel, FdKind, Store, StoreError, StoreExchange, TcpServer, TcpStore};

const T: Duration = Duration::from_secs(30);
const CHILD_LIMIT: Duration = Duration::from_secs(120);

fn env_usize(k: &str) -> usize {
    std::env::var(k).unwrap().parse().unwrap()
}

fn store_addr() -> SocketAddr {
    std::env::var("SYMM_TEST_STORE").unwrap().parse().unwrap()
}

fn test_server() -> TcpServer {
    TcpServer::bind("127.0.0.1:0".parse().unwrap()).unwrap()
}

fn memfd_with(content: &[u8], size: u64) -> std::fs::File {
    let fd = nix::sys::memfd::memfd_create("symm-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
    let f = std::fs::File::from(fd);
    f.set_len(size).unwrap();
    f.write_all_at(content, 0).unwrap();
    f
}

fn read_at(fd: &OwnedFd, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    nix::sys::uio::pread(fd, &mut v, off as i64).unwrap();
    v
}

fn is_cloexec(fd: &OwnedFd) -> bool {
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
    nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC)
}

// ---------------------------------------------------------------------------------------
// 8 processes exchanging through one TcpStore hosted by rank 0 (env:// construction).

#[test]
fn tcp_eight_processes_exchange() {
    if let Some(r) = role() {
        if r == "eight" {
            eight_child();
            common::child_done();
        }
        return;
    }
    let port = common::free_port().to_string();
    let mut kids: Vec<_> = (0..8)
        .map(|r| {
            spawn(
                "tcp_eight_processes_exchange",
                "eight",
                &[
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.clone()),
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "8".into()),
                ],
            )
        })
        .collect();
    assert_all_ok(&mut kids, CHILD_LIMIT);
}

fn eight_child() {
    let rank = env_usize("RANK");
    let world = env_usize("WORLD_SIZE");
    let store = TcpStore::from_env(T).unwrap();
    assert_eq!(store.is_master(), rank == 0);
    let ex = StoreExchange::new(store.clone(), "eight");
    for round in 0..10usize {
        let mine = format!("rank {rank} round {round}");
        let all = ex.all_gather(rank, world, mine.as_bytes(), T).unwrap();
        for (p, v) in all.iter().enumerate() {
            assert_eq!(v, format!("rank {p} round {round}").as_bytes());
        }
        let root = round % world;
        let data = format!("from root {root} in round {round}");
        let got = ex
            .broadcast(rank, world, root, if rank == root { data.as_bytes() } else { b"" }, T)
            .unwrap();
        assert_eq!(got, data.as_bytes());
        ex.barrier(rank, world, T).unwrap();
    }
    // The host of the server leaves last.
    if rank == 0 {
        let deadline = Instant::now() + T;
        while store.add("left", 0).unwrap() < (world - 1) as i64 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
    } else {
        store.add("left", 1).unwrap();
    }
}

#[test]
fn tcp_from_env_master_times_out_without_workers() {
    if let Some(r) = role() {
        if r == "lonely" {
            let t0 = Instant::now();
            let e = TcpStore::from_env(Duration::from_millis(500)).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(5));
            assert!(
                matches!(&e, StoreError::Timeout { what, .. } if what.contains("1/2")),
                "{e}"
            );
        } else if r == "noenv" {
            let e = TcpStore::from_env(Duration::from_millis(500)).unwrap_err();
            assert!(
                matches!(&e, StoreError::InvalidArgument(m) if m.contains("MASTER_ADDR")),
                "{e}"
            );
        } else {
            return;
        }
        common::child_done();
    }
    let port = common::free_port().to_string();
    let mut kids = vec![
        spawn(
            "tcp_from_env_master_times_out_without_workers",
            "lonely",
            &[
                ("MASTER_ADDR", "localhost".into()),
                ("MASTER_PORT", port),
                ("RANK", "0".into()),
                ("WORLD_SIZE", "2".into()),
            ],
        ),
        spawn("tcp_from_env_master_times_out_without_workers", "noenv", &[]),
    ];
    assert_all_ok(&mut kids, CHILD_LIMIT);
}

// ---------------------------------------------------------------------------------------
// 64 clients x 1000 operations (4 processes x 16 threads), nothing lost.

const PROCS: usize = 4;
const THREADS: usize = 16;
const ITERS: usize = 250; // 4 store operations per iteration = 1000 per client

#[test]
fn tcp_64_clients_1000_ops_each() {
    if let Some(r) = role() {
        if r == "ops" {
            ops_child();
            common::child_done();
        }
        return;
    }
    let srv = test_server();
    let addr = srv.local_addr();
    let t0 = Instant::now();
    let mut kids: Vec<_> = (0..PROCS)
        .map(|p| {
            spawn(
                "tcp_64_clients_1000_ops_each",
                "ops",
                &[("SYMM_TEST_STORE", addr.to_string()), ("SYMM_TEST_PROC", p.to_string())],
            )
        })
        .collect();
    assert_all_ok(&mut kids, CHILD_LIMIT);
    let elapsed = t0.elapsed();
    let c = TcpStore::connect(addr, T).unwrap();
    assert_eq!(c.add("total", 0).unwrap(), (PROCS * THREADS * ITERS) as i64);
    for p in 0..PROCS {
        for t in 0..THREADS {
            let keys: Vec<String> = (0..ITERS).map(|i| format!("k/{p}/{t}/{i}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let vals = c.multi_get(&refs).unwrap();
            for (i, v) in vals.iter().enumerate() {
                assert_eq!(v, format!("v{p}.{t}.{i}").as_bytes());
            }
            let log = c.get(&format!("log/{p}/{t}")).unwrap();
            assert_eq!(log, (0..ITERS).map(|i| i as u8).collect::<Vec<_>>());
        }
    }
    let expect_keys = PROCS * THREADS * ITERS + PROCS * THREADS + 1;
    assert_eq!(c.num_keys().unwrap(), expect_keys as i64);
    let st = srv.stats();
    eprintln!("64 clients x 1000 ops: {elapsed:?}; server stats {st:?}");
    assert_eq!(st.dropped_malformed + st.dropped_slow + st.dropped_overflow, 0);
}

fn ops_child() {
    let addr = store_addr();
    let p = env_usize("SYMM_TEST_PROC");
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let c = TcpStore::connect(addr, T).unwrap();
                for i in 0..ITERS {
                    let k = format!("k/{p}/{t}/{i}");
                    let v = format!("v{p}.{t}.{i}");
                    c.set(&k, v.as_bytes()).unwrap();
                    assert_eq!(c.get(&k).unwrap(), v.as_bytes());
                    c.add("total", 1).unwrap();
                    c.append(&format!("log/{p}/{t}"), &[i as u8]).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// FdChannel among 4 processes: each received fd reaches the same memfd.

#[test]
fn fd_channel_four_processes() {
    if let Some(r) = role() {
        if r == "fd4" {
            fd4_child();
            common::child_done();
        }
        return;
    }
    let srv = test_server();
    let addr = srv.local_addr().to_string();
    let mut kids: Vec<_> = (0..4)
        .map(|r| {
            spawn(
                "fd_channel_four_processes",
                "fd4",
                &[
                    ("SYMM_TEST_STORE", addr.clone()),
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "4".into()),
                ],
            )
        })
        .collect();
    assert_all_ok(&mut kids, CHILD_LIMIT);
}

fn fd4_child() {
    let rank = env_usize("RANK");
    let world = env_usize("WORLD_SIZE");
    let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
    let ex = StoreExchange::new(store.clone(), "fd4/sync");
    let ch = FdChannel::new(store.clone(), "fd4", rank, world, T)
        .unwrap()
        .with_expected_kind(FdKind::Memfd);
    let baseline = common::open_fds();
    let mine = memfd_with(format!("payload of rank {rank}").as_bytes(), 4096);
    {
        let fds = ch.all_gather_fds(mine.as_fd(), T).unwrap();
        assert_eq!(fds.len(), world);
        for (p, fd) in fds.iter().enumerate() {
            assert!(is_cloexec(fd), "fd from rank {p} is not close-on-exec");
            let want = format!("payload of rank {p}");
            assert_eq!(read_at(fd, 0, want.len()), want.as_bytes());
            // Write a marker into every peer's memfd through the received fd.
            nix::sys::uio::pwrite(fd, &[rank as u8 + 1], 1024 + rank as i64).unwrap();
        }
        ex.barrier(rank, world, T).unwrap();
        // Every rank wrote its marker into *our* memfd: the fds are the same file.
        let mut marks = vec![0u8; world];
        mine.read_exact_at(&mut marks, 1024).unwrap();
        assert_eq!(marks, (1..=world as u8).collect::<Vec<_>>());
        for root in 0..world {
            let fd = ch.broadcast_fds(root, (rank == root).then(|| mine.as_fd()), T).unwrap();
            let want = format!("payload of rank {root}");
            assert_eq!(read_at(&fd, 0, want.len()), want.as_bytes());
        }
    }
    drop(mine);
    assert_eq!(common::open_fds(), baseline, "fds leaked");
    ex.barrier(rank, world, T).unwrap();
}

// ---------------------------------------------------------------------------------------
// Fault: the store server dies while a client waits.

#[test]
fn fault_server_dies_mid_wait() {
    if let Some(r) = role() {
        if r == "host" {
            let port: u16 = env_usize("SYMM_TEST_PORT") as u16;
            let _srv = TcpServer::bind(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
            std::thread::sleep(Duration::from_secs(60));
        }
        return;
    }
    let port = common::free_port();
    let mut kids = vec![spawn(
        "fault_server_dies_mid_wait",
        "host",
        &[("SYMM_TEST_PORT", port.to_string())],
    )];
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let c = TcpStore::connect(addr, T).unwrap(); // retries until the child listens
    c.set("k", b"v").unwrap();
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = c2.wait(&["never"], Some(Duration::from_secs(60)));
        (r, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    kids[0].kill().unwrap();
    let killed_at = Instant::now();
    let (r, _) = waiter.join().unwrap();
    let after_kill = killed_at.elapsed();
    assert!(matches!(r, Err(StoreError::Connection { .. })), "{r:?}");
    assert!(
        after_kill < Duration::from_secs(5),
        "error took {after_kill:?} after the kill"
    );
    // Later calls fail at once; a new connection fails within its timeout.
    assert!(matches!(c.get("k"), Err(StoreError::Connection { .. })));
    let _ = wait_all(&mut kids, CHILD_LIMIT);
    let t0 = Instant::now();
    assert!(TcpStore::connect(addr, Duration::from_millis(700)).is_err());
    assert!(t0.elapsed() < Duration::from_secs(3));
}

// ---------------------------------------------------------------------------------------
// Fault: a peer dies mid-exchange (store exchange, and fd channel).

#[test]
fn fault_peer_dies_mid_store_exchange() {
    if let Some(r) = role() {
        if r == "ex" {
            let rank = env_usize("RANK");
            let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
            let ex = StoreExchange::new(store, "dies");
            ex.barrier(rank, 3, T).unwrap();
            if rank == 2 {
                std::process::exit(3);
            }
            let t0 = Instant::now();
            let e = ex.all_gather(rank, 3, b"x", Duration::from_secs(2)).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(6));
            assert!(
                matches!(&e, StoreError::MissingRanks { missing, .. } if missing == &vec![2]),
                "{e}"
            );
            common::child_done();
        }
        return;
    }
    let srv = test_server();
    let addr = srv.local_addr().to_string();
    let mut kids: Vec<_> = (0..3)
        .map(|r| {
            spawn(
                "fault_peer_dies_mid_store_exchange",
                "ex",
                &[("SYMM_TEST_STORE", addr.clone()), ("RANK", r.to_string())],
            )
        })
        .collect();
    let st = wait_all(&mut kids, CHILD_LIMIT);
    assert!(common::done(&st[0]) && common::done(&st[1]), "{st:?}");
    assert_eq!(st[2].code(), Some(3));
}

#[test]
fn fault_peer_dies_mid_fd_exchange() {
    if let Some(r) = role() {
        if r == "fdx" {
            let rank = env_usize("RANK");
            let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
            let ch = FdChannel::new(store, "fdx", rank, 3, T).unwrap();
            let m = memfd_with(b"x", 64);
            if rank == 2 {
                // Deliver to rank 0 only, then die before sending to rank 1.
                ch.send_raw_for_testing(0, 1, &[m.as_fd()], T).unwrap();
                std::process::exit(3);
            }
            let baseline = common::open_fds();
            let t0 = Instant::now();
            let e = ch.all_gather_fds(m.as_fd(), Duration::from_secs(60)).unwrap_err();
            let took = t0.elapsed();
            assert!(matches!(&e, StoreError::PeerLost { rank: 2, .. }), "rank {rank}: {e}");
            assert!(took < Duration::from_secs(10), "took {took:?}");
            assert_eq!(common::open_fds(), baseline, "rank {rank}: fds leaked after {e}");
            common::child_done();
        }
        return;
    }
    let srv = test_server();
    let addr = srv.local_addr().to_string();
    let mut kids: Vec<_> = (0..3)
        .map(|r| {
            spawn(
                "fault_peer_dies_mid_fd_exchange",
                "fdx",
                &[("SYMM_TEST_STORE", addr.clone()), ("RANK", r.to_string())],
            )
        })
        .collect();
    let st = wait_all(&mut kids, CHILD_LIMIT);
    assert!(common::done(&st[0]) && common::done(&st[1]), "{st:?}");
    assert_eq!(st[2].code(), Some(3));
}

// ---------------------------------------------------------------------------------------
// Fault: bad fd messages (no fd, two fds, wrong kind, stale generation, intruder).

#[test]
fn fault_bad_fd_messages() {
    if let Some(r) = role() {
        match r.as_str() {
            "victim" => bad_fd_victim(),
            "sender" => bad_fd_sender(),
            "intruder" => bad_fd_intruder(),
            _ => return,
        }
        common::child_done();
    }
    let srv = test_server();
    let addr = srv.local_addr().to_string();
    let mut kids = vec![
        spawn("fault_bad_fd_messages", "victim", &[("SYMM_TEST_STORE", addr.clone())]),
        spawn("fault_bad_fd_messages", "sender", &[("SYMM_TEST_STORE", addr.clone())]),
        spawn("fault_bad_fd_messages", "intruder", &[("SYMM_TEST_STORE", addr)]),
    ];
    assert_all_ok(&mut kids, CHILD_LIMIT);
}

fn expect_bad(r: symm_store::Result<OwnedFd>, needle: &str) {
    match r {
        Err(StoreError::BadFdMessage(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected BadFdMessage({needle}), got {other:?}"),
    }
}

fn bad_fd_victim() {
    let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
    let ch = FdChannel::new(store.clone(), "badfd", 0, 2, T)
        .unwrap()
        .with_expected_kind(FdKind::Memfd);
    store
        .set("victim_sock", ch.socket_name_for_testing(0).unwrap().as_bytes())
        .unwrap();
    let baseline = common::open_fds();
    expect_bad(ch.broadcast_fds(1, None, T), "sent 0 fds");
    expect_bad(ch.broadcast_fds(1, None, T), "sent 2 fds");
    expect_bad(ch.broadcast_fds(1, None, T), "not a regular file");
    expect_bad(ch.broadcast_fds(1, None, T), "not a memfd");
    assert_eq!(common::open_fds(), baseline, "rejected fds were not closed");
    // A stale message is rejected, then the real one is taken.
    let fd = ch.broadcast_fds(1, None, T).unwrap();
    assert_eq!(read_at(&fd, 0, 5), b"good!");
    assert!(is_cloexec(&fd));
    drop(fd);
    // An intruder claiming to be rank 1 is rejected; the real rank 1 gets through.
    let fd = ch.broadcast_fds(1, None, T).unwrap();
    assert_eq!(read_at(&fd, 0, 5), b"good!");
    drop(fd);
    assert_eq!(common::open_fds(), baseline, "fds leaked");
    store.set("victim_done", b"").unwrap();
}

fn bad_fd_sender() {
    let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
    let ch = FdChannel::new(store.clone(), "badfd", 1, 2, T).unwrap();
    let m = memfd_with(b"good!", 64);
    let rejected = |r: symm_store::Result<()>| {
        assert!(
            matches!(&r, Err(StoreError::BadFdMessage(m)) if m.contains("rejected")),
            "{r:?}"
        );
    };
    rejected(ch.send_raw_for_testing(0, 1, &[], T));
    rejected(ch.send_raw_for_testing(0, 2, &[m.as_fd(), m.as_fd()], T));
    let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
    rejected(ch.send_raw_for_testing(0, 3, &[pipe_r.as_fd()], T));
    let tmp = std::env::temp_dir().join(format!("symm-store-test-{}", std::process::id()));
    let file = std::fs::File::create(&tmp).unwrap();
    std::fs::remove_file(&tmp).unwrap();
    rejected(ch.send_raw_for_testing(0, 4, &[file.as_fd()], T));
    // Stale generation (1 while the victim is at 5): rejected, fd closed there.
    rejected(ch.send_raw_for_testing(0, 1, &[m.as_fd()], T));
    ch.skip_generations_for_testing(4);
    ch.broadcast_fds(1, Some(m.as_fd()), T).unwrap();
    store.set("op5_done", b"").unwrap();
    store.wait(&["intruder_done"], Some(T)).unwrap();
    ch.broadcast_fds(1, Some(m.as_fd()), T).unwrap();
    store.wait(&["victim_done"], Some(T)).unwrap();
}

fn bad_fd_intruder() {
    use nix::sys::socket::{self, ControlMessage, MsgFlags, UnixAddr};
    use std::io::{IoSlice, Read};
    let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
    let name = store.get("victim_sock").unwrap();
    store.wait(&["op5_done"], Some(T)).unwrap();
    let m = memfd_with(b"evil!", 64);
    let sock = socket::socket(
        socket::AddressFamily::Unix,
        socket::SockType::Stream,
        socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::connect(sock.as_raw_fd(), &UnixAddr::new_abstract(&name).unwrap()).unwrap();
    // Claims to be rank 1, generation 6, to rank 0.
    let mut h = b"SYMMFD01".to_vec();
    h.extend_from_slice(&6u64.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    let fds = [m.as_raw_fd()];
    socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(&h)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    let mut s = std::os::unix::net::UnixStream::from(sock);
    s.set_read_timeout(Some(T)).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    assert_eq!(b[0], 1, "intruder was not rejected");
    store.set("intruder_done", b"").unwrap();
}

// ---------------------------------------------------------------------------------------
// Fault: fd exhaustion (RLIMIT_NOFILE) while receiving.

#[test]
fn fault_fd_exhaustion_rlimit() {
    if let Some(r) = role() {
        match r.as_str() {
            "recv" => exhaustion_receiver(),
            "root" => exhaustion_root(),
            _ => return,
        }
        common::child_done();
    }
    let srv = test_server();
    let addr = srv.local_addr().to_string();
    let mut kids = vec![
        spawn(
            "fault_fd_exhaustion_rlimit",
            "recv",
            &[("SYMM_TEST_STORE", addr.clone())],
        ),
        spawn("fault_fd_exhaustion_rlimit", "root", &[("SYMM_TEST_STORE", addr)]),
    ];
    assert_all_ok(&mut kids, CHILD_LIMIT);
}

fn fill_fd_holes() -> (Vec<std::fs::File>, i32) {
    let highest = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .max()
        .unwrap();
    // The read_dir fd itself is closed again; fill every hole below `highest`.
    let mut fillers = Vec::new();
    loop {
        let f = std::fs::File::open("/dev/null").unwrap();
        if f.as_raw_fd() > highest {
            break;
        }
        fillers.push(f);
    }
    (fillers, highest)
}

fn expect_exhausted(r: symm_store::Result<OwnedFd>) {
    match r {
        Err(StoreError::FdExhausted { context, .. }) => eprintln!("exhaustion reported: {context}"),
        other => panic!("expected FdExhausted, got {other:?}"),
    }
}

fn exhaustion_receiver() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
    let ch = FdChannel::new(store.clone(), "exh", 0, 2, T).unwrap();
    let baseline = common::open_fds();
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    {
        let (fillers, highest) = fill_fd_holes();
        // No free slot at all: accept(2) fails with EMFILE.
        setrlimit(Resource::RLIMIT_NOFILE, (highest + 1) as u64, hard).unwrap();
        let t0 = Instant::now();
        expect_exhausted(ch.broadcast_fds(1, None, T));
        assert!(t0.elapsed() < Duration::from_secs(20));
        // One free slot: the connection is accepted, the fd cannot be installed (MSG_CTRUNC).
        setrlimit(Resource::RLIMIT_NOFILE, (highest + 2) as u64, hard).unwrap();
        expect_exhausted(ch.broadcast_fds(1, None, T));
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        drop(fillers);
    }
    assert_eq!(common::open_fds(), baseline, "fds leaked after exhaustion");
    // The channel still works once fds are available again.
    let fd = ch.broadcast_fds(1, None, T).unwrap();
    assert_eq!(read_at(&fd, 0, 4), b"root");
    drop(fd);
    assert_eq!(common::open_fds(), baseline);
    store.set("recv_done", b"").unwrap();
}

fn exhaustion_root() {
    let store: Arc<dyn Store> = TcpStore::connect(store_addr(), T).unwrap();
    let ch = FdChannel::new(store.clone(), "exh", 1, 2, T).unwrap();
    let m = memfd_with(b"root", 64);
    // The first two sends are refused or time out on the exhausted receiver.
    for _ in 0..2 {
        let r = ch.broadcast_fds(1, Some(m.as_fd()), Duration::from_secs(5));
        assert!(r.is_err(), "send to an exhausted receiver succeeded");
    }
    ch.broadcast_fds(1, Some(m.as_fd()), T).unwrap();
    store.wait(&["recv_done"], Some(T)).unwrap();
}
