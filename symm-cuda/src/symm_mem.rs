//! [`CudaSymmetricMemory`]: one rank's handle on a rendezvoused CUDA
//! allocation: every peer's buffer and signal pad mapped into this process,
//! device arrays of those addresses, the device-side sync kernels (barrier,
//! put_signal, wait_signal) and the abort / error words.
//!
//! Abort and errors (see `docs/cuda.md`):
//! - the abort word kernels poll is a `u32` in pinned, device-mapped host
//!   memory ([`CudaSymmetricMemory::abort_word_ptr`]): a plain host store
//!   reaches a spinning kernel without any driver call, so it works while the
//!   device's streams are busy. [`SymmetricMemory::set_abort`] also mirrors the
//!   flag into the pad's `ABORT` word (through a separate control stream);
//! - a device wait that times out or is aborted latches a code into the pad's
//!   `ERROR` word ([`CudaSymmetricMemory::error_word_ptr`]); later waits of the
//!   same pad then give up at once, until [`CudaSymmetricMemory::check_error`]
//!   reads and clears it.

#![forbid(unsafe_code)]

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::SyncOnDrop;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchConfig};
use symm_core::pad::{self, SIGNAL_PAD_SIZE};
use symm_core::{check_range, Channel, Device, Error, Group, Rank, Result, SymmetricMemory};

use crate::allocator::LocalMemory;
use crate::driver::launch::{launch, KernelArg};
use crate::driver::mem::{dtoh_sync, htod_sync, memset_d32_async, PinnedWords};
use crate::driver::vmm::Mapping;
use crate::driver::{self, bind};
use crate::kernels;
use crate::streams::{self, PooledStream};

/// After a blocking op's device deadline, how long the host waits for the
/// kernel to finish before it sets the abort word itself.
const HOST_GRACE: Duration = Duration::from_secs(5);
/// Word of the pinned page holding the abort flag; words after
/// [`ERROR_MIRROR_SLOT`] are status slots of blocking operations.
const ABORT_SLOT: usize = 0;
/// Word of the pinned page where the collective kernels copy an error they latched or gave up
/// on (NOTE [error-mirror]): the host reads it with a plain load, no launch, no synchronisation.
/// The kernels find it at `abort_word_ptr() + 4`.
const ERROR_MIRROR_SLOT: usize = ABORT_SLOT + 1;
/// A status slot's value before its kernel reported.
const PENDING: u32 = u32::MAX;

/// The three sync kernels, loaded once per memory.
struct SyncFns {
    barrier: CudaFunction,
    put_signal: CudaFunction,
    wait_signal: CudaFunction,
}

/// What the last stream-ordered wait launched was (for check_error's message).
#[derive(Clone)]
struct LastOp {
    what: String,
    timeout: Duration,
}

/// Status slots for blocking operations (each runs on a stream from the device's pool,
/// NOTE [stream-budget]): each blocking call takes one slot, so calls from several threads run
/// concurrently and never see each other's outcomes.
struct Slots {
    free: Vec<usize>,
    next: usize,
    /// Streams whose blocking operation was still running when it returned (a timeout): kept,
    /// with their slots, until drop waits for them.
    draining: Vec<PooledStream>,
}

pub(crate) struct MemInner {
    group: Arc<Group>,
    device: Device,
    rank: usize,
    world: usize,
    /// Ranks of the group on this rank's device (this one included).
    device_sharers: usize,
    local: Arc<LocalMemory>,
    /// Peer mappings (None at this rank's own index, which uses `local`);
    /// only held: dropping them unmaps the peers.
    _peers: Vec<Option<Mapping>>,
    buffer_ptrs: Vec<u64>,
    pad_ptrs: Vec<u64>,
    /// Word 0: the abort flag kernels poll; words 1..: status slots.
    host_words: PinnedWords,
    slots: Mutex<Slots>,
    fns: Mutex<Option<Arc<SyncFns>>>,
    last_op: Mutex<LastOp>,
}

