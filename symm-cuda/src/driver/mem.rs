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

/// Copies `src` to device address `dst` on `stream` and waits for the copy. Crate-private: the
/// callers pass addresses inside allocations they own and checked; outside the crate,
/// [`unchecked::htod_sync`].
pub(crate) fn htod_sync(stream: &CudaStream, dst: u64, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    bind(stream.context())?;
    check(
        // SAFETY: `src` is valid for `src.len()` bytes until the stream is
        // synchronised below (before this function returns); `dst..dst+len` lies in
        // memory mapped for this device (the crate's callers pass ranges of allocations
        // they own; `unchecked::htod_sync`'s callers promise it).
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast::<c_void>(), src.len(), stream.cu_stream()) },
        "cuMemcpyHtoDAsync",
    )?;
    stream_synchronize(stream)
}

/// Copies `dst.len()` bytes from device address `src` on `stream` and waits (crate-private, as
/// [`htod_sync`]).
pub(crate) fn dtoh_sync(stream: &CudaStream, dst: &mut [u8], src: u64) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    bind(stream.context())?;
    check(
        // SAFETY: `dst` is valid and exclusively borrowed until the stream is
        // synchronised below; the device range is mapped (crate callers: their own
        // allocations; `unchecked` callers: their promise).
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len(), stream.cu_stream()) },
        "cuMemcpyDtoHAsync",
    )?;
    stream_synchronize(stream)
}

/// Enqueues a device-to-device copy of `bytes` on `stream` (no wait; crate-private, as
/// [`htod_sync`]).
pub(crate) fn dtod_async(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: both device ranges are mapped (crate callers: their own allocations;
    // `unchecked` callers: their promise); device memory outlives the enqueued copy
    // (owners synchronise before unmapping).
    check(
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.cu_stream()) },
        "cuMemcpyDtoDAsync",
    )
}

