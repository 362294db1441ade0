//! `--ops ar_rms_norm`: all-reduce + residual + RMSNorm (#19, NOTE [fused-epilogue]) as a
//! tensor-parallel layer runs it, bf16/f16/f32 (`--dtype`), hidden `--hidden` (default 4096,8192)
//! and tokens `--tokens` (default 1,8,32,128,512), eager and CUDA-graph replay:
//! - `fused`: the Lamport one-shot with the epilogue in the same kernel (where it fits);
//! - `symm+norm`: the all-reduce the planner picks for the size, then the epilogue kernel;
//! - `lamport+norm`: the Lamport all-reduce, then the epilogue kernel (the unfused twin of
//!   `fused`);
//! - `nccl+norm`: NCCL's all-reduce, then the same epilogue kernel;
//! - `auto`: what `Communicator::all_reduce_residual_rms_norm` runs.
//!
//! Before timing, every row's outputs are compared: the symm rows bitwise with `auto`, the NCCL
//! row within four units of roundoff of it (another summation order). Rank 0 prints the table
//! (median us per op of the slowest rank, and each row's time over `symm+norm`'s) and appends
//! the rows to `--json` with the extension `.ar_rms_norm.json`.

use symm_ops::symm_cuda::trace;
use symm_ops::{AllReduceAlgo, CommConfig, Communicator, EpilogueAlgo, RmsNorm, SymmBuffer};

use crate::gpu::{time_rounds, RankState, K};
use serde::Serialize;

use crate::{fmt_size, gather_f64s, median, BoxResult, DType, Group, Shared};

/// One row of the table in `--json`'s `.ar_rms_norm.json` (NaN times and ratios are `null`).
#[derive(Debug, Serialize)]
struct Record {
    op: &'static str,
    dtype: &'static str,
    world: usize,
    hidden: usize,
    tokens: usize,
    bytes: usize,
    algo: &'static str,
    path: String,
    mode: &'static str,
    time_us: f64,
    over_unfused: f64,
}

/// One timed configuration.
#[derive(Clone, Copy)]
struct Variant {
    label: &'static str,
    algo: EpilogueAlgo,
}

fn variants(comm: &Communicator, (hidden, tokens): (usize, usize), dtype: DType, nccl: bool) -> Vec<Variant> {
    let bytes = hidden * tokens * dtype.size();
    let planned = match comm.select_epilogue(tokens, hidden, dtype) {
        EpilogueAlgo::Separate(a) => a,
        _ => comm.select_all_reduce(bytes),
    };
    let mut v = vec![Variant {
        label: "auto",
        algo: EpilogueAlgo::Auto,
    }];
    let fits = comm.world_size() == 1 || bytes <= comm.thresholds().lamport_max_bytes;
    if fits {
        v.push(Variant {
            label: "fused",
            algo: EpilogueAlgo::Fused,
        });
        v.push(Variant {
            label: "lamport+norm",
            algo: EpilogueAlgo::Separate(AllReduceAlgo::Lamport),
        });
    }
    if planned != AllReduceAlgo::Lamport && planned != AllReduceAlgo::Nccl {
        v.push(Variant {
            label: "symm+norm",
            algo: EpilogueAlgo::Separate(planned),
        });
    } else if !fits {
        v.push(Variant {
            label: "symm+norm",
            algo: EpilogueAlgo::Separate(AllReduceAlgo::TwoShot),
        });
    }
    if nccl {
        v.push(Variant {
            label: "nccl+norm",
            algo: EpilogueAlgo::Separate(AllReduceAlgo::Nccl),
        });
    }
    v
}

/// Buffers of one (hidden, tokens) point: `K` inputs to rotate, the residual, the weight, two
/// outputs.
struct Bufs<T: symm_ops::Element> {
    xs: Vec<SymmBuffer<T>>,
    res: SymmBuffer<T>,
    weight: SymmBuffer<T>,
    norm_out: SymmBuffer<T>,
    res_out: SymmBuffer<T>,
}

fn val(rank: usize, i: usize, salt: usize) -> f32 {
    (((i * 7 + rank * 13 + salt * 5) % 17) as f32 - 8.0) / 8.0
}

fn bufs<T: symm_ops::Element>(comm: &Communicator, hidden: usize, tokens: usize) -> BoxResult<Bufs<T>> {
    let n = hidden * tokens;
    let r = comm.rank().get();
    let host = |salt: usize, len: usize| -> Vec<T> { (0..len).map(|i| T::from_f32(val(r, i, salt))).collect() };
    let mut xs = Vec::with_capacity(K);
    for k in 0..K {
        let b = comm.alloc::<T>(n)?;
        b.copy_from_host(&host(k, n))?;
        xs.push(b);
    }
    let res = comm.alloc::<T>(n)?;
    // The residual and the weight are the same on every rank.
    res.copy_from_host(&(0..n).map(|i| T::from_f32(val(0, i, 40))).collect::<Vec<T>>())?;
    let weight = comm.alloc::<T>(hidden)?;
    weight.copy_from_host(
        &(0..hidden)
            .map(|i| T::from_f32(1.0 + val(0, i, 41) / 4.0))
            .collect::<Vec<T>>(),
    )?;
    Ok(Bufs {
        xs,
        res,
        weight,
        norm_out: comm.alloc::<T>(n)?,
        res_out: comm.alloc::<T>(n)?,
    })
}

