//! # symm-ops
//!
//! The collectives users call, over symmetric memory: a [`Communicator`]
//! per group and device (PyTorch's IntraNodeComm, generalised) set up once,
//! then
//!
//! - [`Communicator::all_reduce`] / [`Communicator::all_reduce_out`]: the
//!   algorithm picked by size, world size and topology from a printable
//!   selection table ([`Communicator::selection_table`]), handing over to
//!   NCCL where NCCL wins and where the group spans hosts or is not fully
//!   connected;
//! - explicit [`Communicator::one_shot_all_reduce`] (out of place, `_out`),
//!   [`Communicator::two_shot_all_reduce`] (in place, `_out`),
//!   [`Communicator::reduce_scatter`] (`_out`), [`Communicator::all_gather`]
//!   (`_out`) and [`Communicator::barrier`] over a subset of ranks;
//! - f32, f16 and bf16 (the `half` crate), sum / avg / max / min, f32
//!   accumulation in a fixed rank order (bitwise-equal results on every rank).
//!
//! Symmetric tensors ([`symm_core::SymmTensor`]) go zero-copy; plain
//! buffers (host slices, cudarc slices and views, raw device pointers) are
//! staged through the communicator's persistent symmetric buffer, in chunks
//! when larger. Engines: the generic host engine (any backend's
//! `SymmetricMemory`; CI runs it on symm-testkit's host backend), and the
//! kernel engine over the collectives a backend registers for its device
//! type (`symm_core::coll::Collectives`): CUDA (symm-cuda's kernels, feature
//! `cuda`, default, with NCCL from cudarc), ROCm (symm-rocm's launches of the
//! same kernels, feature `rocm`; not run on AMD hardware), or a backend of
//! `DeviceType::Other` linked into the program.
//! See `docs/user-guide.md` and `docs/ops.md`.

// No unsafe code, except the declaration of `RawDevicePtr::new`'s contract (buf.rs) and the
// kernel engine's calls into the backends' raw-address entries (`kernel/engine.rs`; the side's
// `unsafe fn Side::epilogue`, declared in `kernel/side.rs`, passed on in `cuda/mod.rs`).
#![deny(unsafe_code)]

mod buf;
mod comm;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod device;
mod engine;
mod epilogue;
mod host;
mod kernel;
mod knobs;
mod local;
mod ops;
mod pool;
pub mod prelude;
mod reduce;
mod select;
mod setup;

pub use buf::{Buf, BufMut, Element, HostIn, HostOut, RawDevicePtr};
pub use comm::{CommConfig, Communicator, DEFAULT_STAGING_BYTES};
#[cfg(feature = "cuda")]
pub use device::{DeviceInput, DeviceOutput};
pub use epilogue::{EpilogueAlgo, RmsNorm};
pub use ops::{NewOutput, OnStream};
pub use pool::{SymmBuffer, MIN_BLOCK_BYTES};
pub use select::{AllGatherAlgo, AllReduceAlgo, EngineKind, Plan, ReduceScatterAlgo, SelectionThresholds};
pub use symm_core::coll::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};

#[cfg(feature = "cuda")]
pub use cudarc;
pub use half;
pub use symm_core;
#[cfg(feature = "cuda")]
pub use symm_cuda;

/// Forces linkage of the backends this build enables (symm-cuda with the
/// `cuda` feature), so their `inventory` registrations (allocator,
/// connectivity detector) are seen. [`Communicator::new`] calls it.
pub fn link() {
    #[cfg(feature = "cuda")]
    symm_cuda::link();
    #[cfg(feature = "rocm")]
    symm_rocm_link();
}

#[cfg(feature = "rocm")]
fn symm_rocm_link() {
    symm_rocm::link();
}
