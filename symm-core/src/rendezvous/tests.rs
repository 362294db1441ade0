//! The records and their checks (every backend's, written once), and the protocol end to end
//! with a file-backed backend: rank threads through the table and through fds, mismatched
//! sizes, a failed mapping, an injected fault.

use super::*;
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use symm_store::{HashStore, StoreError};

use crate::fault::set_thread_fault;
use crate::group::GroupOptions;
use crate::pad::SIGNAL_PAD_SIZE;

/// A backend's own fields, as CUDA has them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ext {
    bus: String,
    queues: u32,
}

impl RecordExt for Ext {
    fn fields(&self) -> Vec<String> {
        vec![self.bus.clone(), self.queues.to_string()]
    }
    fn parse(f: &[&str]) -> Option<Ext> {
        match f {
            [bus, q] => Some(Ext {
                bus: bus.to_string(),
                queues: q.parse().ok()?,
            }),
            _ => None,
        }
    }
    fn check(records: &[Record<Ext>], sharers: &[usize]) -> Result<()> {
        crate::check_shared_queues(
            sharers,
            &records.iter().map(|r| r.extra.queues).collect::<Vec<_>>(),
            "QUEUES",
        )
    }
}

fn record(r: usize) -> Record<Ext> {
    Record {
        world: 2,
        buffer_size: 1 << 20,
        pad_size: SIGNAL_PAD_SIZE,
        total: 4 << 20,
        host: "h/b".into(),
        device: format!("GPU-{r:032x}"),
        pid: 7,
        pid_ns: "pid:[1]".into(),
        nonce: 9,
        key: r as u64 + 1,
        shared_ok: false,
        extra: Ext {
            bus: format!("0000:{:02x}:00.0", 0x18 + r),
            queues: 8,
        },
    }
}

#[test]
fn records_round_trip() {
    let i = record(1);
    assert_eq!(Record::<Ext>::decode("b", 1, &i.encode("b")).unwrap(), i);
    // Another backend's record, another version's, or one of the wrong shape: refused.
    let e = Record::<Ext>::decode("a", 1, &i.encode("b")).unwrap_err();
    assert!(
        matches!(e, Error::Mismatch { what: "rendezvous record", ref detail } if detail.contains("rank 1")),
        "{e}"
    );
    assert!(Record::<Ext>::decode("b", 0, b"symm-host-rdzv-1\n2").is_err());
    assert!(Record::<Ext>::decode("b", 0, b"junk").is_err());
    assert!(Record::<()>::decode("b", 1, &i.encode("b")).is_err());
    let mut bad = String::from_utf8(i.encode("b")).unwrap();
    bad = bad.replacen("\n7\n", "\nseven\n", 1);
    assert!(Record::<Ext>::decode("b", 0, bad.as_bytes()).is_err());
    let mut weird = record(0);
    weird.host = "a\nb".into();
    weird.extra.bus = "x\ry".into();
    let back = Record::<Ext>::decode("b", 0, &weird.encode("b")).unwrap();
    assert_eq!((back.host.as_str(), back.extra.bus.as_str()), ("a b", "x y"));
    let r = record(2);
    let plain = Record {
        world: r.world,
        buffer_size: r.buffer_size,
        pad_size: r.pad_size,
        total: r.total,
        host: r.host,
        device: r.device,
        pid: r.pid,
        pid_ns: r.pid_ns,
        nonce: r.nonce,
        key: r.key,
        shared_ok: r.shared_ok,
        extra: (),
    };
    assert_eq!(Record::<()>::decode("h", 2, &plain.encode("h")).unwrap(), plain);
}