/// Enqueues `words` 32-bit stores of `value` at device address `dst` (crate-private, as
/// [`htod_sync`]).
pub(crate) fn memset_d32_async(stream: &CudaStream, dst: u64, value: u32, words: usize) -> Result<()> {
    if words == 0 {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: `words * 4` bytes at `dst` (4-aligned) are mapped for this device
    // (crate callers: their own allocations; `unchecked` callers: their promise).
    check(
        unsafe { sys::cuMemsetD32Async(dst, value, words, stream.cu_stream()) },
        "cuMemsetD32Async",
    )
}

/// The same copies and memset for code outside this crate that holds raw device addresses
/// (benchmarks, tests): nothing here can check an address, so each is an `unsafe fn`.
pub mod unchecked {
    use cudarc::driver::CudaStream;
    use symm_core::Result;

    /// Copies `src` to device address `dst` on `stream` and waits for the copy.
    ///
    /// # Safety
    /// `dst .. dst + src.len()` is device memory mapped in `stream`'s context, stays mapped until
    /// this returns, and nothing else accesses it meanwhile.
    pub unsafe fn htod_sync(stream: &CudaStream, dst: u64, src: &[u8]) -> Result<()> {
        super::htod_sync(stream, dst, src)
    }

    /// Copies `dst.len()` bytes from device address `src` on `stream` and waits.
    ///
    /// # Safety
    /// `src .. src + dst.len()` is device memory mapped in `stream`'s context and stays mapped
    /// until this returns.
    pub unsafe fn dtoh_sync(stream: &CudaStream, dst: &mut [u8], src: u64) -> Result<()> {
        super::dtoh_sync(stream, dst, src)
    }

    /// Enqueues a device-to-device copy of `bytes` from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// Both ranges of `bytes` are device memory mapped in `stream`'s context (or peer memory
    /// mapped there) and stay mapped, and `dst` unused by others, until the copy has run on
    /// the stream.
    pub unsafe fn dtod_async(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
        super::dtod_async(stream, dst, src, bytes)
    }

    /// Enqueues `words` 32-bit stores of `value` at `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` is 4-byte aligned and `dst .. dst + 4 * words` is device memory mapped in
    /// `stream`'s context that stays mapped, and unused by others, until the memset has run.
    pub unsafe fn memset_d32_async(stream: &CudaStream, dst: u64, value: u32, words: usize) -> Result<()> {
        super::memset_d32_async(stream, dst, value, words)
    }
}

/// One page of pinned, device-mapped host memory holding `u32` words the
/// host writes or reads and kernels poll or write
/// (`cuMemHostAlloc(PORTABLE | DEVICEMAP)`). A store from the host is seen by
/// a spinning kernel without any driver call, so it works while every stream
/// of the device is busy; a kernel's store is seen by the host once the
/// kernel's stream completed.
///
/// Dropped pages go back to a per-context free list that `new` takes from
/// first, so dropping never calls `cuMemFreeHost`, which waits for every
/// kernel running on the device: with ranks sharing a GPU it would wait for a
/// peer's kernel spinning on this rank (NOTE [co-residency]). The pages stay
/// for the life of the process, 4 KiB per symmetric memory alive at once.
#[derive(Debug)]
pub struct PinnedWords {
    ctx: usize,
    host: *mut u32,
    dev: u64,
}

// SAFETY: the page is only accessed through atomics (see `word`), and it
// lives until drop.
unsafe impl Send for PinnedWords {}
// SAFETY: as above; concurrent host access goes through AtomicU32.
unsafe impl Sync for PinnedWords {}

impl PinnedWords {
    /// Bytes allocated.
    pub const BYTES: usize = 4096;
    /// Words available.
    pub const LEN: usize = Self::BYTES / 4;

    /// Allocates the page (zeroed) with `ctx` current.
    pub fn new(ctx: &CudaContext) -> Result<Self> {
        bind(ctx)?;
        let key = ctx.cu_ctx() as usize;
        let reused = {
            let mut free = FREE_PAGES.lock().unwrap_or_else(|e| e.into_inner());
            free.iter().position(|p| p.ctx == key).map(|i| free.swap_remove(i))
        };
        if let Some(page) = reused {
            let words = PinnedWords {
                ctx: key,
                host: page.host as *mut u32,
                dev: page.dev,
            };
            for i in 0..Self::LEN {
                words.store(i, 0);
            }
            return Ok(words);
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        check(
            // SAFETY: writes the new host pointer; a context is current.
            unsafe { sys::cuMemHostAlloc(&mut p, Self::BYTES, flags) },
            "cuMemHostAlloc",
        )?;
        let host = p.cast::<u32>();
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a live DEVICEMAP host allocation.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) };
        if let Err(e) = check(r, "cuMemHostGetDevicePointer") {
            // SAFETY: allocated just above, never handed out.
            unsafe { sys::cuMemFreeHost(p) };
            return Err(e);
        }
        let words = PinnedWords { ctx: key, host, dev };
        for i in 0..Self::LEN {
            words.store(i, 0);
        }
        Ok(words)
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        let i = i.min(Self::LEN - 1);
        // SAFETY: `host` points to a live, page-aligned allocation of LEN
        // u32 owned by self and `i < LEN`; AtomicU32 has the layout of u32;
        // the host touches the words only through atomics (the device with
        // system-scope loads and stores).
        unsafe { AtomicU32::from_ptr(self.host.add(i)) }
    }

    /// Word `i` (clamped to the page).
    pub fn load(&self, i: usize) -> u32 {
        self.word(i).load(Ordering::SeqCst)
    }
    /// Sets word `i` (clamped to the page).
    pub fn store(&self, i: usize, v: u32) {
        self.word(i).store(v, Ordering::SeqCst)
    }
    /// The device address of word `i` (clamped to the page). Crate-private: only this crate's
    /// kernels are handed it (NOTE [raw-addresses]; `CudaSymmetricMemory::abort_word_ptr` is the
    /// one address of the page that leaves the crate, as a value its users pass to kernels).
    pub(crate) fn device_ptr(&self, i: usize) -> u64 {
        self.dev + 4 * i.min(Self::LEN - 1) as u64
    }
}

impl Drop for PinnedWords {
    fn drop(&mut self) {
        // Back to the free list, never cuMemFreeHost (see the type's doc).
        FREE_PAGES.lock().unwrap_or_else(|e| e.into_inner()).push(FreePage {
            ctx: self.ctx,
            host: self.host as usize,
            dev: self.dev,
        });
    }
}

/// A page of a dropped [`PinnedWords`]: its context, host and device addresses.
struct FreePage {
    ctx: usize,
    host: usize,
    dev: u64,
}

static FREE_PAGES: std::sync::Mutex<Vec<FreePage>> = std::sync::Mutex::new(Vec::new());
