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
