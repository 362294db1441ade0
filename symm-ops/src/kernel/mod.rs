//! The kernel engine: one engine for every GPU backend's collective kernels, run through
//! symm-core's [`Collectives`] trait (symm-cuda's `CudaCollectives`, symm-rocm's
//! `RocmCollectives`, or any backend registered for its device type), with what a
//! stream-ordered backend's side adds behind the [`Side`] trait (`side.rs`; on a CUDA device
//! `crate::cuda::CudaSide`: the communicator's stream, the ordering of ops given other streams,
//! cudarc buffers, NCCL). No `cfg` here: the `cuda` feature decides only whether that side exists
//! and who builds it (`Communicator::build`). What differs between backends is what they report as
//! [`CollFacts`]: whether ops are stream-ordered (enqueued on the op's stream; CUDA) or
//! synchronous (on the backend's own queue, done when the call returns; ROCm), whether the copy
//! engine and a host-only abort word are there.
//!
//! Every op takes the op lock (one op at a time), then its queue ([`KernelEngine::begin`]: a
//! latched error first, then the op's stream, ordered after the previous op), resolves its
//! buffers to device addresses ([`KernelEngine::src`] / [`KernelEngine::dst`]), asks the planner
//! and runs exactly the plan. An argument this rank refuses is told to the peers
//! (NOTE [op-agreement]). This file holds the setup, queues, buffer resolution and refusals;
//! `engine.rs` the ops ([`crate::engine::Engine`]); `side.rs` the [`Side`] trait.
//!
//! The unsafe boundary (NOTE [raw-addresses]): the backends' op entries take raw device
//! addresses, so they are `unsafe fn`s. Every address that reaches them here comes from `src` /
//! `dst`: a symmetric tensor of the communicator (checked for its device and contiguity), a
//! buffer the side resolved (a cudarc slice, checked there), held (with its stream guard, a
//! [`Guard`]) for the op, or a `RawDevicePtr`, whose `unsafe`
//! constructor carries the caller's promise; each checked for alignment (and null), their
//! lengths checked by the communicator against the op's count, and held until the op's work is
//! enqueued (a stream-ordered backend: the stream keeps the memory's users ordered after it) or
//! done (a synchronous backend).

mod engine;
mod side;

pub(crate) use side::Guard;
pub(crate) use side::Side;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use symm_core::coll::check::check_ptr;
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::{CollFacts, Collectives, Queue};
use symm_core::{DType, Device, Error, OpKind, ReduceOp, Result};

use crate::buf::{check_symm_tensor, Buf, BufMut};
use crate::engine::{is_refusal, op_lock, OpStream};

/// What the engine holds for one resolved buffer until the op is enqueued: the guard a side
/// gave (a cudarc buffer's stream guard), nothing otherwise.
pub(crate) type Held<'s> = Option<Guard<'s>>;

/// The kernel engine (module docs).
pub(crate) struct KernelEngine {
    device: Device,
    /// The backend's collectives (`None`: NCCL only, CUDA).
    coll: Option<Arc<dyn Collectives>>,
    /// What they report (the default, all off, without them).
    facts: CollFacts,
    /// Held by the op running.
    lock: Mutex<()>,
    /// Set when this engine told its peers it rejected an op ([`Self::take_told_peers`]).
    told_peers: AtomicBool,
    /// A stream-ordered backend's side (the CUDA extra on a CUDA device: the stream, cudarc
    /// buffers, NCCL).
    side: Option<Box<dyn Side>>,
}

/// The op's queue as resolved by [`KernelEngine::begin`]: the side's stream, or the backend's
/// own queue.
type At<'s> = Queue<'s>;

impl KernelEngine {
    /// The engine over `coll` (`None`: the side's fallback only) on `device`, with a
    /// stream-ordered backend's `side` (`None`: the backend's own queue).
    pub fn new(device: Device, coll: Option<Arc<dyn Collectives>>, side: Option<Box<dyn Side>>) -> Self {
        KernelEngine {
            device,
            facts: coll.as_ref().map(|c| c.facts()).unwrap_or_default(),
            coll,
            lock: Mutex::new(()),
            told_peers: AtomicBool::new(false),
            side,
        }
    }

    /// The collectives, where the op needs them.
    fn coll(&self) -> Result<&dyn Collectives> {
        self.coll
            .as_deref()
            .ok_or_else(|| Error::Unavailable("symmetric-memory kernels on an nccl-only communicator".into()))
    }