fn run_op<T: symm_ops::Element>(comm: &Communicator, b: &mut Bufs<T>, algo: EpilogueAlgo, k: usize) -> BoxResult<()> {
    let Bufs {
        xs,
        res,
        weight,
        norm_out,
        res_out,
    } = b;
    comm.ops().all_reduce_residual_rms_norm_with(
        algo,
        &xs[k % K],
        &*res,
        RmsNorm::new(&*weight, 1e-5),
        norm_out,
        res_out,
    )?;
    Ok(())
}

/// 0: bitwise equal to `base`; else the largest difference in units of roundoff of |base|.
fn compare<T: symm_ops::Element>(got: &[T], base: &[T]) -> f64 {
    let u = T::DTYPE.unit_roundoff();
    got.iter()
        .zip(base)
        .map(|(g, b)| {
            let (g, b) = (g.to_f32() as f64, b.to_f32() as f64);
            if g.to_bits() == b.to_bits() {
                0.0
            } else if g.is_nan() || b.is_nan() {
                f64::INFINITY
            } else {
                (g - b).abs() / (u * b.abs().max(1e-3))
            }
        })
        .fold(0.0, f64::max)
}

fn point<T: symm_ops::Element>(
    sh: &Shared,
    st: &RankState,
    comm: &Communicator,
    nccl: bool,
    (hidden, tokens): (usize, usize),
    out: &mut Vec<Record>,
) -> BoxResult<()> {
    let args = &sh.args;
    let n = hidden * tokens;
    let bytes = n * T::DTYPE.size();
    let mut b = bufs::<T>(comm, hidden, tokens)?;
    let vs = variants(comm, (hidden, tokens), T::DTYPE, nccl);
    let iters = args.iters.unwrap_or(100);
    let mut base: Option<(Vec<T>, Vec<T>)> = None;
    let mut times: Vec<(Variant, Vec<f64>)> = Vec::new();
    for v in &vs {
        // Correctness first: poisoned outputs, one op, compared with auto. (The buffers' host
        // copies run on the memory's own stream: the op stream is drained around them.)
        st.stream.synchronize()?;
        b.norm_out.copy_from_host(&vec![T::from_f32(f32::NAN); n])?;
        b.res_out.copy_from_host(&vec![T::from_f32(f32::NAN); n])?;
        run_op(comm, &mut b, v.algo, 0)?;
        st.stream.synchronize()?;
        let got = (b.norm_out.to_host()?, b.res_out.to_host()?);
        let err = match &base {
            None => {
                let e = if got.0.iter().chain(&got.1).any(|x| x.to_f32().is_nan()) {
                    f64::INFINITY
                } else {
                    0.0
                };
                base = Some(got);
                e
            }
            Some(bs) => compare(&got.0, &bs.0).max(compare(&got.1, &bs.1)),
        };
        let limit = if v.algo == EpilogueAlgo::Separate(AllReduceAlgo::Nccl) {
            4.0
        } else {
            0.0
        };
        let key = sh.next_key(st.rank, "epi-check");
        let all = gather_f64s(sh, st.rank, &key, &[err])?;
        let worst = all.iter().filter_map(|e| e.first().copied()).fold(0.0, f64::max);
        if worst > limit {
            return Err(format!(
                "ar_rms_norm hidden {hidden} tokens {tokens} {}: outputs differ from auto by {worst:.2} units of \
                 roundoff (limit {limit})",
                v.label
            )
            .into());
        }
        let mut per_mode = Vec::new();
        for &mode in &args.modes {
            // SYMM_TRACE=1: drop what ran before, print this rank's kernel phases after.
            let ctx = st.stream.context();
            trace::take(ctx)?;
            let mut t = time_rounds(st, mode, iters, args.rounds, &mut |i| run_op(comm, &mut b, v.algo, i))?;
            comm.check_error()?;
            print_trace(
                st.rank,
                &format!("{hidden} x {tokens} {} {}", v.label, mode.name()),
                &trace::take(ctx)?,
            );
            let key = sh.next_key(st.rank, "epi-time");
            let all = gather_f64s(sh, st.rank, &key, &[median(&mut t)])?;
            per_mode.push(all.iter().filter_map(|e| e.first().copied()).fold(0.0, f64::max));
        }
        times.push((*v, per_mode));
    }
    if st.rank == 0 {
        let unfused = times
            .iter()
            .find(|(v, _)| v.label == "symm+norm" || v.label == "lamport+norm");
        for (v, per_mode) in &times {
            for (mi, &mode) in args.modes.iter().enumerate() {
                let t = per_mode[mi];
                let ratio = unfused.map_or(f64::NAN, |(_, u)| t / u[mi]);
                let line = format!(
                    "{:>6} {:>6} {:>9} {:>13} {:>6} {:>9.2} {:>8.2}",
                    hidden,
                    tokens,
                    fmt_size(bytes),
                    v.label,
                    mode.name(),
                    t,
                    ratio
                );
                println!("{line}");
                out.push(Record {
                    op: "ar_rms_norm",
                    dtype: T::DTYPE.name(),
                    world: st.world,
                    hidden,
                    tokens,
                    bytes,
                    algo: v.label,
                    path: format!("{:?}", v.algo),
                    mode: mode.name(),
                    time_us: t,
                    over_unfused: ratio,
                });
            }
        }
    }
    Ok(())
}