#[test]
fn every_rank_fails_the_same_way() {
    let ok: Vec<_> = (0..2).map(record).collect();
    assert_eq!(check_records(2, &ok, true).unwrap(), vec![1, 1]);
    let mut v = ok.clone();
    v[1].buffer_size = 5;
    let e = check_records(2, &v, true).unwrap_err().to_string();
    assert!(e.contains("buffer size") && e.contains("rank 1: 5"), "{e}");
    let mut v = ok.clone();
    v[0].pad_size = 1;
    assert!(matches!(
        check_records(2, &v, true),
        Err(Error::Mismatch {
            what: "signal pad size",
            ..
        })
    ));
    let mut v = ok.clone();
    v[1].world = 3;
    assert!(matches!(
        check_records(2, &v, true),
        Err(Error::Mismatch { what: "world size", .. })
    ));
    assert!(matches!(
        check_records(3, &ok, true),
        Err(Error::Mismatch { what: "world size", .. })
    ));
    let mut v = ok.clone();
    v[1].total = 6 << 20;
    assert!(matches!(
        check_records(2, &v, true),
        Err(Error::Mismatch {
            what: "allocation size (granularity)",
            ..
        })
    ));
    let mut v = ok.clone();
    v[1].host = "other/b".into();
    assert!(matches!(check_records(2, &v, true), Err(Error::NotSameHost(_))));
    let mut v = ok.clone();
    v[1].device = v[0].device.clone();
    assert!(matches!(
        check_records(2, &v, true),
        Err(Error::OverlappingDevices { a: 0, b: 1, .. })
    ));
    // Shared devices: with the permission, among threads of one process; every rank counts the
    // ranks on its device; and the backend's check (here the hardware queues, NOTE
    // [co-residency]) runs after the common ones.
    v.iter_mut().for_each(|i| i.shared_ok = true);
    match check_records(2, &v, true) {
        Err(Error::Unavailable(m)) => assert!(m.contains("QUEUES=32"), "{m}"),
        other => panic!("8 hardware queues on a shared device: {other:?}"),
    }
    v.iter_mut().for_each(|i| i.extra.queues = 32);
    assert_eq!(check_records(2, &v, true).unwrap(), vec![2, 2]);
    let mut other_process = v.clone();
    other_process[1].pid = 8;
    assert!(matches!(
        check_records(2, &other_process, true),
        Err(Error::Unavailable(_))
    ));
    let mut other_nonce = v.clone();
    other_nonce[1].nonce = 10;
    assert!(matches!(
        check_records(2, &other_nonce, true),
        Err(Error::Unavailable(_))
    ));
    // A backend whose devices processes may share (the host backend).
    assert_eq!(check_records(2, &other_process, false).unwrap(), vec![2, 2]);
    let mut v = ok.clone();
    v[0].shared_ok = true;
    assert!(matches!(check_records(2, &v, true), Err(Error::Mismatch { .. })));
    // Three ranks, as the host backend checked them.
    let three: Vec<_> = (0..3).map(|r| Record { world: 3, ..record(r) }).collect();
    check_records(3, &three, false).unwrap();
    let mut v = three.clone();
    v[2].device = v[0].device.clone();
    assert!(matches!(
        check_records(3, &v, false),
        Err(Error::OverlappingDevices { a: 0, b: 2, .. })
    ));
    v.iter_mut().for_each(|i| {
        i.shared_ok = true;
        i.extra.queues = 32;
    });
    assert_eq!(check_records(3, &v, false).unwrap(), vec![2, 1, 2]);
}

#[test]
fn missing_ranks_are_named() {
    let t = Duration::from_secs(1);
    let e = StoreError::MissingRanks {
        what: "x".into(),
        missing: vec![3, 4],
        timeout: t,
    };
    assert_eq!(missing_rank(&e), Some(3));
    let e = StoreError::PeerLost {
        rank: 2,
        reason: "gone".into(),
    };
    assert_eq!(missing_rank(&e), Some(2));
    assert_eq!(missing_rank(&StoreError::Protocol("p".into())), None);
}

#[test]
fn process_membership() {
    let mut v: Vec<_> = (0..3).map(record).collect();
    assert_eq!(same_process(&v, 0), vec![true, true, true]);
    v[2].pid = 8;
    assert_eq!(same_process(&v, 0), vec![true, true, false]);
    assert_eq!(same_process(&v, 2), vec![false, false, true]);
    v[1].nonce = 10;
    assert_eq!(same_process(&v, 0), vec![true, false, false]);
    v[0].pid_ns = "pid:[2]".into();
    assert_eq!(same_process(&v, 0), vec![true, false, false]);
    assert_eq!(same_process(&v, 1), vec![false, true, false]);
    assert_eq!(process_nonce(), process_nonce());
    let local = LocalRecord {
        buffer_size: 5,
        total: 4096 + SIGNAL_PAD_SIZE,
        device: "d".to_string(),
        extra: (),
    };
    let own = Record::of_this_process(3, local, 11, true);
    assert_eq!(
        (own.world, own.buffer_size, own.total, own.key),
        (3, 5, 4096 + SIGNAL_PAD_SIZE, 11)
    );
    assert_eq!(
        (own.pad_size, own.device.as_str(), own.shared_ok),
        (SIGNAL_PAD_SIZE, "d", true)
    );
    assert_eq!((own.pid, own.nonce), (std::process::id(), process_nonce()));
    assert_eq!(
        (own.host, own.pid_ns),
        (crate::agree::host_id(), crate::agree::pid_namespace())
    );
    assert_ne!(next_key(), next_key());
}

