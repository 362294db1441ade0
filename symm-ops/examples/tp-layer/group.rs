//! A tensor-parallel group: one worker thread per rank, the communicators built together and
//! moved in (docs/embedding.md), every rank running the same plan.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use symm_ops::cudarc::driver::{CudaContext, CudaStream};
use symm_ops::prelude::*;
use symm_ops::symm_cuda::streams::{self, PooledStream};

use crate::gpu::Kernels;
use crate::model::Shape;
use crate::rank::{Exec, Mode, Outputs, Rank};
use crate::Res;
use symm_ops::symm_cuda::trace::{self, TraceRecord};

/// What one group runs.
#[derive(Clone, Debug)]
pub struct Plan {
    pub shape: Shape,
    /// The GPU ordinal of each rank (repeated: ranks share that GPU).
    pub devices: Vec<usize>,
    pub modes: Vec<Mode>,
    pub tokens: Vec<usize>,
    pub kv_lens: Vec<usize>,
    /// Cache positions per head: at least the longest kv length plus the most tokens.
    pub lmax: usize,
    /// Timed executions (none: checked only).
    pub execs: Vec<Exec>,
    pub layers: usize,
    pub rounds: usize,
    pub seed: u64,
}

impl Plan {
    pub fn tp(&self) -> usize {
        self.devices.len()
    }
}

/// One (tokens, kv length, mode) of a group.
pub struct Record {
    pub tokens: usize,
    pub kv_len: usize,
    pub mode: Mode,
    /// The epilogue the mode ran (the planner's picks named).
    pub algo: String,
    /// Rank 0's outputs (not for [`Mode::None`] above TP 1, which is not the layer).
    pub out: Option<Outputs>,
    /// Ranks whose outputs differ from rank 0's, bit for bit.
    pub diverged: Vec<usize>,
    /// Rank 0's microseconds per layer, per round, for each timed execution.
    pub times: Vec<(Exec, Vec<f64>)>,
    /// Every rank's Lamport timeline records of each timed execution (`SYMM_TRACE=1` only).
    pub traces: Vec<(Exec, Vec<TraceRecord>)>,
}

/// The contexts of `devices`' GPUs: one object per GPU for the whole process, so that every
/// group's rank streams come from one pool (NOTE [stream-budget]: a process that keeps creating
/// streams walks the round-robin over the hardware queues, and ranks sharing a GPU then queue
/// behind each other). cudarc's event tracking is off on them: each rank orders its work on its
/// one stream, and the layer's graphs capture the weights' slices.
pub fn contexts(devices: &[usize]) -> Res<Vec<Arc<CudaContext>>> {
    static MADE: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    devices
        .iter()
        .map(|&d| {
            if let Some(c) = made.get(&d) {
                return Ok(c.clone());
            }
            let c = CudaContext::new(d)?;
            // SAFETY: every buffer of a rank is used on that rank's stream only, and the host
            // reads results after synchronising it; cudarc's cross-stream events are not needed.
            unsafe { c.disable_event_tracking() };
            made.insert(d, c.clone());
            Ok(c)
        })
        .collect()
}

fn fingerprint(o: &Outputs) -> Vec<u64> {
    o.residual.iter().chain(&o.norm).map(|v| v.to_bits()).collect()
}