/// With `SYMM_TRACE=1` (symm-cuda's NOTE [device-trace]): this rank's phases of each kernel kind
/// of one timed variant, medians in us (one line per kind; nothing without records).
fn print_trace(rank: usize, what: &str, records: &[trace::TraceRecord]) {
    // The phases are one rank's: ranks sharing a GPU share its context and its records.
    let mut ws: Vec<u64> = records.iter().filter(|r| r.exchanges()).map(|r| r.ws).collect();
    ws.sort_unstable();
    ws.dedup();
    if ws.len() > 1 {
        println!("trace r{rank} {what}: ranks share this GPU's records; the phases need one rank per GPU");
        return;
    }
    for p in trace::phases_by_kind(records) {
        println!(
            "trace r{rank} {what:<28} kind {} n {:>5} pdl {:>6.2} push {:>6.2} wait {:>6.2} tail {:>6.2} \
             kernel {:>6.2} gap {:>6.2}",
            p.kind, p.launches, p.pdl, p.push, p.wait, p.tail, p.kernel, p.gap
        );
    }
    // The pair's blocks, us from the all-reduce's start (bench-notes round 25).
    if let Some(h) = trace::handoff_timeline(records) {
        println!(
            "handoff r{rank} {what:<28} ops {:>4} blocks {:>3} entry {:>5.2}..{:>5.2} sums {:>5.2}..{:>5.2} \
             ar_exit {:>5.2} ar_last {:>5.2} epilogue {:>5.2} end {:>5.2} next {:>5.2} period {:>5.2}",
            h.ops,
            h.blocks,
            h.entry_first,
            h.entry_last,
            h.sums_first,
            h.sums_last,
            h.ar_exit,
            h.ar_last,
            h.epilogue,
            h.end,
            h.next,
            h.period
        );
    }
}

/// The `--ops ar_rms_norm` table on this rank; rank 0 prints it and writes `--json`.
pub(crate) fn run(sh: &Shared, st: &RankState, nccl_ok: bool) -> BoxResult<()> {
    let args = &sh.args;
    let g = Group::new(format!("{}-epilogue", sh.run_id), st.rank, st.world, sh.store.clone())?;
    let cfg = CommConfig::default()
        .with_staging_bytes(args.staging)
        .with_nccl(nccl_ok);
    let comm = Communicator::with_stream(&g, st.stream.clone(), cfg)?;
    let nccl = comm.has_nccl();
    if st.rank == 0 {
        println!(
            "\nar_rms_norm ({}, world {}, median us per op of the slowest rank; ratio: over the unfused \
             symm row, symm+norm where it runs, else lamport+norm)",
            args.dtype, st.world
        );
        println!(
            "{:>6} {:>6} {:>9} {:>13} {:>6} {:>9} {:>8}",
            "hidden", "tokens", "bytes", "algo", "mode", "us", "ratio"
        );
    }
    let mut json = Vec::new();
    for &hidden in &args.hiddens {
        for &tokens in &args.tokens {
            let p = (hidden, tokens);
            match args.dtype {
                DType::F32 => point::<f32>(sh, st, &comm, nccl, p, &mut json)?,
                DType::F16 => point::<half::f16>(sh, st, &comm, nccl, p, &mut json)?,
                _ => point::<half::bf16>(sh, st, &comm, nccl, p, &mut json)?,
            }
        }
    }
    if let (0, Some(json_path)) = (st.rank, &args.json) {
        // Beside the collectives' JSON: `X.json` -> `X.ar_rms_norm.json`.
        let path = json_path.with_extension("ar_rms_norm.json");
        let mut text = serde_json::to_string_pretty(&json)?;
        text.push('\n');
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
