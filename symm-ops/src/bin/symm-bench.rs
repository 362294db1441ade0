//! symm-bench: an nccl-tests style benchmark of symm's collectives against NCCL, run as one
//! thread per GPU in one process (ranks meet through a HashStore), or on the host backend when no
//! GPU is present.
//!
//! For every (op, size, algorithm, mode) it prints size, count, type, redop, algorithm (and for
//! `auto` the algorithm that ran), the median time per op in microseconds (CUDA events around
//! `--iters` back-to-back ops on rotating inputs, median of `--rounds` rounds after a warm-up
//! round, the slowest rank's median), algbw and busbw (nccl-tests formulas) and the maximum
//! relative error against a float64 reference, checked once per row BEFORE timing on poisoned
//! outputs. Modes: `eager` (a host loop of launches) and `graph` (the same ops captured in one
//! CUDA graph, replayed). Also the setup costs: creating the collectives / a communicator, and a
//! symmetric allocation + rendezvous of 1 MiB and 1 GiB (median of 3).
//!
//! The command line (clap, `args::Cli`; `--help` describes every option and lists the
//! algorithms):
//! ```text
//! symm-bench [--ops all_reduce,reduce_scatter,all_gather] [--sizes 1K,16K,1M,...]
//!            [--dtype bf16|f16|f32] [--redop sum|avg|max|min] [--iters N] [--rounds N]
//!            [--modes eager,graph] [--algos auto,lamport,one_shot,two_shot,pull,copy_engine,nccl,...]
//!            [--ranks N] [--staging BYTES] [--lamport-bytes BYTES] [--json PATH] [--quick] [--full]
//!            [--no-nccl] [--no-setup] [--probe] [--probe-bw] [--hidden LIST] [--tokens LIST]
//!            [--skew-us N]
//! ```
//! The default sweep is 1K..256M on GPUs. On the host backend it stops at `host_default_cap`
//! (4M; why: there) and says so in one line; `--full` runs it to 256M there too, and `--sizes`
//! runs exactly the sizes given. The progress line on stderr counts the rows left and estimates
//! the time left from the time per byte measured so far.
//! Algorithms (each may carry tuning, e.g.
//! `one_shot:chunk=64K:minchunk=8K:chunks_per_block=2:blocks=64:threads=256`,
//! `copy_engine:ce_fraction=0.5:ce_chunk=8M`; `args::TUNING_KEYS` lists the keys, see
//! `symm_cuda::collectives::Tuning`): all_reduce `auto lamport lamport_two_shot one_shot two_shot pull
//! copy_engine ce_two_shot nccl`; reduce_scatter `auto lamport ring pull copy_engine nccl`; all_gather `auto lamport sm pull
//! copy_engine nccl` (each a kernel of `symm_core::coll`, run explicitly; `auto` is the Communicator's
//! plan, printed beside it; `pull`: the fused zero-copy pull, inputs in the registered arena, two-shot from
//! three ranks; all_reduce `copy_engine`: the pull with `ce_fraction` of it copied by the copy engine;
//! all_gather `sm`: the ring, `copy_engine` pushes into the peers' registered outputs;
//! `copy_engine_staged`, on request, copies from an unregistered input). Sizes are bytes of the whole tensor as nccl-tests counts them (all_gather: the gathered
//! output; reduce_scatter: the unreduced input). NCCL comes from libnccl.so.2 (pip
//! `nvidia-nccl-cu13`) on LD_LIBRARY_PATH; without it NCCL rows are skipped with the reason.
//! `--json PATH` writes the rows and setup costs as JSON (serde_json, `json.rs`).

// No unsafe code outside gpu.rs (raw addresses of the benchmark arenas).
#![deny(unsafe_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use symm_ops::symm_core::symm_store::{HashStore, Store, StoreExchange};
use symm_ops::symm_core::{DType, Device, Group, ReduceOp};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
const T_STORE: Duration = Duration::from_secs(300);

#[path = "symm-bench/args.rs"]
mod args;
use args::*;

#[path = "symm-bench/json.rs"]
mod json;

// ------------------------------------------------------------------ values, results

/// Input element `j` of `rank`: k/128 for k in -128..=128 (exact in bf16, f16, f32).
fn value(rank: usize, j: usize) -> f64 {
    let mut z = (j as u64)
        .wrapping_mul(64)
        .wrapping_add(rank as u64)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) % 257) as f64 / 128.0 - 1.0
}

fn encode(dtype: DType, n: usize, f: impl Fn(usize) -> f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let v = f(i);
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
            _ => out.extend_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes()),
        }
    }
    out
}

