//! The engine-shaped API on CUDA GPUs (#18), at every world of `GPU_WORLDS`:
//! communicators built at once by `Communicator::for_streams` and moved into
//! one worker thread per rank; activations from `Communicator::alloc` written
//! by a cuBLAS GEMM (cudarc) and all-reduced zero-copy on the engine's compute
//! stream (`comm.on(&stream)`, not the communicator's own); GEMM + all-reduce captured in one CUDA graph
//! with the context's event tracking left on and replayed 100 times, equal to
//! eager and to a float64 reference; ops alternating between two streams with
//! no ordering by the caller, every result right.
//!
//! Without the GPUs a world needs its test skips and says why; when
//! `SYMM_REQUIRE_GPUS` says the machine has them it fails instead.
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gpu::{gate, tracked_context};
use symm_core::symm_store::{HashStore, Store, StoreExchange};
use symm_core::ReduceOp;
use symm_ops::cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use symm_ops::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use symm_ops::cudarc::driver::CudaStream;
use symm_ops::symm_cuda::streams::HostCopies;
use symm_ops::{AllReduceAlgo, CommConfig, Communicator};
use symm_testkit::GpuWorld;

type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// GEMM shape: `y[m x n] = x[m x k] * w[k x n]` (row-major), as a row-parallel projection.
const M: usize = 8;
const K: usize = 96;
const N: usize = 40;

/// Deterministic small values (exact in f32 products and sums of this size).
fn val(rank: usize, i: usize, salt: usize) -> f32 {
    (((i * 7 + rank * 13 + salt * 5) % 17) as f32 - 8.0) / 4.0
}

/// One rank's inputs and its GEMM output in float64.
fn inputs(rank: usize, salt: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..M * K).map(|i| val(rank, i, salt)).collect();
    let w = (0..K * N).map(|i| val(rank + 1, i, salt + 3)).collect();
    (x, w)
}

fn gemm_ref(x: &[f32], w: &[f32]) -> Vec<f64> {
    let mut y = vec![0f64; M * N];
    for r in 0..M {
        for c in 0..N {
            y[r * N + c] = (0..K).map(|i| x[r * K + i] as f64 * w[i * N + c] as f64).sum();
        }
    }
    y
}

/// The all-reduced GEMM output every rank must get.
fn expected(world: usize, salt: usize) -> Vec<f64> {
    let mut sum = vec![0f64; M * N];
    for r in 0..world {
        let (x, w) = inputs(r, salt);
        for (s, v) in sum.iter_mut().zip(gemm_ref(&x, &w)) {
            *s += v;
        }
    }
    sum
}

fn check(what: &str, got: &[f32], want: &[f64]) -> Res {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if (g as f64 - w).abs() > 1e-3 * (1.0 + w.abs()) {
            return Err(format!("{what}: element {i}: {g} where {w} was expected").into());
        }
    }
    Ok(())
}

/// A barrier of the worker threads over an in-process store (it gives up at the timeout, naming
/// the ranks that never came), so that no rank does per-op setup (module loading, graph
/// instantiation) while a peer's kernel may wait for it (NOTE [co-residency]).
struct Ready {
    store: Arc<dyn Store>,
    world: usize,
}

impl Ready {
    fn wait(&self, rank: usize, step: &str) -> Res {
        StoreExchange::new(self.store.clone(), format!("gpu-engine/ready/{step}")).barrier(
            rank,
            self.world,
            Duration::from_secs(60),
        )?;
        Ok(())
    }
}

/// Row-major `y = x * w` through column-major cuBLAS: `y^T = w^T * x^T`.
fn gemm_cfg() -> GemmConfig<f32> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: N as i32,
        n: M as i32,
        k: K as i32,
        alpha: 1.0,
        lda: N as i32,
        ldb: K as i32,
        beta: 0.0,
        ldc: N as i32,
    }
}

