//! All-reduce epilogues (#19) on CUDA GPUs: world 1 and every world of `GPU_WORLDS` (ranks
//! sharing one GPU where the machine has one). The shared suite (`common/epilogue.rs`): every
//! dtype, hidden 128 / 4096 / 5000 / 8192 / 16384, tokens 1 / 7 / 128 / 4096, against the float64
//! reference, the fused Lamport kernel bitwise equal to every all-reduce + epilogue-kernel
//! sequence, to the in-place forms and on every rank. Then: 100 fused ops in place, captured in a
//! CUDA graph and replayed 100 times, bitwise equal to the same 10 000 ops run eagerly; NaN
//! written into the inputs stream-ordered right after an op returns never reaches its outputs.
//!
//! Without the GPUs a world needs its test skips and says why; when `SYMM_REQUIRE_GPUS` says the
//! machine has them it fails instead.
#![cfg(feature = "cuda")]

mod common;

use std::time::{Duration, Instant};

use common::epilogue::{residual_of, suite, weight_of, x_of, Plan, EPS};
use common::gpu::{gate, rig, run, Rig};
use common::{hash, to_bits};
use half::bf16;
use symm_ops::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use symm_ops::prelude::*;
use symm_ops::symm_cuda::streams::HostCopies;
use symm_ops::{EpilogueAlgo, RmsNorm};
use symm_testkit::launch::TestResult;
use symm_testkit::{GpuWorld, Placement};

fn plan(comm: &Communicator) -> Plan {
    Plan {
        // 5000: a row whose last pass over the block is partial (625 bf16 / 1250 f32 vectors).
        hiddens: vec![128, 4096, 5000, 8192, 16384],
        tokens: vec![1, 7, 128, 4096],
        algos: vec![
            EpilogueAlgo::Fused,
            EpilogueAlgo::Separate(AllReduceAlgo::Lamport),
            EpilogueAlgo::Separate(AllReduceAlgo::OneShot),
            EpilogueAlgo::Separate(AllReduceAlgo::TwoShot),
        ],
        fused_max_bytes: comm.thresholds().lamport_max_bytes,
        ref_rows: 24,
        max_buffer_bytes: usize::MAX,
    }
}

/// 100 in-place fused ops captured once and replayed 100 times, against 10 000 eager ones.
fn graph(rig: &Rig) -> TestResult<String> {
    const OPS: usize = 100;
    const REPLAYS: usize = 100;
    let (hidden, tokens) = (4096, 7);
    let n = hidden * tokens;
    let (comm, s) = (&rig.comm, &rig.stream);
    let r = comm.rank().get();
    let x_h: Vec<bf16> = (0..n).map(|i| x_of(77, r, i)).collect();
    let res_h: Vec<bf16> = (0..n).map(|i| residual_of(77, i)).collect();
    let w_h: Vec<bf16> = (0..hidden).map(|i| weight_of(77, i)).collect();
    let weight = comm.alloc::<bf16>(hidden)?;
    weight.copy_from_host(&w_h)?;
    let (mut xg, mut rg) = (comm.alloc::<bf16>(n)?, comm.alloc::<bf16>(n)?);
    let (mut xe, mut re) = (comm.alloc::<bf16>(n)?, comm.alloc::<bf16>(n)?);
    for b in [&xg, &xe] {
        b.copy_from_host(&x_h)?;
    }
    for b in [&rg, &re] {
        b.copy_from_host(&res_h)?;
    }
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut captured = Ok(());
    for _ in 0..OPS {
        captured = comm.all_reduce_residual_rms_norm_in_place(&mut xg, &mut rg, RmsNorm::new(&weight, EPS));
        if captured.is_err() {
            break;
        }
    }
    let g = s.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let g = g.ok_or("nothing captured")?;
    rig.ready()?;
    let t = Instant::now();
    for _ in 0..REPLAYS {
        g.launch()?;
    }
    s.synchronize()?;
    let replay_us = t.elapsed().as_secs_f64() * 1e6 / (OPS * REPLAYS) as f64;
    comm.check_error()?;
    for _ in 0..OPS * REPLAYS {
        comm.all_reduce_residual_rms_norm_in_place(&mut xe, &mut re, RmsNorm::new(&weight, EPS))?;
    }
    s.synchronize()?;
    let (xg, rg, xe, re) = (xg.to_host()?, rg.to_host()?, xe.to_host()?, re.to_host()?);
    for (what, a, b) in [("norm", &xg, &xe), ("residual", &rg, &re)] {
        if let Some(i) = a.iter().zip(b.iter()).position(|(p, q)| to_bits(*p) != to_bits(*q)) {
            return Err(format!("rank {r}: graph {what} [{i}] = {}, eager {}", a[i], b[i]).into());
        }
        if a.iter().any(|v| v.is_nan()) {
            return Err(format!("rank {r}: a NaN in the graph's {what}").into());
        }
    }
    Ok(format!("graph replay {replay_us:.2} us/op, hash {:016x}", hash(&xg)))
}

