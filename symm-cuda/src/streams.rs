//! The streams symm-cuda creates, kept few and reused (NOTE [stream-budget]).
//!
//! A CUDA context feeds its device through `CUDA_DEVICE_MAX_CONNECTIONS` hardware work queues
//! (at most 32) and maps every new stream onto one of them in turn. Ranks sharing a GPU share one
//! context, so their streams share those queues; two streams on one queue run in queue order, and
//! a rank's kernel queued behind a peer's kernel that spins on it deadlocks the pair until the
//! bounded wait gives up (NOTE [co-residency]). So the library keeps its own streams to what
//! ranks need and never churns them:
//! - one **control stream** per device, shared by every rank and object of the process: small
//!   setup copies and kernels, error-word reads and resets; nothing that waits for a peer or
//!   for an event ever runs on it, so it cannot hold a queue;
//! - a per-device **pool** of worker streams for blocking operations (a barrier that waits for
//!   peers), taken one per operation and given back idle, so that a process creates as many as
//!   it ever ran at once, not one per object;
//! - on a device shared by ranks, no copy-engine side streams (the copies run on the op's own
//!   stream; their overlap buys nothing on one GPU).
//!
//! Host copies: the driver serialises a thread's pageable host copy with other threads' launches
//! into the same context, and such a copy first waits for the work queued before it on its
//! stream. When that work is a collective waiting for a peer whose thread is the one held up in
//! its launch, the ranks deadlock until the device timeout (NOTE [pageable-copies]).
//! [`HostCopies`] waits for the stream on the host first (polling, no driver lock held), then
//! copies: rank threads of one process use it, or pinned memory, for every host copy.
//!
//! [`pooled`] is public so that a program with many ranks on one GPU (the test suites) can take
//! its rank streams from the same pool and keep the process's stream count flat as well.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, HostSlice};
use symm_core::{Error, Result};

use crate::driver::{self, from_driver};

#[derive(Default)]
struct DeviceStreams {
    /// Created at the first [`control`] call (a context that only lends pool streams has none).
    control: Option<Arc<CudaStream>>,
    idle: Vec<Arc<CudaStream>>,
}

/// Keyed by the `CudaContext` object (its address), so that a stream from the pool belongs to
/// the object it was asked for (cudarc's event tracking is a property of that object). Every
/// stream an entry holds keeps its context alive, so the address cannot be reused while the
/// entry holds streams; an entry without streams holds nothing a new object could mistake.
fn table() -> &'static Mutex<HashMap<usize, DeviceStreams>> {
    static T: OnceLock<Mutex<HashMap<usize, DeviceStreams>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn with_device<R>(ctx: &Arc<CudaContext>, f: impl FnOnce(&mut DeviceStreams) -> R) -> R {
    let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
    f(t.entry(Arc::as_ptr(ctx) as usize).or_default())
}

fn new_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    driver::bind(ctx)?;
    ctx.new_stream().map_err(|e| from_driver(e, "cuStreamCreate"))
}

/// The control stream of `ctx`'s device: shared by every rank and object of the process, for
/// work that never waits on a peer or an event (NOTE [stream-budget]).
pub fn control(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    with_device(ctx, |d| match &d.control {
        Some(c) => Ok(c.clone()),
        None => {
            let c = new_stream(ctx)?;
            d.control = Some(c.clone());
            Ok(c)
        }
    })
}

/// A worker stream of `ctx` from the process pool (created if none is idle). It goes
/// back to the pool when dropped, if it is idle and nobody else holds it; otherwise it is
/// released like any stream. The pool keeps `ctx` alive while it holds idle streams.
pub fn pooled(ctx: &Arc<CudaContext>) -> Result<PooledStream> {
    let stream = match with_device(ctx, |d| d.idle.pop()) {
        Some(s) => s,
        None => new_stream(ctx)?,
    };
    Ok(PooledStream { stream })
}

/// A stream on loan from the device's pool ([`pooled`]).
#[derive(Debug)]
pub struct PooledStream {
    stream: Arc<CudaStream>,
}

impl PooledStream {
    /// The stream (clone the `Arc` to hand it to an API that keeps it; the stream then goes
    /// back to the pool only once every clone is gone and it is idle).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Deref for PooledStream {
    type Target = Arc<CudaStream>;
    fn deref(&self) -> &Arc<CudaStream> {
        self.stream()
    }
}

impl Drop for PooledStream {
    fn drop(&mut self) {
        // Another holder could still enqueue on it, and work still queued would delay the next
        // borrower: only a stream that is ours alone and idle goes back.
        if Arc::strong_count(&self.stream) != 1 || !matches!(driver::stream_query(&self.stream), Ok(true)) {
            return;
        }
        let key = Arc::as_ptr(self.stream.context()) as usize;
        let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = t.get_mut(&key) {
            d.idle.push(self.stream.clone());
        }
    }
}

