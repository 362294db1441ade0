//! The collectives seam: [`Collectives`], the one trait every GPU backend's collectives
//! implement (symm-cuda's `CudaCollectives`, symm-rocm's `RocmCollectives`), and its registry by
//! device type, built like the allocators' ([`crate::BackendRegistration`]): a backend submits a
//! [`CollectivesRegistration`] with `inventory`, and symm-ops finds it with
//! [`collectives_for`] and builds it with [`make_collectives`]. symm-ops runs every backend's
//! ops through this trait (its kernel engine); what differs between backends is what they
//! report as [`CollFacts`], never a check of which backend it is. (symm-ops' CUDA side also
//! reads `CudaCollectives`' error probe through [`Collectives::as_any`], for the host copies
//! of its buffers: a CUDA extra, not an op.)
//!
//! **Queues.** Backends differ in where an op runs: CUDA enqueues it on the caller's stream and
//! returns before it is done; ROCm runs it on the collectives' own stream and returns when it
//! is done. An op takes a [`Queue`]: either [`Queue::own`] (the backend's own queue) or
//! [`Queue::of`] a backend's queue type (`cudarc::driver::CudaStream` for CUDA), type-erased,
//! which the backend takes back with [`Queue::get`]. A backend refuses a queue it does not run
//! on ([`Error::InvalidArgument`]); [`CollFacts::stream_ordered`] says which kind it takes.
//! symm-core names no vendor type.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::kernels::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};
use super::op_desc::OpKind;
use crate::coll::add_rms::Epilogue;
use crate::coll::launch::DeviceOp;
use crate::error::{Error, Result};
use crate::group::Group;
use crate::memory::SymmetricMemory;
use crate::types::{DType, Device, DeviceType, Rank, ReduceOp};

/// Where an op runs: the backend's own queue, or one the caller gives (type-erased; the
/// backend downcasts it with [`Queue::get`]). See the module docs.
#[derive(Clone, Copy)]
pub struct Queue<'a>(Option<&'a dyn Any>);

impl<'a> Queue<'a> {
    /// The backend's own queue (a synchronous backend's only one).
    pub const fn own() -> Self {
        Queue(None)
    }

    /// The caller's queue `q` (for CUDA, a `cudarc::driver::CudaStream`).
    pub fn of<T: Any>(q: &'a T) -> Self {
        Queue(Some(q))
    }

    /// The caller's queue as a `T`: `None` for [`Queue::own`] or a queue of another type.
    pub fn get<T: Any>(&self) -> Option<&'a T> {
        self.0.and_then(|q| q.downcast_ref::<T>())
    }

    /// Whether this is [`Queue::own`].
    pub fn is_own(&self) -> bool {
        self.0.is_none()
    }
}

impl fmt::Debug for Queue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_own() { "Queue::own" } else { "Queue::of(..)" })
    }
}

/// What a backend's collectives can do, as the backend reports it: the facts symm-ops' engine
/// and planner read instead of asking which backend runs. The same on every rank of a group
/// for the same configuration (the planner's choices depend on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CollFacts {
    /// The backend's short name ("cuda", "rocm"), for messages.
    pub backend: &'static str,
    /// Bytes one Lamport slot holds (0 without Lamport kernels): the largest all-reduce, and a
    /// rank's largest part of a reduce-scatter or all-gather, the Lamport kernels take.
    pub lamport_slot: usize,
    /// The copy-engine kernels run here (`AllReduceKernel::CopyEngineTwoShot`,
    /// `AllGatherKernel::CopyEnginePush` / `CopyEnginePull`); without, the planner plans the
    /// zero-copy pulls for them.
    pub copy_engine: bool,
    /// The fused all-reduce epilogue kernel runs here ([`Collectives::lamport_epilogue`]).
    pub fused_epilogue: bool,
    /// Bytes of the largest epilogue the fused path runs as the handoff pair (NOTE
    /// [fused-epilogue] "handoff"; for rows `coll::add_rms::handoff_fits` takes): `Rig::handoff_bytes`.
    /// 0: never.
    pub handoff_bytes: usize,
    /// Kernels launch with programmatic dependent launch (CUDA's PDL).
    pub pdl: bool,
    /// Ops are enqueued on a queue the caller gives ([`Queue::of`]) and return before they are
    /// done (errors latched on the device surface through [`Collectives::check_error`]); false:
    /// ops run on the backend's own queue ([`Queue::own`]) and return when done, their errors
    /// the op's own.
    pub stream_ordered: bool,
    /// [`Collectives::abort_long_waits`] stops waits that have lasted without failing an op
    /// whose data already arrived (a host-only abort word, NOTE [host-abort-poll]); false: it
    /// does nothing, and a wait on a lost peer ends at its timeout.
    pub host_abort: bool,
}

