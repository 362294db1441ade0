//! The GPU suites' rig: gating a world, running its ranks as threads, one
//! rank's pooled stream and communicator, one context per GPU per process.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use symm_core::DeviceType;
use symm_ops::cudarc::driver::{CudaContext, CudaStream};
use symm_ops::{CommConfig, Communicator};
use symm_testkit::launch::{run_threads_with, RankCtx, TestResult};
use symm_testkit::GpuWorld;

/// Wall-clock limit of one GPU test's ranks.
pub const LIMIT: Duration = Duration::from_secs(540);

/// True when the test can run at `w`; else prints why (the gate itself fails
/// the test when SYMM_REQUIRE_GPUS says the GPUs are there).
pub fn gate(name: &str, w: GpuWorld) -> bool {
    symm_ops::link();
    match w.gate(DeviceType::Cuda) {
        None => true,
        Some(reason) => {
            println!("SUMMARY {name} {} skipped {reason}", w.label());
            false
        }
    }
}

/// Runs `f` on every rank of `w` as threads; panics naming the world when a rank fails.
pub fn run<T, F>(w: GpuWorld, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(RankCtx) -> TestResult<T> + Send + Sync + 'static,
{
    run_threads_with(&w.thread_options(LIMIT), f).unwrap_or_else(|e| panic!("{}: {e}", w.label()))
}

/// A progress line (shown by a failing or `--nocapture` run): where a rank was when a run stopped.
pub fn progress(rc: &RankCtx, test: &str, what: &str) {
    eprintln!("{test} rank {}/{}: {what}", rc.rank, rc.world);
}

/// One rank's GPU, stream and communicator.
pub struct Rig {
    pub stream: Arc<CudaStream>,
    pub comm: Communicator,
    pub rc: RankCtx,
    pub name: String,
    readies: Cell<usize>,
    /// Last, so it drops after every other holder of the stream and goes back to the pool.
    _pooled: symm_ops::symm_cuda::streams::PooledStream,
}

impl Rig {
    /// Ranks sharing a GPU: a store barrier between per-op setup (a symmetric allocation, a graph
    /// instantiation) and the ops that follow (`RankCtx::shared_ready`, NOTE [co-residency]).
    pub fn ready(&self) -> TestResult {
        let n = self.readies.get();
        self.readies.set(n + 1);
        Ok(self.rc.shared_ready(&format!("{}-{n}", self.name), LIMIT)?)
    }
}

pub fn rig(rc: &RankCtx, name: &str, config: CommConfig) -> TestResult<Rig> {
    symm_ops::link();
    let pooled = symm_ops::symm_cuda::streams::pooled(&test_context(rc.gpu())?)?;
    let stream = pooled.stream().clone();
    let group = rc.group(&rc.unique(name))?;
    let comm = Communicator::with_stream(&group, stream.clone(), config)?;
    let rig = Rig {
        stream,
        comm,
        rc: rc.clone(),
        name: rc.unique(name),
        readies: Cell::new(0),
        _pooled: pooled,
    };
    rig.ready()?;
    Ok(rig)
}

/// One context object per GPU for the whole test process, so that rank streams come from one
/// pool and the process's stream count stays flat (NOTE [stream-budget]). cudarc's event
/// tracking is off on it.
pub fn test_context(ordinal: usize) -> TestResult<Arc<CudaContext>> {
    static CTXS: Contexts = OnceLock::new();
    cached_context(&CTXS, ordinal, |ctx| {
        // SAFETY: every cudarc buffer of these tests is used on its rank's stream only
        // (the host reads results after synchronising it), so cudarc's
        // cross-stream events are not needed; without them the ops can be
        // captured in a CUDA graph (a capturing stream may not wait on events
        // recorded outside the capture).
        unsafe { ctx.disable_event_tracking() };
    })
}

/// [`test_context`]'s twin with cudarc's event tracking left on (its default), for the tests
/// whose ops must capture without turning it off.
pub fn tracked_context(ordinal: usize) -> TestResult<Arc<CudaContext>> {
    static CTXS: Contexts = OnceLock::new();
    cached_context(&CTXS, ordinal, |ctx| assert!(ctx.is_event_tracking()))
}

type Contexts = OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>>;

/// The context object of `ordinal` in `ctxs`, made (and set up by `init`) on first use.
fn cached_context(ctxs: &Contexts, ordinal: usize, init: impl FnOnce(&CudaContext)) -> TestResult<Arc<CudaContext>> {
    let mut map = ctxs
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(c) = map.get(&ordinal) {
        c.bind_to_thread()?;
        return Ok(c.clone());
    }
    let ctx = CudaContext::new(ordinal)?;
    init(&ctx);
    map.insert(ordinal, ctx.clone());
    Ok(ctx)
}
