//! symm-bench's command line: the ops, modes and algorithms it runs, and the plan of
//! (op, size) steps.

use clap::{CommandFactory, Parser};

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl Op {
    pub(crate) const ALL: [Op; 3] = [Op::AllReduce, Op::ReduceScatter, Op::AllGather];
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        }
    }
    /// nccl-tests' bus bandwidth factor.
    pub(crate) fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            _ => (n - 1.0) / n,
        }
    }
    /// Algorithms run by default.
    pub(crate) fn default_algos(self) -> &'static [&'static str] {
        match self {
            Op::AllReduce => &[
                "auto",
                "lamport",
                "lamport_two_shot",
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
    /// Algorithms run only when `--algos` names them (all_gather `ring`: the kernel's name in
    /// `symm_core::coll`, the same as `sm`, which earlier results use).
    pub(crate) fn on_request(self) -> &'static [&'static str] {
        match self {
            Op::AllGather => &["copy_engine_staged", "ring"],
            _ => &[],
        }
    }
    pub(crate) fn accepts(self, base: &str) -> bool {
        self.default_algos().contains(&base) || self.on_request().contains(&base)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Eager,
    Graph,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Graph => "graph",
        }
    }
}

/// The tuning parameters an algorithm may carry (`one_shot:chunks_per_block=2`), each setting one
/// field of `symm_cuda::collectives::Tuning`: `chunk` the largest ring chunk (`max_chunk_bytes`),
/// `minchunk` the smallest (`min_chunk_bytes`), `chunks_per_block`, `blocks` (`max_blocks`),
/// `threads`, `ce_fraction` and `ce_chunk` (`ce_chunk_bytes`). Sizes take suffixes (`64K`).
pub(crate) const TUNING_KEYS: [&str; 7] = [
    "chunk",
    "minchunk",
    "chunks_per_block",
    "blocks",
    "threads",
    "ce_fraction",
    "ce_chunk",
];

/// An algorithm as given on the command line: base name plus tuning parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AlgoSpec {
    pub(crate) label: String,
    pub(crate) base: String,
    pub(crate) params: Vec<(String, String)>,
}