impl Drop for MemInner {
    fn drop(&mut self) {
        // Stop every wait of this memory still running (ours on any stream),
        // let our own streams drain, then fields drop: peer mappings unmap,
        // imported handles release, the pinned page is freed.
        self.host_words.store(ABORT_SLOT, 1);
        let draining = std::mem::take(&mut self.slots.get_mut().unwrap_or_else(|e| e.into_inner()).draining);
        // Bounded: the abort above ends every wait within a poll; a stream still busy after
        // the grace is reported and the memory freed regardless (nothing waits forever).
        let r = bind(&self.local.ctx).and_then(|()| {
            streams::wait_idle(
                &self.local.stream,
                streams::HOST_COPY_TIMEOUT,
                "freeing symmetric memory",
            )?;
            draining.iter().try_for_each(|s| {
                streams::wait_idle(s, HOST_GRACE, "freeing symmetric memory (an op past its deadline)")
            })
        });
        if let Err(e) = r {
            log::warn!("symm-cuda: freeing symmetric memory: {e}");
        }
    }
}

/// One rank's handle on a rendezvoused CUDA symmetric allocation. The
/// mappings live until the last handle and every [`SymmView`] dropped.
pub struct CudaSymmetricMemory {
    inner: Arc<MemInner>,
}

impl std::fmt::Debug for CudaSymmetricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSymmetricMemory")
            .field("group", &self.inner.group.name())
            .field("rank", &self.inner.rank)
            .field("world", &self.inner.world)
            .field("device", &self.inner.device)
            .field("buffer_size", &self.inner.local.size)
            .finish()
    }
}

impl CudaSymmetricMemory {
    /// Builds the handle from mapped peers; writes the device pointer arrays
    /// into the allocation's metadata area (synchronously).
    pub(crate) fn new(
        group: Arc<Group>,
        device: Device,
        local: Arc<LocalMemory>,
        peers: Vec<Option<Mapping>>,
        device_sharers: usize,
    ) -> Result<Self> {
        let rank = group.rank().get();
        let world = group.world_size();
        bind(&local.ctx)?;
        let buffer_ptrs: Vec<u64> = peers
            .iter()
            .enumerate()
            .map(|(r, m)| match m {
                Some(m) => m.ptr(),
                None if r == rank => local.ptr(),
                None => 0,
            })
            .collect();
        if buffer_ptrs.contains(&0) || buffer_ptrs.len() != world {
            return Err(Error::InvalidArgument("a peer of the group is not mapped".into()));
        }
        let pad_ptrs: Vec<u64> = buffer_ptrs.iter().map(|p| p + local.pad_offset as u64).collect();
        let mut table = Vec::with_capacity(2 * pad::MAX_WORLD_SIZE * 8);
        for list in [&buffer_ptrs, &pad_ptrs] {
            for i in 0..pad::MAX_WORLD_SIZE {
                table.extend_from_slice(&list.get(i).copied().unwrap_or(0).to_le_bytes());
            }
        }
        htod_sync(&local.stream, local.meta_ptr(), &table)?;
        let host_words = PinnedWords::new(&local.ctx)?;
        let mem = CudaSymmetricMemory {
            inner: Arc::new(MemInner {
                group,
                device,
                rank,
                world,
                device_sharers,
                local,
                _peers: peers,
                buffer_ptrs,
                pad_ptrs,
                host_words,
                slots: Mutex::new(Slots {
                    free: Vec::new(),
                    next: ERROR_MIRROR_SLOT + 1,
                    draining: Vec::new(),
                }),
                fns: Mutex::new(None),
                last_op: Mutex::new(LastOp {
                    what: "no stream-ordered wait yet".into(),
                    timeout: Duration::ZERO,
                }),
            }),
        };
        // Ranks sharing a GPU load the barrier and signal kernels now, during rendezvous: loading
        // a module or function later could synchronise the context while a peer's kernel spins
        // on this rank (NOTE [co-residency]).
        if device_sharers > 1 {
            mem.fns()?;
        }
        Ok(mem)
    }