/// Host polling of a stream: spin for a while, then sleep between queries.
pub(crate) struct Backoff {
    start: Instant,
}

impl Backoff {
    const SPIN_FOR: Duration = Duration::from_micros(200);
    const SLEEP: Duration = Duration::from_micros(50);

    pub(crate) fn new() -> Backoff {
        Backoff { start: Instant::now() }
    }
    /// When polling started.
    pub(crate) fn start(&self) -> Instant {
        self.start
    }
    /// One pause between two queries.
    pub(crate) fn pause(&self) {
        if self.start.elapsed() < Self::SPIN_FOR {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Self::SLEEP);
        }
    }
}

/// Whether `stream` is being captured into a CUDA graph.
pub fn capturing(stream: &CudaStream) -> Result<bool> {
    let st = stream
        .capture_status()
        .map_err(|e| from_driver(e, "cuStreamIsCapturing"))?;
    Ok(st != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Waits on the host until every operation queued on `stream` finished (polling
/// `cuStreamQuery`, which holds no lock while the GPU works), or [`Error::Timeout`] naming
/// `what` after `timeout`; an operation that failed gives its error.
pub fn wait_idle(stream: &CudaStream, timeout: Duration, what: &str) -> Result<()> {
    poll_until(
        || driver::stream_query(stream),
        timeout,
        || format!("waiting for a stream: {what}"),
    )
}

/// [`wait_idle`] for the work before `event`'s last record (complete when it was never
/// recorded): polled, so no lock is held while the GPU works; [`Error::Timeout`] after `timeout`.
pub fn wait_event(event: &cudarc::driver::CudaEvent, timeout: Duration, what: &str) -> Result<()> {
    poll_until(
        || event.try_is_complete().map_err(|e| from_driver(e, "cuEventQuery")),
        timeout,
        || format!("waiting for an event: {what}"),
    )
}

/// Polls `done` with the [`Backoff`] until it says true, or [`Error::Timeout`] naming `what`.
fn poll_until(mut done: impl FnMut() -> Result<bool>, timeout: Duration, what: impl Fn() -> String) -> Result<()> {
    let b = Backoff::new();
    loop {
        if done()? {
            return Ok(());
        }
        if b.start().elapsed() >= timeout {
            return Err(Error::Timeout { what: what(), timeout });
        }
        b.pause();
    }
}

/// How long [`HostCopies`] waits for the stream's earlier work. The library's own kernels stop
/// at their deadlines (seconds); this only bounds a user kernel that never ends.
pub const HOST_COPY_TIMEOUT: Duration = Duration::from_secs(120);

/// cudarc's host copies, each after the stream went idle ([`wait_idle`], at most
/// [`HOST_COPY_TIMEOUT`]): safe for rank threads of one process (NOTE [pageable-copies]).
pub trait HostCopies {
    /// `clone_dtoh` after the stream went idle.
    fn synced_clone_dtoh<T: DeviceRepr, Src: DevicePtr<T>>(&self, src: &Src) -> Result<Vec<T>>;
    /// `memcpy_dtoh` after the stream went idle.
    fn synced_memcpy_dtoh<T: DeviceRepr, Src: DevicePtr<T>, Dst: HostSlice<T> + ?Sized>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<()>;
    /// `clone_htod` after the stream went idle.
    fn synced_clone_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized>(&self, src: &Src) -> Result<CudaSlice<T>>;
    /// `memcpy_htod` after the stream went idle.
    fn synced_memcpy_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<()>;
}

/// `copy` (cudarc's call `call`) once `stream` went idle ([`wait_idle`]).
fn after_idle<R>(
    stream: &CudaStream,
    call: &str,
    copy: impl FnOnce() -> std::result::Result<R, DriverError>,
) -> Result<R> {
    wait_idle(stream, HOST_COPY_TIMEOUT, "before a host copy")?;
    copy().map_err(|e| from_driver(e, call))
}

impl HostCopies for Arc<CudaStream> {
    fn synced_clone_dtoh<T: DeviceRepr, Src: DevicePtr<T>>(&self, src: &Src) -> Result<Vec<T>> {
        after_idle(self, "cuMemcpyDtoHAsync", || self.clone_dtoh(src))
    }
    fn synced_memcpy_dtoh<T: DeviceRepr, Src: DevicePtr<T>, Dst: HostSlice<T> + ?Sized>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<()> {
        after_idle(self, "cuMemcpyDtoHAsync", || self.memcpy_dtoh(src, dst))
    }
    fn synced_clone_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized>(&self, src: &Src) -> Result<CudaSlice<T>> {
        after_idle(self, "cuMemcpyHtoDAsync", || self.clone_htod(src))
    }
    fn synced_memcpy_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<()> {
        after_idle(self, "cuMemcpyHtoDAsync", || self.memcpy_htod(src, dst))
    }
}