fn decode_at(dtype: DType, b: &[u8], i: usize) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]) as f64,
        DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f64(),
        _ => half::bf16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f64(),
    }
}

fn reduce_ref(op: ReduceOp, world: usize, f: impl Fn(usize) -> f64) -> f64 {
    let mut acc = f(0);
    for r in 1..world {
        let v = f(r);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + v,
            ReduceOp::Max => acc.max(v),
            ReduceOp::Min => acc.min(v),
        };
    }
    if op == ReduceOp::Avg {
        acc / world as f64
    } else {
        acc
    }
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    }
}

/// The geometry of one (op, size) point.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    /// Bytes as nccl-tests counts them.
    bytes: usize,
    /// The `count` the API takes (all_reduce: elements; reduce_scatter: output elements; all_gather:
    /// input elements).
    count: usize,
    in_elems: usize,
    out_elems: usize,
}

fn geometry(op: Op, bytes: usize, dtype: DType, world: usize) -> Geometry {
    let es = dtype.size();
    match op {
        Op::AllReduce => {
            let count = (bytes / es).max(1);
            Geometry {
                bytes: count * es,
                count,
                in_elems: count,
                out_elems: count,
            }
        }
        Op::ReduceScatter | Op::AllGather => {
            let count = (bytes / es / world).max(1);
            let (i, o) = if op == Op::ReduceScatter {
                (count * world, count)
            } else {
                (count, count * world)
            };
            Geometry {
                bytes: count * world * es,
                count,
                in_elems: i,
                out_elems: o,
            }
        }
    }
}

/// Max relative error of `got` (this rank's output) against the float64 reference.
fn max_error(op: Op, redop: ReduceOp, dtype: DType, g: &Geometry, rank: usize, world: usize, got: &[u8]) -> f64 {
    let mut worst = 0.0f64;
    for i in 0..g.out_elems {
        let want = match op {
            Op::AllReduce => reduce_ref(redop, world, |r| value(r, i)),
            Op::ReduceScatter => reduce_ref(redop, world, |r| value(r, rank * g.count + i)),
            Op::AllGather => value(i / g.count, i % g.count),
        };
        let v = decode_at(dtype, got, i);
        let e = (v - want).abs() / want.abs().max(1.0);
        if e.is_nan() {
            return f64::INFINITY;
        }
        worst = worst.max(e);
    }
    worst
}

/// One printed / JSON row.
#[derive(Debug, Clone)]
struct Row {
    op: Op,
    bytes: usize,
    count: usize,
    dtype: DType,
    redop: ReduceOp,
    algo: String,
    path: String,
    mode: Mode,
    time_us: f64,
    max_err: f64,
    ok: bool,
    note: String,
    world: usize,
}

