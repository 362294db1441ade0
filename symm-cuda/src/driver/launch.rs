//! Kernel launches with plain-value arguments.
//!
//! Kernels of this crate take only scalars and device addresses (`u64`), so a
//! launch is described by a slice of [`KernelArg`]s. The contract (checked by
//! the kernels' Rust wrappers, which live next to the `.cu` signatures they
//! mirror) is that the argument list matches the `extern "C"` signature.

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use symm_core::Result;

use super::{bind, from_driver};

/// One kernel argument, passed by value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    U64(u64),
    U32(u32),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// Launches `f` on `stream` with `cfg` and `args` (asynchronous).
///
/// The argument list must match the kernel's parameter list in number, order
/// and size; every kernel wrapper in this crate builds it from the kernel's
/// documented signature.
pub fn launch(stream: &CudaStream, f: &CudaFunction, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
    bind(stream.context())?;
    let mut b = stream.launch_builder(f);
    for a in args {
        match a {
            KernelArg::U64(v) => b.arg(v),
            KernelArg::U32(v) => b.arg(v),
            KernelArg::I32(v) => b.arg(v),
            KernelArg::I64(v) => b.arg(v),
            KernelArg::F32(v) => b.arg(v),
        };
    }
    // SAFETY: the arguments are plain values that live (borrowed from `args`)
    // until the launch call returns, which copies them; they match the
    // kernel's signature by this function's contract. Device addresses among
    // them point into memory kept alive by the caller until the stream is
    // synchronised.
    unsafe { b.launch(cfg) }.map_err(|e| from_driver(e, "cuLaunchKernel"))?;
    Ok(())
}
