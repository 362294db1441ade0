//! # tp-layer: a tensor-parallel Llama decoder layer on symm, against the same layer on NCCL
//!
//! Each rank runs, on its own stream and in bf16, what an inference engine's worker runs per
//! layer: QKV GEMM (column-parallel) -> rotary embedding -> decode attention over a KV cache ->
//! O GEMM (row-parallel) -> all-reduce + residual + RMSNorm -> gate/up GEMM (column-parallel)
//! -> SiLU x up -> down GEMM (row-parallel) -> all-reduce + residual + the next layer's RMSNorm.
//! GEMMs are cuBLAS through cudarc; the other kernels are NVRTC-compiled (`kernels.cu`);
//! the collectives are symm-ops ops on activations from `Communicator::alloc`. Weights are
//! random from a fixed seed, identical at every TP (model.rs).
//!
//! Communication modes (`--modes`): `nccl` (NCCL all-reduce + the separate residual/norm
//! kernel), `symm` (symm's all-reduce + the same kernel), `fused` (one kernel), `auto` (what
//! the op picks), `barrier` (a signal-pad barrier where each all-reduce was, then the separate
//! kernel: not the layer; its time over `none` is the ranks' skew plus one synchronisation).
//! `none` (no collective) runs by itself: at TP 1 it is the layer, above it the compute floor
//! behind the `coll%` column. With `SYMM_TRACE=1` in the environment (symm-cuda's NOTE
//! [device-trace]) every timed symm run also prints the Lamport kernels' timeline inside the
//! layer (trace.rs).
//!
//! Every configuration is checked before it is timed: the TP = t output against the TP = 1
//! output within NOTE [tp-tolerance], every rank's output bit for bit against rank 0's, and
//! TP 1 against a float64 CPU reference (reference.rs; the `tiny` layer at every token count up
//! to 32 and KV 1, 37 and 300, the real models at their smallest). A failed check stops the run
//! and prints the worst element.
//! TP sizes over the GPU count run with ranks sharing GPU 0: checked, not timed, no NCCL.
//! symm's kernels run with programmatic dependent launch unless `SYMM_PDL=0` (CommConfig::pdl).
//!
//! `cargo xtask bench --tp-layer [args]` runs it and plots the JSON; alone:
//! `cargo run --release -p symm-ops --example tp-layer -- [args]` (`--help`).

mod gpu;
mod group;
mod model;
mod rank;
mod reference;
mod report;
mod trace;

use std::process::ExitCode;

use model::{Diff, Shape, TINY};
use rank::{Exec, Mode};
use report::Row;

