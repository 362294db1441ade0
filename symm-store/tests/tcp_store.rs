//! TcpStore client and server in one process: every query type, PyTorch key layout,
//! wait/cancel, 256+ concurrent clients.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_store::tcp::protocol::{encode_request, Request};
use symm_store::{PrefixStore, Store, StoreError, TcpServer, TcpStore};

const T: Duration = Duration::from_secs(10);

fn loopback0() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[test]
fn tcp_store_every_query_type() {
    let s = TcpStore::server(loopback0(), T).unwrap();
    assert!(s.is_master());
    s.ping().unwrap();
    s.set("a", b"1").unwrap();
    assert_eq!(s.get("a").unwrap(), b"1");
    assert_eq!(s.get_now("a").unwrap(), b"1");
    assert!(matches!(s.get_now("nope"), Err(StoreError::KeyNotFound(_))));
    assert_eq!(s.add("c", 5).unwrap(), 5);
    assert_eq!(s.add("c", -8).unwrap(), -3);
    assert_eq!(s.get("c").unwrap(), b"-3");
    assert_eq!(s.compare_set("cs", b"", b"x").unwrap(), b"x");
    assert_eq!(s.compare_set("cs2", b"nope", b"y").unwrap(), b"nope");
    assert!(!s.check(&["cs2"]).unwrap());
    assert_eq!(s.compare_set("cs", b"x", b"z").unwrap(), b"z");
    assert_eq!(s.compare_set("cs", b"q", b"w").unwrap(), b"z");
    s.append("ap", b"he").unwrap();
    s.append("ap", b"llo").unwrap();
    assert_eq!(s.get("ap").unwrap(), b"hello");
    assert!(s.check(&["a", "ap"]).unwrap());
    assert!(!s.check(&["a", "missing"]).unwrap());
    s.wait(&["a", "c"], None).unwrap();
    let n = s.num_keys().unwrap();
    s.multi_set(&[("m1", b"1"), ("m2", b"")]).unwrap();
    assert_eq!(s.num_keys().unwrap(), n + 2);
    assert_eq!(s.multi_get(&["m1", "m2"]).unwrap(), vec![b"1".to_vec(), vec![]]);
    assert!(s.delete_key("m1").unwrap());
    assert!(!s.delete_key("m1").unwrap());
    s.queue_push("q", b"x").unwrap();
    s.queue_push("q", b"y").unwrap();
    assert_eq!(s.queue_len("q").unwrap(), 2);
    assert_eq!(s.queue_pop("q", None).unwrap(), b"x");
    assert_eq!(s.queue_pop("q", None).unwrap(), b"y");
    assert_eq!(s.queue_len("q").unwrap(), 0);
    // Empty keys and binary values are legal.
    s.set("", &[0, 255, 1]).unwrap();
    assert_eq!(s.get("").unwrap(), vec![0, 255, 1]);
    // Bounds are checked before sending.
    let long = "k".repeat(9000);
    assert!(matches!(s.set(&long, b""), Err(StoreError::TooLarge { .. })));
    assert!(matches!(
        s.set("v", &vec![0u8; 8 * 1024 * 1024 + 1]),
        Err(StoreError::TooLarge { .. })
    ));
    s.set("big", &vec![7u8; 8 * 1024 * 1024]).unwrap();
    assert_eq!(s.get("big").unwrap().len(), 8 * 1024 * 1024);
    s.set_timeout(Duration::from_secs(3));
    assert_eq!(s.timeout(), Duration::from_secs(3));
}

#[test]
fn tcp_wait_timeout_cancels_and_connection_stays_usable() {
    let s = TcpStore::server(loopback0(), T).unwrap();
    let t0 = Instant::now();
    let e = s.wait(&["never"], Some(Duration::from_millis(200))).unwrap_err();
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    let e = s.get_timeout("never", Duration::from_millis(100)).unwrap_err();
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    let e = s.queue_pop("nq", Some(Duration::from_millis(100))).unwrap_err();
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    // The cancelled wait must not leave a stray STOP_WAITING behind.
    s.set("never", b"now").unwrap();
    assert_eq!(s.get("never").unwrap(), b"now");
    assert_eq!(s.add("x", 1).unwrap(), 1);
}

