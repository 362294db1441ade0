//! Kernel launches with plain-value arguments.
//!
//! Kernels of this crate take only scalars and device addresses (`u64`), so a
//! launch is described by a slice of [`KernelArg`]s. The contract (checked by
//! the kernels' Rust wrappers, which live next to the `.cu` signatures they
//! mirror) is that the argument list matches the `extern "C"` signature.

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};
use symm_core::Result;

use super::{bind, check};

/// One kernel argument, passed by value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    U64(u64),
    U32(u32),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// Most arguments a kernel of this crate takes.
pub const MAX_ARGS: usize = 32;

/// Launches `f` on `stream` with `cfg` and `args` (asynchronous).
///
/// The argument list must match the kernel's parameter list in number, order
/// and size; every kernel wrapper in this crate builds it from the kernel's
/// documented signature. Calls `cuLaunchKernel` directly with the values on
/// the stack (no allocation: the eager per-op cost of small collectives is
/// mostly this call).
pub fn launch(stream: &CudaStream, f: &CudaFunction, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
    if args.len() > MAX_ARGS {
        return Err(symm_core::Error::InvalidArgument(format!(
            "kernel launch with {} arguments (at most {MAX_ARGS})",
            args.len()
        )));
    }
    bind(stream.context())?;
    if via_cudarc() {
        return launch_cudarc(stream, f, cfg, args);
    }
    // Every argument is stored in an 8-byte cell; the driver reads as many bytes as the
    // parameter's size from the cell's start (little-endian, so a 4-byte value's bytes come first).
    let mut cells = [0u64; MAX_ARGS];
    for (c, a) in cells.iter_mut().zip(args) {
        *c = match *a {
            KernelArg::U64(v) => v,
            KernelArg::I64(v) => v as u64,
            KernelArg::U32(v) => u64::from(v),
            KernelArg::I32(v) => u64::from(v as u32),
            KernelArg::F32(v) => u64::from(v.to_bits()),
        };
    }
    let mut ptrs = [std::ptr::null_mut::<std::ffi::c_void>(); MAX_ARGS];
    for (p, c) in ptrs.iter_mut().zip(cells.iter_mut()) {
        *p = (c as *mut u64).cast();
    }
    // SAFETY: `ptrs[..args.len()]` point at live stack cells holding the arguments (4-byte values
    // in the cell's first bytes: little-endian targets only, checked below at compile time);
    // cuLaunchKernel copies them before returning. They match the kernel's signature by this
    // function's contract; device addresses among them point into memory kept alive by the caller
    // until the stream is synchronised. The function and stream belong to the bound context.
    let r = unsafe {
        sys::cuLaunchKernel(
            f.cu_function(),
            cfg.grid_dim.0,
            cfg.grid_dim.1,
            cfg.grid_dim.2,
            cfg.block_dim.0,
            cfg.block_dim.1,
            cfg.block_dim.2,
            cfg.shared_mem_bytes,
            stream.cu_stream(),
            ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check(r, "cuLaunchKernel")
}

/// `SYMM_LAUNCH_VIA_CUDARC=1` launches through cudarc's launch builder instead (diagnostics: the
/// two paths must behave the same).
fn via_cudarc() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("SYMM_LAUNCH_VIA_CUDARC").is_ok_and(|v| v == "1"))
}

fn launch_cudarc(stream: &CudaStream, f: &CudaFunction, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
    use cudarc::driver::PushKernelArg;
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
    // SAFETY: the arguments are plain values that live (borrowed from `args`) until the launch
    // call returns, which copies them; they match the kernel's signature by `launch`'s contract.
    unsafe { b.launch(cfg) }.map_err(|e| super::from_driver(e, "cuLaunchKernel"))?;
    Ok(())
}

#[cfg(not(target_endian = "little"))]
compile_error!("symm-cuda's kernel launches pass 4-byte arguments in 8-byte cells: little-endian only");
