//! A candle-shaped engine's use of symm: its own cudarc (linked dynamically, the CUDA version
//! taken from the build system) and symm-ops' communicator on the same cudarc stream type.
//! Building this proves the two link modes do not clash (cudarc stops the build when both
//! `dynamic-loading` and `dynamic-linking` are on, which symm's old `dynamic-loading` caused).

use std::sync::Arc;

use symm_ops::prelude::*;

/// A model's tensor-parallel all-reduce on the engine's own stream.
pub fn all_reduce_in_place(
    comm: &Communicator,
    stream: &Arc<cudarc::driver::CudaStream>,
    x: &mut SymmBuffer<symm_ops::half::bf16>,
) -> symm_ops::symm_core::Result<()> {
    comm.on(stream).all_reduce(x, ReduceOp::Sum)
}

/// The engine's cuBLAS handle, from the same cudarc symm-ops uses.
pub fn blas(stream: Arc<cudarc::driver::CudaStream>) -> Result<cudarc::cublas::CudaBlas, cudarc::cublas::result::CublasError> {
    cudarc::cublas::CudaBlas::new(stream)
}