/// A file of `len` bytes (unlinked at once) stands for physical memory.
#[derive(Debug)]
struct FileHandle {
    file: File,
    len: usize,
}

struct FileBackend {
    rank: usize,
    size: usize,
    own: Arc<FileHandle>,
    threads: bool,
    fail_map: bool,
}

static FILES: AtomicUsize = AtomicUsize::new(0);

impl FileBackend {
    fn new(rank: usize, size: usize, threads: bool) -> FileBackend {
        let path = std::env::temp_dir().join(format!(
            "symm-core-rdzv-{}-{}",
            std::process::id(),
            FILES.fetch_add(1, Ordering::Relaxed)
        ));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let len = size.div_ceil(4096) * 4096 + SIGNAL_PAD_SIZE;
        file.set_len(len as u64).unwrap();
        FileBackend {
            rank,
            size,
            own: Arc::new(FileHandle { file, len }),
            threads,
            fail_map: false,
        }
    }
}

impl RendezvousBackend for FileBackend {
    type Handle = FileHandle;
    type Mapped = Arc<FileHandle>;
    type Extra = ();

    fn backend_name(&self) -> &'static str {
        "file"
    }
    fn prefix(&self) -> &'static str {
        "file-rendezvous"
    }
    fn local_record(&self) -> Result<LocalRecord<()>> {
        Ok(LocalRecord {
            buffer_size: self.size,
            total: self.own.len,
            device: format!("file-{}", self.rank),
            extra: (),
        })
    }
    fn handle(&self) -> Arc<FileHandle> {
        self.own.clone()
    }
    fn handle_size(&self, h: &FileHandle) -> usize {
        h.len
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        Ok(self.own.file.try_clone()?.into())
    }
    fn fd_kind(&self) -> FdKind {
        FdKind::Regular
    }
    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<Arc<FileHandle>> {
        let file = File::from(fd);
        let len = file.metadata()?.len() as usize;
        if len != size {
            return Err(Error::Mismatch {
                what: "received fd",
                detail: format!("{len} bytes, expected {size}"),
            });
        }
        Ok(Arc::new(FileHandle { file, len }))
    }
    fn map_peer(&self, h: Arc<FileHandle>, record: &Record<()>) -> Result<Arc<FileHandle>> {
        if self.fail_map {
            return Err(Error::Backend {
                backend: "file",
                call: "map".into(),
                detail: format!("refused {}", record.device),
            });
        }
        Ok(h)
    }
    fn hands_over_in_process(&self) -> bool {
        self.threads
    }
    fn sharing_needs_one_process(&self) -> bool {
        false
    }
}