impl Row {
    fn algbw(&self) -> f64 {
        if self.time_us > 0.0 {
            self.bytes as f64 / (self.time_us * 1e-6) / 1e9
        } else {
            0.0
        }
    }
    fn busbw(&self) -> f64 {
        self.algbw() * self.op.bus_factor(self.world)
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn fmt_size(b: usize) -> String {
    if b >= MIB && b.is_multiple_of(MIB) {
        format!("{}M", b / MIB)
    } else if b >= KIB && b.is_multiple_of(KIB) {
        format!("{}K", b / KIB)
    } else {
        format!("{b}")
    }
}

fn header() -> String {
    format!(
        "{:>9} {:>11} {:>5} {:>6} {:<34} {:<5} {:>10} {:>8} {:>8} {:>9}  {}",
        "size", "count", "type", "redop", "algorithm (path)", "mode", "time_us", "algbw", "busbw", "maxerr", "note"
    )
}

fn format_row(r: &Row) -> String {
    let algo = if r.path.is_empty() || r.path == r.algo {
        r.algo.clone()
    } else {
        format!("{} ({})", r.algo, r.path)
    };
    let (t, a, b) = if r.time_us.is_finite() && r.time_us > 0.0 {
        (
            format!("{:.2}", r.time_us),
            format!("{:.2}", r.algbw()),
            format!("{:.2}", r.busbw()),
        )
    } else {
        ("-".into(), "-".into(), "-".into())
    };
    format!(
        "{:>9} {:>11} {:>5} {:>6} {:<34} {:<5} {:>10} {:>8} {:>8} {:>9.2e}  {}{}",
        fmt_size(r.bytes),
        r.count,
        r.dtype.name(),
        r.redop.name(),
        algo,
        r.mode.name(),
        t,
        a,
        b,
        r.max_err,
        if r.ok { "" } else { "FAILED " },
        r.note
    )
}

#[derive(Debug, Clone)]
struct SetupCost {
    what: String,
    bytes: usize,
    median_ms: f64,
}

// ------------------------------------------------------------------ rank plumbing

/// What every rank thread shares.
struct Shared {
    store: Arc<dyn Store>,
    world: usize,
    args: Args,
    run_id: String,
    seq: Vec<AtomicUsize>,
    progress: Mutex<Progress>,
}

impl Shared {
    /// `plan`: the (op, size) of every progress step (a row on the host backend, an algorithm's
    /// rows at one size on GPUs), in the order they run.
    fn new(store: Arc<dyn Store>, world: usize, args: Args, run_id: String, plan: Vec<(Op, usize)>) -> Shared {
        let plan = plan.into_iter().map(|(op, size)| args.step(op, size)).collect();
        Shared {
            store,
            world,
            args,
            run_id,
            seq: (0..world).map(|_| AtomicUsize::new(0)).collect(),
            progress: Mutex::new(Progress::new(plan)),
        }
    }
}

/// One progress step: an op at a size, and its work (`Args::work`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    op: Op,
    size: usize,
    work: f64,
}

/// The progress line: how many steps are left and an estimate of the time they take.
///
/// A step's time is taken as proportional to its work, the bytes it moves (`Args::work`); the
/// estimate for a step still to run is its work times the seconds per byte measured so far:
/// on steps of the same op and size (another algorithm's), or else on steps of the same size of
/// the ops before, scaled by how this op compares with them at its largest size measured, or else
/// on this op's (or any op's) largest size measured. Early on, with only small latency-bound
/// sizes measured, the estimate runs high; it settles once the larger sizes have run.
#[derive(Debug)]
struct Progress {
    plan: Vec<Step>,
    /// Steps started.
    started: usize,
    start: Option<Instant>,
    /// The running step and when it started.
    current: Option<(Step, Instant)>,
    /// Finished steps and their seconds.
    done: Vec<(Step, f64)>,
    /// Length of the last line printed (to blank it out).
    width: usize,
}

impl Progress {
    /// No estimate before this much time has passed.
    const ESTIMATE_AFTER: Duration = Duration::from_secs(1);

    fn new(plan: Vec<Step>) -> Progress {
        Progress {
            plan,
            started: 0,
            start: None,
            current: None,
            done: Vec::new(),
            width: 0,
        }
    }

    /// Records that `step` starts at `now`; returns the line to show.
    fn step(&mut self, step: Step, now: Instant, what: &str) -> String {
        self.finish_current(now);
        let start = *self.start.get_or_insert(now);
        self.started += 1;
        self.current = Some((step, now));
        let total = self.total();
        let left = total + 1 - self.started;
        let mut line = format!("[{}/{total}] {what}: {left} left", self.started);
        // The first steps' times are too short to extrapolate from.
        if now.duration_since(start) >= Self::ESTIMATE_AFTER {
            if let Some(secs) = self.estimate(self.started - 1) {
                let _ = write!(line, ", ~{} (estimate)", fmt_secs(secs));
            }
        }
        line
    }

    /// Steps in all: those planned, or those started where more ran.
    fn total(&self) -> usize {
        self.plan.len().max(self.started)
    }

    fn finish_current(&mut self, now: Instant) {
        if let Some((step, t)) = self.current.take() {
            self.done.push((step, now.duration_since(t).as_secs_f64()));
        }
    }

    /// Seconds per unit of work of the finished steps that `keep` selects.
    fn rate_of(&self, keep: impl Fn(&Step) -> bool) -> Option<f64> {
        let (w, t) = self
            .done
            .iter()
            .filter(|(s, _)| keep(s))
            .fold((0.0, 0.0), |(w, t), (s, secs)| (w + s.work, t + secs));
        (w > 0.0).then(|| t / w)
    }

    /// The largest size of the finished steps that `keep` selects.
    fn largest(&self, keep: impl Fn(&Step) -> bool) -> Option<usize> {
        self.done.iter().filter(|(s, _)| keep(s)).map(|(s, _)| s.size).max()
    }

    /// Estimated seconds per unit of work of a step of `op` at `size`; None before any step
    /// finished.
    fn rate(&self, op: Op, size: usize) -> Option<f64> {
        if let Some(r) = self.rate_of(|s| s.op == op && s.size == size) {
            return Some(r);
        }
        if let Some(r) = self.rate_of(|s| s.size == size) {
            // Only other ops ran this size: scale by this op's speed against theirs at the
            // largest size both ran.
            let common = self.largest(|s| s.op == op && self.done.iter().any(|(o, _)| o.op != op && o.size == s.size));
            let scale = common
                .and_then(|m| {
                    Some(self.rate_of(|s| s.op == op && s.size == m)? / self.rate_of(|s| s.op != op && s.size == m)?)
                })
                .unwrap_or(1.0);
            return Some(r * scale);
        }
        // A size nobody ran yet: this op's largest, else any op's largest.
        match self.largest(|s| s.op == op) {
            Some(m) => self.rate_of(|s| s.op == op && s.size == m),
            None => {
                let m = self.largest(|_| true)?;
                self.rate_of(|s| s.size == m)
            }
        }
    }

