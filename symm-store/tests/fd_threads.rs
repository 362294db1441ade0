//! FdChannel among threads of one process (all ranks share one pid).

use std::io::{Read, Seek, SeekFrom, Write};
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

fn read_all(fd: OwnedFd) -> Vec<u8> {
    let mut f = std::fs::File::from(fd);
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
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