/// Runs a rendezvous of `world` rank threads; `setup(rank)` gives each rank's backend, and
/// `fault` arms an injected fault in one rank's thread. Returns each rank's outcome: the
/// peers' sizes and whether a peer's handle is the peer's own object.
fn rendezvous(
    name: &str,
    world: usize,
    timeout: Duration,
    setup: impl Fn(usize) -> FileBackend + Sync,
    fault: Option<(usize, &'static str)>,
) -> Vec<Result<Vec<Option<usize>>>> {
    let store = HashStore::new(Duration::from_secs(10));
    let threads = setup(0).threads;
    let owns: Vec<Mutex<Option<Arc<FileHandle>>>> = (0..world).map(|_| Mutex::new(None)).collect();
    let outcomes: Vec<_> = thread::scope(|s| {
        let joins: Vec<_> = (0..world)
            .map(|rank| {
                let (store, setup, owns) = (store.clone(), &setup, &owns);
                s.spawn(move || {
                    let g = Group::with_options(name, rank, world, store, GroupOptions::default())?;
                    let b = setup(rank);
                    *owns[rank].lock().unwrap() = Some(b.own.clone());
                    set_thread_fault(fault.filter(|f| f.0 == rank).map(|f| f.1));
                    let r = run(&b, &g, timeout, |done| {
                        assert_eq!(done.records.len(), world);
                        assert_eq!(done.sharers, vec![1; world]);
                        assert!(done.peers[rank].is_none());
                        Ok((done.peers, done.records[rank].key))
                    });
                    set_thread_fault(None);
                    // The table entry went with the rendezvous.
                    r.map(|(peers, key)| {
                        assert!(!table().lock().unwrap().contains_key(&key));
                        peers
                    })
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    outcomes
        .into_iter()
        .map(|o| {
            o.map(|peers| {
                peers
                    .iter()
                    .enumerate()
                    .map(|(r, p)| {
                        p.as_ref().map(|h| {
                            let own = owns[r].lock().unwrap().clone().unwrap();
                            // Threads get the peer's own handle; fds a handle of its own.
                            assert_eq!(Arc::ptr_eq(h, &own), threads);
                            h.len
                        })
                    })
                    .collect()
            })
        })
        .collect()
}

#[test]
fn threads_through_the_table_and_through_fds() {
    for threads in [true, false] {
        let name = format!("rdzv-ok-{threads}");
        let out = rendezvous(
            &name,
            3,
            Duration::from_secs(10),
            |r| FileBackend::new(r, 100, threads),
            None,
        );
        let len = 4096 + SIGNAL_PAD_SIZE;
        for (rank, o) in out.into_iter().enumerate() {
            let peers = o.unwrap_or_else(|e| panic!("threads {threads}, rank {rank}: {e}"));
            let want: Vec<_> = (0..3).map(|r| (r != rank).then_some(len)).collect();
            assert_eq!(peers, want);
        }
    }
}

#[test]
fn mismatched_sizes_fail_every_rank_alike() {
    let out = rendezvous(
        "rdzv-mismatch",
        3,
        Duration::from_secs(10),
        |r| FileBackend::new(r, if r == 2 { 200 } else { 100 }, true),
        None,
    );
    let texts: Vec<String> = out
        .into_iter()
        .map(|o| match o {
            Err(
                e @ Error::Mismatch {
                    what: "buffer size", ..
                },
            ) => e.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        texts.iter().all(|t| t == &texts[0] && t.contains("rank 2: 200")),
        "{texts:?}"
    );
}

#[test]
fn a_failed_mapping_fails_every_rank() {
    for threads in [true, false] {
        let out = rendezvous(
            &format!("rdzv-map-{threads}"),
            3,
            Duration::from_secs(10),
            |r| FileBackend {
                fail_map: r == 1,
                ..FileBackend::new(r, 100, threads)
            },
            None,
        );
        for (rank, o) in out.into_iter().enumerate() {
            match o {
                Err(Error::Backend { backend, call, detail }) if rank == 1 => {
                    assert_eq!(backend, "file");
                    assert!(call.starts_with("map (memory of rank "), "{call}");
                    assert!(detail.starts_with("refused file-"), "{detail}");
                }
                Err(Error::Backend { backend, call, detail }) => {
                    assert_eq!((backend, call.as_str()), ("file", "rendezvous (rank 1)"));
                    assert!(detail.starts_with("failed: file error in map"), "{detail}");
                }
                other => panic!("threads {threads}, rank {rank}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_killed_rank_fails_the_others() {
    for (threads, point) in [
        (true, "rendezvous.before_send"),
        (true, "rendezvous.after_send"),
        (true, "rendezvous.after_map"),
        (false, "rendezvous.before_send"),
        (false, "rendezvous.after_send"),
        (false, "rendezvous.after_map"),
    ] {
        let victim = 1;
        let out = rendezvous(
            &format!("rdzv-killed-{threads}-{point}"),
            3,
            Duration::from_millis(500),
            |r| FileBackend::new(r, 100, threads),
            Some((victim, point)),
        );
        for (rank, o) in out.into_iter().enumerate() {
            match o {
                Err(e) if rank == victim => assert!(is_injected(&e), "{e}"),
                Err(Error::PeerLost { rank: r, .. }) => assert_eq!(r, victim),
                Err(Error::Store(StoreError::MissingRanks { missing, .. })) => assert_eq!(missing, vec![victim]),
                other => panic!("{point}, threads {threads}, rank {rank}: {other:?}"),
            }
        }
    }
}