/// Runs `plan` on its ranks; returns rank 0's records.
pub fn run(plan: &Plan) -> Res<Vec<Record>> {
    let ctxs = contexts(&plan.devices)?;
    // Rank streams on loan from symm's pool; they go back when the group is done.
    let pooled: Vec<PooledStream> = ctxs.iter().map(streams::pooled).collect::<Result<_, _>>()?;
    let streams: Vec<Arc<CudaStream>> = pooled.iter().map(|p| p.stream().clone()).collect();
    let config = CommConfig::default().with_timeout(Duration::from_secs(60));
    let comms = Communicator::for_streams(&streams, config)?;
    let barrier = Arc::new(RankBarrier::new(plan.tp()));
    let done = AtomicBool::new(false);
    let per_rank: Vec<Res<RankRecords>> = std::thread::scope(|sc| {
        sc.spawn(|| watchdog(&barrier, &done));
        let hs: Vec<_> = comms
            .into_iter()
            .zip(streams)
            .zip(&ctxs)
            .map(|((comm, stream), ctx)| {
                let barrier = barrier.clone();
                sc.spawn(move || {
                    // A rank that fails or panics abandons the group, so its peers stop at
                    // their next barrier instead of pairing with a rank that is gone.
                    let guard = AbandonOnDrop(&barrier);
                    let r = worker(plan, comm, stream, ctx, &barrier);
                    if r.is_ok() {
                        std::mem::forget(guard);
                    }
                    r
                })
            })
            .collect();
        let results = hs
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank's thread panicked".into())))
            .collect();
        done.store(true, Ordering::Release);
        results
    });
    let mut ranks = Vec::with_capacity(per_rank.len());
    for (r, res) in per_rank.into_iter().enumerate() {
        ranks.push(res.map_err(|e| format!("{} TP {} rank {r}: {e}", plan.shape.name, plan.tp()))?);
    }
    let mut rank0 = ranks.remove(0);
    for (i, (rec, fp0)) in rank0.iter_mut().enumerate() {
        for (r, other) in ranks.iter_mut().enumerate() {
            if other[i].1 != *fp0 {
                rec.diverged.push(r + 1);
            }
            for ((_, mine), (_, theirs)) in rec.traces.iter_mut().zip(&mut other[i].0.traces) {
                mine.append(theirs);
            }
        }
        for (exec, recs) in &rec.traces {
            if let Some(sum) = crate::trace::summarise(recs) {
                eprintln!(
                    "tp-layer trace: {} TP {} {} tokens {} kv {} {}: {}",
                    plan.shape.name,
                    plan.tp(),
                    rec.mode.name(),
                    rec.tokens,
                    rec.kv_len,
                    exec.name(),
                    sum.line()
                );
            }
        }
    }
    Ok(rank0.into_iter().map(|(rec, _)| rec).collect())
}

type RankRecords = Vec<(Record, Option<Vec<u64>>)>;

/// One rank's run of the plan. On a GPU shared by ranks, nothing may wait for the whole
/// device while a peer's kernel spins (NOTE [co-residency]): module loads (cuBLAS loads its
/// kernels lazily, at a GEMM's first launch of a shape) and setup sit between host barriers,
/// apart from every collective (the activations' allocation is one when the pool grows); a
/// warm-up layer without collectives loads every GEMM kernel a token count uses.
fn worker(
    plan: &Plan,
    comm: Communicator,
    stream: Arc<CudaStream>,
    ctx: &Arc<CudaContext>,
    barrier: &Arc<RankBarrier>,
) -> Res<RankRecords> {
    ctx.bind_to_thread()?;
    let kernels = Kernels::load(ctx)?;
    // Ranks sharing a GPU meet before each collective (correctness only; see `Rank::fence`).
    let fence = (comm.device_sharers() > 1).then(|| barrier.clone());
    let mut rank = Rank::new(comm, stream, kernels, plan.shape, plan.lmax, plan.seed, fence)?;
    barrier.wait()?;
    let layer_fn = plan.tp() == 1;
    let tracing = symm_ops::symm_cuda::knobs::trace();
    let mut out = Vec::new();
    for &tokens in &plan.tokens {
        let mut acts = rank.acts(tokens)?; // a collective step when the pool grows
        barrier.wait()?;
        rank.warm_up(&mut acts)?;
        barrier.wait()?;
        for &kv_len in &plan.kv_lens {
            let mut checked = Vec::with_capacity(plan.modes.len());
            for &mode in &plan.modes {
                let outputs = if layer_fn || mode.is_layer() {
                    Some(rank.check(&mut acts, mode, kv_len)?)
                } else {
                    None
                };
                checked.push(outputs);
            }
            let mut times = vec![Vec::new(); plan.modes.len()];
            let mut traces = vec![Vec::new(); plan.modes.len()];
            for &exec in &plan.execs {
                if tracing {
                    // One mode at a time, so each mode's records are its own.
                    for (i, &mode) in plan.modes.iter().enumerate() {
                        // Drop what ran before; every rank's stream is idle here.
                        barrier.wait()?;
                        trace::take(ctx)?;
                        barrier.wait()?;
                        times[i].push((
                            exec,
                            rank.time(&mut acts, mode, kv_len, exec, plan.layers, plan.rounds)?,
                        ));
                        barrier.wait()?;
                        traces[i].push((exec, trace::take(ctx)?));
                    }
                    continue;
                }
                // Every mode's rounds in turn (mode 1, mode 2, ..., mode 1, ...): a drift of the
                // GPU over the run (clocks, heat) reaches each mode alike. Run one mode after the
                // other, the later of two identical modes measured 1.5-3 % slower (bench-notes
                // round 25, sitting 6).
                let timers = plan
                    .modes
                    .iter()
                    .map(|&mode| rank.timer(&mut acts, mode, kv_len, exec, plan.layers))
                    .collect::<Res<Vec<_>>>()?;
                let mut rounds = vec![Vec::with_capacity(plan.rounds); plan.modes.len()];
                for _ in 0..plan.rounds {
                    for (t, r) in timers.iter().zip(rounds.iter_mut()) {
                        r.push(rank.round(&mut acts, t)?);
                    }
                }
                for (i, r) in rounds.into_iter().enumerate() {
                    times[i].push((exec, r));
                }
            }
            for (((&mode, outputs), times), traces) in plan.modes.iter().zip(checked).zip(times).zip(traces) {
                let fp = outputs.as_ref().map(fingerprint);
                let record = Record {
                    tokens,
                    kv_len,
                    mode,
                    algo: rank.algo_name(mode, &acts),
                    out: if rank.comm.rank().get() == 0 { outputs } else { None },
                    diverged: Vec::new(),
                    times,
                    traces,
                };
                out.push((record, fp));
            }
        }
    }
    rank.comm.check_error()?;
    // Tearing down (cuBLAS, module unloads) may wait for the device: after every rank's last op.
    barrier.wait()?;
    Ok(out)
}