/// The worker thread of one rank: what an engine's worker does with the communicator it was
/// handed.
fn worker(comm: Communicator, compute: Arc<CudaStream>, side: Arc<CudaStream>, ready: &Ready) -> Res<String> {
    let rank = comm.rank().get();
    let world = comm.world_size();
    let blas = CudaBlas::new(compute.clone())?;
    // Activations in symmetric memory; the weights too, since a graph captured with the
    // context's event tracking on can read no cudarc slice written before the capture.
    let mut x = comm.alloc::<f32>(M * K)?;
    let mut w = comm.alloc::<f32>(K * N)?;
    let mut y = comm.alloc::<f32>(M * N)?;
    let (hx, hw) = inputs(rank, 0);
    compute.synced_memcpy_htod(&hx, x.view_mut()?)?;
    compute.synced_memcpy_htod(&hw, w.view_mut()?)?;
    // Warm up cuBLAS (its first call loads modules, which waits for every running kernel:
    // never while a peer's collective may wait for this rank, NOTE [co-residency]).
    // SAFETY: the views hold M*K, K*N and M*N f32 elements, as the config says.
    unsafe { blas.gemm(gemm_cfg(), w.view()?, x.view()?, y.view_mut()?) }?;
    compute.synced_clone_dtoh(y.view()?)?;
    ready.wait(rank, "cublas-warm")?;

    // Eager: GEMM into the activation, all-reduce it in place on the compute stream (the
    // one-shot pull reads peers' registered inputs in place; in place it is the auto pick).
    let want = expected(world, 0);
    for algo in [None, Some(AllReduceAlgo::Lamport), Some(AllReduceAlgo::TwoShot)] {
        // SAFETY: as above.
        unsafe { blas.gemm(gemm_cfg(), w.view()?, x.view()?, y.view_mut()?) }?;
        match algo {
            None => comm.on(&compute).all_reduce(&mut y, ReduceOp::Sum)?,
            Some(a) => comm
                .on(&compute)
                .all_reduce_with(a, None, (&mut y).into(), ReduceOp::Sum)?,
        }
        check(
            &format!("rank {rank} eager {algo:?}"),
            &compute.synced_clone_dtoh(y.view()?)?,
            &want,
        )?;
    }
    // Out of place from an activation into another (the zero-copy pull where it is picked).
    let mut z = comm.alloc::<f32>(M * N)?;
    // SAFETY: as above.
    unsafe { blas.gemm(gemm_cfg(), w.view()?, x.view()?, y.view_mut()?) }?;
    comm.on(&compute)
        .all_reduce_with(AllReduceAlgo::Pull, Some((&y).into()), (&mut z).into(), ReduceOp::Sum)?;
    check(
        &format!("rank {rank} pull"),
        &compute.synced_clone_dtoh(z.view()?)?,
        &want,
    )?;

    // A graph: GEMM + all-reduce, captured with event tracking on, replayed 100 times on new
    // inputs each time it is checked.
    let (hx1, hw1) = inputs(rank, 1);
    compute.synced_memcpy_htod(&hx1, x.view_mut()?)?;
    compute.synced_memcpy_htod(&hw1, w.view_mut()?)?;
    compute.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    // SAFETY: as above.
    let g = unsafe { blas.gemm(gemm_cfg(), w.view()?, x.view()?, y.view_mut()?) }
        .map_err(|e| format!("{e:?}"))
        .and_then(|()| {
            comm.on(&compute)
                .all_reduce(&mut y, ReduceOp::Sum)
                .map_err(|e| e.to_string())
        });
    let graph = compute.end_capture(CUgraphInstantiate_flags(0))?;
    g?;
    let graph = graph.ok_or("nothing captured")?;
    compute.synced_clone_dtoh(y.view()?)?;
    ready.wait(rank, "graph-built")?;
    let want1 = expected(world, 1);
    let t = Instant::now();
    for i in 0..100 {
        graph.launch()?;
        if i % 25 == 24 {
            check(
                &format!("rank {rank} replay {i}"),
                &compute.synced_clone_dtoh(y.view()?)?,
                &want1,
            )?;
        }
    }
    let replay_us = t.elapsed().as_secs_f64() * 1e6 / 100.0;
    // Eager again on the same inputs: the graph's result.
    // SAFETY: as above.
    unsafe { blas.gemm(gemm_cfg(), w.view()?, x.view()?, y.view_mut()?) }?;
    comm.on(&compute).all_reduce(&mut y, ReduceOp::Sum)?;
    check(
        &format!("rank {rank} eager after the graph"),
        &compute.synced_clone_dtoh(y.view()?)?,
        &want1,
    )?;

    // Ops alternating between two streams, the caller ordering nothing: the communicator
    // keeps them from overlapping. Each op has its own buffer and payload.
    const OPS: usize = 64;
    const LEN: usize = 3001;
    let mut bufs = Vec::with_capacity(OPS);
    for i in 0..OPS {
        let mut b = comm.alloc::<f32>(LEN)?;
        let h: Vec<f32> = (0..LEN).map(|j| val(rank, j, i + 7)).collect();
        let s = if i % 2 == 0 { &compute } else { &side };
        s.synced_memcpy_htod(&h, b.view_mut()?)?;
        bufs.push(b);
    }
    ready.wait(rank, "buffers-filled")?;
    let algos = [AllReduceAlgo::Lamport, AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot];
    for (i, b) in bufs.iter_mut().enumerate() {
        let s = if i % 2 == 0 { &compute } else { &side };
        comm.on(s)
            .all_reduce_with(algos[i % 3], None, b.into(), ReduceOp::Sum)?;
    }
    for (i, b) in bufs.iter().enumerate() {
        let want: Vec<f64> = (0..LEN)
            .map(|j| (0..world).map(|r| val(r, j, i + 7) as f64).sum())
            .collect();
        let s = if i % 2 == 0 { &compute } else { &side };
        side.synchronize()?;
        check(
            &format!("rank {rank} two-stream op {i}"),
            &s.synced_clone_dtoh(b.view()?)?,
            &want,
        )?;
    }
    comm.check_error()?;
    let (blocks, used) = comm.pool_blocks();
    Ok(format!(
        "replay {replay_us:.1} us/iter, pool {blocks} blocks ({used} in use)"
    ))
}