    /// Estimated seconds for the planned steps from index `from` (the one starting) on.
    fn estimate(&self, from: usize) -> Option<f64> {
        let mut secs = 0.0;
        for s in self.plan.iter().skip(from) {
            secs += self.rate(s.op, s.size)? * s.work;
        }
        Some(secs)
    }

    /// The closing line: steps run and time taken; None when no step ran.
    fn summary(&mut self, now: Instant) -> Option<String> {
        self.finish_current(now);
        let start = self.start?;
        Some(format!(
            "[{}/{}] done in {}",
            self.started,
            self.total(),
            fmt_secs(now.duration_since(start).as_secs_f64())
        ))
    }

    /// `line` padded to blank out the previous one, after a carriage return.
    fn overwrite(&mut self, line: &str) -> String {
        let w = self.width.max(line.len());
        self.width = line.len();
        format!("\r{line:<w$}")
    }
}

/// Seconds for people: `45 s`, `3 min 05 s`, `1 h 02 min`.
fn fmt_secs(secs: f64) -> String {
    let s = if secs.is_finite() {
        secs.max(0.0).round() as u64
    } else {
        0
    };
    if s < 60 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{} h {:02} min", s / 3600, s % 3600 / 60)
    }
}

/// Per-rank measurement exchanged through the store.
fn gather_f64s(sh: &Shared, rank: usize, key: &str, vals: &[f64]) -> BoxResult<Vec<Vec<f64>>> {
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ex = StoreExchange::new(sh.store.clone(), format!("{}/{key}", sh.run_id));
    let all = ex.all_gather(rank, sh.world, &bytes, T_STORE)?;
    Ok(all
        .iter()
        .map(|b| {
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect()
        })
        .collect())
}

impl Shared {
    /// A store key for the next exchange of `rank` (every rank counts its own exchanges, and
    /// all ranks make the same exchanges in the same order).
    fn next_key(&self, rank: usize, what: &str) -> String {
        let n = self.seq.get(rank).map_or(0, |c| c.fetch_add(1, Ordering::Relaxed));
        format!("{what}-{n}")
    }
    /// Rank 0 shows the progress line for a step of `size` starting now.
    fn progress(&self, rank: usize, op: Op, size: usize, what: &str) {
        if rank != 0 {
            return;
        }
        let Ok(mut p) = self.progress.lock() else {
            return;
        };
        let line = p.step(self.args.step(op, size), Instant::now(), what);
        let out = p.overwrite(&line);
        let _ = write!(std::io::stderr(), "{out}");
        let _ = std::io::stderr().flush();
    }

    /// Closes the progress line (steps run, time taken), when there was one.
    fn progress_done(&self) {
        let Ok(mut p) = self.progress.lock() else {
            return;
        };
        if let Some(line) = p.summary(Instant::now()) {
            let out = p.overwrite(&line);
            let _ = write!(std::io::stderr(), "{out}");
        }
    }
}

/// Combines every rank's (time, err, ok) into a row: slowest rank's time, worst error.
#[allow(clippy::too_many_arguments)]
fn combine(
    sh: &Shared,
    rank: usize,
    key: &str,
    op: Op,
    g: &Geometry,
    algo: &str,
    path: &str,
    mode: Mode,
    time_us: f64,
    max_err: f64,
    ok: bool,
    note: &str,
) -> BoxResult<Row> {
    let all = gather_f64s(sh, rank, key, &[time_us, max_err, if ok { 1.0 } else { 0.0 }])?;
    let time = all
        .iter()
        .map(|v| v.first().copied().unwrap_or(f64::NAN))
        .fold(
            0.0f64,
            |a, b| {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            },
        );
    let err = all
        .iter()
        .map(|v| v.get(1).copied().unwrap_or(f64::INFINITY))
        .fold(0.0f64, f64::max);
    let all_ok = all.iter().all(|v| v.get(2).copied() == Some(1.0));
    Ok(Row {
        op,
        bytes: g.bytes,
        count: g.count,
        dtype: sh.args.dtype,
        redop: sh.args.redop,
        algo: algo.to_string(),
        path: path.to_string(),
        mode,
        time_us: time,
        max_err: err,
        ok: all_ok,
        note: note.to_string(),
        world: sh.world,
    })
}