/// The collectives of one rank of a group on one device, over a symmetric workspace: what
/// CUDA's and ROCm's collectives share. Each op entry runs exactly the kernel it is given
/// (symm-ops' planner chooses, NOTE [one-planner]) and refuses buffers the kernel cannot take
/// with an error that names why. Object-safe: symm-ops holds an `Arc<dyn Collectives>`.
///
/// The op entries take raw device addresses, packed once as a [`DeviceOp`], so they are
/// `unsafe fn`s (NOTE [raw-addresses]).
pub trait Collectives: Send + Sync + 'static {
    /// What this backend can do ([`CollFacts`]).
    fn facts(&self) -> CollFacts;

    /// All-reduces `d.count` elements at `d.input` into `d.output` (equal: in place) with
    /// `kernel`, on `q`.
    ///
    /// # Safety
    /// NOTE [raw-addresses], the union of every backend's contract:
    /// - `d.input` and `d.output` are device memory of this object's device (or mapped for it,
    ///   registered symmetric memory included), each holding `d.count` elements of `d.dtype`;
    /// - they stay allocated and untouched by anything but this op until its work on `q` has
    ///   completed: for a captured op, until the graph's last launch has; for a synchronous
    ///   backend, until the call returns, or, should it return an error after launching (a
    ///   timeout the device did not end), until the device has gone idle;
    /// - a registered output may be written by every rank (the zero-copy two-shot kernels):
    ///   every rank passes an output in the same registered allocation at the same offset (the
    ///   op's check word compares offsets and sizes, not which allocation).
    #[allow(unsafe_code)] // the contract is declared here
    unsafe fn all_reduce(&self, q: Queue<'_>, kernel: AllReduceKernel, d: DeviceOp) -> Result<()>;

    /// Reduce-scatters `d.count * world` elements at `d.input` into `d.count` at `d.output`
    /// with `kernel`, on `q`.
    ///
    /// # Safety
    /// As [`Self::all_reduce`], with `d.input` holding `d.count * world` elements and
    /// `d.output` `d.count`.
    #[allow(unsafe_code)] // the contract is declared here
    unsafe fn reduce_scatter(&self, q: Queue<'_>, kernel: ReduceScatterKernel, d: DeviceOp) -> Result<()>;

    /// All-gathers `d.count` elements at `d.input` into `d.count * world` at `d.output` (the
    /// input may be this rank's slice of the output) with `kernel`, on `q`; `d.op` is not used.
    ///
    /// # Safety
    /// As [`Self::all_reduce`], with `d.input` holding `d.count` elements and `d.output`
    /// `d.count * world`.
    #[allow(unsafe_code)] // the contract is declared here
    unsafe fn all_gather(&self, q: Queue<'_>, kernel: AllGatherKernel, d: DeviceOp) -> Result<()>;

    /// The fused Lamport all-reduce epilogue (NOTE [fused-epilogue]) of `e`, on `q` (where
    /// [`CollFacts::fused_epilogue`]). Safe: `e`'s addresses were promised by its `unsafe`
    /// constructor.
    fn lamport_epilogue(&self, q: Queue<'_>, e: &Epilogue) -> Result<()>;

    /// The separate epilogue kernel of `e` over the all-reduced sum at `sum`, on `q`.
    ///
    /// # Safety
    /// `sum` holds `e`'s rows (`rows.count()` elements of its dtype) of device memory as in
    /// [`Self::all_reduce`].
    #[allow(unsafe_code)] // the contract is declared here
    unsafe fn epilogue(&self, q: Queue<'_>, sum: u64, e: &Epilogue) -> Result<()>;

    /// A barrier over `ranks` (sorted, distinct, this rank included), on `q`.
    fn barrier(&self, q: Queue<'_>, ranks: &[Rank]) -> Result<()>;

    /// An op with nothing to move: a checked barrier whose check word is the op's header, so
    /// it still takes its place in the group's op sequence (NOTE [op-agreement]).
    fn agree_empty(&self, q: Queue<'_>, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()>;

    /// This rank refused its own arguments for an op: latches the rejection in every peer's
    /// kernels, so their matching op gives up (NOTE [op-agreement]).
    fn reject(&self, q: Queue<'_>) -> Result<()>;

    /// Registers a rendezvoused symmetric allocation of this group for the zero-copy kernels.
    fn register_symmetric(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()>;

    /// Forgets the registered allocation whose local buffer starts at `base`; true if it was.
    fn unregister_symmetric(&self, base: u64) -> bool;

    /// Whether `bytes` at `ptr` lie in one registered allocation.
    fn is_registered(&self, ptr: u64, bytes: usize) -> bool;

    /// Sets or clears the abort word every wait polls.
    fn set_abort(&self, abort: bool) -> Result<()>;

    /// A peer is gone: stops the waits that have lasted (where [`CollFacts::host_abort`]);
    /// nothing otherwise.
    fn abort_long_waits(&self) {}

    /// Whether the kernels latched an error since the last [`Self::check_error`], known without
    /// a launch or a synchronisation (a stream-ordered backend's mirror, NOTE [error-mirror]).
    fn has_pending_error(&self) -> bool {
        false
    }

    /// Reads and clears an error the kernels latched since the last check (a stream-ordered
    /// backend; a synchronous one returned it from the op).
    fn check_error(&self) -> Result<()> {
        Ok(())
    }

    /// The object, for a caller that needs the backend's own type.
    fn as_any(&self) -> &dyn Any;
}

/// How [`make_collectives`] builds a backend's collectives: what every rank of the group
/// passes alike (but `queue`).
#[derive(Clone, Copy)]
pub struct CollectivesSetup<'a> {
    pub group: &'a Arc<Group>,
    pub device: Device,
    /// Ranks of the group on this rank's device, this one included (NOTE [shared-device]).
    pub device_sharers: usize,
    /// Bytes of the ring's staging area per peer and slot set.
    pub staging_bytes: usize,
    /// Bytes of one Lamport slot (`None`: the backend's default for the world; `Some(0)`: no
    /// Lamport kernels).
    pub lamport_bytes: Option<usize>,
    /// Every device wait's deadline.
    pub timeout: Duration,
    /// Programmatic dependent launch (`None`: the backend's default; ignored without it).
    pub pdl: Option<bool>,
    /// The queue the ops will run on by default (CUDA: its context is the collectives'); a
    /// synchronous backend takes [`Queue::own`].
    pub queue: Queue<'a>,
}

/// A backend's collectives registration: plain data, submitted with `inventory::submit!`
/// beside its allocator's [`crate::BackendRegistration`].
pub struct CollectivesRegistration {
    pub device_type: DeviceType,
    pub name: &'static str,
    pub make: fn(&CollectivesSetup<'_>) -> Result<Arc<dyn Collectives>>,
}

inventory::collect!(CollectivesRegistration);

type Lookup = std::result::Result<
    HashMap<DeviceType, &'static CollectivesRegistration>,
    (DeviceType, &'static str, &'static str),
>;

fn lookup() -> &'static Lookup {
    static LOOKUP: OnceLock<Lookup> = OnceLock::new();
    LOOKUP.get_or_init(|| {
        let mut map: HashMap<DeviceType, &'static CollectivesRegistration> = HashMap::new();
        for r in inventory::iter::<CollectivesRegistration> {
            if let Some(prev) = map.insert(r.device_type, r) {
                return Err((r.device_type, prev.name, r.name));
            }
        }
        Ok(map)
    })
}

/// The collectives registration for `device_type`: [`Error::Unavailable`] when no linked
/// backend registered collectives for it, [`Error::DuplicateBackend`] when two did.
pub fn collectives_for(device_type: DeviceType) -> Result<&'static CollectivesRegistration> {
    match lookup() {
        Ok(m) => m.get(&device_type).copied().ok_or_else(|| {
            Error::Unavailable(format!(
                "collective kernels for device type {device_type}: no linked backend registered them \
                 (link the backend crate: call its `link()`)"
            ))
        }),
        Err((d, a, b)) => Err(Error::DuplicateBackend {
            device_type: *d,
            first: a,
            second: b,
        }),
    }
}

/// Whether a linked backend registered collectives for `device_type`.
pub fn has_collectives(device_type: DeviceType) -> bool {
    matches!(lookup(), Ok(m) if m.contains_key(&device_type))
}

/// Builds the collectives of `setup.device`'s type (collective: every rank of the group calls
/// it, as the backend's constructor).
pub fn make_collectives(setup: &CollectivesSetup<'_>) -> Result<Arc<dyn Collectives>> {
    (collectives_for(setup.device.ty)?.make)(setup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_gives_back_what_it_was_given() {
        let s = 7u32;
        let q = Queue::of(&s);
        assert_eq!(q.get::<u32>(), Some(&7));
        assert_eq!(q.get::<u64>(), None);
        assert!(!q.is_own());
        assert!(Queue::own().is_own());
        assert_eq!(Queue::own().get::<u32>(), None);
    }

    #[test]
    fn no_collectives_without_a_backend() {
        // symm-core's own tests link no backend.
        assert!(!has_collectives(DeviceType::Cuda));
        assert!(matches!(collectives_for(DeviceType::Rocm), Err(Error::Unavailable(_))));
    }
}