pub type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const USAGE: &str = "usage: tp-layer [options]
  --models 8b,70b          layer shapes (Llama-3-8B, Llama-3-70B)
  --tokens 1,8,32,128      new tokens per step
  --kv 1024,4096           cached positions before the step
  --tp 1,2,4,8             tensor-parallel sizes (over the GPU count: ranks share GPU 0, checked only)
  --modes nccl,symm,fused,auto
                           communication modes besides `none` (always run); also `barrier`
  --exec graph,eager       timed executions
  --layers 4               layers per CUDA graph (and per eager round)
  --rounds 7               timed rounds (median reported; the modes' rounds interleave)
  --seed 1                 weight seed
  --no-tiny                skip the float64 reference checks of the tiny layer
  --quick                  8b, tokens 1,8, kv 1024, tp 1,2, 3 rounds
  --json FILE              write the rows as JSON
  --compile-only [--arch sm_90]
                           NVRTC-compile kernels.cu and exit (no GPU needed)";

#[derive(Clone, Debug)]
struct Args {
    models: Vec<Shape>,
    tokens: Vec<usize>,
    kv: Vec<usize>,
    tp: Vec<usize>,
    modes: Vec<Mode>,
    execs: Vec<Exec>,
    layers: usize,
    rounds: usize,
    seed: u64,
    tiny: bool,
    json: Option<String>,
    compile_only: Option<String>,
}

fn list<T>(v: &str, f: impl Fn(&str) -> Option<T>) -> Res<Vec<T>> {
    v.split(',')
        .map(|x| f(x.trim()).ok_or_else(|| format!("bad value {x:?}").into()))
        .collect()
}

fn parse(args: &[String]) -> Res<Args> {
    let mut a = Args {
        models: vec![model::LLAMA3_8B, model::LLAMA3_70B],
        tokens: vec![1, 8, 32, 128],
        kv: vec![1024, 4096],
        tp: vec![1, 2, 4, 8],
        modes: vec![Mode::Nccl, Mode::Symm, Mode::Fused, Mode::Auto],
        execs: vec![Exec::Graph, Exec::Eager],
        layers: 4,
        rounds: 7,
        seed: 1,
        tiny: true,
        json: None,
        compile_only: None,
    };
    let mut it = args.iter();
    let num = |v: &str| v.parse::<usize>().ok().filter(|&n| n > 0);
    while let Some(k) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--models" => a.models = list(&val()?, Shape::by_name)?,
            "--tokens" => a.tokens = list(&val()?, num)?,
            "--kv" => a.kv = list(&val()?, num)?,
            "--tp" => a.tp = list(&val()?, num)?,
            "--modes" => {
                a.modes = list(&val()?, Mode::parse)?
                    .into_iter()
                    .filter(|m| *m != Mode::None)
                    .collect()
            }
            "--exec" => {
                a.execs = list(&val()?, |e| match e {
                    "graph" => Some(Exec::Graph),
                    "eager" => Some(Exec::Eager),
                    _ => None,
                })?
            }
            "--layers" => a.layers = num(&val()?).ok_or("--layers: a positive number")?,
            "--rounds" => a.rounds = num(&val()?).ok_or("--rounds: a positive number")?,
            "--seed" => a.seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--no-tiny" => a.tiny = false,
            "--json" => a.json = Some(val()?),
            "--quick" => {
                a.models = vec![model::LLAMA3_8B];
                a.tokens = vec![1, 8];
                a.kv = vec![1024];
                a.tp = vec![1, 2];
                a.rounds = 3;
            }
            "--compile-only" => a.compile_only = Some(a.compile_only.unwrap_or_else(|| "sm_90".into())),
            "--arch" => a.compile_only = Some(val()?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
        }
    }
    for s in &a.models {
        for &t in &a.tp {
            s.check_tp(t)?;
        }
    }
    let lmax = a.kv.iter().max().copied().unwrap_or(0) + a.tokens.iter().max().copied().unwrap_or(0);
    if lmax > model::CACHE_STRIDE {
        return Err(format!("--kv plus --tokens up to {}, not {lmax}", model::CACHE_STRIDE).into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(arch) = &a.compile_only {
        return match gpu::compile(arch) {
            Ok(bytes) => {
                println!("tp-layer: kernels.cu compiled for {arch} ({bytes} bytes of PTX and CUBIN)");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tp-layer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // Ranks sharing a GPU need more hardware queues than the driver's default of 8 (NOTE
    // [shared-device]), and CUDA reads the variable when it starts: the program sets it before
    // its first CUDA call, unless the user chose a value.
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    }
    // Never NVLink SHARP / multicast (docs/architecture.md); NCCL reads it at its first init.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    symm_ops::link();
    let gpus = match symm_ops::symm_cuda::cuda_available() {
        Ok(n) => n,
        Err(e) => {
            eprintln!(
                "tp-layer: no CUDA GPU here ({e}); the layer needs at least one (ranks beyond the \
                 GPU count share GPU 0). Nothing was run."
            );
            return ExitCode::from(2);
        }
    };
    match run(&a, gpus) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tp-layer: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args, gpus: usize) -> Res {
    let ctx0 = group::contexts(&[0])?.remove(0);
    let device = ctx0.name()?;
    let arch = symm_ops::symm_cuda::kernels::arch_of(&ctx0)?;
    gpu::compile(&arch)?;
    eprintln!("tp-layer: {gpus} x {device} ({arch}); kernels compiled");
    let mut rows: Vec<Row> = Vec::new();
    if a.tiny {
        let tiny = Args {
            tokens: {
                let mut t: Vec<usize> = a.tokens.iter().map(|&t| t.min(32)).collect();
                t.sort_unstable();
                t.dedup();
                t
            },
            // A one-position cache makes the new tokens' keys, positions and mask carry the
            // softmax (the unit test `the_checks_see_mask_and_position_mistakes`); 37 and 300 a
            // partial and a multi-chunk cache.
            kv: vec![1, 37, 300],
            execs: Vec::new(),
            ..a.clone()
        };
        rows.extend(model_runs(&tiny, &TINY, gpus, true)?);
    }
    for s in &a.models {
        rows.extend(model_runs(a, s, gpus, false)?);
    }
    println!("{}", report::table(&rows));
    if let Some(path) = &a.json {
        let meta = serde_json::json!({
            "device": device, "gpus": gpus, "arch": arch, "seed": a.seed,
            "layers_per_graph": a.layers, "rounds": a.rounds,
            "args": std::env::args().skip(1).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&report::json(&rows, meta))?)
            .map_err(|e| format!("write {path}: {e}"))?;
        eprintln!("tp-layer: wrote {path}");
    }
    Ok(())
}

/// Every TP size of one model: TP 1 first (the outputs the others must match), checked, then
/// timed where the ranks have GPUs of their own.
fn model_runs(a: &Args, s: &Shape, gpus: usize, full_reference: bool) -> Res<Vec<Row>> {
    let lmax = a.kv.iter().max().copied().unwrap_or(0) + a.tokens.iter().max().copied().unwrap_or(0);
    let plan = |devices: Vec<usize>, modes: Vec<Mode>, execs: Vec<Exec>| group::Plan {
        shape: *s,
        devices,
        modes,
        tokens: a.tokens.clone(),
        kv_lens: a.kv.clone(),
        lmax,
        execs,
        layers: a.layers,
        rounds: a.rounds,
        seed: a.seed,
    };
    let mut rows = Vec::new();
    eprintln!(
        "tp-layer: {} TP 1 ({} MiB of weights per layer)",
        s.name,
        s.weight_bytes() >> 20
    );
    let tp1 = group::run(&plan(vec![0], vec![Mode::None], a.execs.clone()))?;
    let wanted_reference = |tokens: usize, kv: usize| {
        full_reference
            || (tokens == a.tokens.iter().min().copied().unwrap_or(1) && kv == a.kv.iter().min().copied().unwrap_or(0))
    };
    let mut refs = Vec::new();
    for r in &tp1 {
        let mut vs_ref = None;
        if wanted_reference(r.tokens, r.kv_len) {
            let want = reference::layer(s, a.seed, r.tokens, r.kv_len, 1);
            let got = r.out.as_ref().ok_or("TP 1 returned no output")?;
            let d = worst(got, &want.residual, &want.norm, s.hidden);
            ensure(
                d,
                &format!(
                    "{} TP 1 tokens {} kv {} against the float64 reference",
                    s.name, r.tokens, r.kv_len
                ),
            )?;
            vs_ref = Some(d.worst);
            refs.push((r.tokens, r.kv_len, want));
        }
        for mut row in Row::from_record(s, 1, false, r) {
            row.vs_reference = vs_ref;
            rows.push(row);
        }
    }
    for &tp in a.tp.iter().filter(|&&t| t > 1) {
        let shared = tp > gpus;
        let (devices, mut modes, execs) = if shared {
            (vec![0; tp], a.modes.clone(), Vec::new())
        } else {
            // The compute floor only where it is timed (it is not the layer: nothing to check).
            let mut m = if a.execs.is_empty() {
                Vec::new()
            } else {
                vec![Mode::None]
            };
            m.extend(&a.modes);
            ((0..tp).collect(), m, a.execs.clone())
        };
        if shared {
            // NCCL refuses two ranks on one GPU.
            modes.retain(|m| *m != Mode::Nccl);
        }
        eprintln!(
            "tp-layer: {} TP {tp}{}",
            s.name,
            if shared {
                " (ranks share GPU 0: checked, not timed)"
            } else {
                ""
            }
        );
        for r in group::run(&plan(devices, modes, execs))? {
            let what = format!(
                "{} TP {tp} {} tokens {} kv {}",
                s.name,
                r.mode.name(),
                r.tokens,
                r.kv_len
            );
            if !r.diverged.is_empty() {
                return Err(format!("{what}: ranks {:?} hold outputs that differ from rank 0's", r.diverged).into());
            }
            let (mut vs_tp1, mut vs_ref) = (None, None);
            if let Some(out) = &r.out {
                let base = tp1
                    .iter()
                    .find(|b| b.tokens == r.tokens && b.kv_len == r.kv_len)
                    .and_then(|b| b.out.as_ref())
                    .ok_or("no TP 1 output to compare with")?;
                let d = worst(out, &base.residual, &base.norm, s.hidden);
                ensure(d, &format!("{what} against TP 1"))?;
                vs_tp1 = Some(d.worst);
                if let Some((_, _, want)) = refs.iter().find(|(t, k, _)| *t == r.tokens && *k == r.kv_len) {
                    let d = worst(out, &want.residual, &want.norm, s.hidden);
                    ensure(d, &format!("{what} against the float64 reference"))?;
                    vs_ref = Some(d.worst);
                }
            }
            for mut row in Row::from_record(s, tp, shared, &r) {
                row.vs_tp1 = vs_tp1;
                row.vs_reference = vs_ref;
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The larger of the residual's and the norm's differences.
fn worst(got: &rank::Outputs, residual: &[f64], norm: &[f64], hidden: usize) -> Diff {
    let a = Diff::of(&got.residual, residual, hidden);
    let b = Diff::of(&got.norm, norm, hidden);
    if b.worst > a.worst {
        b
    } else {
        a
    }
}

fn ensure(d: Diff, what: &str) -> Res {
    if d.ok() {
        return Ok(());
    }
    Err(format!("{what}: {d} (tolerance {:.3}, NOTE [tp-tolerance])", model::TOLERANCE).into())
}
