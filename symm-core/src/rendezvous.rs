//! The rendezvous protocol of every backend, written once: how the ranks of a group map each
//! other's allocations. A backend implements [`RendezvousBackend`] (its record fields, export
//! a handle as an fd, import one, map a peer's memory) and calls [`run`].
//!
//! Under `group.next_prefix(backend.prefix())`:
//! 1. `info`: every rank publishes its [`Record`] (world size, buffer, pad and allocation
//!    sizes, host id, device, pid, pid namespace, the [`process_nonce`], a fresh key, the
//!    group's shared-device permission, the backend's own fields) through a `StoreExchange`
//!    all_gather.
//! 2. Every rank checks every record the same way ([`check_records`]), so all fail alike
//!    before anything is mapped.
//! 3. Fault point `rendezvous.before_send`. Handles: if every rank is in this process (same
//!    pid, pid namespace and nonce: one thread per device) and the backend hands handles over
//!    in process ([`RendezvousBackend::hands_over_in_process`]), each rank publishes its handle
//!    in a process-wide table under its key, a store barrier `sent` follows, and each takes
//!    its peers' handles from the table (no fd at all; the handle stays alive while any rank
//!    holds it). Otherwise every rank exports its handle as a POSIX fd, the fds go through a
//!    [`FdChannel`] (`all_gather_fds`), and each peer fd is imported and closed. Fault point
//!    `rendezvous.after_send`.
//! 4. Each peer's memory is mapped here ([`RendezvousBackend::map_peer`]); fault point
//!    `rendezvous.after_map`; the backend builds its memory from the mappings.
//! 5. `status`: an all_gather of every rank's outcome; rendezvous succeeds only if every rank
//!    mapped every peer and built its memory, and fails on every rank otherwise (naming the
//!    rank that failed, or the rank that vanished as [`Error::PeerLost`]). It is also the
//!    barrier after which the table entry goes: nobody drops a handle before every rank took
//!    it.
//!
//! A rank that hits an injected fault leaves at once, without a word, as a dead process
//! would. Every step waits at most until the one deadline `timeout` sets.

mod record;
#[cfg(test)]
mod tests;

use std::any::Any;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use symm_store::{FdChannel, FdKind};

use crate::agree::time_left;
use crate::error::{Error, Result};
use crate::fault::{fault_point, is_injected};
use crate::group::Group;

pub use record::{check_records, missing_rank, next_key, process_nonce, same_process, LocalRecord, Record, RecordExt};

/// What one rank brings to the rendezvous: its record's backend-specific values, its handle,
/// and how to export, import and map handles. Every method is called on the rendezvousing
/// rank's thread.
pub trait RendezvousBackend {
    /// The physical memory ranks share: what the process-wide table hands over among rank
    /// threads and what an imported fd becomes (CUDA / HIP: a physical allocation handle;
    /// host: the mapped memfd).
    type Handle: Any + Send + Sync;
    /// A peer's memory as this rank uses it (CUDA / HIP: its mapping into this device).
    type Mapped;
    /// The backend's own record fields.
    type Extra: RecordExt;

    /// The backend's name: in its records (a record of another backend is refused) and in
    /// errors (`Error::Backend::backend`).
    fn backend_name(&self) -> &'static str;
    /// The store-key segment of this backend's rendezvous (`group.next_prefix(prefix)`).
    fn prefix(&self) -> &'static str;
    /// This rank's values of the record.
    fn local_record(&self) -> Result<LocalRecord<Self::Extra>>;
    /// This rank's handle, published in the thread table.
    fn handle(&self) -> Arc<Self::Handle>;
    /// Bytes of a handle (a handle taken from the table must be `total` bytes).
    fn handle_size(&self, handle: &Self::Handle) -> usize;
    /// This rank's handle as a POSIX fd, for peers in other processes.
    fn export_fd(&self) -> Result<OwnedFd>;
    /// What kind of fd a peer must send ([`FdChannel::with_expected_kind`]).
    fn fd_kind(&self) -> FdKind {
        FdKind::Any
    }
    /// Imports the fd a peer sent, of `size` bytes (the fd closes when dropped).
    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<Arc<Self::Handle>>;
    /// Maps a peer's handle here; `record` is the peer's.
    fn map_peer(&self, handle: Arc<Self::Handle>, record: &Record<Self::Extra>) -> Result<Self::Mapped>;
    /// Makes this rank's device current on the calling thread (before imports and maps).
    fn bind(&self) -> Result<()> {
        Ok(())
    }
    /// Whether rank threads of one process hand their handles over through the process-wide
    /// table (true) or pass fds like processes (false).
    fn hands_over_in_process(&self) -> bool {
        true
    }
    /// Whether ranks that share a device must be threads of one process (GPU backends: one
    /// context, NOTE [shared-device]).
    fn sharing_needs_one_process(&self) -> bool {
        true
    }
}

