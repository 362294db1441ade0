//! Copies, memsets and the pinned host word used as an abort flag.
//!
//! Copies take a stream: they are enqueued with the `*Async` calls and the
//! blocking helpers synchronise that stream only (never the whole context,
//! which could wait on a user kernel spinning on a peer).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};
use symm_core::Result;

use super::{bind, check, stream_synchronize};

/// Copies `src` to device address `dst` on `stream` and waits for the copy.
pub fn htod_sync(stream: &CudaStream, dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: `src` is valid for `src.len()` bytes until the stream is
    // synchronised below (before this function returns); the caller checked
    // that `dst..dst+len` lies in memory mapped for this device.
    check(
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast::<c_void>(), src.len(), stream.cu_stream()) },
        "cuMemcpyHtoDAsync",
    )?;
    stream_synchronize(stream)
}

/// Copies `dst.len()` bytes from device address `src` on `stream` and waits.
pub fn dtoh_sync(stream: &CudaStream, dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: `dst` is valid and exclusively borrowed until the stream is
    // synchronised below; the caller checked the device range.
    check(
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len(), stream.cu_stream()) },
        "cuMemcpyDtoHAsync",
    )?;
    stream_synchronize(stream)
}

/// Enqueues a device-to-device copy of `bytes` on `stream` (no wait).
pub fn dtod_async(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: the caller checked both device ranges; device memory outlives
    // the enqueued copy (owners synchronise before unmapping).
    check(
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.cu_stream()) },
        "cuMemcpyDtoDAsync",
    )
}

/// Enqueues `words` 32-bit stores of `value` at device address `dst`.
pub fn memset_d32_async(stream: &CudaStream, dst: u64, value: u32, words: usize) -> Result<()> {
    if words == 0 {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: the caller checked that `words * 4` bytes at `dst` (4-aligned)
    // are mapped for this device.
    check(
        unsafe { sys::cuMemsetD32Async(dst, value, words, stream.cu_stream()) },
        "cuMemsetD32Async",
    )
}

/// One page of pinned, device-mapped host memory holding a `u32` the host
/// writes and kernels poll (`cuMemHostAlloc(PORTABLE | DEVICEMAP)`). A store
/// from the host is seen by a spinning kernel without any driver call, so it
/// works while every stream of the device is busy.
#[derive(Debug)]
pub struct PinnedWord {
    host: *mut u32,
    dev: u64,
}

// SAFETY: the pointer is only accessed through atomics (`AtomicU32::from_ptr`
// semantics via `word()`), and the allocation lives until drop.
unsafe impl Send for PinnedWord {}
// SAFETY: as above; concurrent access goes through an AtomicU32.
unsafe impl Sync for PinnedWord {}

impl PinnedWord {
    /// Allocates the word (zeroed) with `ctx` current.
    pub fn new(ctx: &CudaContext) -> Result<Self> {
        bind(ctx)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: writes the new host pointer; a context is current.
        check(unsafe { sys::cuMemHostAlloc(&mut p, 4096, flags) }, "cuMemHostAlloc")?;
        let host = p.cast::<u32>();
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a live DEVICEMAP host allocation.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) };
        let word = PinnedWord { host, dev };
        check(r, "cuMemHostGetDevicePointer")?;
        word.word().store(0, Ordering::SeqCst);
        Ok(word)
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: `host` points to a live, 4096-byte, page-aligned allocation
        // owned by self; AtomicU32 has the layout of u32; only atomics touch it
        // on the host (the device reads/writes it with system-scope accesses).
        unsafe { AtomicU32::from_ptr(self.host) }
    }

    pub fn load(&self) -> u32 {
        self.word().load(Ordering::SeqCst)
    }
    pub fn store(&self, v: u32) {
        self.word().store(v, Ordering::SeqCst)
    }
    /// The device address kernels use.
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }
}

impl Drop for PinnedWord {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
        let r = unsafe { sys::cuMemFreeHost(self.host.cast::<c_void>()) };
        if let Err(e) = check(r, "cuMemFreeHost") {
            eprintln!("symm-cuda: {e}");
        }
    }
}
