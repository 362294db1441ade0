//! Host reads and writes of a `SymmBuffer` right around ops, with no synchronisation by the
//! caller (#38): `to_host` right after `comm.all_reduce(&mut buf, ..)` returns the op's result,
//! never the data from before it, and `copy_from_host` right after an op waits for the op
//! before it writes. A fresh payload at every step, so a stale read cannot pass; odd sizes,
//! one on the Lamport path and one above it; exact small-integer sums against a float64
//! reference. Then the same after CUDA graph replay: an all-reduce captured once, replayed at
//! every step between `copy_from_host` and `to_host`. Every world of `gpu_world_tests!` (ranks
//! sharing one GPU, and distinct GPUs).
#![cfg(feature = "cuda")]

mod common;

use std::time::{Duration, Instant};

use common::gpu::{gate, rig, run};
use symm_core::ReduceOp;
use symm_ops::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use symm_ops::CommConfig;
use symm_testkit::launch::{RankCtx, TestResult};
use symm_testkit::GpuWorld;

/// Rank `rank`'s element `i` at step `step`: small integers, so every sum is exact in f32.
fn val(rank: usize, i: usize, step: usize) -> f32 {
    ((i * 7 + rank * 13 + step * 29) % 23) as f32 - 11.0
}

fn payload(rank: usize, n: usize, step: usize) -> Vec<f32> {
    (0..n).map(|i| val(rank, i, step)).collect()
}

fn expected(world: usize, n: usize, step: usize) -> Vec<f64> {
    (0..n)
        .map(|i| (0..world).map(|r| val(r, i, step) as f64).sum())
        .collect()
}

fn check(what: &str, got: &[f32], want: &[f64]) -> TestResult {
    if let Some((i, (g, w))) = got.iter().zip(want).enumerate().find(|(_, (g, w))| **g as f64 != **w) {
        return Err(format!("{what}: element {i} is {g}, the op's result is {w} (a stale or early copy)").into());
    }
    Ok(())
}

fn body(rc: RankCtx) -> TestResult<String> {
    let config = CommConfig::default().with_timeout(Duration::from_secs(30));
    let rig = rig(&rc, "gpu_host_copies", config)?;
    let (comm, rank, world) = (&rig.comm, rc.rank, rc.world);
    let t0 = Instant::now();
    let mut steps = 0;
    // 3001 f32: the Lamport path; 300_007 f32 (1.2 MB): above its bound at most worlds.
    for n in [3001usize, 300_007] {
        let mut buf = comm.alloc::<f32>(n)?;
        rig.ready()?;
        for step in 0..12 {
            // Read right after the op.
            buf.copy_from_host(&payload(rank, n, step))?;
            comm.all_reduce(&mut buf, ReduceOp::Sum)?;
            check(
                &format!("rank {rank} n {n} step {step}: to_host after all_reduce"),
                &buf.to_host()?,
                &expected(world, n, step),
            )?;
            // Write right after an op that still reads and writes the buffer, then one more op.
            comm.all_reduce(&mut buf, ReduceOp::Sum)?;
            buf.copy_from_host(&payload(rank, n, step + 100))?;
            comm.all_reduce(&mut buf, ReduceOp::Sum)?;
            check(
                &format!("rank {rank} n {n} step {step}: copy_from_host right after an op"),
                &buf.to_host()?,
                &expected(world, n, step + 100),
            )?;
            steps += 1;
        }
    }
    // After graph replay: the captured op's result, read right after each launch.
    let n = 3001usize;
    let mut buf = comm.alloc::<f32>(n)?;
    buf.copy_from_host(&payload(rank, n, 0))?;
    comm.all_reduce(&mut buf, ReduceOp::Sum)?; // eager first: modules loaded before the capture
    rig.stream.synchronize()?;
    rig.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = comm.all_reduce(&mut buf, ReduceOp::Sum);
    let graph = rig.stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("nothing captured")?;
    rig.ready()?;
    for step in 0..12 {
        buf.copy_from_host(&payload(rank, n, step + 200))?;
        graph.launch()?;
        check(
            &format!("rank {rank} n {n} step {step}: to_host after a graph replay"),
            &buf.to_host()?,
            &expected(world, n, step + 200),
        )?;
        steps += 1;
    }
    comm.check_error()?;
    Ok(format!("{steps} steps, {:.1} s", t0.elapsed().as_secs_f64()))
}

fn gpu_host_copies(w: GpuWorld) {
    if !gate("gpu_host_copies", w) {
        return;
    }
    let t = Instant::now();
    let out = run(w, body);
    println!(
        "SUMMARY gpu_host_copies {} pass {:.1}s; rank 0: {}",
        w.label(),
        t.elapsed().as_secs_f64(),
        out.first().map(|s| s.as_str()).unwrap_or("")
    );
}
symm_testkit::gpu_world_tests!(gpu_host_copies, gpu_host_copies);