#[test]
fn tcp_wait_wakes_on_every_writer() {
    let host = TcpStore::server(loopback0(), T).unwrap();
    let addr = host.addr();
    type Writer = Box<dyn Fn(&TcpStore) + Send>;
    let writers: Vec<(&str, Writer)> = vec![
        ("w_set", Box::new(|s: &TcpStore| s.set("w_set", b"1").unwrap())),
        (
            "w_add",
            Box::new(|s: &TcpStore| assert_eq!(s.add("w_add", 1).unwrap(), 1)),
        ),
        ("w_append", Box::new(|s: &TcpStore| s.append("w_append", b"1").unwrap())),
        (
            "w_cas",
            Box::new(|s: &TcpStore| assert_eq!(s.compare_set("w_cas", b"", b"1").unwrap(), b"1")),
        ),
        (
            "w_multi",
            Box::new(|s: &TcpStore| s.multi_set(&[("w_multi", b"1")]).unwrap()),
        ),
        (
            "w_queue",
            Box::new(|s: &TcpStore| s.queue_push("w_queue", b"1").unwrap()),
        ),
    ];
    for (key, write) in writers {
        let waiter = TcpStore::connect(addr, T).unwrap();
        let h = std::thread::spawn(move || waiter.wait(&[key], Some(T)));
        std::thread::sleep(Duration::from_millis(50));
        write(&host);
        h.join().unwrap().unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}

#[test]
fn tcp_keys_use_pytorch_layout_on_the_wire() {
    let s = TcpStore::server(loopback0(), T).unwrap();
    let p = PrefixStore::new("pg0", s.clone() as Arc<dyn Store>);
    p.set("k", b"v").unwrap();
    // A raw client sees "/" + "pg0/k".
    let mut raw = common::raw_client(s.addr());
    let mut buf = Vec::new();
    encode_request(
        &Request::Get {
            key: b"/pg0/k".to_vec(),
        },
        &mut buf,
    );
    raw.write_all(&buf).unwrap();
    let mut len = [0u8; 8];
    raw.read_exact(&mut len).unwrap();
    assert_eq!(u64::from_le_bytes(len), 1);
    let mut v = [0u8; 1];
    raw.read_exact(&mut v).unwrap();
    assert_eq!(&v, b"v");
    // Non-UTF-8 keys are stored exactly as received.
    let mut buf = Vec::new();
    encode_request(
        &Request::Set {
            key: vec![0xff, 0x00, b'/'],
            value: b"bin".to_vec(),
        },
        &mut buf,
    );
    encode_request(
        &Request::Check {
            keys: vec![vec![0xff, 0x00, b'/']],
        },
        &mut buf,
    );
    raw.write_all(&buf).unwrap();
    raw.read_exact(&mut v).unwrap();
    assert_eq!(v[0], 0, "binary key must be present");
}

#[test]
fn tcp_connect_to_nothing_fails_within_timeout() {
    let port = common::free_port();
    let t0 = Instant::now();
    let e = TcpStore::connect(SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(500)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(
        matches!(e, StoreError::Connection { .. } | StoreError::Timeout { .. }),
        "{e}"
    );
}

#[test]
fn tcp_300_concurrent_clients_with_deferred_waits() {
    let server = TcpServer::bind(loopback0()).unwrap();
    let addr = server.local_addr();
    let n = 300;
    let clients: Vec<Arc<TcpStore>> = (0..n).map(|_| TcpStore::connect(addr, T).unwrap()).collect();
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            std::thread::spawn(move || {
                c.wait(&["go"], Some(Duration::from_secs(60))).unwrap();
                c.set(&format!("k{i}"), &(i as u64).to_le_bytes()).unwrap();
                c.add("count", 1).unwrap()
            })
        })
        .collect();
    let main = TcpStore::connect(addr, T).unwrap();
    // Every client is connected and parked in WAIT at once.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.stats().active < n as u64 + 1 {
        assert!(
            Instant::now() < deadline,
            "only {} clients connected",
            server.stats().active
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    main.set("go", b"").unwrap();
    let mut counts: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    counts.sort();
    assert_eq!(counts, (1..=n as i64).collect::<Vec<_>>());
    for i in 0..n {
        assert_eq!(main.get(&format!("k{i}")).unwrap(), (i as u64).to_le_bytes());
    }
}