/// What a completed exchange gives the backend to build its memory from.
#[derive(Debug)]
pub struct Rendezvoused<M, E> {
    /// Every rank's record, checked.
    pub records: Vec<Record<E>>,
    /// Every peer's memory mapped here; `None` at this rank's own index.
    pub peers: Vec<Option<M>>,
    /// How many ranks use each rank's device (itself included).
    pub sharers: Vec<usize>,
}

/// `Allocation::rendezvous` of every backend: the memory `make` gives at the first call that
/// succeeds, the same `Arc` at every later call. Calls wait for each other; a failed call
/// leaves `slot` empty, so a later one may try again.
pub fn once<M>(slot: &Mutex<Option<Arc<M>>>, make: impl FnOnce() -> Result<M>) -> Result<Arc<M>> {
    let mut mem = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = mem.as_ref() {
        return Ok(m.clone());
    }
    let m = Arc::new(make()?);
    *mem = Some(m.clone());
    Ok(m)
}

/// The memory of a slot [`once`] filled, without waiting (`Allocation::symmetric_memory` of
/// every backend): `None` before a rendezvous succeeded, and while one runs on another thread.
pub fn current<M>(slot: &Mutex<Option<Arc<M>>>) -> Option<Arc<M>> {
    match slot.try_lock() {
        Ok(m) => m.clone(),
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().clone(),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Process-wide table of handles published for rendezvous among threads of this process.
type Table = Mutex<HashMap<u64, Weak<dyn Any + Send + Sync>>>;

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// Removes a key from the table when dropped.
struct Published(u64);

impl Published {
    fn new(key: u64, handle: Arc<dyn Any + Send + Sync>) -> Published {
        table()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Arc::downgrade(&handle));
        Published(key)
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        table().lock().unwrap_or_else(|e| e.into_inner()).remove(&self.0);
    }
}

/// A timeout too large for an `Instant` means "a year": effectively none.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// Adds `what` to the call of a backend error.
fn naming(e: Error, what: impl FnOnce() -> String) -> Error {
    match e {
        Error::Backend { backend, call, detail } => Error::Backend {
            backend,
            call: format!("{call} ({})", what()),
            detail,
        },
        e => e,
    }
}

/// Rendezvous of `group` for `backend`'s allocation within `timeout`: steps 1 to 5 of the
/// module's description; `build` makes the backend's memory from the mappings before the
/// status exchange (its error fails every rank alike).
pub fn run<B: RendezvousBackend, M>(
    backend: &B,
    group: &Arc<Group>,
    timeout: Duration,
    build: impl FnOnce(Rendezvoused<B::Mapped, B::Extra>) -> Result<M>,
) -> Result<M> {
    let deadline = deadline_after(timeout);
    let name = backend.backend_name();
    let (rank, world) = (group.rank().get(), group.world_size());
    let prefix = group.next_prefix(backend.prefix());
    let me = Record::of_this_process(
        world,
        backend.local_record()?,
        next_key(),
        group.options().shared_devices,
    );
    let info = group.exchange(format!("{prefix}/info"), time_left(deadline, timeout, "rendezvous")?)?;
    let raw = info.all_gather(
        rank,
        world,
        &me.encode(name),
        time_left(deadline, timeout, "rendezvous")?,
    )?;
    let records = raw
        .iter()
        .enumerate()
        .map(|(r, b)| Record::decode(name, r, b))
        .collect::<Result<Vec<_>>>()?;
    let sharers = check_records(world, &records, backend.sharing_needs_one_process())?;

    // Lives until after the status exchange: no rank's lookup can miss this handle.
    let mut published = None;
    let outcome =
        exchange_and_map(backend, group, &prefix, &records, &mut published, deadline, timeout).and_then(|peers| {
            build(Rendezvoused {
                records,
                peers,
                sharers,
            })
        });
    // An injected fault stands for a dead rank: leave without a word.
    if let Err(e) = &outcome {
        if is_injected(e) {
            return outcome;
        }
    }
    // Every rank learns every outcome: all succeed or all fail.
    let status = match &outcome {
        Ok(_) => b"ok".to_vec(),
        Err(e) => format!("failed: {e}").into_bytes(),
    };
    // The membership was checked at the info exchange: nothing to fail here.
    let all = group.exchange(format!("{prefix}/status"), timeout)?.all_gather(
        rank,
        world,
        &status,
        time_left(deadline, timeout, "rendezvous status exchange").unwrap_or(Duration::from_millis(1)),
    );
    drop(published);
    let mem = match (outcome, &all) {
        (Ok(m), _) => m,
        // A local failure (an import or a mapping) while a peer vanished: the vanished peer
        // is the likely cause; name it.
        (Err(e), Err(se)) if !matches!(e, Error::Store(_) | Error::Timeout { .. } | Error::PeerLost { .. }) => {
            return Err(match missing_rank(se) {
                Some(rank) => Error::PeerLost {
                    rank,
                    reason: format!("it did not finish rendezvous; here: {e}"),
                },
                None => e,
            });
        }
        (Err(e), _) => return Err(e),
    };
    let all = all?;
    if let Some((r, s)) = all.iter().enumerate().find(|(_, s)| s.as_slice() != b"ok") {
        return Err(Error::Backend {
            backend: name,
            call: format!("rendezvous (rank {r})"),
            detail: String::from_utf8_lossy(s).into_owned(),
        });
    }
    Ok(mem)
}

/// Steps 3 and 4: the peers' handles, mapped here.
fn exchange_and_map<B: RendezvousBackend>(
    backend: &B,
    group: &Arc<Group>,
    prefix: &str,
    records: &[Record<B::Extra>],
    published: &mut Option<Published>,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<Option<B::Mapped>>> {
    let (rank, world) = (group.rank().get(), group.world_size());
    let total = records[rank].total;
    let in_process = backend.hands_over_in_process() && same_process(records, rank).iter().all(|&b| b);
    fault_point("rendezvous.before_send")?;
    backend.bind()?;
    let handles: Vec<Option<Arc<B::Handle>>> = if in_process {
        // Threads: hand the handle over through the process-wide table.
        *published = Some(Published::new(records[rank].key, backend.handle()));
        fault_point("rendezvous.after_send")?;
        group.exchange(format!("{prefix}/sent"), timeout)?.barrier(
            rank,
            world,
            time_left(deadline, timeout, "rendezvous")?,
        )?;
        let table = table().lock().unwrap_or_else(|e| e.into_inner());
        records
            .iter()
            .enumerate()
            .map(|(r, rec)| {
                if r == rank {
                    return Ok(None);
                }
                table
                    .get(&rec.key)
                    .and_then(Weak::upgrade)
                    .and_then(|h| h.downcast::<B::Handle>().ok())
                    .filter(|h| backend.handle_size(h) == total)
                    .map(Some)
                    .ok_or_else(|| Error::PeerLost {
                        rank: r,
                        reason: "its allocation was freed during rendezvous".into(),
                    })
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        // Processes: POSIX fds over the FdChannel.
        let own = backend.export_fd()?;
        let channel = FdChannel::with_liveness(
            group.store().clone(),
            &format!("{prefix}/fds"),
            rank,
            world,
            time_left(deadline, timeout, "rendezvous")?,
            group.liveness(),
        )?
        .with_expected_kind(backend.fd_kind());
        let fds = channel.all_gather_fds(own.as_fd(), time_left(deadline, timeout, "rendezvous")?)?;
        drop(channel);
        drop(own);
        fault_point("rendezvous.after_send")?;
        fds.into_iter()
            .enumerate()
            .map(|(r, fd)| {
                if r == rank {
                    return Ok(None);
                }
                let handle = backend
                    .import_fd(fd, records[r].total)
                    .map_err(|e| naming(e, || format!("handle of rank {r}")))?;
                Ok(Some(handle))
            })
            .collect::<Result<Vec<_>>>()?
    };
    // Imports (above) and mappings (below) run in the backend's context, bound once here.
    let mut peers = Vec::with_capacity(world);
    for (r, h) in handles.into_iter().enumerate() {
        peers.push(match h {
            None => None,
            Some(h) => Some(
                backend
                    .map_peer(h, &records[r])
                    .map_err(|e| naming(e, || format!("memory of rank {r} on device {}", records[r].device)))?,
            ),
        });
    }
    fault_point("rendezvous.after_map")?;
    Ok(peers)
}
