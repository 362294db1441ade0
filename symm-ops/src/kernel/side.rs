//! What a stream-ordered backend's side adds to the kernel engine ([`Side`]): the op's stream
//! and the ordering of ops given other streams, the backend's own buffer types resolved on the
//! op's stream (with a guard held until the op is enqueued), a fallback library's ops (NCCL)
//! and its own separate epilogue kernel. The kernel engine holds one where its backend has such
//! a side (`crate::cuda::CudaSide` on a CUDA device) and asks nothing of it otherwise; which
//! side there is, is decided where the communicator builds its engine, not here.

use std::any::Any;

use symm_core::coll::add_rms::Epilogue;
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::Queue;
use symm_core::{OpKind, Rank, Result};

use crate::buf::{Buf, BufMut};
use crate::engine::OpStream;

/// What the engine holds for one buffer a side resolved (a cudarc buffer's stream guard, in
/// place: no allocation).
pub(crate) use crate::buf::Guard;

/// A stream-ordered backend's side of the kernel engine (module docs). Every method is called
/// with the engine's op lock held, except the facts ([`Self::has_nccl`], [`Self::nccl_missing`],
/// [`Self::buffers`]). `Any`: the side's own module downcasts it (the communicator's stream,
/// read by `crate::cuda`).
pub(crate) trait Side: Any + Send + Sync {
    /// The op's queue: the op's stream (`stream`, else the communicator's), checked to be of
    /// this device and ordered after the previous op. A refusal (an `InvalidArgument`) the
    /// engine tells the peers.
    fn begin<'s>(&'s self, stream: OpStream<'s>) -> Result<Queue<'s>>;

    /// Where a refusal of the op given `stream` is told.
    fn telling<'s>(&'s self, stream: OpStream<'s>) -> Queue<'s>;

    /// An input the engine does not resolve itself (neither symmetric nor raw), on the op's
    /// queue `q`: its device address and what to hold until the op is enqueued; `None` for a
    /// buffer this side does not take either.
    fn input<'s>(&'s self, q: Queue<'s>, b: &'s Buf<'_>) -> Option<Result<(u64, Guard<'s>)>>;

    /// As [`Self::input`], for an output.
    fn output<'s>(&'s self, q: Queue<'s>, b: &'s mut BufMut<'_>) -> Option<Result<(u64, Guard<'s>)>>;

    /// A plan that names the fallback library (NCCL): `kind` over `d` on the op's queue `q`.
    fn nccl_op(&self, q: Queue<'_>, kind: OpKind, d: DeviceOp) -> Result<()>;

    /// A barrier without the backend's collectives, on `q`.
    fn nccl_barrier(&self, q: Queue<'_>, ranks: &[Rank]) -> Result<()>;

    /// The separate epilogue kernel over `sum` without the backend's collectives, on `q`.
    ///
    /// # Safety
    /// `sum` and `e`'s addresses are device memory of this device, `e`'s rows long, held until
    /// the work is enqueued (NOTE [raw-addresses]).
    #[allow(unsafe_code)]
    unsafe fn epilogue(&self, q: Queue<'_>, sum: u64, e: &Epilogue) -> Result<()>;

    /// Whether the fallback library (NCCL) is there.
    fn has_nccl(&self) -> bool;

    /// Why NCCL is not there although the config asked for it.
    fn nccl_missing(&self) -> Option<String>;

    /// The buffers this side takes, for messages (", cudarc buffers").
    fn buffers(&self) -> &'static str;
}