/// Abandons the group when dropped (a failed or panicking rank's thread).
struct AbandonOnDrop<'a>(&'a RankBarrier);

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

/// How long the ranks of an abandoned group may take to stop before the process exits.
const ABANDON_GRACE: Duration = Duration::from_secs(120);

/// Ends the process when a rank failed and its peers have not stopped within
/// [`ABANDON_GRACE`]: symm's ops and the ranks' stream waits are bounded, but a peer's NCCL
/// kernel waiting for the failed rank never ends, and tearing down that NCCL communicator can
/// wait for it.
fn watchdog(barrier: &RankBarrier, done: &AtomicBool) {
    let mut since: Option<Instant> = None;
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        if barrier.abandoned() {
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > ABANDON_GRACE {
                eprintln!(
                    "tp-layer: FAILED: a rank failed and its peers did not stop within {ABANDON_GRACE:?} \
                     (a wait outside symm, such as NCCL's, has no bound); exiting"
                );
                std::process::exit(1);
            }
        }
    }
}

/// A barrier of the group's rank threads that never hangs: a wait ends with an error after
/// [`RankBarrier::TIMEOUT`] or as soon as a rank that failed abandons the group.
pub struct RankBarrier {
    state: Mutex<(usize, u64, bool)>, // (arrived, generation, abandoned)
    cv: Condvar,
    n: usize,
}

impl RankBarrier {
    const TIMEOUT: Duration = Duration::from_secs(300);

    pub fn new(n: usize) -> RankBarrier {
        RankBarrier {
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
            n,
        }
    }

    pub fn wait(&self) -> Res {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.2 {
            return Err("another rank failed".into());
        }
        let generation = g.1;
        g.0 += 1;
        if g.0 == self.n {
            g.0 = 0;
            g.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + Self::TIMEOUT;
        while g.1 == generation {
            if g.2 {
                return Err("another rank failed".into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("the rank barrier timed out after {:?}", Self::TIMEOUT).into());
            }
            g = self.cv.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(())
    }

    /// Whether a rank abandoned the group.
    pub fn abandoned(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).2
    }

    /// A rank failed: every wait, now or later, returns an error.
    pub fn abandon(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).2 = true;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barrier_releases_together_and_never_hangs() {
        let b = RankBarrier::new(3);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..3).map(|_| s.spawn(|| (b.wait(), b.wait()))).collect();
            for h in hs {
                let (x, y) = h.join().unwrap();
                assert!(x.is_ok() && y.is_ok());
            }
        });
        let b = RankBarrier::new(2);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| b.wait());
            std::thread::sleep(Duration::from_millis(20));
            b.abandon();
            assert!(waiter.join().unwrap().is_err(), "an abandoned group's wait fails");
        });
        assert!(b.abandoned());
        let last = RankBarrier::new(1);
        last.abandon();
        assert!(
            last.wait().is_err(),
            "the last rank to arrive is not released into a gone group"
        );
    }
}
