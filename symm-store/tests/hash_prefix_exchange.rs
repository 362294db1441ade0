//! HashStore, PrefixStore and StoreExchange semantics (threads in one process).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use symm_store::{HashStore, PrefixStore, Store, StoreError, StoreExchange};

const T: Duration = Duration::from_secs(10);

#[test]
fn hash_store_semantics() {
    let s = HashStore::new(Duration::from_millis(200));
    s.set("a", b"1").unwrap();
    assert_eq!(s.get("a").unwrap(), b"1");
    assert!(matches!(s.get_now("zz"), Err(StoreError::KeyNotFound(_))));
    let t0 = Instant::now();
    let e = s.get("missing").unwrap_err();
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(s.add("c", 5).unwrap(), 5);
    assert_eq!(s.add("c", -7).unwrap(), -2);
    assert_eq!(s.get("c").unwrap(), b"-2");
    assert!(matches!(s.add("a", 1), Ok(2)));
    s.set("txt", b"abc").unwrap();
    assert!(matches!(s.add("txt", 1), Err(StoreError::BadValue { .. })));
    // compare_set, PyTorch semantics.
    assert_eq!(s.compare_set("cs", b"", b"x").unwrap(), b"x");
    assert_eq!(s.compare_set("cs2", b"nope", b"y").unwrap(), b"nope");
    assert!(!s.check(&["cs2"]).unwrap());
    assert_eq!(s.compare_set("cs", b"x", b"z").unwrap(), b"z");
    assert_eq!(s.compare_set("cs", b"x", b"w").unwrap(), b"z");
    s.append("ap", b"he").unwrap();
    s.append("ap", b"llo").unwrap();
    assert_eq!(s.get("ap").unwrap(), b"hello");
    assert!(s.check(&["a", "ap"]).unwrap());
    assert!(!s.check(&["a", "nope"]).unwrap());
    assert!(s.delete_key("a").unwrap());
    assert!(!s.delete_key("a").unwrap());
    let n = s.num_keys().unwrap();
    s.multi_set(&[("m1", b"1"), ("m2", b"22")]).unwrap();
    assert_eq!(s.num_keys().unwrap(), n + 2);
    assert_eq!(s.multi_get(&["m1", "m2"]).unwrap(), vec![b"1".to_vec(), b"22".to_vec()]);
    s.queue_push("q", b"x").unwrap();
    s.queue_push("q", b"y").unwrap();
    assert_eq!(s.queue_len("q").unwrap(), 2);
    assert!(s.check(&["q"]).unwrap());
    assert_eq!(s.queue_pop("q", None).unwrap(), b"x");
    assert_eq!(s.queue_pop("q", None).unwrap(), b"y");
    assert!(matches!(
        s.queue_pop("q", Some(Duration::from_millis(50))),
        Err(StoreError::Timeout { .. })
    ));
    assert_eq!(s.queue_len("nothing").unwrap(), 0);
    s.set_timeout(Duration::from_secs(3));
    assert_eq!(s.timeout(), Duration::from_secs(3));
}

#[test]
fn hash_store_wait_wakes_on_set_and_queue_push() {
    let s = HashStore::new(T);
    let s2 = s.clone();
    let h = thread::spawn(move || {
        s2.wait(&["k1", "k2"], None).unwrap();
        s2.queue_pop("q", None).unwrap()
    });
    thread::sleep(Duration::from_millis(30));
    s.set("k1", b"").unwrap();
    s.add("k2", 1).unwrap();
    s.queue_push("q", b"v").unwrap();
    assert_eq!(h.join().unwrap(), b"v");
}

#[test]
fn prefix_store_uses_pytorch_layout() {
    let base = HashStore::new(T);
    let p = PrefixStore::new("group0", base.clone() as Arc<dyn Store>);
    p.set("k", b"v").unwrap();
    assert_eq!(base.get("group0/k").unwrap(), b"v");
    assert_eq!(p.add("n", 2).unwrap(), 2);
    assert_eq!(base.get("group0/n").unwrap(), b"2");
    p.multi_set(&[("a", b"1"), ("b", b"2")]).unwrap();
    assert_eq!(
        base.multi_get(&["group0/a", "group0/b"]).unwrap(),
        vec![b"1".to_vec(), b"2".to_vec()]
    );
    assert_eq!(p.multi_get(&["a", "b"]).unwrap().len(), 2);
    assert!(p.check(&["a"]).unwrap());
    assert!(!base.check(&["a"]).unwrap());
    let nested = PrefixStore::new("sub", Arc::new(p) as Arc<dyn Store>);
    nested.set("x", b"y").unwrap();
    assert_eq!(base.get("group0/sub/x").unwrap(), b"y");
}