    /// Whether `bytes` at `ptr` lie in symmetric memory registered with the kernels.
    fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        self.coll.as_ref().is_some_and(|c| c.is_registered(ptr, bytes))
    }

    /// The start of every op, with the op lock held: any error the kernels latched since the
    /// last op (NOTE [error-mirror]), read without a launch or a synchronisation, so a timeout,
    /// an abort or a disagreement reaches the caller without a `check_error` call; then the
    /// op's queue: on CUDA the op's stream (`stream`, else the communicator's), checked to be of
    /// this device and ordered after the previous op; otherwise the backend's own, and a stream
    /// given is refused. A refused stream is told to the peers.
    fn begin<'s>(&'s self, stream: OpStream<'s>) -> Result<At<'s>> {
        if let Some(c) = self.coll.as_ref().filter(|c| c.has_pending_error()) {
            c.check_error()?;
        }
        if let Some(side) = &self.side {
            return match side.begin(stream) {
                Ok(s) => Ok(s),
                Err(e) => {
                    if is_refusal(&e) {
                        // A refusal of this rank's own argument: the peers' matching op must fail.
                        let _ = self.tell_peers(self.telling(stream));
                    }
                    Err(e)
                }
            };
        }
        match stream {
            None => Ok(Queue::own()),
            Some(_) => {
                let e = Error::InvalidArgument(format!(
                    "a CUDA stream given to an op of a {}-engine communicator (its ops run on the backend's own queue)",
                    self.facts.backend
                ));
                let _ = self.tell_peers(self.telling(stream));
                Err(e)
            }
        }
    }

    /// One op: the op lock, the op's queue ([`Self::begin`]), then `f` on it; an argument it
    /// refuses is told to the peers.
    fn locked(&self, stream: OpStream<'_>, f: impl FnOnce(At<'_>) -> Result<()>) -> Result<()> {
        let _l = self.lock()?;
        let s = self.begin(stream)?;
        let r = f(s);
        if let Err(e) = &r {
            if is_refusal(e) {
                // The op's own error is what the caller needs; a failure to tell the peers
                // surfaces on their side as a timeout.
                let _ = self.tell_peers(s);
            }
        }
        r
    }

    fn lock(&self) -> Result<MutexGuard<'_, ()>> {
        op_lock(&self.lock)
    }

    /// Where a refusal is told: on CUDA the op's stream, or the communicator's when the op's
    /// stream is of another context; otherwise the backend's own queue.
    fn telling<'s>(&'s self, stream: OpStream<'s>) -> At<'s> {
        match &self.side {
            Some(side) => side.telling(stream),
            None => Queue::own(),
        }
    }

    /// This rank refused its own arguments for an op (NOTE [op-agreement]), on `s`: the
    /// kernels' peers learn it at once. Without kernels nothing is sent (NCCL does not check),
    /// but the communicator still poisons itself.
    fn tell_peers(&self, s: At<'_>) -> Result<()> {
        self.told_peers.store(true, Ordering::Release);
        match &self.coll {
            Some(c) => c.reject(s),
            None => Ok(()),
        }
    }

    /// This rank refused its own arguments (`reject`): told under the op lock (refused, and
    /// nothing sent, while another op of this communicator runs: a local refusal).
    fn send_rejection(&self, stream: OpStream<'_>) -> Result<()> {
        let _l = self.lock()?;
        self.tell_peers(self.telling(stream))
    }

    /// What this engine's ops take, named, for a buffer it cannot take.
    fn not_device(&self, what: &str) -> Error {
        Error::InvalidArgument(format!(
            "{what}: host slices need the host engine; copy them to the device first (the {} engine takes \
             device buffers of the communicator's device: symmetric tensors, RawDevicePtr{})",
            self.facts.backend,
            self.side.as_ref().map_or("", |side| side.buffers())
        ))
    }

    /// An input's device address on the op's queue `s`, with what to hold until the op is
    /// enqueued.
    fn src<'s>(&'s self, s: At<'s>, b: &'s Buf<'_>) -> Result<(u64, Held<'s>)> {
        match b {
            Buf::Symm(t) => {
                check_symm_tensor(t, self.device, "input tensor")?;
                Ok((t.ptr(), None))
            }
            Buf::Raw(r) => {
                check_ptr("input pointer", r.ptr, r.dtype)?;
                Ok((r.ptr, None))
            }
            // Host slices, and what only a side takes (cudarc buffers).
            b => match self.side.as_ref().and_then(|side| side.input(s, b)) {
                Some(r) => r.map(|(p, g)| (p, Some(g))),
                None => Err(self.not_device("the input")),
            },
        }
    }

    /// An output's device address on the op's queue `s`, with what to hold until the op is
    /// enqueued.
    fn dst<'s>(&'s self, s: At<'s>, b: &'s mut BufMut<'_>) -> Result<(u64, Held<'s>)> {
        match b {
            BufMut::Symm(t) => {
                check_symm_tensor(t, self.device, "output tensor")?;
                Ok((t.ptr(), None))
            }
            BufMut::Raw(r) => {
                check_ptr("output pointer", r.ptr, r.dtype)?;
                Ok((r.ptr, None))
            }
            // Host slices, and what only a side takes (cudarc buffers).
            b => match self.side.as_ref().and_then(|side| side.output(s, b)) {
                Some(r) => r.map(|(p, g)| (p, Some(g))),
                None => Err(self.not_device("the output")),
            },
        }
    }

    /// An op's buffers resolved on `s` into the packed [`DeviceOp`] (the output first; no input:
    /// in place, the output's address), with their guards, held by the caller until the op is
    /// enqueued.
    fn resolve<'s>(
        &'s self,
        s: At<'s>,
        input: Option<&'s Buf<'_>>,
        output: &'s mut BufMut<'_>,
        (count, dtype, op): (usize, DType, ReduceOp),
    ) -> Result<(DeviceOp, [Held<'s>; 2])> {
        let (out_ptr, g_out) = self.dst(s, output)?;
        let (in_ptr, g_in) = match input {
            Some(b) => self.src(s, b)?,
            None => (out_ptr, None),
        };
        let d = DeviceOp {
            input: in_ptr,
            output: out_ptr,
            count,
            dtype,
            op,
        };
        Ok((d, [g_out, g_in]))
    }

    /// A plan that names NCCL (`kind` over `d`): run by the side, unavailable elsewhere.
    fn nccl(&self, s: At<'_>, kind: OpKind, d: DeviceOp) -> Result<()> {
        if let Some(side) = &self.side {
            return side.nccl_op(s, kind, d);
        }
        Err(Error::Unavailable(format!(
            "NCCL on a {}-engine communicator",
            self.facts.backend
        )))
    }
}
