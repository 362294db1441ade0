//! FdChannel among threads of one process (all ranks share one pid).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use symm_store::{FdChannel, FdKind, HashStore, Store};

const T: Duration = Duration::from_secs(10);

fn memfd_with(content: &[u8]) -> std::fs::File {
    let fd = nix::sys::memfd::memfd_create("symm-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
    let mut f = std::fs::File::from(fd);
    f.write_all(content).unwrap();
    f
}

/// Reads the whole file with pread: dups share one file offset, and the threads of this
/// test read the same open files concurrently.
fn read_all(fd: OwnedFd) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::from(fd);
    let mut v = vec![0u8; f.metadata().unwrap().len() as usize];
    f.read_exact_at(&mut v, 0).unwrap();
    v
}

#[test]
fn fd_all_gather_and_broadcast_threads() {
    let store: Arc<dyn Store> = HashStore::new(T);
    let world = 3;
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let store = store.clone();
            thread::spawn(move || {
                let ch = FdChannel::new(store, "fdt", r, world, T)
                    .unwrap()
                    .with_expected_kind(FdKind::Memfd);
                let f = memfd_with(format!("rank {r}").as_bytes());
                for _ in 0..3 {
                    let fds = ch.all_gather_fds(f.as_fd(), T).unwrap();
                    let got: Vec<Vec<u8>> = fds.into_iter().map(read_all).collect();
                    let want: Vec<Vec<u8>> = (0..world).map(|p| format!("rank {p}").into_bytes()).collect();
                    assert_eq!(got, want);
                    let b = ch.broadcast_fds(1, (r == 1).then(|| f.as_fd()), T).unwrap();
                    assert_eq!(read_all(b), b"rank 1");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn fd_channel_failure_then_recycled_prefix() {
    use symm_store::StoreError;
    let store: Arc<dyn Store> = HashStore::new(T);
    let world = 2;
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let store = store.clone();
            thread::spawn(move || {
                let f = memfd_with(format!("rank {r}").as_bytes());
                {
                    let ch = FdChannel::new(store.clone(), "re", r, world, T).unwrap();
                    if r == 0 {
                        // Rank 1 never joins this broadcast: a timeout naming it.
                        let e = ch.broadcast_fds(1, None, Duration::from_millis(200)).unwrap_err();
                        assert!(
                            matches!(&e, StoreError::MissingRanks { missing, .. } if missing == &vec![1]),
                            "{e}"
                        );
                    }
                    ExBarrier::wait(&store, r, world, "re-b1");
                }
                // The same prefix again: the old failure must not leak into the new channel.
                let ch = FdChannel::new(store.clone(), "re", r, world, T).unwrap();
                let fds = ch.all_gather_fds(f.as_fd(), T).unwrap();
                let got: Vec<Vec<u8>> = fds.into_iter().map(read_all).collect();
                assert_eq!(got, vec![b"rank 0".to_vec(), b"rank 1".to_vec()]);
                assert!(matches!(
                    ch.broadcast_fds(5, None, T),
                    Err(StoreError::InvalidArgument(_))
                ));
                if r == 0 {
                    assert!(matches!(
                        ch.broadcast_fds(0, None, T),
                        Err(StoreError::InvalidArgument(_))
                    ));
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

struct ExBarrier;

impl ExBarrier {
    fn wait(store: &Arc<dyn Store>, rank: usize, world: usize, name: &str) {
        symm_store::StoreExchange::new(store.clone(), name)
            .barrier(rank, world, T)
            .unwrap();
    }
}

#[test]
fn fd_channel_rejects_bad_arguments() {
    let store: Arc<dyn Store> = HashStore::new(T);
    assert!(FdChannel::new(store.clone(), "bad", 2, 2, T).is_err());
    assert!(FdChannel::new(store, "bad", 0, 0, T).is_err());
}

#[test]
fn fd_rotating_broadcasts_with_jitter() {
    // Fast roots run generations ahead of slow receivers: early messages must be kept
    // for later, not rejected (regression: a receiver two generations behind refused).
    use rand::{Rng, SeedableRng};
    let store: Arc<dyn Store> = HashStore::new(T);
    let world = 4;
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let store = store.clone();
            thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(r as u64);
                let ch = FdChannel::new(store, "jit", r, world, T).unwrap();
                let f = memfd_with(format!("rank {r}").as_bytes());
                for round in 0..40 {
                    let root = round % world;
                    if rng.random_bool(0.3) {
                        thread::sleep(Duration::from_millis(rng.random_range(0..15)));
                    }
                    let fd = ch.broadcast_fds(root, (r == root).then(|| f.as_fd()), T).unwrap();
                    assert_eq!(read_all(fd), format!("rank {root}").into_bytes());
                    if round % 10 == 9 {
                        let all = ch.all_gather_fds(f.as_fd(), T).unwrap();
                        assert_eq!(all.len(), world);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn fd_messages_from_generations_ahead_are_kept() {
    // Rank 1 delivers generation 3 before 1 and 2 (a root that runs ahead of a slow
    // receiver); rank 0 must keep it for its third operation.
    let store: Arc<dyn Store> = HashStore::new(T);
    let s1 = store.clone();
    let receiver = thread::spawn(move || {
        let ch = FdChannel::new(s1, "ahead", 0, 2, T).unwrap();
        (0..3)
            .map(|_| read_all(ch.broadcast_fds(1, None, T).unwrap()))
            .collect::<Vec<_>>()
    });
    let ch = FdChannel::new(store, "ahead", 1, 2, T).unwrap();
    let files: Vec<_> = (1..=3).map(|g| memfd_with(format!("gen {g}").as_bytes())).collect();
    ch.send_raw_for_testing(0, 3, &[files[2].as_fd()], T).unwrap();
    ch.send_raw_for_testing(0, 1, &[files[0].as_fd()], T).unwrap();
    ch.send_raw_for_testing(0, 2, &[files[1].as_fd()], T).unwrap();
    let got = receiver.join().unwrap();
    assert_eq!(got, vec![b"gen 1".to_vec(), b"gen 2".to_vec(), b"gen 3".to_vec()]);
}
