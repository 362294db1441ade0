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
//! [`pooled`] is public so that a program with many ranks on one GPU (the test suites) can take
//! its rank streams from the same pool and keep the process's stream count flat as well.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream};
use symm_core::Result;

use crate::driver::{self, from_driver};

struct DeviceStreams {
    control: Arc<CudaStream>,
    idle: Vec<Arc<CudaStream>>,
}

/// Keyed by the `CudaContext` object (its address: a pooled stream holds its context, so the
/// address cannot be reused while the entry lives), so that a stream from the pool belongs to
/// the object it was asked for (cudarc's event tracking is a property of that object).
fn table() -> &'static Mutex<HashMap<usize, DeviceStreams>> {
    static T: OnceLock<Mutex<HashMap<usize, DeviceStreams>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn with_device<R>(ctx: &Arc<CudaContext>, f: impl FnOnce(&mut DeviceStreams) -> R) -> Result<R> {
    use std::collections::hash_map::Entry;
    let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
    let d = match t.entry(Arc::as_ptr(ctx) as usize) {
        Entry::Occupied(o) => o.into_mut(),
        Entry::Vacant(v) => {
            driver::bind(ctx)?;
            let control = ctx.new_stream().map_err(|e| from_driver(e, "cuStreamCreate"))?;
            v.insert(DeviceStreams { control, idle: Vec::new() })
        }
    };
    Ok(f(d))
}

/// The control stream of `ctx`'s device: shared by every rank and object of the process, for
/// work that never waits on a peer or an event (NOTE [stream-budget]).
pub fn control(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    with_device(ctx, |d| d.control.clone())
}

/// A worker stream of `ctx` from the process pool (created if none is idle). It goes
/// back to the pool when dropped, if it is idle and nobody else holds it; otherwise it is
/// released like any stream.
pub fn pooled(ctx: &Arc<CudaContext>) -> Result<PooledStream> {
    let stream = match with_device(ctx, |d| d.idle.pop())? {
        Some(s) => s,
        None => {
            driver::bind(ctx)?;
            ctx.new_stream().map_err(|e| from_driver(e, "cuStreamCreate"))?
        }
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
