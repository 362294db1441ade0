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
use crate::driver::mem::{dtoh_sync, htod_sync, memset_d32_async, PinnedWord};
use crate::driver::vmm::Mapping;
use crate::driver::{self, bind, from_driver};
use crate::kernels;

/// After a blocking op's device deadline, how long the host waits for the
/// kernel to finish before it sets the abort word itself.
const HOST_GRACE: Duration = Duration::from_secs(5);
/// Host polling of a stream: spin this long, then sleep between queries.
const SPIN_FOR: Duration = Duration::from_micros(200);
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// The three sync kernels, loaded once per memory.
struct SyncFns {
    barrier: CudaFunction,
    put_signal: CudaFunction,
    wait_signal: CudaFunction,
}

/// What the last device wait launched was (for check_error's message).
#[derive(Clone)]
struct LastOp {
    what: String,
    timeout: Duration,
}

pub(crate) struct MemInner {
    group: Arc<Group>,
    device: Device,
    rank: usize,
    world: usize,
    local: Arc<LocalMemory>,
    /// Peer mappings (None at this rank's own index, which uses `local`).
    peers: Vec<Option<Mapping>>,
    buffer_ptrs: Vec<u64>,
    pad_ptrs: Vec<u64>,
    abort: PinnedWord,
    /// Stream for set_abort / check_error / read_signal_pad: never queued
    /// behind a wait.
    control: Arc<CudaStream>,
    /// Idle streams for blocking operations: each blocking call takes its own,
    /// so calls from several threads (on different channels) run concurrently.
    streams: Mutex<Vec<Arc<CudaStream>>>,
    fns: Mutex<Option<Arc<SyncFns>>>,
    last_op: Mutex<LastOp>,
}

impl Drop for MemInner {
    fn drop(&mut self) {
        // Let our own queued work finish (it is bounded by its deadlines)
        // before the peers' mappings go away; then fields drop: peer mappings
        // unmap, imported handles release, the pinned word is freed.
        let streams = std::mem::take(self.streams.get_mut().unwrap_or_else(|e| e.into_inner()));
        let r = bind(&self.local.ctx).and_then(|()| {
            driver::stream_synchronize(&self.control)?;
            streams.iter().try_for_each(|s| driver::stream_synchronize(s))
        });
        if let Err(e) = r {
            eprintln!("symm-cuda: freeing symmetric memory: {e}");
        }
    }
}