    /// The CUDA context (primary context of the device) this memory lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.local.ctx
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.local.ordinal
    }

    /// How many ranks of the group use this rank's device, this one included (1 unless the
    /// group shares devices, NOTE [shared-device]).
    pub fn device_sharers(&self) -> usize {
        self.inner.device_sharers
    }

    /// Sets (or clears) the pinned host abort word alone, without the pad's ABORT word that
    /// [`SymmetricMemory::set_abort`] also sets: no driver call, effective at the kernels' next
    /// read of it (NOTE [host-abort-poll]).
    pub fn set_host_abort(&self, abort: bool) {
        self.inner.host_words.store(ABORT_SLOT, u32::from(abort));
    }

    /// Device-visible address of the abort word kernels poll (pinned host
    /// memory; non-zero = abort every wait of this memory).
    pub fn abort_word_ptr(&self) -> u64 {
        self.inner.host_words.device_ptr(ABORT_SLOT)
    }

    /// The error code the collective kernels last copied into the pinned mirror word (NOTE
    /// [error-mirror]; 0: none): a host load, no launch, no synchronisation.
    pub fn error_mirror(&self) -> u32 {
        self.inner.host_words.load(ERROR_MIRROR_SLOT)
    }

    /// Clears the mirror word (after the error it showed was taken from the `ERROR` word).
    pub fn clear_error_mirror(&self) {
        self.inner.host_words.store(ERROR_MIRROR_SLOT, 0)
    }

    /// Device address of this rank's `ERROR` word (in its signal pad).
    pub fn error_word_ptr(&self) -> u64 {
        self.inner.pad_ptrs[self.inner.rank] + (pad::ERROR_WORD * 4) as u64
    }

    /// Reads and clears the `ERROR` word: `Ok(())` when no stream-ordered
    /// wait failed since the last call, [`Error::Timeout`] / [`Error::Aborted`]
    /// otherwise. Call it after synchronising the stream of the
    /// stream-ordered ops. (Blocking ops report their own outcome and never
    /// latch here.)
    pub fn check_error(&self) -> Result<()> {
        let i = &self.inner;
        bind(&i.local.ctx)?;
        let mut word = [0u8; 4];
        dtoh_sync(&i.local.stream, &mut word, self.error_word_ptr())?;
        let code = u32::from_le_bytes(word);
        if code == pad::ERR_NONE {
            return Ok(());
        }
        memset_d32_async(&i.local.stream, self.error_word_ptr(), 0, 1)?;
        streams::wait_idle(&i.local.stream, streams::HOST_COPY_TIMEOUT, "clearing the ERROR word")?;
        let last = i.last_op.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Err(self.code_error(code, &format!("device wait (last op: {})", last.what), last.timeout))
    }

    fn code_error(&self, code: u32, what: &str, timeout: Duration) -> Error {
        let what = format!("{what} (rank {})", self.inner.rank);
        pad::code_error(code, driver::BACKEND, what.clone(), timeout).unwrap_or_else(|| Error::Backend {
            backend: driver::BACKEND,
            call: what,
            detail: "a failed wait reported no error code".into(),
        })
    }

    fn fns(&self) -> Result<Arc<SyncFns>> {
        let mut g = self.inner.fns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = g.as_ref() {
            return Ok(f.clone());
        }
        let module = kernels::load(self.context(), kernels::source("sync")?, "")?;
        let get = |name: &str| driver::load_function(&module, name);
        let f = Arc::new(SyncFns {
            barrier: get("symm_barrier")?,
            put_signal: get("symm_put_signal")?,
            wait_signal: get("symm_wait_signal")?,
        });
        *g = Some(f.clone());
        Ok(f)
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context().cu_ctx() != self.context().cu_ctx() {
            return Err(Error::InvalidArgument(format!(
                "stream belongs to another CUDA context than this memory (device {})",
                self.inner.device
            )));
        }
        Ok(())
    }

    fn check_peer(&self, what: &'static str, r: Rank) -> Result<usize> {
        if r.get() >= self.inner.world || r.world_size() != self.inner.world {
            return Err(Error::OutOfRange {
                what,
                value: r.get() as u64,
                limit: self.inner.world as u64,
            });
        }
        Ok(r.get())
    }

    fn record(&self, what: String, timeout: Duration) {
        *self.inner.last_op.lock().unwrap_or_else(|e| e.into_inner()) = LastOp { what, timeout };
    }

    fn signal_pad_ptrs_dev_impl(&self) -> u64 {
        self.inner.local.meta_ptr() + (pad::MAX_WORLD_SIZE * 8) as u64
    }

    fn common_args(&self) -> [KernelArg; 3] {
        [
            KernelArg::U64(self.signal_pad_ptrs_dev_impl()),
            KernelArg::U32(self.inner.rank as u32),
            KernelArg::U32(self.inner.world as u32),
        ]
    }

    // Kernel wrappers: the argument lists mirror the signatures in
    // kernels/sync.cu. `status` is 0 for stream-ordered calls.

    fn launch_barrier(&self, stream: &CudaStream, channel: Channel, timeout: Duration, status: u64) -> Result<()> {
        self.check_stream(stream)?;
        let f = self.fns()?;
        let threads = self.inner.world.div_ceil(32).max(1) * 32;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let [pads, rank, world] = self.common_args();
        launch(
            stream,
            &f.barrier,
            cfg,
            &[
                pads,
                rank,
                world,
                KernelArg::U32(channel.get() as u32),
                KernelArg::U64(duration_ns(timeout)),
                KernelArg::U64(self.abort_word_ptr()),
                KernelArg::U64(status),
            ],
        )
    }

    fn launch_put(&self, stream: &CudaStream, dst: usize, channel: Channel, status: u64) -> Result<()> {
        self.check_stream(stream)?;
        let f = self.fns()?;
        let [pads, rank, world] = self.common_args();
        launch(
            stream,
            &f.put_signal,
            single_thread(),
            &[
                pads,
                rank,
                world,
                KernelArg::U32(dst as u32),
                KernelArg::U32(channel.get() as u32),
                KernelArg::U64(status),
            ],
        )
    }

    fn launch_wait(
        &self,
        stream: &CudaStream,
        src: usize,
        channel: Channel,
        timeout: Duration,
        status: u64,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let f = self.fns()?;
        let [pads, rank, world] = self.common_args();
        launch(
            stream,
            &f.wait_signal,
            single_thread(),
            &[
                pads,
                rank,
                world,
                KernelArg::U32(src as u32),
                KernelArg::U32(channel.get() as u32),
                KernelArg::U64(duration_ns(timeout)),
                KernelArg::U64(self.abort_word_ptr()),
                KernelArg::U64(status),
            ],
        )
    }

    /// Enqueues a barrier with every rank on `channel` (NOTE
    /// [signal-pad-layout]); a peer that does not arrive within `timeout`
    /// latches a timeout into the ERROR word ([`Self::check_error`]). No host
    /// synchronisation; capturable in a CUDA graph.
    pub fn barrier_on(&self, stream: &CudaStream, channel: Channel, timeout: Duration) -> Result<()> {
        self.record(format!("barrier on {channel}"), timeout);
        self.launch_barrier(stream, channel, timeout, 0)
    }

    /// Enqueues a signal to `dst` on `channel` (never waits).
    pub fn put_signal_on(&self, stream: &CudaStream, dst: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let d = self.check_peer("put_signal destination rank", dst)?;
        self.record(format!("put_signal to rank {d} on {channel}"), timeout);
        self.launch_put(stream, d, channel, 0)
    }

    /// Enqueues a wait for one signal from `src` on `channel`, bounded by
    /// `timeout` (a timeout is latched for [`Self::check_error`]).
    pub fn wait_signal_on(&self, stream: &CudaStream, src: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let s = self.check_peer("wait_signal source rank", src)?;
        self.record(format!("wait_signal from rank {s} on {channel}"), timeout);
        self.launch_wait(stream, s, channel, timeout, 0)
    }

    /// Runs a blocking operation on a stream from the device's pool with its own status slot.
    /// The slot is reused only if the stream is idle afterwards; otherwise both are kept until
    /// drop waits for them.
    fn with_stream<R>(&self, f: impl FnOnce(&Arc<CudaStream>, usize) -> Result<R>) -> Result<R> {
        bind(self.context())?;
        // The stream first: if no slot is free it just goes back to the pool when dropped.
        let stream = streams::pooled(self.context())?;
        let slot = {
            let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.free.pop() {
                Some(s) => s,
                None if slots.next < PinnedWords::LEN => {
                    slots.next += 1;
                    slots.next - 1
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "more than {} blocking operations at once on one symmetric memory",
                        PinnedWords::LEN - (ERROR_MIRROR_SLOT + 1)
                    )))
                }
            }
        };
        let r = f(&stream, slot);
        let mut slots = self.inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(driver::stream_query(&stream), Ok(true)) {
            slots.free.push(slot);
        } else {
            slots.draining.push(stream);
        }
        r
    }

    /// One blocking sync op: arm the status slot, launch, wait for the
    /// kernel's report.
    fn blocking(
        &self,
        what: &str,
        timeout: Duration,
        launch_op: impl FnOnce(&CudaStream, u64) -> Result<()>,
    ) -> Result<()> {
        self.with_stream(|stream, slot| {
            let words = &self.inner.host_words;
            words.store(slot, PENDING);
            launch_op(stream, words.device_ptr(slot))?;
            self.finish_blocking(stream, slot, what, timeout)
        })
    }

    /// Waits (host side) for a blocking op's stream, then reads the status
    /// the kernel stored. The kernel stops itself at its deadline; if it has
    /// not finished `HOST_GRACE` after that, the host sets the abort word.
    fn finish_blocking(&self, stream: &CudaStream, slot: usize, what: &str, timeout: Duration) -> Result<()> {
        let words = &self.inner.host_words;
        let backoff = streams::Backoff::new();
        let start = backoff.start();
        // None: a timeout too large to express; the device deadline alone applies.
        let soft = start.checked_add(timeout.saturating_add(HOST_GRACE));
        let hard = soft.and_then(|s| s.checked_add(HOST_GRACE));
        let mut aborted_by_us = false;
        loop {
            if driver::stream_query(stream)? {
                break;
            }
            let now = Instant::now();
            if soft.is_some_and(|s| now >= s) && !aborted_by_us {
                // The device deadline passed long ago: stop the wait ourselves.
                words.store(ABORT_SLOT, 1);
                aborted_by_us = true;
            } else if aborted_by_us && hard.is_some_and(|h| now >= h) {
                words.store(ABORT_SLOT, 0);
                return Err(Error::Timeout {
                    what: format!("{what}: the device wait did not stop after its deadline and an abort"),
                    timeout,
                });
            }
            backoff.pause();
        }
        if aborted_by_us {
            words.store(ABORT_SLOT, 0);
            return Err(Error::Timeout {
                what: format!("{what} (stopped by the host)"),
                timeout,
            });
        }
        match words.load(slot) {
            0 => Ok(()),
            PENDING => Err(Error::Backend {
                backend: driver::BACKEND,
                call: what.to_string(),
                detail: "the kernel finished without reporting a status".into(),
            }),
            code => Err(self.code_error(code, what, timeout)),
        }
    }

    /// A view of `len` elements of `T` in `rank`'s buffer, starting
    /// `byte_offset` bytes in, usable wherever cudarc takes
    /// [`DevicePtr`] / [`DevicePtrMut`]. It never frees anything; it keeps the
    /// mappings alive while it exists.
    pub fn view<T>(
        &self,
        rank: usize,
        byte_offset: usize,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<SymmView<T>> {
        let r = Rank::new(rank, self.inner.world)?;
        let elem = std::mem::size_of::<T>().max(1);
        if !byte_offset.is_multiple_of(std::mem::align_of::<T>().max(1)) {
            return Err(Error::Misaligned {
                what: "view offset",
                value: byte_offset as u64,
                align: std::mem::align_of::<T>() as u64,
            });
        }
        let bytes = len.checked_mul(elem).ok_or(Error::OutOfRange {
            what: "view length",
            value: len as u64,
            limit: (self.inner.local.size / elem) as u64,
        })?;
        check_range("view", byte_offset, bytes, self.inner.local.size)?;
        self.check_stream(stream)?;
        Ok(SymmView {
            ptr: self.inner.buffer_ptrs[r.get()] + byte_offset as u64,
            len,
            stream: stream.clone(),
            _mem: self.inner.clone(),
            _t: PhantomData,
        })
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn single_thread() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Typed device memory inside a symmetric allocation (any rank's buffer as
/// mapped here), for cudarc's copy and launch APIs. Not a `CudaSlice`: it
/// never calls `cuMemFree` on mapped memory.
pub struct SymmView<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    _mem: Arc<MemInner>,
    _t: PhantomData<fn() -> T>,
}

impl<T> SymmView<T> {
    /// The device address of element 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl<T> std::fmt::Debug for SymmView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmView")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl<T> DeviceSlice<T> for SymmView<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for SymmView<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        // Symmetric memory is ordered by the caller's streams and the
        // signal-pad protocol, not by cudarc's per-slice events.
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for SymmView<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl SymmetricMemory for CudaSymmetricMemory {
    fn group(&self) -> &Arc<Group> {
        &self.inner.group
    }
    fn device(&self) -> Device {
        self.inner.device
    }
    fn buffer_size(&self) -> usize {
        self.inner.local.size
    }
    fn signal_pad_size(&self) -> usize {
        SIGNAL_PAD_SIZE
    }
    fn buffer_ptrs(&self) -> &[u64] {
        &self.inner.buffer_ptrs
    }
    fn signal_pad_ptrs(&self) -> &[u64] {
        &self.inner.pad_ptrs
    }
    fn buffer_ptrs_dev(&self) -> u64 {
        self.inner.local.meta_ptr()
    }
    fn signal_pad_ptrs_dev(&self) -> u64 {
        self.signal_pad_ptrs_dev_impl()
    }

    fn barrier(&self, channel: Channel, timeout: Duration) -> Result<()> {
        // A rank dying here has signalled nobody: every peer's barrier times out.
        symm_core::fault_point("barrier.mid")?;
        let what = format!("barrier on {channel}");
        self.blocking(&what, timeout, |s, status| {
            self.launch_barrier(s, channel, timeout, status)
        })
    }

    fn put_signal(&self, dst: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let d = self.check_peer("put_signal destination rank", dst)?;
        let what = format!("put_signal to rank {d} on {channel}");
        self.blocking(&what, timeout, |s, status| self.launch_put(s, d, channel, status))
    }

    fn wait_signal(&self, src: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let sr = self.check_peer("wait_signal source rank", src)?;
        let what = format!("wait_signal from rank {sr} on {channel}");
        self.blocking(&what, timeout, |s, status| {
            self.launch_wait(s, sr, channel, timeout, status)
        })
    }

    fn read_bytes(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.check_peer("read rank", rank)?;
        check_range("read", offset, out.len(), self.inner.local.size)?;
        let src = self.inner.buffer_ptrs[r] + offset as u64;
        self.with_stream(|s, _| dtoh_sync(s, out, src))
    }

    fn write_bytes(&self, rank: Rank, offset: usize, data: &[u8]) -> Result<()> {
        let r = self.check_peer("write rank", rank)?;
        check_range("write", offset, data.len(), self.inner.local.size)?;
        let dst = self.inner.buffer_ptrs[r] + offset as u64;
        self.with_stream(|s, _| htod_sync(s, dst, data))
    }

    fn read_signal_pad(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.check_peer("signal pad rank", rank)?;
        check_range("signal pad read", offset, out.len(), SIGNAL_PAD_SIZE)?;
        // The control stream: never queued behind a spinning wait.
        dtoh_sync(&self.inner.local.stream, out, self.inner.pad_ptrs[r] + offset as u64)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        let i = &self.inner;
        // The pinned host word first: effective at once, even if the driver
        // call below cannot run. Then the pad's ABORT word (checked by every
        // kernel when it starts), through the control stream.
        i.host_words.store(ABORT_SLOT, u32::from(abort));
        bind(&i.local.ctx)?;
        let word = i.pad_ptrs[i.rank] + (pad::ABORT_WORD * 4) as u64;
        memset_d32_async(&i.local.stream, word, u32::from(abort), 1)?;
        streams::wait_idle(&i.local.stream, streams::HOST_COPY_TIMEOUT, "setting the ABORT word")
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