fn run_ranks<T: Send + 'static>(world: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let f = f.clone();
            thread::spawn(move || f(r))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn exchange_all_gather_broadcast_barrier_threads() {
    let store: Arc<dyn Store> = HashStore::new(T);
    let world = 5;
    let out = run_ranks(world, move |r| {
        let ex = StoreExchange::new(store.clone(), "ex");
        let mut res = Vec::new();
        for round in 0..3u8 {
            let g = ex.all_gather(r, world, &[r as u8, round], T).unwrap();
            res.push(g);
            let b = ex
                .broadcast(
                    r,
                    world,
                    (round as usize) % world,
                    if r == round as usize { b"root!" } else { b"" },
                    T,
                )
                .unwrap();
            assert_eq!(b, b"root!");
            ex.barrier(r, world, T).unwrap();
        }
        (res, store.num_keys().unwrap())
    });
    for (res, _) in &out {
        for (round, g) in res.iter().enumerate() {
            let want: Vec<Vec<u8>> = (0..world).map(|r| vec![r as u8, round as u8]).collect();
            assert_eq!(g, &want);
        }
    }
}

#[test]
fn exchange_names_missing_ranks_within_timeout() {
    let store: Arc<dyn Store> = HashStore::new(T);
    let world = 4;
    // Ranks 1 and 3 never arrive.
    let out = run_ranks(world, move |r| {
        if r == 1 || r == 3 {
            return None;
        }
        let ex = StoreExchange::new(store.clone(), "miss");
        let t0 = Instant::now();
        let e = ex.all_gather(r, world, b"x", Duration::from_millis(300)).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(3));
        let e2 = ex.broadcast(r, world, 3, b"", Duration::from_millis(100)).unwrap_err();
        Some((e, e2))
    });
    for (e, e2) in out.into_iter().flatten() {
        match e {
            StoreError::MissingRanks { missing, .. } => assert_eq!(missing, vec![1, 3]),
            other => panic!("unexpected {other}"),
        }
        match e2 {
            StoreError::MissingRanks { missing, .. } => assert_eq!(missing, vec![3]),
            other => panic!("unexpected {other}"),
        }
    }
}

#[test]
fn exchange_rejects_bad_arguments() {
    let ex = StoreExchange::new(HashStore::new(T), "bad");
    assert!(matches!(
        ex.all_gather(3, 3, b"", T),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        ex.broadcast(0, 2, 2, b"", T),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(ex.barrier(0, 0, T), Err(StoreError::InvalidArgument(_))));
}

#[test]
fn exchange_cleans_up_its_keys() {
    let store: Arc<dyn Store> = HashStore::new(T);
    let s2 = store.clone();
    run_ranks(3, move |r| {
        let ex = StoreExchange::new(s2.clone(), "clean");
        for _ in 0..10 {
            ex.all_gather(r, 3, b"abc", T).unwrap();
            ex.barrier(r, 3, T).unwrap();
        }
    });
    assert_eq!(store.num_keys().unwrap(), 0);
}

/// A rank that a `Liveness` reports gone ends an exchange at the next poll with `PeerLost`
/// naming it; one only late (reported alive) is waited for; without a liveness the timeout
/// names the missing rank.
#[test]
fn liveness_ends_waits_for_a_lost_rank() {
    use symm_store::{Liveness, LIVENESS_POLL};
    struct Gone(Option<usize>);
    impl Liveness for Gone {
        fn lost(&self, missing: &[usize]) -> Option<(usize, String)> {
            self.0
                .filter(|r| missing.contains(r))
                .map(|r| (r, "its process exited".into()))
        }
    }
    let store: Arc<dyn Store> = HashStore::new(Duration::from_secs(30));
    let timeout = Duration::from_secs(3);
    let t0 = Instant::now();
    let e = StoreExchange::new(store.clone(), "live-a")
        .with_liveness(Arc::new(Gone(Some(2))))
        .barrier(0, 3, timeout)
        .unwrap_err();
    assert!(matches!(&e, StoreError::PeerLost { rank: 2, .. }), "{e}");
    assert!(t0.elapsed() < LIVENESS_POLL * 3, "{:?}", t0.elapsed());
    // Alive but late: the barrier completes when it arrives.
    let s2 = store.clone();
    let late = std::thread::spawn(move || {
        std::thread::sleep(LIVENESS_POLL * 2);
        StoreExchange::new(s2, "live-b").barrier(1, 2, Duration::from_secs(10))
    });
    StoreExchange::new(store.clone(), "live-b")
        .with_liveness(Arc::new(Gone(None)))
        .barrier(0, 2, Duration::from_secs(10))
        .unwrap();
    late.join().unwrap().unwrap();
    // No liveness: the timeout, naming the missing ranks.
    let t0 = Instant::now();
    let e = StoreExchange::new(store, "live-c")
        .barrier(0, 2, Duration::from_millis(500))
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::MissingRanks { missing, .. } if missing == &[1]),
        "{e}"
    );
    assert!(t0.elapsed() >= Duration::from_millis(500));
}