impl AlgoSpec {
    pub(crate) fn parse(s: &str) -> Result<AlgoSpec, String> {
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
            if !TUNING_KEYS.contains(&k) {
                return Err(format!(
                    "unknown algorithm parameter {k:?} in {s:?} (the parameters: {})",
                    TUNING_KEYS.join(", ")
                ));
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
pub(crate) struct Args {
    pub(crate) ops: Vec<Op>,
    pub(crate) sizes: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) redop: ReduceOp,
    pub(crate) iters: Option<usize>,
    pub(crate) rounds: usize,
    pub(crate) modes: Vec<Mode>,
    pub(crate) algos: Option<Vec<AlgoSpec>>,
    pub(crate) ranks: Option<usize>,
    pub(crate) staging: usize,
    /// Lamport buffer size (largest Lamport message) of the explicit kernels' collectives.
    pub(crate) lamport_bytes: Option<usize>,
    pub(crate) json: Option<PathBuf>,
    pub(crate) quick: bool,
    /// `--full`: the whole default sweep on the host backend too (see `host_default_cap`).
    pub(crate) full: bool,
    /// The sizes are the default sweep (neither `--sizes` nor `--quick` chose them).
    pub(crate) default_sweep: bool,
    pub(crate) nccl: bool,
    pub(crate) setup: bool,
    /// Run the latency probes (symm_cuda::probe) instead of the collectives.
    pub(crate) probe: bool,
    /// Run the bandwidth probes (SM and copy-engine copies to and from the peer) instead.
    pub(crate) probe_bw: bool,
    /// `--skew-us N`: rank 0 runs a kernel of N microseconds before every op (a late rank, as a
    /// GEMM's skew makes one in a model layer; the times include it).
    pub(crate) skew_us: u64,
    /// `--ops ar_rms_norm`: the all-reduce epilogue table (symm-bench/epilogue.rs).
    pub(crate) epilogue: bool,
    /// Its row lengths (`--hidden`) and row counts (`--tokens`).
    pub(crate) hiddens: Vec<usize>,
    pub(crate) tokens: Vec<usize>,
}

pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
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
pub(crate) fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad count {s:?}"))
}

/// 1K..256M: powers of 4 plus 1M, 4M, 16M, 64M, 256M.
pub(crate) fn default_sizes() -> Vec<usize> {
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
pub(crate) fn host_default_cap() -> usize {
    let chunk = symm_ops::DEFAULT_STAGING_BYTES / 2;
    default_sizes().into_iter().filter(|&s| s <= chunk).max().unwrap_or(KIB)
}

/// The sizes the host backend runs, and the one line saying where the default sweep stopped
/// (when it did): the default sweep stops at `host_default_cap` unless `--full`; sizes from
/// `--sizes` or `--quick` run as given.
pub(crate) fn host_sweep(args: &Args) -> (Vec<usize>, Option<String>) {
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

/// A comma-separated list (`--sizes 64K,1M`): every item parsed by the option's item parser,
/// the whole list replacing the default (given twice, the last one counts).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct List<T>(pub(crate) Vec<T>);

/// The value parser of a comma-separated list of what `item` parses.
fn list<T>(item: fn(&str) -> Result<T, String>) -> impl Fn(&str) -> Result<List<T>, String> + Clone {
    move |s: &str| s.split(',').map(item).collect::<Result<_, _>>().map(List)
}

/// `--ops`: the collectives, and whether `ar_rms_norm` (the epilogue table) was named with them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpList {
    ops: Vec<Op>,
    epilogue: bool,
}

fn parse_ops(v: &str) -> Result<OpList, String> {
    // `ar_rms_norm`: the all-reduce epilogue table (symm-bench/epilogue.rs).
    let epilogue = v.split(',').any(|s| s.trim() == "ar_rms_norm");
    let ops = v
        .split(',')
        .filter(|s| s.trim() != "ar_rms_norm")
        .map(|s| {
            Op::ALL
                .into_iter()
                .find(|o| o.name() == s.trim())
                .ok_or_else(|| format!("unknown op {s:?}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(OpList { ops, epilogue })
}

fn parse_dtype(v: &str) -> Result<DType, String> {
    match v {
        "bf16" => Ok(DType::BF16),
        "f16" | "fp16" => Ok(DType::F16),
        "f32" | "fp32" => Ok(DType::F32),
        o => Err(format!("unsupported dtype {o:?}")),
    }
}

fn parse_redop(v: &str) -> Result<ReduceOp, String> {
    ReduceOp::ALL
        .into_iter()
        .find(|o| o.name() == v)
        .ok_or_else(|| format!("unknown redop {v:?}"))
}

fn parse_mode(m: &str) -> Result<Mode, String> {
    match m.trim() {
        "eager" => Ok(Mode::Eager),
        "graph" => Ok(Mode::Graph),
        o => Err(format!("unknown mode {o:?}")),
    }
}

/// What `--help` says after the options: the algorithms of every op and the tuning keys.
fn algorithms_help() -> String {
    let mut s = String::from("Algorithms (--algos NAME[:KEY=VALUE...],...):\n");
    for op in Op::ALL {
        let _ = write!(s, "  {:<15} {}", op.name(), op.default_algos().join(" "));
        if !op.on_request().is_empty() {
            let _ = write!(s, " (only when named: {})", op.on_request().join(" "));
        }
        s.push('\n');
    }
    let _ = write!(
        s,
        "Tuning keys: {} (sizes take K/M/G, e.g. one_shot:chunk=64K:chunks_per_block=2,copy_engine:ce_fraction=0.5:ce_chunk=8M)",
        TUNING_KEYS.join(", ")
    );
    s
}

/// symm-bench's command line as clap parses it; [`Cli::into_args`] makes the [`Args`] the
/// benchmark runs (defaults, `--quick`, and the checks across options).
#[derive(Debug, Parser)]
#[command(
    name = "symm-bench",
    about = "nccl-tests style benchmark of symm's collectives against NCCL (GPUs when present, the host backend otherwise)",
    after_help = algorithms_help(),
    args_override_self = true
)]
pub(crate) struct Cli {
    /// Ops to run: all_reduce, reduce_scatter, all_gather; ar_rms_norm (with or instead of them):
    /// all-reduce + residual + RMSNorm, fused against unfused, for every --hidden and --tokens (CUDA only)
    #[arg(long, value_name = "LIST", value_parser = parse_ops, default_value = "all_reduce,reduce_scatter,all_gather")]
    ops: OpList,
    /// Message sizes in bytes (K/M/G suffixes) [default: 1K..256M; on the host backend to 4M unless --full]
    #[arg(long, value_name = "LIST", value_parser = list(parse_size))]
    sizes: Option<List<usize>>,
    /// Element type: bf16, f16 (fp16) or f32 (fp32)
    #[arg(long, value_name = "TYPE", value_parser = parse_dtype, default_value = "bf16")]
    dtype: DType,
    /// Reduction: sum, avg, max or min
    #[arg(long, value_name = "OP", value_parser = parse_redop, default_value = "sum")]
    redop: ReduceOp,
    /// Ops per timed round [default: 2 GiB per round over the size, 5 to 100; 10 with --quick]
    #[arg(long, value_name = "N")]
    iters: Option<usize>,
    /// Timed rounds (the median is reported) [default: 15; at most 5 with --quick]
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Modes: eager (a host loop of launches), graph (CUDA graph replay)
    #[arg(long, value_name = "LIST", value_parser = list(parse_mode), default_value = "eager,graph")]
    modes: List<Mode>,
    /// Algorithms, each with optional tuning (NAME[:KEY=VALUE...], see below) [default: every
    /// algorithm of each op]
    #[arg(long, value_name = "LIST", value_parser = list(AlgoSpec::parse))]
    algos: Option<List<AlgoSpec>>,
    /// Ranks (one per GPU) [default: every GPU; 2 on the host backend]
    #[arg(long, value_name = "N")]
    ranks: Option<usize>,
    /// Staging bytes of the communicators
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "10M")]
    staging: usize,
    /// Lamport buffer size (largest Lamport message) of the explicit kernels' collectives
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    lamport_bytes: Option<usize>,
    /// Write the results there as JSON (--ops ar_rms_norm: also PATH with the extension
    /// .ar_rms_norm.json)
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Short run (sizes 1K,16K,64K unless --sizes, 10 iterations, at most 5 rounds)
    #[arg(long)]
    quick: bool,
    /// The whole default sweep on the host backend too (to 256M)
    #[arg(long)]
    full: bool,
    /// No NCCL rows
    #[arg(long)]
    no_nccl: bool,
    /// No setup costs (collectives, communicator, symmetric allocation)
    #[arg(long)]
    no_setup: bool,
    /// Run the latency probes instead of the collectives (CUDA only)
    #[arg(long)]
    probe: bool,
    /// Run the bandwidth probes (SM and copy-engine copies to and from the peer) instead (CUDA only)
    #[arg(long)]
    probe_bw: bool,
    /// Row lengths of --ops ar_rms_norm
    #[arg(long, value_name = "LIST", value_parser = list(parse_count), default_value = "4096,8192")]
    hidden: List<usize>,
    /// Row counts of --ops ar_rms_norm
    #[arg(long, value_name = "LIST", value_parser = list(parse_count), default_value = "1,8,32,128,512")]
    tokens: List<usize>,
    /// Rank 0 runs an N-microsecond kernel before every op (the times include it; CUDA only)
    #[arg(long, value_name = "N", default_value_t = 0)]
    skew_us: u64,
}

impl Cli {
    /// The [`Args`] this command line asks for; an error where options contradict each other.
    pub(crate) fn into_args(self) -> Result<Args, String> {
        let sizes_given = self.sizes.is_some();
        if self.full && (sizes_given || self.quick) {
            return Err(format!(
                "--full runs the whole default sweep; it does not go with {} (which {} the sizes)\n{}",
                if sizes_given { "--sizes" } else { "--quick" },
                if sizes_given { "sets" } else { "shortens" },
                Cli::command().render_usage()
            ));
        }
        let mut a = Args {
            ops: self.ops.ops,
            sizes: match self.sizes {
                Some(List(s)) => s,
                None if self.quick => vec![KIB, 16 * KIB, 64 * KIB],
                None => default_sizes(),
            },
            dtype: self.dtype,
            redop: self.redop,
            iters: self.iters,
            rounds: self.rounds.unwrap_or(15),
            modes: self.modes.0,
            algos: self.algos.map(|l| l.0),
            ranks: self.ranks,
            staging: self.staging,
            lamport_bytes: self.lamport_bytes,
            json: self.json,
            quick: self.quick,
            full: self.full,
            default_sweep: !sizes_given && !self.quick,
            nccl: !self.no_nccl,
            setup: !self.no_setup,
            probe: self.probe,
            probe_bw: self.probe_bw,
            skew_us: self.skew_us,
            epilogue: self.ops.epilogue,
            hiddens: self.hidden.0,
            tokens: self.tokens.0,
        };
        if a.quick && a.iters.is_none() {
            a.iters = Some(10);
            a.rounds = a.rounds.min(5);
        }
        if a.rounds == 0 || a.iters == Some(0) {
            return Err("--rounds and --iters must be positive".into());
        }
        Ok(a)
    }
}

/// Parses symm-bench's arguments (`argv` without the program name) as `main` does; the error
/// is clap's message (or `--help`'s text) or [`Cli::into_args`]'s.
#[cfg(test)]
pub(crate) fn parse_args(argv: &[String]) -> Result<Args, String> {
    let argv = std::iter::once("symm-bench").chain(argv.iter().map(String::as_str));
    Cli::try_parse_from(argv)
        .map_err(|e| e.render().to_string())?
        .into_args()
}

impl Args {
    pub(crate) fn algos_for(&self, op: Op) -> Vec<AlgoSpec> {
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
    pub(crate) fn iters_for(&self, bytes: usize) -> usize {
        self.iters.unwrap_or_else(|| (2048 * MIB / bytes.max(1)).clamp(5, 100))
    }
    /// Bytes one row of `bytes` moves: the checked op, a warm-up round and the timed rounds (the
    /// progress line's estimate takes a row's time as proportional to it).
    pub(crate) fn work(&self, bytes: usize) -> f64 {
        ((self.rounds as f64 + 1.0) * self.iters_for(bytes) as f64 + 1.0) * bytes as f64
    }
    /// The progress step of `op` at `size`.
    pub(crate) fn step(&self, op: Op, size: usize) -> Step {
        Step {
            op,
            size,
            work: self.work(size),
        }
    }
    /// The (op, size) of every progress step, in the order they run: each op's sizes, each
    /// repeated for the `algos(op)` algorithms that run it.
    pub(crate) fn plan(&self, algos: impl Fn(Op) -> usize) -> Vec<(Op, usize)> {
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
