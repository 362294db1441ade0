//! [`Engine`]: what every engine implements, so that the ops (`ops.rs`, `epilogue.rs`) are
//! written once and the communicator holds the engine it built as an `Arc<dyn Engine>` (its peer
//! watch holds a weak one, NOTE [peer-watch]). An engine
//! is handed the op's [`Plan`] (the op, `ops.rs`, computed the buffers' facts and asked the
//! planner, `crate::select`, the one place that decides what runs), resolves the op's buffers
//! and runs exactly that plan. Engines: the generic host engine (`host/`, any backend's
//! `SymmetricMemory`) and the kernel engine (`kernel/`: any GPU backend's collectives through
//! symm-core's `coll::Collectives`, found by device type; on CUDA with the CUDA extra of
//! `cuda/` behind `kernel::Side`: its stream ordering, cudarc buffers and NCCL, which a plan may
//! name). Also here, for
//! every engine and the communicator alike: the op's stream ([`OpStream`]), and which errors
//! leave the group out of step ([`is_fatal`]) or are this rank's refusal ([`is_refusal`]).

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use symm_core::coll::epilogue_check::Rows;
use symm_core::coll::Collectives;
use symm_core::{DType, Error, OpKind, Rank, ReduceOp, Result, SymmTensor, SymmetricMemory};

use crate::buf::{Buf, BufMut};
use crate::epilogue::{EpiArgs, EpiPlan};
use crate::kernel::Side;
use crate::select::Plan;
use symm_core::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};

/// The engine's per-op state, taken by the op: a second op running at once on one communicator
/// is refused (an engine's ops must not overlap), a poisoned lock taken over.
pub(crate) fn op_lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Ok(g),
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => Err(Error::InvalidArgument(
            "two ops ran at once on one communicator (use one communicator per thread)".into(),
        )),
    }
}

/// The stream an op was given (`None`: the communicator's own).
#[cfg(feature = "cuda")]
pub(crate) type OpStream<'a> = Option<&'a Arc<cudarc::driver::CudaStream>>;
/// The stream an op was given: always `None` without CUDA.
#[cfg(not(feature = "cuda"))]
pub(crate) type OpStream<'a> = Option<&'a std::convert::Infallible>;

/// Errors after which the ranks' protocol state is out of step.
pub(crate) fn is_fatal(e: &Error) -> bool {
    matches!(
        e,
        Error::Timeout { .. }
            | Error::Mismatch { .. }
            | Error::Aborted(_)
            | Error::PeerLost { .. }
            | Error::Backend { .. }
            | Error::Store(_)
            | Error::Io(_)
    )
}

/// An error that means this rank refused its own arguments for an op its peers may be running.
pub(crate) fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidArgument(_)
            | Error::Misaligned { .. }
            | Error::OutOfRange { .. }
            | Error::UnsupportedDType { .. }
            | Error::NotRendezvoused
            | Error::OutOfMemory { .. }
    )
}

/// One op's context: the stream it was given.
#[derive(Clone, Copy)]
pub(crate) struct Cx<'a> {
    pub stream: OpStream<'a>,
}

/// One op's operands, packed once by the op (`ops.rs`) and handed to the engine whole: the
/// input (`I`: `Option<Buf>` for an all-reduce, `None` in place in `output`; `Buf` for a
/// reduce-scatter and an all-gather), the output, `count` elements (an all-reduce's whole
/// vector, a reduce-scatter's output, an all-gather's input), their dtype and the reduction (an
/// all-gather reduces nothing: [`OpArgs::gather`]).
pub(crate) struct OpArgs<'a, I> {
    pub input: I,
    pub output: BufMut<'a>,
    pub count: usize,
    pub dtype: DType,
    pub op: ReduceOp,
}

impl<'a, I> OpArgs<'a, I> {
    /// An all-gather's operands (its reduction unused: [`ReduceOp::Sum`]).
    pub fn gather(input: I, output: BufMut<'a>, count: usize, dtype: DType) -> Self {
        OpArgs {
            input,
            output,
            count,
            dtype,
            op: ReduceOp::Sum,
        }
    }
}

/// What the planner needs from an engine at setup.
#[derive(Debug, Clone, Default)]
pub(crate) struct Caps {
    /// The symmetric-memory kernels (or the host engine's generic paths) run here.
    pub symm: bool,
    /// NCCL is there as the fallback.
    pub nccl: bool,
    /// Bytes one Lamport slot holds (0 without Lamport kernels): the largest all-reduce, and a
    /// rank's largest part of a reduce-scatter or all-gather, the Lamport kernels take.
    pub lamport_slot: usize,
    /// Why NCCL is not there although the config asked for it.
    pub nccl_missing: Option<String>,
    /// The copy-engine kernels run here (the backend's `CollFacts::copy_engine`).
    pub copy_engine: bool,
    /// The fused epilogue kernel runs here (the backend's `CollFacts::fused_epilogue`).
    pub fused_epilogue: bool,
    /// The fused epilogue runs as the handoff pair up to these bytes (the backend's
    /// `CollFacts::handoff_bytes`; 0 never).
    pub handoff_bytes: usize,
}

