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
//! ```text
//! symm-bench [--ops all_reduce,reduce_scatter,all_gather] [--sizes 1K,16K,1M,...]
//!            [--dtype bf16|f16|f32] [--redop sum|avg|max|min] [--iters N] [--rounds N]
//!            [--modes eager,graph] [--algos auto,lamport,one_shot,two_shot,pull,copy_engine,nccl,...]
//!            [--ranks N] [--staging BYTES] [--lamport-bytes BYTES] [--json PATH] [--quick] [--full]
//!            [--no-nccl] [--no-setup] [--probe] [--probe-bw]
//! ```
//! The default sweep is 1K..256M on GPUs. On the host backend it stops at `host_default_cap`
//! (4M; why: there) and says so in one line; `--full` runs it to 256M there too, and `--sizes`
//! runs exactly the sizes given. The progress line on stderr counts the rows left and estimates
//! the time left from the time per byte measured so far.
//! Algorithms (each may carry tuning, e.g. `one_shot:chunk=64K:minchunk=8K:cpb=2:blocks=64:threads=256`,
//! `copy_engine:frac=0.5:cechunk=8M`; see `symm_cuda::collectives::Tuning`): all_reduce `auto lamport one_shot two_shot pull
//! copy_engine ce_two_shot nccl`; reduce_scatter `auto lamport ring pull copy_engine nccl`; all_gather `auto lamport sm pull
//! copy_engine nccl` (`pull`: the fused zero-copy pull, inputs in the registered arena; all_gather `copy_engine`
//! pushes into the peers' registered outputs; `copy_engine_staged`, on request, copies from an unregistered
//! input). Sizes are bytes of the whole tensor as nccl-tests counts them (all_gather: the gathered
//! output; reduce_scatter: the unreduced input). NCCL comes from libnccl.so.2 (pip
//! `nvidia-nccl-cu13`) on LD_LIBRARY_PATH; without it NCCL rows are skipped with the reason.

#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use symm_ops::symm_core::symm_store::{HashStore, Store, StoreExchange};
use symm_ops::symm_core::{DType, Device, Group, ReduceOp};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
const T_STORE: Duration = Duration::from_secs(300);

// ------------------------------------------------------------------ arguments

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl Op {
    const ALL: [Op; 3] = [Op::AllReduce, Op::ReduceScatter, Op::AllGather];
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        }
    }
    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            _ => (n - 1.0) / n,
        }
    }
    /// Algorithms run by default.
    fn default_algos(self) -> &'static [&'static str] {
        match self {
            Op::AllReduce => &[
                "auto",
                "lamport",
                "one_shot",
                "two_shot",
                "pull",
                "copy_engine",
                "ce_two_shot",
                "nccl",
            ],
            Op::ReduceScatter => &["auto", "lamport", "ring", "pull", "copy_engine", "nccl"],
            Op::AllGather => &["auto", "lamport", "sm", "pull", "copy_engine", "nccl"],
        }
    }
    fn accepts(self, base: &str) -> bool {
        self.default_algos().contains(&base) || (self == Op::AllGather && base == "copy_engine_staged")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Eager,
    Graph,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Graph => "graph",
        }
    }
}

/// An algorithm as given on the command line: base name plus tuning parameters.
#[derive(Debug, Clone, PartialEq)]
struct AlgoSpec {
    label: String,
    base: String,
    params: Vec<(String, String)>,
}

impl AlgoSpec {
    fn parse(s: &str) -> Result<AlgoSpec, String> {
        let mut parts = s.split(':');
        let base = parts.next().unwrap_or("").trim().to_string();
        if base.is_empty() {
            return Err(format!("empty algorithm in {s:?}"));
        }
        let mut params = Vec::new();
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("algorithm parameter {p:?} is not key=value"))?;
            if !["chunk", "minchunk", "cpb", "blocks", "threads", "frac", "cechunk"].contains(&k) {
                return Err(format!("unknown algorithm parameter {k:?} in {s:?}"));
            }
            params.push((k.to_string(), v.to_string()));
        }
        if !Op::ALL.iter().any(|o| o.accepts(&base)) {
            return Err(format!("unknown algorithm {base:?}"));
        }
        Ok(AlgoSpec {
            label: s.to_string(),
            base,
            params,
        })
    }
}

#[derive(Debug, Clone)]
struct Args {
    ops: Vec<Op>,
    sizes: Vec<usize>,
    dtype: DType,
    redop: ReduceOp,
    iters: Option<usize>,
    rounds: usize,
    modes: Vec<Mode>,
    algos: Option<Vec<AlgoSpec>>,
    ranks: Option<usize>,
    staging: usize,
    /// Lamport buffer size (largest Lamport message) of the explicit kernels' collectives.
    lamport_bytes: Option<usize>,
    json: Option<PathBuf>,
    quick: bool,
    /// `--full`: the whole default sweep on the host backend too (see `host_default_cap`).
    full: bool,
    /// The sizes are the default sweep (neither `--sizes` nor `--quick` chose them).
    default_sweep: bool,
    nccl: bool,
    setup: bool,
    /// Run the latency probes (symm_cuda::probe) instead of the collectives.
    probe: bool,
    /// Run the bandwidth probes (SM and copy-engine copies to and from the peer) instead.
    probe_bw: bool,
    /// `--ops ar_rms_norm`: the all-reduce epilogue table (symm-bench/epilogue.rs).
    epilogue: bool,
    /// Its row lengths (`--hidden`) and row counts (`--tokens`).
    hiddens: Vec<usize>,
    tokens: Vec<usize>,
}

const USAGE: &str = "usage: symm-bench [--ops LIST] [--sizes LIST] [--dtype bf16|f16|f32] [--redop sum|avg|max|min] \
[--iters N] [--rounds N] [--modes eager,graph] [--algos LIST] [--ranks N] [--staging BYTES] [--lamport-bytes BYTES] [--json PATH] \
[--quick] [--full] [--no-nccl] [--no-setup] [--probe] [--probe-bw] [--hidden LIST] [--tokens LIST]
--ops ar_rms_norm (with or instead of the collectives): all-reduce + residual + RMSNorm, fused against unfused, \
for every --hidden (default 4096,8192) and --tokens (default 1,8,32,128,512); CUDA only";

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K') | Some('k') => (&s[..s.len() - 1], KIB),
        Some('M') | Some('m') => (&s[..s.len() - 1], MIB),
        Some('G') | Some('g') => (&s[..s.len() - 1], 1024 * MIB),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("bad size {s:?}"))
}

/// A positive count (`--hidden`, `--tokens`).
fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad count {s:?}"))
}