fn gpu_engine(w: GpuWorld) {
    if !gate("gpu_engine", w) {
        return;
    }
    let t = Instant::now();
    let ctx = |r: usize| tracked_context(if w.is_shared() { 0 } else { r });
    // One compute stream and one side stream per rank, built on this thread; the
    // communicators too, then moved into the workers.
    let compute: Vec<Arc<CudaStream>> = (0..w.world)
        .map(|r| ctx(r)?.new_stream().map_err(Into::into))
        .collect::<Res<_>>()
        .unwrap();
    let side: Vec<Arc<CudaStream>> = (0..w.world)
        .map(|r| ctx(r)?.new_stream().map_err(Into::into))
        .collect::<Res<_>>()
        .unwrap();
    let config = CommConfig::default().with_timeout(Duration::from_secs(20));
    // The communicators' own streams are neither: every op below runs on a stream given per
    // call, so the ordering between streams is the communicator's to keep.
    let own: Vec<Arc<CudaStream>> = (0..w.world)
        .map(|r| ctx(r)?.new_stream().map_err(Into::into))
        .collect::<Res<_>>()
        .unwrap();
    let comms = Communicator::for_streams(&own, config).unwrap();
    assert_eq!(
        comms.iter().map(|c| c.device_sharers()).max(),
        Some(if w.is_shared() { w.world } else { 1 })
    );
    let ready = Ready {
        store: HashStore::new(Duration::from_secs(60)),
        world: w.world,
    };
    let results: Vec<Res<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(compute.iter().cloned().zip(side.iter().cloned()))
            .map(|(comm, (c, sd))| {
                let ready = &ready;
                s.spawn(move || worker(comm, c, sd, ready))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect()
    });
    for (r, res) in results.iter().enumerate() {
        if let Err(e) = res {
            panic!("{}: rank {r}: {e}", w.label());
        }
    }
    println!(
        "SUMMARY gpu_engine {} pass {:.1}s; rank 0: {}",
        w.label(),
        t.elapsed().as_secs_f64(),
        results[0].as_ref().map(|s| s.as_str()).unwrap_or("")
    );
}
symm_testkit::gpu_world_tests!(gpu_engine, gpu_engine);