/// The ops of one engine. Every method runs one op of this rank (every rank calls the same in
/// the same order) as the op planned it: the caller (`ops.rs`) checked the arguments (lengths,
/// dtypes, the request's availability), computed the buffers' facts once and asked the planner,
/// and hands over the [`Plan`] with the operands packed in one [`OpArgs`]; the engine resolves
/// the buffers to what it runs on, checks what only it can (buffers' devices, alignment) and
/// tells its peers when it refuses (NOTE [op-agreement]), then runs exactly the plan.
pub(crate) trait Engine: Send + Sync {
    /// What the planner needs to know.
    fn caps(&self) -> Caps;

    /// All-reduce `a.count` elements of `a.input` (`None`: in place in `a.output`) into
    /// `a.output` by `plan`.
    fn all_reduce(&self, cx: Cx<'_>, plan: Plan<AllReduceKernel>, a: OpArgs<'_, Option<Buf<'_>>>) -> Result<()>;

    /// Reduce-scatter `a.input` (`a.count * world` elements) into `a.output` (`a.count`) by
    /// `plan`.
    fn reduce_scatter(&self, cx: Cx<'_>, plan: Plan<ReduceScatterKernel>, a: OpArgs<'_, Buf<'_>>) -> Result<()>;

    /// All-gather `a.input` (`a.count` elements) into `a.output` (`a.count * world`) by `plan`;
    /// `a.op` is not used.
    fn all_gather(&self, cx: Cx<'_>, plan: Plan<AllGatherKernel>, a: OpArgs<'_, Buf<'_>>) -> Result<()>;

    /// Whether `bytes` at `ptr` lie in symmetric memory registered with this engine's kernels
    /// (the planner's zero-copy rows; the same offsets on every rank, so the same answer).
    fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        let _ = (ptr, bytes);
        false
    }

    /// Barrier over `ranks` (sorted, distinct, this rank included).
    fn barrier(&self, stream: OpStream<'_>, ranks: &[Rank]) -> Result<()>;

    /// An all-reduce epilogue (NOTE [fused-epilogue]) by `plan`.
    fn epilogue(&self, cx: Cx<'_>, plan: EpiPlan, a: EpiArgs<'_>, rows: Rows) -> Result<()>;

    /// Whether an op with nothing to move takes its place in the group's op sequence through
    /// [`Self::empty_op`] (NOTE [op-agreement]): the CUDA engine; not the host engine, whose op
    /// runs its own exchange with nothing to move.
    fn runs_empty_ops(&self) -> bool {
        false
    }

    /// An op with nothing to move, where [`Self::runs_empty_ops`].
    fn empty_op(&self, stream: OpStream<'_>, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        let _ = (stream, kind, dtype, reduce);
        Ok(())
    }

    /// This rank refused `e`, its own arguments for an op: tells the peers where the engine can
    /// (NOTE [op-agreement]). True when the group is out of step from here on (the caller
    /// poisons the communicator).
    fn reject(&self, stream: OpStream<'_>, e: &Error) -> bool;

    /// True once the engine told its peers it refused an op's arguments (the group is out of
    /// step); cleared by the call.
    fn take_told_peers(&self) -> bool {
        false
    }

    /// An error a device wait latched since the last check (after synchronising the stream).
    fn check_error(&self) -> Result<()> {
        Ok(())
    }

    /// Sets or clears the abort word every wait of this engine polls.
    fn set_abort(&self, abort: bool) -> Result<()>;

    /// A peer is gone (NOTE [peer-watch]): stop the waits on it, but not an op whose data already
    /// arrived (the peer may have left right after finishing the ops this rank still runs). The
    /// host engine's waits check their data before the abort word, so [`Self::set_abort`] is
    /// that; the CUDA engine sets its host abort word alone (kernels read it only once a wait
    /// has lasted, NOTE [host-abort-poll]; the pad's word stops kernels as they start).
    fn abort_waits_on_lost_peer(&self) -> Result<()> {
        self.set_abort(true)
    }

    /// Makes a rendezvoused symmetric tensor known for the zero-copy kernels.
    fn register(&self, t: &SymmTensor) -> Result<()> {
        let _ = t;
        Ok(())
    }

    /// [`Self::register`] for a whole symmetric allocation.
    fn register_memory(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        drop(mem);
        Ok(())
    }

    /// Forgets the registered allocation whose local buffer starts at `base`.
    fn unregister_memory(&self, base: u64) -> bool {
        let _ = base;
        false
    }

    /// What the backend's collectives reported ([`symm_core::coll::CollFacts`]); `None` where
    /// no collective kernels run (the host engine, NCCL alone).
    fn facts(&self) -> Option<symm_core::coll::CollFacts> {
        None
    }

    /// A stream-ordered backend's side (the kernel engine's on a CUDA device, whose stream
    /// `crate::cuda::stream_of` reads).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn side(&self) -> Option<&dyn Side> {
        None
    }

    /// The backend's collectives (the kernel engine's; `crate::cuda::error_probe_of` reads
    /// symm-cuda's error probe from them).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn collectives(&self) -> Option<&dyn Collectives> {
        None
    }
}