/// One rank's handle on a rendezvoused CUDA symmetric allocation (cheap to
/// clone; the mappings live until the last clone and every view drop).
#[derive(Clone)]
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
        let abort = PinnedWord::new(&local.ctx)?;
        let control = local.ctx.new_stream().map_err(|e| from_driver(e, "cuStreamCreate"))?;
        Ok(CudaSymmetricMemory {
            inner: Arc::new(MemInner {
                group,
                device,
                rank,
                world,
                local,
                peers,
                buffer_ptrs,
                pad_ptrs,
                abort,
                control,
                streams: Mutex::new(Vec::new()),
                fns: Mutex::new(None),
                last_op: Mutex::new(LastOp {
                    what: "no device wait yet".into(),
                    timeout: Duration::ZERO,
                }),
            }),
        })
    }

    /// The CUDA context (primary context of the device) this memory lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.local.ctx
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.local.ordinal
    }

    /// Runs a blocking operation on an idle internal stream (created on
    /// demand). The stream goes back to the pool only if it is idle afterwards.
    fn with_stream<R>(&self, f: impl FnOnce(&Arc<CudaStream>) -> Result<R>) -> Result<R> {
        bind(self.context())?;
        let pooled = self.inner.streams.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let stream = match pooled {
            Some(s) => s,
            None => self
                .context()
                .new_stream()
                .map_err(|e| from_driver(e, "cuStreamCreate"))?,
        };
        let r = f(&stream);
        if matches!(driver::stream_query(&stream), Ok(true)) {
            self.inner
                .streams
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(stream);
        }
        r
    }

    /// Device-visible address of the abort word kernels poll (pinned host
    /// memory; non-zero = abort every wait).
    pub fn abort_word_ptr(&self) -> u64 {
        self.inner.abort.device_ptr()
    }

    /// Device address of this rank's `ERROR` word (in its signal pad).
    pub fn error_word_ptr(&self) -> u64 {
        self.inner.pad_ptrs[self.inner.rank] + (pad::ERROR_WORD * 4) as u64
    }

    /// Number of devices mapped (one per rank).
    pub fn num_peers_mapped(&self) -> usize {
        self.inner.peers.iter().filter(|m| m.is_some()).count()
    }

    /// Reads and clears the `ERROR` word: `Ok(())` when no device wait failed
    /// since the last call, [`Error::Timeout`] / [`Error::Aborted`] otherwise.
    /// Call it after synchronising the stream of the stream-ordered ops.
    pub fn check_error(&self) -> Result<()> {
        let i = &self.inner;
        bind(&i.local.ctx)?;
        let mut word = [0u8; 4];
        dtoh_sync(&i.control, &mut word, self.error_word_ptr())?;
        let code = u32::from_le_bytes(word);
        if code == pad::ERR_NONE {
            return Ok(());
        }
        memset_d32_async(&i.control, self.error_word_ptr(), 0, 1)?;
        driver::stream_synchronize(&i.control)?;
        let last = i.last_op.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Err(match code {
            pad::ERR_TIMEOUT => Error::Timeout {
                what: format!("device wait (rank {}, last op: {})", i.rank, last.what),
                timeout: last.timeout,
            },
            pad::ERR_ABORTED => {
                Error::Aborted(format!("device wait aborted (rank {}, last op: {})", i.rank, last.what))
            }
            other => Error::Backend {
                backend: driver::BACKEND,
                call: "check_error".into(),
                detail: format!("unknown code {other} in the ERROR word"),
            },
        })
    }

    fn fns(&self) -> Result<Arc<SyncFns>> {
        let mut g = self.inner.fns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = g.as_ref() {
            return Ok(f.clone());
        }
        let module = kernels::load(self.context(), kernels::source("sync")?, "")?;
        let get = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| from_driver(e, &format!("cuModuleGetFunction({name})")))
        };
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

    fn common_args(&self) -> [KernelArg; 3] {
        [
            KernelArg::U64(self.signal_pad_ptrs_dev_impl()),
            KernelArg::U32(self.inner.rank as u32),
            KernelArg::U32(self.inner.world as u32),
        ]
    }

    fn signal_pad_ptrs_dev_impl(&self) -> u64 {
        self.inner.local.meta_ptr() + (pad::MAX_WORLD_SIZE * 8) as u64
    }

    /// Enqueues a barrier with every rank on `channel` (see NOTE
    /// [signal-pad-layout]); a peer that does not arrive within `timeout`
    /// latches a timeout ([`Self::check_error`]).
    pub fn barrier_on(&self, stream: &CudaStream, channel: Channel, timeout: Duration) -> Result<()> {
        self.check_stream(stream)?;
        let f = self.fns()?;
        self.record(format!("barrier on {channel}"), timeout);
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
            ],
        )
    }

    /// Enqueues a signal to `dst` on `channel` (never waits).
    pub fn put_signal_on(&self, stream: &CudaStream, dst: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        self.check_stream(stream)?;
        let d = self.check_peer("put_signal destination rank", dst)?;
        let f = self.fns()?;
        self.record(format!("put_signal to rank {d} on {channel}"), timeout);
        let [pads, rank, world] = self.common_args();
        launch(
            stream,
            &f.put_signal,
            single_thread(),
            &[
                pads,
                rank,
                world,
                KernelArg::U32(d as u32),
                KernelArg::U32(channel.get() as u32),
            ],
        )
    }

    /// Enqueues a wait for one signal from `src` on `channel`, bounded by `timeout`.
    pub fn wait_signal_on(&self, stream: &CudaStream, src: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        self.check_stream(stream)?;
        let s = self.check_peer("wait_signal source rank", src)?;
        let f = self.fns()?;
        self.record(format!("wait_signal from rank {s} on {channel}"), timeout);
        let [pads, rank, world] = self.common_args();
        launch(
            stream,
            &f.wait_signal,
            single_thread(),
            &[
                pads,
                rank,
                world,
                KernelArg::U32(s as u32),
                KernelArg::U32(channel.get() as u32),
                KernelArg::U64(duration_ns(timeout)),
                KernelArg::U64(self.abort_word_ptr()),
            ],
        )
    }

    /// Waits (host side) for the internal stream after a blocking op, then
    /// reads the ERROR word. The kernel stops itself at its deadline; if it
    /// has not finished `HOST_GRACE` after that, the host sets the abort word.
    fn finish_blocking(&self, stream: &CudaStream, what: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let soft = start + timeout.saturating_add(HOST_GRACE);
        let mut aborted_by_us = false;
        loop {
            if driver::stream_query(stream)? {
                break;
            }
            let now = Instant::now();
            if now >= soft && !aborted_by_us {
                // The device deadline passed long ago: stop the wait ourselves.
                self.inner.abort.store(1);
                aborted_by_us = true;
            } else if aborted_by_us && now >= soft + HOST_GRACE {
                self.inner.abort.store(0);
                return Err(Error::Timeout {
                    what: format!("{what}: the device wait did not stop after its deadline and an abort"),
                    timeout,
                });
            }
            if now.duration_since(start) < SPIN_FOR {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
        if aborted_by_us {
            self.inner.abort.store(0);
            let _ = self.check_error();
            return Err(Error::Timeout {
                what: format!("{what} (stopped by the host)"),
                timeout,
            });
        }
        self.check_error()
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
        if byte_offset % std::mem::align_of::<T>().max(1) != 0 {
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
        self.with_stream(|s| {
            self.barrier_on(s, channel, timeout)?;
            self.finish_blocking(s, &format!("barrier on {channel} (rank {})", self.inner.rank), timeout)
        })
    }

    fn put_signal(&self, dst: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        self.with_stream(|s| {
            self.put_signal_on(s, dst, channel, timeout)?;
            self.finish_blocking(s, &format!("put_signal to rank {} on {channel}", dst.get()), timeout)
        })
    }

    fn wait_signal(&self, src: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        self.with_stream(|s| {
            self.wait_signal_on(s, src, channel, timeout)?;
            self.finish_blocking(s, &format!("wait_signal from rank {} on {channel}", src.get()), timeout)
        })
    }

    fn read_bytes(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.check_peer("read rank", rank)?;
        check_range("read", offset, out.len(), self.inner.local.size)?;
        let src = self.inner.buffer_ptrs[r] + offset as u64;
        self.with_stream(|s| dtoh_sync(s, out, src))
    }

    fn write_bytes(&self, rank: Rank, offset: usize, data: &[u8]) -> Result<()> {
        let r = self.check_peer("write rank", rank)?;
        check_range("write", offset, data.len(), self.inner.local.size)?;
        let dst = self.inner.buffer_ptrs[r] + offset as u64;
        self.with_stream(|s| htod_sync(s, dst, data))
    }

    fn read_signal_pad(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.check_peer("signal pad rank", rank)?;
        check_range("signal pad read", offset, out.len(), SIGNAL_PAD_SIZE)?;
        // The control stream: never queued behind a spinning wait.
        dtoh_sync(&self.inner.control, out, self.inner.pad_ptrs[r] + offset as u64)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        let i = &self.inner;
        // Host word first: effective at once, even if the driver call below
        // cannot run.
        i.abort.store(u32::from(abort));
        bind(&i.local.ctx)?;
        let word = i.pad_ptrs[i.rank] + (pad::ABORT_WORD * 4) as u64;
        memset_d32_async(&i.control, word, u32::from(abort), 1)?;
        driver::stream_synchronize(&i.control)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