// ------------------------------------------------------------------ main

fn main() {
    // clap exits itself on `--help` (0) and on a bad command line (2).
    let args = match <Cli as clap::Parser>::parse().into_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    // Never NVLink SHARP / multicast (docs/architecture.md); set before any NCCL init.
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    match run(args) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("symm-bench: {e}");
            std::process::exit(1);
        }
    }
}

fn run(args: Args) -> BoxResult<()> {
    #[cfg(feature = "cuda")]
    {
        symm_ops::link();
        if let Ok(n) = symm_ops::symm_cuda::cuda_available() {
            // One rank per GPU: ranks sharing a GPU (NOTE [shared-device]) are a correctness mode,
            // and their timings would say nothing about the links between GPUs.
            if let Some(r) = args.ranks.filter(|&r| r > n && n > 0) {
                return Err(format!(
                    "--ranks {r} on {n} GPU(s): symm-bench times one rank per GPU and does not time ranks \
                     sharing a GPU (a correctness mode: the GPU suites run it)"
                )
                .into());
            }
            let world = args.ranks.unwrap_or(n).min(n);
            if world >= 1 {
                return gpu::run(args, world);
            }
        }
    }
    host::run(args)
}

/// Runs `body` on `world` rank threads sharing `shared`; returns rank 0's rows and setup costs.
fn launch<F>(shared: Arc<Shared>, body: F) -> BoxResult<(Vec<Row>, Vec<SetupCost>)>
where
    F: Fn(usize, &Shared) -> BoxResult<(Vec<Row>, Vec<SetupCost>)> + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let mut handles = Vec::new();
    for rank in 0..shared.world {
        let (sh, body) = (shared.clone(), body.clone());
        handles.push(std::thread::Builder::new().name(format!("rank-{rank}")).spawn(
            move || -> Result<(Vec<Row>, Vec<SetupCost>), String> {
                match catch_unwind(AssertUnwindSafe(|| body(rank, &sh))) {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(format!("rank {rank}: {e}")),
                    Err(p) => Err(format!(
                        "rank {rank} panicked: {}",
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default()
                    )),
                }
            },
        )?);
    }
    let mut first = None;
    let mut errors = Vec::new();
    for (rank, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(v)) => {
                if rank == 0 {
                    first = Some(v);
                }
            }
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push(format!("rank {rank} thread died")),
        }
    }
    shared.progress_done();
    let _ = writeln!(std::io::stderr());
    if !errors.is_empty() {
        return Err(errors.join("\n").into());
    }
    first.ok_or_else(|| "rank 0 returned nothing".into())
}

fn report(backend: &str, world: usize, args: &Args, rows: &[Row], setup: &[SetupCost]) -> BoxResult<()> {
    println!(
        "# symm-bench: {backend}, {world} ranks, dtype {}, redop {}",
        args.dtype, args.redop
    );
    println!(
        "# time_us: median over {} rounds of the slowest rank; algbw/busbw GB/s (nccl-tests)",
        args.rounds
    );
    for op in &args.ops {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.op == *op).collect();
        if mine.is_empty() {
            continue;
        }
        println!("\n## {}", op.name());
        println!("{}", header());
        for r in mine {
            println!("{}", format_row(r));
        }
    }
    if !setup.is_empty() {
        println!("\n## setup (median of 3, slowest rank)");
        for c in setup {
            println!("{:<48} {:>10} {:>10.2} ms", c.what, fmt_size(c.bytes), c.median_ms);
        }
    }
    let failed = rows.iter().filter(|r| !r.ok).count();
    if failed > 0 {
        println!("\n# {failed} row(s) FAILED their correctness check or did not run");
    }
    if let Some(p) = &args.json {
        json::write(p, backend, world, args, rows, setup)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

// ------------------------------------------------------------------ host backend

#[path = "symm-bench/host.rs"]
mod host;

// ------------------------------------------------------------------ GPUs

// `--ops ar_rms_norm`: times with `gpu`'s rig (`RankState`, `time_rounds`).
#[cfg(feature = "cuda")]
#[path = "symm-bench/epilogue.rs"]
mod epilogue;

#[cfg(feature = "cuda")]
#[path = "symm-bench/gpu.rs"]
mod gpu;

// `--probe` / `--probe-bw`: the latency and bandwidth probes, with `gpu`'s rig.
#[cfg(feature = "cuda")]
#[path = "symm-bench/probe.rs"]
mod probe;

#[cfg(test)]
#[path = "symm-bench/tests.rs"]
mod tests;