/// 1K..256M: powers of 4 plus 1M, 4M, 16M, 64M, 256M.
fn default_sizes() -> Vec<usize> {
    let mut v: Vec<usize> = (0..10).map(|i| KIB << (2 * i)).filter(|&s| s <= 256 * MIB).collect();
    for s in [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB] {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v.sort_unstable();
    v
}

/// The largest size of the host backend's default sweep (4M; `--full` goes on to 256M).
///
/// The host engine (symm-ops' `HostEngine`, used with `CommConfig::default()` here) moves every
/// op through its symmetric staging buffer in chunks of half of it (`DEFAULT_STAGING_BYTES / 2`
/// = 5 MiB): stage, barrier, read and reduce, barrier, write. Up to 4M a message is one chunk and
/// the sweep shows the latency-to-bandwidth curve; above it every message is the same 5 MiB step
/// repeated `bytes / 5 MiB` times, host-memory-bandwidth bound, so the time just scales with the
/// size and algbw / busbw stay flat. Measured (`taskset -c 0,1 symm-bench`: 2 cores, 2 ranks,
/// bf16, sum), busbw in GB/s at 4M / 16M / 64M / 256M: all_reduce two_shot 1.87 / 1.76 / 1.75 /
/// 1.80 (2244 / 9510 / 38367 / 149285 us: 561-599 us per MiB), reduce_scatter ring 1.40 / 1.37 /
/// 1.36 / 1.37, all_gather sm 3.23 / 2.65 / 2.55 / 2.61. Yet every row from 16M up takes 7 to 20
/// s (`iters_for` moves 2 GiB per round, 16 rounds): those 21 rows took 5.8 of the 6.3 minutes
/// of the whole sweep there (9.9 minutes on CI's 2-core machine); the sweep to 4M takes 32 s.
fn host_default_cap() -> usize {
    let chunk = symm_ops::DEFAULT_STAGING_BYTES / 2;
    default_sizes().into_iter().filter(|&s| s <= chunk).max().unwrap_or(KIB)
}

/// The sizes the host backend runs, and the one line saying where the default sweep stopped
/// (when it did): the default sweep stops at `host_default_cap` unless `--full`; sizes from
/// `--sizes` or `--quick` run as given.
fn host_sweep(args: &Args) -> (Vec<usize>, Option<String>) {
    if !args.default_sweep || args.full {
        return (args.sizes.clone(), None);
    }
    let cap = host_default_cap();
    let kept: Vec<usize> = args.sizes.iter().copied().filter(|&s| s <= cap).collect();
    let Some(&max) = args.sizes.iter().max() else {
        return (kept, None);
    };
    if kept.len() == args.sizes.len() {
        return (kept, None);
    }
    let note = format!(
        "# host backend: sizes stop at {} (above it the host engine repeats its {} staging step and the time \
         just scales with size); --full runs the whole sweep to {}",
        fmt_size(cap),
        fmt_size(symm_ops::DEFAULT_STAGING_BYTES / 2),
        fmt_size(max)
    );
    (kept, Some(note))
}

fn parse_args(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        ops: Op::ALL.to_vec(),
        sizes: default_sizes(),
        dtype: DType::BF16,
        redop: ReduceOp::Sum,
        iters: None,
        rounds: 15,
        modes: vec![Mode::Eager, Mode::Graph],
        algos: None,
        ranks: None,
        staging: 10 * MIB,
        lamport_bytes: None,
        json: None,
        quick: false,
        full: false,
        default_sweep: true,
        nccl: true,
        setup: true,
        probe: false,
        probe_bw: false,
        epilogue: false,
        hiddens: vec![4096, 8192],
        tokens: vec![1, 8, 32, 128, 512],
    };
    let mut sizes_given = false;
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--ops" => {
                let v = val("--ops")?;
                // `ar_rms_norm`: the all-reduce epilogue table (symm-bench/epilogue.rs).
                a.epilogue = v.split(',').any(|s| s.trim() == "ar_rms_norm");
                a.ops = v
                    .split(',')
                    .filter(|s| s.trim() != "ar_rms_norm")
                    .map(|s| {
                        Op::ALL
                            .into_iter()
                            .find(|o| o.name() == s.trim())
                            .ok_or_else(|| format!("unknown op {s:?}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--sizes" => {
                a.sizes = val("--sizes")?.split(',').map(parse_size).collect::<Result<_, _>>()?;
                sizes_given = true;
            }
            "--dtype" => {
                a.dtype = match val("--dtype")?.as_str() {
                    "bf16" => DType::BF16,
                    "f16" | "fp16" => DType::F16,
                    "f32" | "fp32" => DType::F32,
                    o => return Err(format!("unsupported dtype {o:?}")),
                }
            }
            "--redop" => {
                let v = val("--redop")?;
                a.redop = ReduceOp::ALL
                    .into_iter()
                    .find(|o| o.name() == v)
                    .ok_or_else(|| format!("unknown redop {v:?}"))?
            }
            "--iters" => a.iters = Some(val("--iters")?.parse().map_err(|_| "bad --iters")?),
            "--rounds" => a.rounds = val("--rounds")?.parse().map_err(|_| "bad --rounds")?,
            "--modes" => {
                a.modes = val("--modes")?
                    .split(',')
                    .map(|m| match m.trim() {
                        "eager" => Ok(Mode::Eager),
                        "graph" => Ok(Mode::Graph),
                        o => Err(format!("unknown mode {o:?}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--algos" => {
                a.algos = Some(
                    val("--algos")?
                        .split(',')
                        .map(AlgoSpec::parse)
                        .collect::<Result<_, _>>()?,
                )
            }
            "--ranks" => a.ranks = Some(val("--ranks")?.parse().map_err(|_| "bad --ranks")?),
            "--staging" => a.staging = parse_size(&val("--staging")?)?,
            "--lamport-bytes" => a.lamport_bytes = Some(parse_size(&val("--lamport-bytes")?)?),
            "--hidden" => a.hiddens = val("--hidden")?.split(',').map(parse_count).collect::<Result<_, _>>()?,
            "--tokens" => a.tokens = val("--tokens")?.split(',').map(parse_count).collect::<Result<_, _>>()?,
            "--json" => a.json = Some(PathBuf::from(val("--json")?)),
            "--quick" => a.quick = true,
            "--full" => a.full = true,
            "--no-nccl" => a.nccl = false,
            "--no-setup" => a.setup = false,
            "--probe" => a.probe = true,
            "--probe-bw" => a.probe_bw = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            o => return Err(format!("unknown argument {o:?}\n{USAGE}")),
        }
    }
    if a.full && (sizes_given || a.quick) {
        return Err(format!(
            "--full runs the whole default sweep; it does not go with {} (which {} the sizes)\n{USAGE}",
            if sizes_given { "--sizes" } else { "--quick" },
            if sizes_given { "sets" } else { "shortens" }
        ));
    }
    if a.quick && !sizes_given {
        a.sizes = vec![KIB, 16 * KIB, 64 * KIB];
    }
    a.default_sweep = !sizes_given && !a.quick;
    if a.quick && a.iters.is_none() {
        a.iters = Some(10);
        a.rounds = a.rounds.min(5);
    }
    if a.rounds == 0 || a.iters == Some(0) {
        return Err("--rounds and --iters must be positive".into());
    }
    Ok(a)
}

impl Args {
    fn algos_for(&self, op: Op) -> Vec<AlgoSpec> {
        match &self.algos {
            Some(list) => list.iter().filter(|s| op.accepts(&s.base)).cloned().collect::<Vec<_>>(),
            None => op
                .default_algos()
                .iter()
                .filter_map(|s| AlgoSpec::parse(s).ok())
                .collect::<Vec<_>>(),
        }
        .into_iter()
        .filter(|s| self.nccl || s.base != "nccl")
        .collect()
    }
    /// Ops per timed round for a message of `bytes`.
    fn iters_for(&self, bytes: usize) -> usize {
        self.iters.unwrap_or_else(|| (2048 * MIB / bytes.max(1)).clamp(5, 100))
    }
    /// Bytes one row of `bytes` moves: the checked op, a warm-up round and the timed rounds (the
    /// progress line's estimate takes a row's time as proportional to it).
    fn work(&self, bytes: usize) -> f64 {
        ((self.rounds as f64 + 1.0) * self.iters_for(bytes) as f64 + 1.0) * bytes as f64
    }
    /// The progress step of `op` at `size`.
    fn step(&self, op: Op, size: usize) -> Step {
        Step {
            op,
            size,
            work: self.work(size),
        }
    }
    /// The (op, size) of every progress step, in the order they run: each op's sizes, each
    /// repeated for the `algos(op)` algorithms that run it.
    fn plan(&self, algos: impl Fn(Op) -> usize) -> Vec<(Op, usize)> {
        let mut plan = Vec::new();
        for &op in &self.ops {
            let n = algos(op);
            for &size in &self.sizes {
                plan.extend(std::iter::repeat_n((op, size), n));
            }
        }
        plan
    }
}

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
    if b >= MIB && b % MIB == 0 {
        format!("{}M", b / MIB)
    } else if b >= KIB && b % KIB == 0 {
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

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

#[derive(Debug, Clone)]
struct SetupCost {
    what: String,
    bytes: usize,
    median_ms: f64,
}

fn write_json(
    path: &PathBuf,
    backend: &str,
    world: usize,
    args: &Args,
    rows: &[Row],
    setup: &[SetupCost],
) -> BoxResult<()> {
    let mut s = String::from("{\n");
    let _ = writeln!(s, "  \"tool\": \"symm-bench\",");
    let _ = writeln!(s, "  \"backend\": {},", json_str(backend));
    let _ = writeln!(s, "  \"world\": {world},");
    let _ = writeln!(s, "  \"dtype\": {},", json_str(args.dtype.name()));
    let _ = writeln!(s, "  \"redop\": {},", json_str(args.redop.name()));
    let _ = writeln!(s, "  \"rounds\": {},", args.rounds);
    s.push_str("  \"results\": [\n");
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(
            s,
            "    {{\"op\": {}, \"bytes\": {}, \"count\": {}, \"dtype\": {}, \"redop\": {}, \"algo\": {}, \"path\": {}, \
             \"mode\": {}, \"time_us\": {}, \"algbw\": {}, \"busbw\": {}, \"max_err\": {}, \"ok\": {}, \"note\": {}}}{}",
            json_str(r.op.name()),
            r.bytes,
            r.count,
            json_str(r.dtype.name()),
            json_str(r.redop.name()),
            json_str(&r.algo),
            json_str(&r.path),
            json_str(r.mode.name()),
            json_num(r.time_us),
            json_num(r.algbw()),
            json_num(r.busbw()),
            json_num(r.max_err),
            r.ok,
            json_str(&r.note),
            if i + 1 < rows.len() { "," } else { "" }
        );
    }
    s.push_str("  ],\n  \"setup\": [\n");
    for (i, c) in setup.iter().enumerate() {
        let _ = writeln!(
            s,
            "    {{\"what\": {}, \"size_bytes\": {}, \"median_ms\": {}}}{}",
            json_str(&c.what),
            c.bytes,
            json_num(c.median_ms),
            if i + 1 < setup.len() { "," } else { "" }
        );
    }
    s.push_str("  ]\n}\n");
    std::fs::write(path, s)?;
    Ok(())
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
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    // Never NVLink SHARP / multicast (DESIGN.md); set before any NCCL init.
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
        write_json(p, backend, world, args, rows, setup)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

// ------------------------------------------------------------------ host backend

mod host {
    use super::*;
    use symm_ops::{AllGatherAlgo, AllReduceAlgo, CommConfig, Communicator};

    pub fn run(mut args: Args) -> BoxResult<()> {
        if args.probe || args.probe_bw || args.epilogue {
            return Err("--probe, --probe-bw and --ops ar_rms_norm measure GPU kernels: no CUDA device here".into());
        }
        symm_testkit::link();
        let world = args.ranks.unwrap_or(2).max(1);
        let (sizes, note) = host_sweep(&args);
        args.sizes = sizes;
        if let Some(note) = note {
            println!("{note}");
        }
        let plan = args.plan(|op| args.algos_for(op).iter().filter(|a| host_algo(op, &a.base)).count());
        let store: Arc<dyn Store> = HashStore::new(T_STORE);
        let run_id = format!("symm-bench/host/{}", std::process::id());
        let shared = Arc::new(Shared::new(store, world, args.clone(), run_id, plan));
        let (rows, setup) = launch(shared, |rank, sh| match sh.args.dtype {
            DType::F32 => rank_body::<f32>(rank, sh),
            DType::F16 => rank_body::<half::f16>(rank, sh),
            _ => rank_body::<half::bf16>(rank, sh),
        })?;
        report("host backend (symm-testkit, CPU memory)", world, &args, &rows, &setup)
    }

    fn host_algo(op: Op, base: &str) -> bool {
        match op {
            Op::AllReduce => matches!(base, "auto" | "one_shot" | "two_shot"),
            Op::ReduceScatter => matches!(base, "auto" | "ring"),
            Op::AllGather => matches!(base, "auto" | "sm"),
        }
    }

    fn rank_body<T: symm_ops::Element>(rank: usize, sh: &Shared) -> BoxResult<(Vec<Row>, Vec<SetupCost>)> {
        let args = &sh.args;
        let world = sh.world;
        let mut setup = Vec::new();
        let t0 = Instant::now();
        let group = Group::new(format!("{}-g", sh.run_id), rank, world, sh.store.clone())?;
        let comm = Communicator::new(&group, Device::host(rank as u32), CommConfig::default())?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if args.setup {
            let all = gather_f64s(sh, rank, "setup-comm", &[ms])?;
            setup.push(SetupCost {
                what: "host communicator creation (once)".into(),
                bytes: 0,
                median_ms: all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max),
            });
        }
        let mut rows = Vec::new();
        for &op in &args.ops {
            for &size in &args.sizes {
                let g = geometry(op, size, args.dtype, world);
                let input: Vec<T> = (0..g.in_elems).map(|j| T::from_f32(value(rank, j) as f32)).collect();
                let mut out: Vec<T> = vec![T::default(); g.out_elems];
                for spec in args.algos_for(op).iter().filter(|a| host_algo(op, &a.base)) {
                    sh.progress(
                        rank,
                        op,
                        size,
                        &format!("{} {} {}", op.name(), fmt_size(size), spec.label),
                    );
                    let run_op = |out: &mut Vec<T>| -> symm_ops::symm_core::Result<()> {
                        match (op, spec.base.as_str()) {
                            (Op::AllReduce, "one_shot") => comm.all_reduce_with(
                                AllReduceAlgo::OneShot,
                                Some((&input).into()),
                                out.into(),
                                args.redop,
                            ),
                            (Op::AllReduce, "two_shot") => comm.all_reduce_with(
                                AllReduceAlgo::TwoShot,
                                Some((&input).into()),
                                out.into(),
                                args.redop,
                            ),
                            (Op::AllReduce, _) => comm.all_reduce_out(&input, out, args.redop),
                            (Op::ReduceScatter, _) => comm.reduce_scatter_out(&input, out, args.redop),
                            (Op::AllGather, _) => comm.all_gather_out(&input, out),
                        }
                    };
                    let path = match op {
                        Op::AllReduce if spec.base == "auto" => comm.select_all_reduce(g.bytes).to_string(),
                        Op::AllGather if spec.base == "auto" => {
                            let a: AllGatherAlgo = comm.select_all_gather(g.bytes);
                            a.to_string()
                        }
                        _ => String::new(),
                    };
                    // Check first, on a poisoned output.
                    out.iter_mut().for_each(|x| *x = T::from_f32(f32::NAN));
                    let (err, ok, note) = match run_op(&mut out) {
                        Ok(()) => {
                            let bytes: Vec<u8> = out
                                .iter()
                                .flat_map(|x| {
                                    let mut b = vec![0u8; args.dtype.size()];
                                    x.write_le(&mut b);
                                    b
                                })
                                .collect();
                            let e = max_error(op, args.redop, args.dtype, &g, rank, world, &bytes);
                            (e, e <= tolerance(args.dtype), String::new())
                        }
                        Err(e) => (f64::INFINITY, false, e.to_string()),
                    };
                    let iters = args.iters_for(g.bytes);
                    let mut times = Vec::new();
                    if ok {
                        for _ in 0..=args.rounds {
                            comm.barrier(None)?;
                            let t = Instant::now();
                            for _ in 0..iters {
                                run_op(&mut out)?;
                            }
                            times.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
                        }
                        times.remove(0);
                    }
                    let key = sh.next_key(rank, "host");
                    rows.push(combine(
                        sh,
                        rank,
                        &key,
                        op,
                        &g,
                        &spec.label,
                        &path,
                        Mode::Eager,
                        median(&mut times),
                        err,
                        ok,
                        &note,
                    )?);
                }
            }
        }
        Ok((rows, setup))
    }
}

// ------------------------------------------------------------------ GPUs

// `--ops ar_rms_norm`: times with `gpu`'s rig (`RankState`, `time_rounds`).
#[cfg(feature = "cuda")]
#[path = "symm-bench/epilogue.rs"]
mod epilogue;

#[cfg(feature = "cuda")]
mod gpu {
    use crate::epilogue;

    use super::*;
    use std::marker::PhantomData;

    use symm_ops::cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
    use symm_ops::cudarc::driver::{
        sys::CUdeviceptr, CudaContext, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
    };
    use symm_ops::cudarc::nccl::{Comm, Id, NcclType, ReduceOp as NcclOp};
    use symm_ops::symm_core::{get_allocator, DeviceType, Rank, SymmetricMemory};
    use symm_ops::symm_cuda::collectives::{
        AllGatherPath, AllReduceAlgo as KAlgo, CollectivesConfig, CudaCollectives, ReduceScatterAlgo, Tuning,
    };
    use symm_ops::symm_cuda::driver::mem::{dtod_async, dtoh_sync, htod_sync, memset_d32_async};
    use symm_ops::{CommConfig, Communicator, RawDevicePtr};

    /// Rotating inputs per point.
    pub(super) const K: usize = 4;

    /// Where NCCL's library may be, for a clear skip message (dlopen also searches the loader cache).
    fn nccl_library() -> Result<PathBuf, String> {
        let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        for d in [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/cuda/lib64",
            "/usr/local/lib",
        ] {
            dirs.push(PathBuf::from(d));
        }
        for d in &dirs {
            for name in ["libnccl.so.2", "libnccl.so"] {
                let p = d.join(name);
                if p.exists() {
                    return Ok(p);
                }
            }
        }
        Err(
            "libnccl.so.2 not found on LD_LIBRARY_PATH or in the system library folders (pip install \
             nvidia-nccl-cu13 and add site-packages/nvidia/nccl/lib to LD_LIBRARY_PATH)"
                .into(),
        )
    }

    /// A device address as a cudarc `DevicePtr` without event tracking (ordered by our stream).
    struct RawDev<T> {
        ptr: u64,
        len: usize,
        stream: Arc<CudaStream>,
        _t: PhantomData<T>,
    }
    impl<T> DeviceSlice<T> for RawDev<T> {
        fn len(&self) -> usize {
            self.len
        }
        fn stream(&self) -> &Arc<CudaStream> {
            &self.stream
        }
    }
    impl<T> DevicePtr<T> for RawDev<T> {
        fn device_ptr<'a>(&'a self, _s: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
            (self.ptr, SyncOnDrop::Record(None))
        }
    }
    impl<T> DevicePtrMut<T> for RawDev<T> {
        fn device_ptr_mut<'a>(&'a mut self, _s: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
            (self.ptr, SyncOnDrop::Record(None))
        }
    }

    fn nccl_run<T: NcclType>(
        comm: &Comm,
        op: Op,
        redop: ReduceOp,
        input: u64,
        output: u64,
        g: &Geometry,
        stream: &Arc<CudaStream>,
    ) -> BoxResult<()> {
        let src = RawDev::<T> {
            ptr: input,
            len: g.in_elems,
            stream: stream.clone(),
            _t: PhantomData,
        };
        let mut dst = RawDev::<T> {
            ptr: output,
            len: g.out_elems,
            stream: stream.clone(),
            _t: PhantomData,
        };
        let nop = match redop {
            ReduceOp::Sum => NcclOp::Sum,
            ReduceOp::Avg => NcclOp::Avg,
            ReduceOp::Max => NcclOp::Max,
            ReduceOp::Min => NcclOp::Min,
        };
        let r = match op {
            Op::AllReduce => comm.all_reduce(&src, &mut dst, &nop).map(|_| ()),
            Op::ReduceScatter => comm.reduce_scatter(&src, &mut dst, &nop).map(|_| ()),
            Op::AllGather => comm.all_gather(&src, &mut dst).map(|_| ()),
        };
        r.map_err(|e| format!("nccl {}: {:?}", op.name(), e.0).into())
    }

    fn parse_bytes(v: &str) -> BoxResult<usize> {
        Ok(parse_size(v)?)
    }

    /// Tuning from an algorithm spec's parameters.
    fn tuning_of(spec: &AlgoSpec, base: &Tuning) -> BoxResult<Tuning> {
        let mut t = *base;
        for (k, v) in &spec.params {
            match k.as_str() {
                "chunk" => t.max_chunk_bytes = parse_bytes(v)?,
                "minchunk" => t.min_chunk_bytes = parse_bytes(v)?,
                "cpb" => t.chunks_per_block = v.parse()?,
                "blocks" => t.max_blocks = Some(v.parse()?),
                "threads" => t.threads = v.parse()?,
                "frac" => t.ce_fraction = v.parse()?,
                "cechunk" => t.ce_chunk_bytes = parse_bytes(v)?,
                _ => return Err(format!("unknown parameter {k}").into()),
            }
        }
        t.validate()?;
        Ok(t)
    }

    pub(super) struct RankState {
        pub(super) rank: usize,
        pub(super) world: usize,
        pub(super) ctx: Arc<CudaContext>,
        pub(super) stream: Arc<CudaStream>,
        pub(super) coll: CudaCollectives,
        pub(super) comm: Option<Communicator>,
        pub(super) comm_err: String,
        pub(super) nccl: Option<Comm>,
        pub(super) nccl_err: String,
        pub(super) all: Vec<Rank>,
        pub(super) start: CudaEvent,
        pub(super) end: CudaEvent,
    }

    pub fn run(args: Args, world: usize) -> BoxResult<()> {
        let nccl_note = if args.nccl {
            nccl_library().err()
        } else {
            Some("--no-nccl".into())
        };
        if let Some(n) = &nccl_note {
            eprintln!("NCCL rows skipped: {n}");
        }
        let plan = args.plan(|op| args.algos_for(op).len());
        let store: Arc<dyn Store> = HashStore::new(T_STORE);
        let run_id = format!("symm-bench/gpu/{}", std::process::id());
        let shared = Arc::new(Shared::new(store, world, args.clone(), run_id, plan));
        let nccl_ok = nccl_note.is_none();
        let (rows, setup) = launch(shared, move |rank, sh| rank_body(rank, sh, nccl_ok))?;
        let ctx0 = symm_ops::symm_cuda::driver::context(0).ok();
        let name = ctx0
            .as_ref()
            .and_then(|c| c.name().ok())
            .unwrap_or_else(|| "CUDA".into());
        // The collective kernels ran with programmatic dependent launch: asked (SYMM_PDL=1) and
        // supported, the same test CudaCollectives makes.
        let pdl_ran = symm_ops::symm_cuda::knobs::pdl()
            && ctx0.is_some_and(|c| symm_ops::symm_cuda::driver::supports_pdl(c.cu_device()).unwrap_or(false));
        let pdl = if pdl_ran { ", PDL" } else { "" };
        report(&format!("{world} x {name}{pdl}"), world, &args, &rows, &setup)
    }

    fn setup_costs(
        rank: usize,
        sh: &Shared,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
    ) -> BoxResult<Vec<SetupCost>> {
        let world = sh.world;
        let mut out = Vec::new();
        let mut measure = |what: &str, bytes: usize, f: &mut dyn FnMut(usize) -> BoxResult<()>| -> BoxResult<()> {
            let mut ms = Vec::new();
            for i in 0..3 {
                let t = Instant::now();
                f(i)?;
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let mine = median(&mut ms);
            let key = sh.next_key(rank, &format!("setup-{what}-{bytes}"));
            let all = gather_f64s(sh, rank, &key, &[mine])?;
            out.push(SetupCost {
                what: what.to_string(),
                bytes,
                median_ms: all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max),
            });
            Ok(())
        };
        for bytes in [MIB, 1024 * MIB] {
            measure("symmetric alloc + rendezvous", bytes, &mut |i| {
                let g = Group::new(
                    format!("{}-alloc-{bytes}-{i}", sh.run_id),
                    rank,
                    world,
                    sh.store.clone(),
                )?;
                let a = get_allocator(DeviceType::Cuda)?.alloc(bytes, Device::cuda(rank as u32), &g)?;
                let _m = a.rendezvous(T_STORE)?;
                Ok(())
            })?;
        }
        measure("CudaCollectives::new (10 MiB staging)", 10 * MIB, &mut |i| {
            let g = Group::new(format!("{}-coll-{i}", sh.run_id), rank, world, sh.store.clone())?;
            let _c = CudaCollectives::new(&g, ctx, 10 * MIB, T_STORE)?;
            Ok(())
        })?;
        measure("Communicator::with_stream (no NCCL)", 10 * MIB, &mut |i| {
            let g = Group::new(format!("{}-comm-{i}", sh.run_id), rank, world, sh.store.clone())?;
            let cfg = CommConfig::default().with_nccl(false);
            let _c = Communicator::with_stream(&g, stream.clone(), cfg)?;
            Ok(())
        })?;
        Ok(out)
    }

    fn rank_body(rank: usize, sh: &Shared, nccl_ok: bool) -> BoxResult<(Vec<Row>, Vec<SetupCost>)> {
        let args = &sh.args;
        let world = sh.world;
        let ctx = symm_ops::symm_cuda::driver::context(rank)?;
        let stream = ctx.new_stream()?;
        // Warm up the kernel cache and the driver before timing setup.
        let group = Group::new(format!("{}-main", sh.run_id), rank, world, sh.store.clone())?;
        let mut config = CollectivesConfig::new(args.staging, Duration::from_secs(60));
        config.timeout = Duration::from_secs(60);
        if let Some(b) = args.lamport_bytes {
            config.lamport_bytes = Some(b);
        }
        let coll = CudaCollectives::with_config(&group, &ctx, config)?;
        let setup = if args.setup {
            setup_costs(rank, sh, &ctx, &stream)?
        } else {
            Vec::new()
        };
        let wants_auto = args
            .ops
            .iter()
            .any(|&op| args.algos_for(op).iter().any(|a| a.base == "auto"));
        let (comm, comm_err) = if wants_auto {
            let g = Group::new(format!("{}-comm", sh.run_id), rank, world, sh.store.clone())?;
            let cfg = CommConfig::default()
                .with_staging_bytes(args.staging)
                .with_nccl(nccl_ok);
            match Communicator::with_stream(&g, stream.clone(), cfg) {
                Ok(c) => (Some(c), String::new()),
                Err(e) => (None, format!("communicator: {e}")),
            }
        } else {
            (None, String::new())
        };
        let wants_nccl = args
            .ops
            .iter()
            .any(|&op| args.algos_for(op).iter().any(|a| a.base == "nccl"));
        let (nccl, nccl_err) = if wants_nccl && nccl_ok {
            match make_nccl(rank, sh, &stream) {
                Ok(c) => (Some(c), String::new()),
                Err(e) => (None, format!("nccl: {e}")),
            }
        } else {
            (None, "nccl unavailable".to_string())
        };
        let all: Vec<Rank> = (0..world).map(|r| Rank::new(r, world)).collect::<Result<_, _>>()?;
        let st = RankState {
            rank,
            world,
            start: ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            end: ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            ctx,
            stream,
            coll,
            comm,
            comm_err,
            nccl,
            nccl_err,
            all,
        };
        let mut rows = Vec::new();
        if args.probe {
            probes(sh, &st)?;
            return Ok((rows, setup));
        }
        if args.probe_bw {
            bandwidth_probes(sh, &st)?;
            return Ok((rows, setup));
        }
        if args.epilogue {
            epilogue::run(sh, &st, nccl_ok)?;
        }
        let mut disabled: Vec<(Op, String)> = Vec::new();
        'ops: for &op in &args.ops {
            for &size in &args.sizes {
                if !point(sh, &st, op, size, &mut rows, &mut disabled)? {
                    eprintln!("\nrank {rank}: a collective failed with a timeout or abort: stopping the benchmark");
                    break 'ops;
                }
            }
        }
        drop(st);
        Ok((rows, setup))
    }

    /// `--probe`: every latency probe (symm_cuda::probe) in eager mode and CUDA-graph replay, median
    /// us per launch of the slowest rank; rank 0 prints the table. The probes' counters are
    /// checked afterwards (a wait that timed out leaves its counter short).
    fn probes(sh: &Shared, st: &RankState) -> BoxResult<()> {
        use symm_ops::symm_cuda::probe::{LatencyProbe, Probe};
        let args = &sh.args;
        let g = Group::new(format!("{}-probe", sh.run_id), st.rank, st.world, sh.store.clone())?;
        let a = get_allocator(DeviceType::Cuda)?.alloc(LatencyProbe::BYTES, Device::cuda(st.rank as u32), &g)?;
        let m = a.rendezvous(T_STORE)?;
        let p = LatencyProbe::new(&st.ctx, &st.stream, m, Duration::from_secs(10))?;
        let iters = args.iters.unwrap_or(200);
        let s = &st.stream;
        let mut expected = [0u32; 7];
        let mut table = String::new();
        // Every probe launched plainly, then (compute capability 9.0+) with programmatic
        // dependent launch (NOTE [pdl]): the launch latency PDL hides between back-to-back kernels.
        let pdl_ok = symm_ops::symm_cuda::driver::supports_pdl(st.ctx.cu_device())?;
        let hows: &[bool] = if pdl_ok { &[false, true] } else { &[false] };
        for &pdl in hows {
            let how = symm_ops::symm_cuda::driver::launch::Launch { pdl };
            for (i, probe) in Probe::ALL.into_iter().enumerate() {
                let mut cols = Vec::new();
                for &mode in &args.modes {
                    // One warm-up launch, then the rounds (each counted in the probe's counter).
                    p.launch_with(s, probe, how)?;
                    expected[i] += 1;
                    let mut times =
                        time_rounds(st, mode, iters, args.rounds, &mut |_| Ok(p.launch_with(s, probe, how)?))?;
                    expected[i] += ((args.rounds + 1) * iters) as u32;
                    s.synchronize()?;
                    let mine = median(&mut times);
                    let key = sh.next_key(st.rank, &format!("probe-{i}-{pdl}-{}", mode.name()));
                    let all = gather_f64s(sh, st.rank, &key, &[mine])?;
                    cols.push(all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max));
                }
                let name = format!("{}{}", probe.name(), if pdl { ", PDL" } else { "" });
                let _ = write!(table, "{name:<42}");
                for c in &cols {
                    let _ = write!(table, " {c:>9.2}");
                }
                table.push('\n');
            }
        }
        let got = p.counters(s)?;
        // The empty kernel keeps no counter.
        let short: Vec<String> = Probe::ALL
            .iter()
            .zip(got.iter().zip(expected.iter()))
            .skip(1)
            .filter(|(_, (g, e))| g != e)
            .map(|(p, (g, e))| format!("{}: counter {g}, expected {e}", p.name()))
            .collect();
        if st.rank == 0 {
            let modes: Vec<&str> = args.modes.iter().map(|m| m.name()).collect();
            println!(
                "# latency probes: median us per launch, {iters} launches per round, {} rounds",
                args.rounds
            );
            println!(
                "{:<42} {}",
                "probe",
                modes.iter().map(|m| format!("{m:>9}")).collect::<Vec<_>>().join(" ")
            );
            print!("{table}");
        }
        if !short.is_empty() {
            return Err(format!("rank {}: probes did not complete: {}", st.rank, short.join("; ")).into());
        }
        Ok(())
    }

    /// `--probe-bw`: SM copy kernel and copy engine, reading from or writing to the next rank's
    /// memory, with every rank copying at once ("both") and with rank 0 alone ("one"); per size
    /// (`--sizes`, bytes moved per rank and direction), median us per copy of the slowest copying
    /// rank and GB/s per direction. `sm+ce` splits the bytes half and half between the SM kernel
    /// and the copy engine on a second stream, both running at once.
    fn bandwidth_probes(sh: &Shared, st: &RankState) -> BoxResult<()> {
        use symm_ops::symm_cuda::probe::BandwidthProbe;
        let args = &sh.args;
        let max = args.sizes.iter().copied().max().unwrap_or(MIB).div_ceil(4096) * 4096;
        let g = Group::new(format!("{}-probe-bw", sh.run_id), st.rank, st.world, sh.store.clone())?;
        let a = get_allocator(DeviceType::Cuda)?.alloc(2 * max, Device::cuda(st.rank as u32), &g)?;
        let m = a.rendezvous(T_STORE)?;
        let own = m.buffer_ptrs()[st.rank];
        let peer = m.buffer_ptrs()[(st.rank + 1) % st.world];
        let p = BandwidthProbe::new(&st.ctx, st.coll.sm_count())?;
        let side = st.stream.fork()?;
        let s = &st.stream;
        // Source [0, max), destination [max, 2 max) on every rank.
        symm_ops::symm_cuda::driver::mem::memset_d32_async(s, own, 0x3f80_3f80, max / 2)?;
        s.synchronize()?;
        let iters = args.iters.unwrap_or(10);
        let mut table = String::new();
        for &size in &args.sizes {
            let bytes = size.div_ceil(16) * 16;
            let half = (bytes / 2).div_ceil(16) * 16;
            for engine in ["sm", "ce", "sm+ce"] {
                for dir in ["read", "write"] {
                    for who in ["both", "one"] {
                        let active = who == "both" || st.rank == 0;
                        // read: own dst <- peer src; write: peer dst <- own src.
                        let (dst, src) = if dir == "read" {
                            (own + max as u64, peer)
                        } else {
                            (peer + max as u64, own)
                        };
                        let mut run = |_: usize| -> BoxResult<()> {
                            if !active {
                                return Ok(());
                            }
                            match engine {
                                "sm" => p.sm_copy(s, dst, src, bytes)?,
                                "ce" => p.ce_copy(s, dst, src, bytes)?,
                                _ => {
                                    side.join(s)?;
                                    p.ce_copy(&side, dst + half as u64, src + half as u64, bytes - half)?;
                                    p.sm_copy(s, dst, src, half)?;
                                    s.join(&side)?;
                                }
                            }
                            Ok(())
                        };
                        run(0)?;
                        let mut times = time_rounds(st, Mode::Eager, iters, args.rounds, &mut run)?;
                        s.synchronize()?;
                        let mine = if active { median(&mut times) } else { 0.0 };
                        let key = sh.next_key(st.rank, &format!("probe-bw-{size}-{engine}-{dir}-{who}"));
                        let all = gather_f64s(sh, st.rank, &key, &[mine])?;
                        let us = all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max);
                        let _ = writeln!(
                            table,
                            "{:>10} {engine:>6} {dir:>6} {who:>5} {us:>10.2} {:>8.1}",
                            fmt_size(size),
                            bytes as f64 / us / 1e3
                        );
                    }
                }
            }
        }
        if st.rank == 0 {
            println!(
                "# bandwidth probes: median us per copy ({iters} copies per round, {} rounds), GB/s per direction",
                args.rounds
            );
            println!(
                "{:>10} {:>6} {:>6} {:>5} {:>10} {:>8}",
                "size", "engine", "dir", "ranks", "us", "GB/s"
            );
            print!("{table}");
        }
        Ok(())
    }

    fn make_nccl(rank: usize, sh: &Shared, stream: &Arc<CudaStream>) -> BoxResult<Comm> {
        let ex = StoreExchange::new(sh.store.clone(), format!("{}/nccl-id", sh.run_id));
        let id_bytes: Vec<u8> = if rank == 0 {
            let id = catch_unwind(Id::new).map_err(|_| "loading libnccl failed")?;
            let id = id.map_err(|e| format!("ncclGetUniqueId: {:?}", e.0))?;
            id.internal().iter().map(|&c| c as u8).collect()
        } else {
            Vec::new()
        };
        let bytes = ex.broadcast(rank, sh.world, 0, &id_bytes, T_STORE)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(bytes.iter()) {
            *d = *s as std::ffi::c_char;
        }
        let c = catch_unwind(AssertUnwindSafe(|| {
            Comm::from_rank(stream.clone(), rank, sh.world, Id::uninit(internal))
        }))
        .map_err(|_| "loading libnccl failed")?;
        c.map_err(|e| format!("ncclCommInitRank: {:?}", e.0).into())
    }

    /// Buffers of one (op, size) point, in one symmetric arena registered with the collectives.
    struct Arena {
        _mem: Arc<dyn SymmetricMemory>,
        base: u64,
        inputs: Vec<u64>,
        output: u64,
        _staged_input: Option<symm_ops::cudarc::driver::CudaSlice<u8>>,
        staged_ptr: u64,
    }

    fn arena(st: &RankState, g: &Geometry, dtype: DType, need_staged: bool, group: &Arc<Group>) -> BoxResult<Arena> {
        let es = dtype.size();
        let round = |b: usize| b.div_ceil(4096) * 4096;
        let in_b = round(g.in_elems * es);
        let out_b = round(g.out_elems * es);
        let total = K * in_b + out_b;
        let a = get_allocator(DeviceType::Cuda)?.alloc(total, Device::cuda(st.rank as u32), group)?;
        let m = a.rendezvous(T_STORE)?;
        st.coll.register_symmetric(m.clone())?;
        if let Some(c) = &st.comm {
            // auto goes through the Communicator: its zero-copy paths need the arena too.
            c.register_memory(m.clone())?;
        }
        let base = m.buffer_ptrs()[st.rank];
        let inputs: Vec<u64> = (0..K).map(|k| base + (k * in_b) as u64).collect();
        let output = base + (K * in_b) as u64;
        // Input 0 holds this rank's values; the other rotating inputs are copies.
        let data = encode(dtype, g.in_elems, |j| value(st.rank, j));
        htod_sync(&st.stream, inputs[0], &data)?;
        for &p in &inputs[1..] {
            dtod_async(&st.stream, p, inputs[0], g.in_elems * es)?;
        }
        let (staged_input, staged_ptr) = if need_staged {
            let s = st.stream.clone_htod(&data)?;
            let p = {
                let (p, _g) = s.device_ptr(&st.stream);
                p
            };
            (Some(s), p)
        } else {
            (None, 0)
        };
        st.stream.synchronize()?;
        Ok(Arena {
            _mem: m,
            base,
            inputs,
            output,
            _staged_input: staged_input,
            staged_ptr,
        })
    }

    /// One run of algorithm `spec` on rotating input `k`.
    #[allow(clippy::too_many_arguments)]
    fn run_once(
        sh: &Shared,
        st: &RankState,
        op: Op,
        spec: &AlgoSpec,
        tuning: &Tuning,
        g: &Geometry,
        ar: &Arena,
        k: usize,
    ) -> BoxResult<()> {
        let (dtype, redop) = (sh.args.dtype, sh.args.redop);
        let s = &st.stream;
        let input = ar.inputs[k % K];
        let out = ar.output;
        match (op, spec.base.as_str()) {
            (_, "nccl") => {
                let c = st.nccl.as_ref().ok_or_else(|| st.nccl_err.clone())?;
                match dtype {
                    DType::F32 => nccl_run::<f32>(c, op, redop, input, out, g, s),
                    DType::F16 => nccl_run::<half::f16>(c, op, redop, input, out, g, s),
                    _ => nccl_run::<half::bf16>(c, op, redop, input, out, g, s),
                }
            }
            (_, "auto") => {
                let c = st.comm.as_ref().ok_or_else(|| st.comm_err.clone())?;
                let i = RawDevicePtr::new(input, g.in_elems, dtype);
                let o = RawDevicePtr::new(out, g.out_elems, dtype);
                Ok(match op {
                    Op::AllReduce => c.all_reduce_out(i, o, redop),
                    Op::ReduceScatter => c.reduce_scatter_out(i, o, redop),
                    Op::AllGather => c.all_gather_out(i, o),
                }?)
            }
            (Op::AllReduce, "ce_two_shot") => {
                Ok(st.coll.all_reduce_ce_two_shot(s, input, out, g.count, dtype, redop)?)
            }
            (Op::AllReduce, base) => {
                let algo = match base {
                    "lamport" => KAlgo::Lamport,
                    "one_shot" => KAlgo::OneShot,
                    "two_shot" => KAlgo::TwoShot,
                    "pull" => KAlgo::Pull,
                    _ => KAlgo::CopyEngine,
                };
                Ok(st
                    .coll
                    .all_reduce_tuned(s, algo, tuning, input, out, g.count, dtype, redop)?)
            }
            (Op::ReduceScatter, "pull") => Ok(st.coll.reduce_scatter_pull(s, input, out, g.count, dtype, redop)?),
            (Op::ReduceScatter, "copy_engine") => {
                Ok(st.coll.reduce_scatter_ce(s, input, out, g.count, dtype, redop)?)
            }
            (Op::ReduceScatter, base) => {
                let algo = if base == "lamport" {
                    ReduceScatterAlgo::Lamport
                } else {
                    ReduceScatterAlgo::Ring
                };
                Ok(st
                    .coll
                    .reduce_scatter_tuned(s, algo, tuning, input, out, g.count, dtype, redop)?)
            }
            (Op::AllGather, base) => {
                let (path, inp) = match base {
                    "copy_engine" => (AllGatherPath::CopyEngine, input),
                    "pull" => (AllGatherPath::Pull, input),
                    "copy_engine_staged" => (AllGatherPath::CopyEngine, ar.staged_ptr),
                    "lamport" => (AllGatherPath::Lamport, input),
                    _ => (AllGatherPath::Sm, input),
                };
                Ok(st.coll.all_gather_tuned(s, tuning, inp, out, g.count, dtype, path)?)
            }
        }
    }

    /// Measures every algorithm of `op` at `size`; false when the ranks must stop (a timeout or
    /// abort leaves the collectives' protocol state out of step). An algorithm that gave a wrong
    /// result is disabled for the rest of the run (`disabled`), the others go on. Every rank takes
    /// the same decisions (they are gathered).
    fn point(
        sh: &Shared,
        st: &RankState,
        op: Op,
        size: usize,
        rows: &mut Vec<Row>,
        disabled: &mut Vec<(Op, String)>,
    ) -> BoxResult<bool> {
        let args = &sh.args;
        let dtype = args.dtype;
        let g = geometry(op, size, dtype, st.world);
        let specs: Vec<AlgoSpec> = args
            .algos_for(op)
            .into_iter()
            .filter(|s| !disabled.iter().any(|(o, l)| *o == op && *l == s.label))
            // The Lamport buffers bound its message (per peer: one rank's input for all-gather,
            // one shard for reduce-scatter): larger sizes have no Lamport row.
            .filter(|s| s.base != "lamport" || g.count * dtype.size() <= st.coll.lamport_max_bytes())
            // The copy-engine two-shot all-reduce is a two-rank algorithm.
            .filter(|s| s.base != "ce_two_shot" || st.world == 2)
            .collect();
        let need_staged = specs.iter().any(|s| s.base == "copy_engine_staged");
        let ar = arena(st, &g, dtype, need_staged, st.coll.group())?;
        let iters = args.iters_for(g.bytes);
        for spec in &specs {
            sh.progress(
                st.rank,
                op,
                size,
                &format!("{} {} {}", op.name(), fmt_size(g.bytes), spec.label),
            );
            let tuning = tuning_of(spec, &st.coll.config().tuning)?;
            let path = path_of(st, op, spec, &g, dtype, &tuning);
            // ---- correctness first: poisoned output, one op, float64 reference.
            let key = sh.next_key(st.rank, "check");
            let checked: BoxResult<f64> = (|| {
                memset_d32_async(&st.stream, ar.output, 0xFFFF_FFFF, g.out_elems * dtype.size() / 4)?;
                run_once(sh, st, op, spec, &tuning, &g, &ar, 0)?;
                st.stream.synchronize()?;
                st.coll.check_error()?;
                if let Some(c) = &st.comm {
                    c.check_error()?;
                }
                let mut host = vec![0u8; g.out_elems * dtype.size()];
                dtoh_sync(&st.stream, &mut host, ar.output)?;
                Ok(max_error(op, args.redop, dtype, &g, st.rank, st.world, &host))
            })();
            // 0: ok; 1: wrong result or a host-side error; 2: a device wait timed out or aborted.
            let (err, mut note, code) = match checked {
                Ok(e) => (e, String::new(), if e <= tolerance(dtype) { 0.0 } else { 1.0 }),
                Err(e) => {
                    let fatal = e.downcast_ref::<symm_ops::symm_core::Error>().is_some_and(|x| {
                        matches!(
                            x,
                            symm_ops::symm_core::Error::Timeout { .. } | symm_ops::symm_core::Error::Aborted(_)
                        )
                    });
                    (f64::INFINITY, e.to_string(), if fatal { 2.0 } else { 1.0 })
                }
            };
            let ok_here = code == 0.0;
            // Every rank must agree before timing (a failed rank would leave its peers waiting).
            let agree = gather_f64s(sh, st.rank, &key, &[code])?;
            let worst = agree.iter().filter_map(|v| v.first().copied()).fold(0.0f64, f64::max);
            let all_ok = worst == 0.0;
            if !all_ok && note.is_empty() {
                note = if ok_here {
                    "another rank failed the check".into()
                } else {
                    format!("max error {err:.3e} above {:.1e}", tolerance(dtype))
                };
            }
            for &mode in &args.modes {
                let time = if all_ok {
                    match time_mode(sh, st, op, spec, &tuning, &g, &ar, mode, iters) {
                        Ok(t) => t,
                        Err(e) => {
                            note = format!("{} timing failed: {e}", mode.name());
                            f64::NAN
                        }
                    }
                } else {
                    f64::NAN
                };
                let key = sh.next_key(st.rank, "row");
                let ok = all_ok && time.is_finite();
                rows.push(combine(
                    sh,
                    st.rank,
                    &key,
                    op,
                    &g,
                    &spec.label,
                    &path,
                    mode,
                    time,
                    err,
                    ok,
                    &note,
                )?);
            }
            if !all_ok {
                eprintln!(
                    "\nrank {}: {} {} {} failed ({note}); {} disabled for the rest of the run",
                    st.rank,
                    op.name(),
                    fmt_size(g.bytes),
                    spec.label,
                    spec.label
                );
                disabled.push((op, spec.label.clone()));
                if worst >= 2.0 {
                    return Ok(false);
                }
            }
        }
        let base = ar.base;
        drop(ar);
        st.coll.unregister_symmetric(base);
        if let Some(c) = &st.comm {
            c.unregister_memory(base);
        }
        Ok(true)
    }

    /// The algorithm (and, where the Communicator hands the choice to the kernels, the kernel
    /// path) that an `auto` row runs.
    fn path_of(st: &RankState, op: Op, spec: &AlgoSpec, g: &Geometry, dtype: DType, tuning: &Tuning) -> String {
        if let ("auto", Some(c)) = (spec.base.as_str(), st.comm.as_ref()) {
            return match op {
                Op::AllReduce => c.select_all_reduce(g.bytes).to_string(),
                Op::ReduceScatter => match c.select_reduce_scatter(g.bytes) {
                    a @ symm_ops::ReduceScatterAlgo::Symm => {
                        format!("{a}: {}", st.coll.select_reduce_scatter(g.count, dtype).name())
                    }
                    a => a.to_string(),
                },
                Op::AllGather => match c.select_all_gather(g.bytes) {
                    a @ symm_ops::AllGatherAlgo::Sm => {
                        format!("{a}: {}", st.coll.select_all_gather(g.count, dtype).name())
                    }
                    a => a.to_string(),
                },
            };
        }
        match (op, spec.base.as_str()) {
            (Op::AllReduce, "copy_engine") => format!("{:.0}% by copy engine", tuning.ce_fraction * 100.0),
            _ => String::new(),
        }
    }

    /// Median microseconds per op of `iters` back-to-back ops (rotating inputs), over the rounds.
    #[allow(clippy::too_many_arguments)]
    fn time_mode(
        sh: &Shared,
        st: &RankState,
        op: Op,
        spec: &AlgoSpec,
        tuning: &Tuning,
        g: &Geometry,
        ar: &Arena,
        mode: Mode,
        iters: usize,
    ) -> BoxResult<f64> {
        let mut times = time_rounds(st, mode, iters, sh.args.rounds, &mut |i| {
            run_once(sh, st, op, spec, tuning, g, ar, i)
        })?;
        st.coll.check_error()?;
        Ok(median(&mut times))
    }

    /// Microseconds per launch of `iters` back-to-back calls of `launch(i)` on the rank's
    /// stream, one value per round (after one round of warm-up): a host loop (eager) or one
    /// captured CUDA graph replayed (graph). The ranks meet in a barrier before every round.
    pub(super) fn time_rounds(
        st: &RankState,
        mode: Mode,
        iters: usize,
        rounds: usize,
        launch: &mut dyn FnMut(usize) -> BoxResult<()>,
    ) -> BoxResult<Vec<f64>> {
        let s = &st.stream;
        let mut times = Vec::with_capacity(rounds);
        let mut timed = |run: &mut dyn FnMut() -> BoxResult<()>| -> BoxResult<()> {
            for round in 0..=rounds {
                st.coll.barrier(s, &st.all)?;
                st.start.record(s)?;
                run()?;
                st.end.record(s)?;
                let ms = st.start.elapsed_ms(&st.end)?;
                if round > 0 {
                    times.push(ms as f64 * 1e3 / iters as f64);
                }
            }
            Ok(())
        };
        match mode {
            Mode::Eager => timed(&mut || (0..iters).try_for_each(&mut *launch))?,
            Mode::Graph => {
                s.synchronize()?;
                s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                let captured = (0..iters).try_for_each(&mut *launch);
                let graph = s.end_capture(CUgraphInstantiate_flags(0));
                captured?;
                let graph = graph?.ok_or("stream capture gave no graph")?;
                graph.upload()?;
                timed(&mut || Ok(graph.launch()?))?;
                s.synchronize()?;
            }
        }
        let _ = &st.ctx;
        Ok(times)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_args() {
        let d = default_sizes();
        assert_eq!(d.first(), Some(&KIB));
        assert_eq!(d.last(), Some(&(256 * MIB)));
        for s in [4 * KIB, 16 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB] {
            assert!(d.contains(&s), "{s}");
        }
        assert_eq!(parse_size("16K"), Ok(16 * KIB));
        assert_eq!(parse_size("3"), Ok(3));
        assert!(parse_size("0").is_err() && parse_size("x").is_err());
        let a = parse_args(&["--quick".into(), "--algos".into(), "one_shot:chunk=64K,nccl,sm".into()]).unwrap();
        assert_eq!(a.sizes, vec![KIB, 16 * KIB, 64 * KIB]);
        assert_eq!(a.algos_for(Op::AllReduce).len(), 2);
        assert_eq!(a.algos_for(Op::AllGather).len(), 2);
        assert_eq!(a.algos_for(Op::ReduceScatter).len(), 1);
        let a = parse_args(&["--algos".into(), "lamport".into()]).unwrap();
        assert_eq!(
            Op::ALL.map(|o| a.algos_for(o).len()),
            [1, 1, 1],
            "lamport runs for every op"
        );
        assert!(parse_args(&["--algos".into(), "bogus".into()]).is_err());
        assert!(parse_args(&["--algos".into(), "one_shot:foo=1".into()]).is_err());
        let a = parse_args(&["--no-nccl".into()]).unwrap();
        assert!(a.algos_for(Op::AllReduce).iter().all(|s| s.base != "nccl"));
        assert_eq!(a.iters_for(KIB), 100);
        assert_eq!(a.iters_for(256 * MIB), 8);
    }

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn host_default_sweep_stops_at_the_cap() {
        // The cap documented at host_default_cap: the largest default size in one 5 MiB
        // staging chunk of the host engine.
        assert_eq!(host_default_cap(), 4 * MIB);
        let a = parse_args(&[]).unwrap();
        // GPUs (which take args.sizes as parsed) keep the whole default sweep.
        assert_eq!(a.sizes, default_sizes());
        assert_eq!(a.sizes.last(), Some(&(256 * MIB)));
        let (sizes, note) = host_sweep(&a);
        assert_eq!(sizes, vec![KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB]);
        let note = note.expect("the capped sweep says where it stopped");
        assert_eq!(note.lines().count(), 1, "{note}");
        assert!(
            note.contains("stop at 4M") && note.contains("--full runs the whole sweep to 256M"),
            "{note}"
        );
        // --full: the whole sweep, as before.
        let full = parse_args(&argv(&["--full"])).unwrap();
        assert_eq!(host_sweep(&full), (default_sizes(), None));
        // --sizes and --quick: exactly those sizes, nothing said.
        let given = parse_args(&argv(&["--sizes", "1K,64M,512M"])).unwrap();
        assert_eq!(host_sweep(&given), (vec![KIB, 64 * MIB, 512 * MIB], None));
        let quick = parse_args(&argv(&["--quick"])).unwrap();
        assert_eq!(host_sweep(&quick), (vec![KIB, 16 * KIB, 64 * KIB], None));
        // --full with sizes chosen otherwise is a contradiction, said so.
        let e = parse_args(&argv(&["--full", "--sizes", "1K"])).unwrap_err();
        assert!(
            e.starts_with("--full runs the whole default sweep") && e.contains("--sizes"),
            "{e}"
        );
        let e = parse_args(&argv(&["--quick", "--full"])).unwrap_err();
        assert!(e.contains("--quick"), "{e}");
    }

    #[test]
    fn progress_counts_down_and_estimates() {
        let args = parse_args(&[]).unwrap();
        let step = |op, size| args.step(op, size);
        let plan = vec![
            step(Op::AllReduce, KIB),
            step(Op::AllReduce, MIB),
            step(Op::AllGather, KIB),
            step(Op::AllGather, MIB),
        ];
        let (w1k, w1m) = (args.work(KIB), args.work(MIB));
        let secs = Duration::from_secs;
        let t0 = Instant::now();
        let mut p = Progress::new(plan.clone());
        assert_eq!(p.step(plan[0], t0, "a"), "[1/4] a: 4 left");
        // 2 s for all_reduce 1K: the rest scaled by bytes from it.
        let want = 2.0 / w1k * (w1m + w1k + w1m);
        assert_eq!(
            p.step(plan[1], t0 + secs(2), "b"),
            format!("[2/4] b: 3 left, ~{} (estimate)", fmt_secs(want))
        );
        // 10 s for all_reduce 1M: all_gather estimated from all_reduce at the same sizes.
        assert_eq!(p.step(plan[2], t0 + secs(12), "c"), "[3/4] c: 2 left, ~12 s (estimate)");
        // all_gather 1K took half all_reduce's time: its 1M is estimated at half too.
        assert_eq!(p.step(plan[3], t0 + secs(13), "d"), "[4/4] d: 1 left, ~5 s (estimate)");
        assert_eq!(p.summary(t0 + secs(18)).as_deref(), Some("[4/4] done in 18 s"));
        // No estimate from the first second; no summary when nothing ran.
        let mut p = Progress::new(plan.clone());
        p.step(plan[0], t0, "a");
        assert_eq!(p.step(plan[1], t0 + Duration::from_millis(500), "b"), "[2/4] b: 3 left");
        assert_eq!(Progress::new(plan).summary(t0), None);
        // A shorter line blanks out the longer one before it.
        assert_eq!(p.overwrite("abc"), "\rabc");
        assert_eq!(p.overwrite("x"), "\rx  ");
        for (s, want) in [
            (0.4, "0 s"),
            (59.4, "59 s"),
            (65.0, "1 min 05 s"),
            (3725.0, "1 h 02 min"),
            (f64::NAN, "0 s"),
        ] {
            assert_eq!(fmt_secs(s), want);
        }
    }

    #[test]
    fn geometry_and_formulas() {
        let g = geometry(Op::AllGather, 4 * KIB, DType::BF16, 2);
        assert_eq!((g.count, g.in_elems, g.out_elems, g.bytes), (1024, 1024, 2048, 4096));
        let g = geometry(Op::ReduceScatter, 4 * KIB, DType::BF16, 2);
        assert_eq!((g.count, g.in_elems, g.out_elems), (1024, 2048, 1024));
        let r = Row {
            op: Op::AllReduce,
            bytes: 1_000_000,
            count: 0,
            dtype: DType::BF16,
            redop: ReduceOp::Sum,
            algo: "x".into(),
            path: String::new(),
            mode: Mode::Graph,
            time_us: 10.0,
            max_err: 0.0,
            ok: true,
            note: String::new(),
            world: 2,
        };
        assert!((r.algbw() - 100.0).abs() < 1e-9);
        assert!((r.busbw() - 100.0).abs() < 1e-9);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn values_are_exact_and_the_reference_checks() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let b = encode(dtype, 1000, |j| value(1, j));
            for j in 0..1000 {
                assert_eq!(decode_at(dtype, &b, j), value(1, j));
            }
        }
        // A correct all-gather output has zero error; a corrupted one does not.
        let g = geometry(Op::AllGather, 64, DType::F32, 2);
        let good = encode(DType::F32, g.out_elems, |i| value(i / g.count, i % g.count));
        assert_eq!(
            max_error(Op::AllGather, ReduceOp::Sum, DType::F32, &g, 0, 2, &good),
            0.0
        );
        let mut bad = good.clone();
        bad[0] ^= 0x40;
        bad[3] ^= 0x40;
        assert!(max_error(Op::AllGather, ReduceOp::Sum, DType::F32, &g, 0, 2, &bad) > 0.0);
        let g = geometry(Op::AllReduce, 64, DType::F32, 2);
        let sum = encode(DType::F32, g.out_elems, |i| value(0, i) + value(1, i));
        assert_eq!(max_error(Op::AllReduce, ReduceOp::Sum, DType::F32, &g, 0, 2, &sum), 0.0);
    }

    #[test]
    fn json_escapes() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
        assert_eq!(json_num(f64::NAN), "null");
    }
}
