//! Kernel launches with plain-value arguments.
//!
//! Kernels of this crate take only scalars and device addresses (`u64`), so a
//! launch is described by a slice of [`KernelArg`]s. The contract (checked by
//! the kernels' Rust wrappers, which live next to the `.cu` signatures they
//! mirror) is that the argument list matches the `extern "C"` signature.

use crate::knobs::{self, LaunchMode};
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};
use symm_core::Result;

use super::{bind, check};

pub use symm_core::coll::arg::{pack, KernelArg, MAX_ARGS};

/// Bytes of the packed parameter buffer: every parameter at its natural alignment, as the
/// kernel's parameter space lays them out (at most `MAX_ARGS` parameters of 8 bytes).
const PACKED_BYTES: usize = MAX_ARGS * 8;

/// How a kernel is launched, beyond its grid and arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Launch {
    /// Programmatic dependent launch (NOTE [pdl] in symm-core's `kernels/common.cuh`): the kernel may be
    /// scheduled before the kernel ahead of it on the stream has finished, which hides the
    /// launch latency of back-to-back kernels. Only for kernels that call `symm_pdl_wait()`
    /// before touching memory (the collective kernels do); needs compute capability 9.0 or newer
    /// (the caller checks).
    pub pdl: bool,
    /// Blocks per thread-block cluster along x (0 or 1: no cluster): consecutive blocks
    /// `c * i .. c * (i + 1)` run at once on one GPU processing cluster and share their
    /// shared memory (the fused epilogue's cluster rows, NOTE [fused-epilogue]); compute
    /// capability 9.0 or newer, at most 8 (the caller checks), the grid a multiple of it.
    pub cluster: u32,
}

/// Launches `f` on `stream` with `cfg` and `args` (asynchronous), the plain way.
///
/// The argument list must match the kernel's parameter list in number, order
/// and size; every kernel wrapper in this crate builds it from the kernel's
/// documented signature. Calls `cuLaunchKernel` directly, with the arguments
/// packed into one buffer on the stack (`CU_LAUNCH_PARAM_BUFFER_POINTER`: one
/// copy instead of one per parameter; no allocation: the eager per-op cost of
/// small collectives is mostly this call). `SYMM_LAUNCH_MODE=params` passes
/// one pointer per parameter instead, `cudarc` goes through cudarc's launch
/// builder (diagnostics and comparisons: all three must behave the same).
pub(crate) fn launch(stream: &CudaStream, f: &CudaFunction, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
    launch_with(stream, f, cfg, args, Launch::default())
}

/// [`launch`] with options: with `how.pdl`, `cuLaunchKernelEx` with the
/// programmatic-stream-serialization attribute (the arguments passed the same
/// way; `SYMM_LAUNCH_MODE=cudarc` does not apply, cudarc's builder takes no
/// attributes).
pub(crate) fn launch_with(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &[KernelArg],
    how: Launch,
) -> Result<()> {
    if args.len() > MAX_ARGS {
        return Err(symm_core::Error::InvalidArgument(format!(
            "kernel launch with {} arguments (at most {MAX_ARGS})",
            args.len()
        )));
    }
    bind(stream.context())?;
    match knobs::launch_mode() {
        LaunchMode::Cudarc if !how.pdl && how.cluster <= 1 => return launch_cudarc(stream, f, cfg, args),
        LaunchMode::Cudarc | LaunchMode::Params => {}
        LaunchMode::Packed => {
            let (mut words, len) = pack(args);
            debug_assert!(len <= PACKED_BYTES);
            let mut size: usize = len;
            let mut extra = [
                sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut std::ffi::c_void,
                words.as_mut_ptr().cast(),
                sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut std::ffi::c_void,
                (&mut size as *mut usize).cast(),
                sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut std::ffi::c_void,
            ];
            // SAFETY: `extra` is the driver's documented list (buffer pointer, pointer to its size,
            // end marker); the buffer holds the arguments at the offsets of the kernel's parameter
            // space (natural alignment, `pack`), which match the kernel's signature by this
            // function's contract, and lives on the stack until the launch call, which copies it,
            // returns. Device addresses among them point into memory kept alive by the caller
            // until the stream is synchronised. The function and stream belong to the bound context.
            return unsafe { cu_launch(stream, f, cfg, how, std::ptr::null_mut(), extra.as_mut_ptr()) };
        }
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
    // the launch call copies them before returning. They match the kernel's signature by this
    // function's contract; device addresses among them point into memory kept alive by the caller
    // until the stream is synchronised. The function and stream belong to the bound context.
    unsafe { cu_launch(stream, f, cfg, how, ptrs.as_mut_ptr(), std::ptr::null_mut()) }
}

/// The programmatic-stream-serialization attribute (NOTE [pdl]).
fn pdl_attribute() -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            programmaticStreamSerializationAllowed: 1,
        },
    }
}

/// `cuLaunchKernel` (or, with `how.pdl`, `cuLaunchKernelEx`) of `f` on `stream` with `cfg`, the
/// arguments given either way the driver takes them.
///
/// # Safety
/// Exactly one of `params` (one pointer per kernel parameter, each to the parameter's value) and
/// `extra` (a `CU_LAUNCH_PARAM_*` list) is non-null; what it points to lives until this returns
/// and matches the kernel's signature; device addresses among the arguments stay valid until the
/// stream is synchronised; the function and stream belong to the bound context.
unsafe fn cu_launch(
    stream: &CudaStream,
    f: &CudaFunction,
    cfg: LaunchConfig,
    how: Launch,
    params: *mut *mut std::ffi::c_void,
    extra: *mut *mut std::ffi::c_void,
) -> Result<()> {
    if how.pdl || how.cluster > 1 {
        let cluster = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                clusterDim: sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
                    x: how.cluster.max(1),
                    y: 1,
                    z: 1,
                },
            },
        };
        let mut attrs = [pdl_attribute(), cluster];
        let attrs: &mut [sys::CUlaunchAttribute] = match (how.pdl, how.cluster > 1) {
            (true, true) => &mut attrs[..],
            (true, false) => &mut attrs[..1],
            (false, _) => &mut attrs[1..],
        };
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        // SAFETY: `config` and the attribute array it points to live on the stack until the call
        // returns (the driver copies them); the arguments satisfy this function's contract.
        let r = unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params, extra) };
        return check(r, "cuLaunchKernelEx");
    }
    // SAFETY: this function's contract (the arguments and what they point to are valid for the
    // call, which copies them before returning).
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
            params,
            extra,
        )
    };
    check(r, "cuLaunchKernel")
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