/// NaN copied into x and residual on the op's stream right after each op returns (no host
/// synchronisation in between) never reaches the outputs: fused (Lamport) and separate. Rounds
/// alternate two inputs of one shape, so an op that read the previous op's data would give other
/// bits than the first round with its input.
fn nan_after_return(rig: &Rig) -> TestResult {
    let (hidden, tokens) = (8192, 7);
    let n = hidden * tokens;
    let (comm, s) = (&rig.comm, &rig.stream);
    let r = comm.rank().get();
    let weight = comm.alloc::<bf16>(hidden)?;
    weight.copy_from_host(&(0..hidden).map(|i| weight_of(5, i)).collect::<Vec<bf16>>())?;
    let (mut x, mut res) = (comm.alloc::<bf16>(n)?, comm.alloc::<bf16>(n)?);
    let (mut no, mut ro) = (comm.alloc::<bf16>(n)?, comm.alloc::<bf16>(n)?);
    // NaN on the device, copied device to device behind each op: a pageable host copy queued
    // behind a collective would hold up the peer threads' launches (NOTE [pageable-copies]).
    let nan = s.synced_clone_htod(&vec![bf16::NAN; n])?;
    for (algo, poison) in [
        (EpilogueAlgo::Fused, false),
        (EpilogueAlgo::Fused, true),
        (EpilogueAlgo::Separate(AllReduceAlgo::OneShot), true),
    ] {
        let mut first: Vec<Option<(Vec<bf16>, Vec<bf16>)>> = vec![None, None];
        for round in 0..20usize {
            let seed = 1000 + (round % 2) as u64;
            x.copy_from_host(&(0..n).map(|i| x_of(seed, r, i)).collect::<Vec<bf16>>())?;
            res.copy_from_host(&(0..n).map(|i| residual_of(seed, i)).collect::<Vec<bf16>>())?;
            comm.ops().all_reduce_residual_rms_norm_with(
                algo,
                &x,
                &res,
                RmsNorm::new(&weight, EPS),
                &mut no,
                &mut ro,
            )?;
            if poison {
                // Stream-ordered right behind the op: no host synchronisation in between.
                s.memcpy_dtod(&nan, x.view_mut()?)?;
                s.memcpy_dtod(&nan, res.view_mut()?)?;
            }
            s.synchronize()?;
            comm.check_error()?;
            let got = (no.to_host()?, ro.to_host()?);
            let what = format!("rank {r} {algo:?} poison {poison} round {round}");
            if got.0.iter().chain(&got.1).any(|v| v.is_nan()) {
                return Err(format!("{what}: a NaN reached an output").into());
            }
            // Rounds alternate two inputs: the same input gives the same bits every time.
            match &first[round % 2] {
                None => first[round % 2] = Some(got),
                Some(f) => {
                    let diff = |a: &[bf16], b: &[bf16]| {
                        let bad: Vec<usize> = (0..a.len()).filter(|&i| to_bits(a[i]) != to_bits(b[i])).collect();
                        (
                            bad.len(),
                            bad.first().map(|i| i / hidden),
                            bad.last().map(|i| i / hidden),
                        )
                    };
                    let (dn, dr) = (diff(&got.0, &f.0), diff(&got.1, &f.1));
                    if dn.0 > 0 || dr.0 > 0 {
                        let other = first[(round + 1) % 2].as_ref().map(|o| diff(&got.1, &o.1).0);
                        return Err(format!(
                            "{what}: outputs changed between runs: norm {dn:?}, residual {dr:?} (elements, first \
                             and last row); residual differs from the other input's in {other:?} elements"
                        )
                        .into());
                    }
                }
            }
        }
    }
    Ok(())
}

fn gpu_epilogue(w: GpuWorld) {
    if !gate("gpu_epilogue", w) {
        return;
    }
    let t = Instant::now();
    let out = run(w, |rc| {
        let config = CommConfig::default().with_timeout(Duration::from_secs(60));
        let rig = rig(&rc, "gpu-epilogue", config)?;
        Ok(suite(&rig.comm, &plan(&rig.comm))?)
    });
    assert!(!out[0].is_empty());
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o, &out[0], "{}: rank {r}'s outputs differ from rank 0's", w.label());
    }
    println!(
        "SUMMARY gpu_epilogue {} pass {} cases, {:.1}s",
        w.label(),
        out[0].len(),
        t.elapsed().as_secs_f64()
    );
}
symm_testkit::gpu_world_tests!(gpu_epilogue, gpu_epilogue);

/// The NaN-after-return and graph checks, on a communicator of their own.
fn gpu_epilogue_nan_graph(w: GpuWorld) {
    if !gate("gpu_epilogue_nan_graph", w) {
        return;
    }
    let t = Instant::now();
    let out = run(w, |rc| {
        let config = CommConfig::default().with_timeout(Duration::from_secs(20));
        let rig = rig(&rc, "gpu-epilogue-ng", config)?;
        nan_after_return(&rig)?;
        rig.ready()?;
        graph(&rig)
    });
    println!(
        "SUMMARY gpu_epilogue_nan_graph {} pass {:.1}s; rank 0: {}",
        w.label(),
        t.elapsed().as_secs_f64(),
        out[0]
    );
}
symm_testkit::gpu_world_tests!(gpu_epilogue_nan_graph, gpu_epilogue_nan_graph);

#[test]
fn gpu_epilogue_world_1() {
    let w = GpuWorld {
        world: 1,
        placement: Placement::Distinct,
    };
    gpu_epilogue(w);
    gpu_epilogue_nan_graph(w);
}
