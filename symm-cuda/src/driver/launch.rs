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

/// One kernel argument, passed by value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    U64(u64),
    U32(u32),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// Most arguments a kernel of this crate takes (the fused pull: 34; collectives' args tests
/// check every entry against it).
pub const MAX_ARGS: usize = 40;

/// Bytes of the packed parameter buffer: every parameter at its natural alignment, as the
/// kernel's parameter space lays them out (at most `MAX_ARGS` parameters of 8 bytes).
const PACKED_BYTES: usize = MAX_ARGS * 8;

/// The arguments packed as the kernel's parameter space lays them out: each at the next offset
/// aligned to its size (8-byte values to 8, 4-byte values to 4). Returns the buffer and its
/// length in bytes.
pub fn pack(args: &[KernelArg]) -> ([u64; MAX_ARGS], usize) {
    let mut words = [0u64; MAX_ARGS];
    let mut off = 0usize;
    for a in args {
        let (bytes, v): (usize, u64) = match *a {
            KernelArg::U64(v) => (8, v),
            KernelArg::I64(v) => (8, v as u64),
            KernelArg::U32(v) => (4, u64::from(v)),
            KernelArg::I32(v) => (4, u64::from(v as u32)),
            KernelArg::F32(v) => (4, u64::from(v.to_bits())),
        };
        off = off.next_multiple_of(bytes);
        let w = &mut words[off / 8];
        if bytes == 8 {
            *w = v;
        } else {
            // Little-endian: the 4-byte value at byte offset `off % 8` of its word.
            *w |= v << ((off % 8) * 8);
        }
        off += bytes;
    }
    (words, off)
}

/// How a kernel is launched, beyond its grid and arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Launch {
    /// Programmatic dependent launch (NOTE [pdl] in symm-core's `kernels/common.cuh`): the kernel may be
    /// scheduled before the kernel ahead of it on the stream has finished, which hides the
    /// launch latency of back-to-back kernels. Only for kernels that call `symm_pdl_wait()`
    /// before touching memory (the collective kernels do); needs compute capability 9.0 or newer
    /// (the caller checks).
    pub pdl: bool,
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
        LaunchMode::Cudarc if !how.pdl => return launch_cudarc(stream, f, cfg, args),
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
    if how.pdl {
        let mut attrs = [pdl_attribute()];
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

#[cfg(not(target_endian = "little"))]
compile_error!("symm-cuda's kernel launches pass 4-byte arguments in 8-byte cells: little-endian only");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_follows_natural_alignment() {
        let (w, len) = pack(&[KernelArg::U64(0x1122), KernelArg::U32(7), KernelArg::U64(9)]);
        // u64 at 0, u32 at 8, padding to 16, u64 at 16.
        assert_eq!(len, 24);
        assert_eq!(&w[..3], &[0x1122, 7, 9]);
        let (w, len) = pack(&[
            KernelArg::U32(1),
            KernelArg::U32(2),
            KernelArg::I32(-1),
            KernelArg::F32(1.0),
            KernelArg::U32(3),
        ]);
        assert_eq!(len, 20);
        assert_eq!(w[0], 1 | (2 << 32));
        assert_eq!(w[1], 0xFFFF_FFFF | (u64::from(1.0f32.to_bits()) << 32));
        assert_eq!(w[2], 3);
        let (_, len) = pack(&[KernelArg::U64(1); MAX_ARGS]);
        assert_eq!(len, PACKED_BYTES);
    }
}
