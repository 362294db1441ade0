//! Ranks that disagree on a collective never get `Ok` on the CUDA kernels
//! (NOTE [op-agreement]), at every world of `symm_testkit::GPU_WORLDS`, eager
//! and replayed from a CUDA graph: the last rank differs in element count, in
//! dtype with the same byte count, in reduce operator, in the op itself,
//! skips an op, or rejects its own argument, on the Lamport, one-shot (ring),
//! two-shot, pull and copy-engine all-reduce, on reduce-scatter and
//! all-gather, and on the fused all-reduce + residual + RMSNorm (whose op may
//! also meet a plain Lamport all-reduce). Every rank gets an error (`Mismatch`: eager, from its next op
//! by itself, NOTE [error-mirror]; from a graph, from `check_error`; the
//! rejecting rank its own `InvalidArgument`) well within the ops' deadline,
//! the communicator is poisoned afterwards, and ops that agree (empty ones
//! included) run first.
//!
//! Without the GPUs a world needs its test skips and says why; when
//! `SYMM_REQUIRE_GPUS` says the machine has them it fails instead.
#![cfg(feature = "cuda")]

mod common;

use std::time::{Duration, Instant};

use common::gpu::*;
use common::{MismatchClass as Class, MISMATCH_CLASSES};
use half::bf16;
use symm_core::{Error, ReduceOp, SymmTensor};
use symm_ops::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use symm_ops::cudarc::driver::{CudaSlice, DeviceRepr};
use symm_ops::symm_cuda::streams::HostCopies;
use symm_ops::{AllReduceAlgo, CommConfig, Communicator, Element};
use symm_testkit::launch::{RankCtx, TestResult};
use symm_testkit::GpuWorld;

/// The ops' deadline: a disagreement must be reported long before it.
const OP_TIMEOUT: Duration = Duration::from_secs(20);
/// Elements of the agreeing op (f32: 4 KB, a Lamport-sized message).
const N: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mech {
    Lamport,
    OneShot,
    TwoShot,
    Pull,
    /// The copy-engine two-shot (two ranks, symmetric input and output; the pull at more).
    CopyEngine,
    ReduceScatter,
    AllGather,
    /// The fused all-reduce + residual + RMSNorm (NOTE [fused-epilogue]; rows of `HIDDEN`).
    Fused,
    /// The Lamport two-shot all-reduce (NOTE [lamport-two-shot]).
    LamportTwoShot,
}

/// Row length of the fused epilogue's cases (16-byte rows in bf16, 32 in f32).
const HIDDEN: usize = 8;

const MECHS: [Mech; 9] = [
    Mech::Lamport,
    Mech::OneShot,
    Mech::TwoShot,
    Mech::Pull,
    Mech::CopyEngine,
    Mech::ReduceScatter,
    Mech::AllGather,
    Mech::Fused,
    Mech::LamportTwoShot,
];

/// The cases: every class on the mechanisms it applies to.
fn cases() -> Vec<(Mech, Class)> {
    let mut v = Vec::new();
    for m in [
        Mech::Lamport,
        Mech::OneShot,
        Mech::TwoShot,
        Mech::Pull,
        Mech::CopyEngine,
        Mech::LamportTwoShot,
    ] {
        for c in [
            Class::Count,
            Class::DtypeSameBytes,
            Class::ReduceOp,
            Class::RejectsItsArgument,
        ] {
            v.push((m, c));
        }
    }
    for c in [
        Class::Count,
        Class::DtypeSameBytes,
        Class::ReduceOp,
        Class::RejectsItsArgument,
    ] {
        v.push((Mech::ReduceScatter, c));
    }
    for c in [Class::Count, Class::DtypeSameBytes, Class::RejectsItsArgument] {
        v.push((Mech::AllGather, c));
    }
    // The op itself, and a skipped op: a Lamport all-reduce meets a Lamport all-gather (ops
    // that run different mechanisms never read each other's header: NOTE [op-agreement]).
    v.push((Mech::Lamport, Class::OpKind));
    v.push((Mech::Lamport, Class::SkipsAnOp));
    // The Lamport two-shot against the one-shot of the same count (the headers' mechanisms
    // differ; both poll the same header slots).
    v.push((Mech::LamportTwoShot, Class::OpKind));
    // The fused epilogue (sum only): its count, dtype, a rejection, and the op itself: a fused
    // op against a plain Lamport all-reduce of the same count (the same buffers; the headers'
    // mechanisms differ).
    for c in [
        Class::Count,
        Class::DtypeSameBytes,
        Class::RejectsItsArgument,
        Class::OpKind,
    ] {
        v.push((Mech::Fused, c));
    }
    v
}

/// One dtype's buffers: device input and output, and a symmetric input and output (the pull
/// and the copy engine).
struct Bufs<T: DeviceRepr> {
    input: CudaSlice<T>,
    output: CudaSlice<T>,
    sym: SymmTensor,
    sym_out: SymmTensor,
}

impl<T: DeviceRepr + Element + Default + Clone> Bufs<T> {
    fn new(rig: &Rig, alloc_id: u64, len: usize) -> TestResult<Self> {
        Ok(Bufs {
            input: rig.stream.synced_clone_htod(&vec![T::default(); len])?,
            output: rig.stream.synced_clone_htod(&vec![T::default(); len])?,
            sym: rig.comm.persistent_buffer(alloc_id, &[len], T::DTYPE)?,
            sym_out: rig.comm.persistent_buffer(alloc_id + 100, &[len], T::DTYPE)?,
        })
    }

    /// The op of `mech` over `n` elements (as the op counts them) with `op`; `short`: the output
    /// one element short (the rank rejects its own argument).
    fn run(&mut self, comm: &Communicator, mech: Mech, n: usize, op: ReduceOp, short: bool) -> symm_core::Result<()> {
        let w = comm.world_size();
        let cut = usize::from(short);
        let x = self.input.slice(..n);
        let algo = match mech {
            Mech::Lamport => AllReduceAlgo::Lamport,
            Mech::LamportTwoShot => AllReduceAlgo::LamportTwoShot,
            Mech::OneShot => AllReduceAlgo::OneShot,
            Mech::TwoShot => AllReduceAlgo::TwoShot,
            Mech::Pull => AllReduceAlgo::Pull,
            Mech::CopyEngine => {
                let (xs, os) = (self.sym.narrow(0, n)?, self.sym_out.narrow(0, n - cut)?);
                return comm.all_reduce_with(AllReduceAlgo::CopyEngine, Some((&xs).into()), (&os).into(), op);
            }
            Mech::ReduceScatter => {
                let x = self.input.slice(..n * w);
                return comm.reduce_scatter_out(&x, &mut self.output.slice_mut(..n - cut), op);
            }
            Mech::AllGather => return comm.all_gather_out(&x, &mut self.output.slice_mut(..n * w - cut)),
            Mech::Fused => {
                // x and the residual from the input, norm_out and residual_out from the output;
                // the weight overlaps x (inputs may overlap).
                let (x, res, wt) = (
                    self.input.slice(..n),
                    self.input.slice(n..2 * n),
                    self.input.slice(..HIDDEN),
                );
                let (mut no, mut ro) = self.output.split_at_mut(n);
                let (mut no, mut ro) = (no.slice_mut(..n - cut), ro.slice_mut(..n));
                let _ = op;
                return comm.ops().all_reduce_residual_rms_norm_with(
                    symm_ops::EpilogueAlgo::Fused,
                    &x,
                    &res,
                    symm_ops::RmsNorm::new(&wt, 1e-5),
                    &mut no,
                    &mut ro,
                );
            }
        };
        let mut o = self.output.slice_mut(..n - cut);
        if mech == Mech::Pull {
            let xs = self.sym.narrow(0, n)?;
            return comm.all_reduce_with(algo, Some((&xs).into()), (&mut o).into(), op);
        }
        comm.all_reduce_with(algo, Some((&x).into()), (&mut o).into(), op)
    }

    fn all_gather(&mut self, comm: &Communicator, n: usize) -> symm_core::Result<()> {
        let w = comm.world_size();
        comm.all_gather_out(&self.input.slice(..n), &mut self.output.slice_mut(..n * w))
    }
}

/// The disagreeing op(s) of `class` on this rank (`odd`: the last rank).
fn disagree(
    comm: &Communicator,
    f: &mut Bufs<f32>,
    h: &mut Bufs<bf16>,
    mech: Mech,
    class: Class,
    odd: bool,
) -> symm_core::Result<()> {
    let (n, op) = (N, ReduceOp::Sum);
    match (class, odd) {
        (Class::Count, true) => f.run(comm, mech, 2 * n, op, false),
        // f32 x N against bf16 x 2N: the same bytes.
        (Class::DtypeSameBytes, true) => h.run(comm, mech, 2 * n, op, false),
        (Class::ReduceOp, true) => f.run(comm, mech, n, ReduceOp::Max, false),
        (Class::OpKind, true) if matches!(mech, Mech::Fused | Mech::LamportTwoShot) => {
            f.run(comm, Mech::Lamport, n, op, false)
        }
        (Class::OpKind, true) => f.all_gather(comm, n),
        (Class::RejectsItsArgument, true) => f.run(comm, mech, n, op, true),
        (Class::SkipsAnOp, _) => {
            // The others run the all-reduce, then an all-gather; the last rank skips the former.
            if !odd {
                f.run(comm, mech, n, op, false)?;
            }
            f.all_gather(comm, n)
        }
        _ => f.run(comm, mech, n, op, false),
    }
}

/// One case on one rank: agreeing ops, then the disagreement, eager or from a graph. Returns the
/// error this rank saw and how long it took.
fn case(rc: &RankCtx, mech: Mech, class: Class, graph: bool) -> TestResult<String> {
    let config = CommConfig::default().with_timeout(OP_TIMEOUT).with_nccl(false);
    let name = format!("gpu-mismatch-{mech:?}-{class:?}-{graph}");
    let rig = rig(rc, &name, config)?;
    let (s, comm) = (&rig.stream, &rig.comm);
    let w = rc.world;
    let odd = rc.rank == w - 1;
    let mut f = Bufs::<f32>::new(&rig, 1, 2 * N * w)?;
    let mut h = Bufs::<bf16>::new(&rig, 2, 4 * N * w)?;
    rig.ready()?;
    // In step first: two different empty ops back to back (each a checked barrier), the case's
    // op on every rank, another empty op.
    comm.all_reduce(&mut f.output.slice_mut(..0), ReduceOp::Sum)?;
    comm.all_gather_out(&h.input.slice(..0), &mut h.output.slice_mut(..0))?;
    f.run(comm, mech, N, ReduceOp::Sum, false)?;
    comm.all_reduce(&mut f.output.slice_mut(..0), ReduceOp::Sum)?;
    s.synchronize()?;
    comm.check_error()?;
    rig.ready()?;
    let t = Instant::now();
    let issued = if graph {
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let issued = disagree(comm, &mut f, &mut h, mech, class, odd);
        let g = s.end_capture(CUgraphInstantiate_flags(0))?;
        let g = g.ok_or("the capture produced no graph")?;
        rig.ready()?;
        g.launch()?;
        issued
    } else {
        disagree(comm, &mut f, &mut h, mech, class, odd)
    };
    s.synchronize()?;
    // From a graph, `check_error`; eager, the next op reports it by itself (NOTE [error-mirror]).
    let checked = if graph {
        comm.check_error()
    } else {
        f.run(comm, mech, N, ReduceOp::Sum, false)
    };
    let took = t.elapsed();
    let got = match (issued, checked) {
        (Err(e @ Error::InvalidArgument(_)), _) if odd && class == Class::RejectsItsArgument => e,
        (Ok(()), Err(e @ Error::Mismatch { .. })) => e,
        other => return Err(format!("rank {}: {other:?} after {took:?}, want a mismatch", rc.rank).into()),
    };
    if took > OP_TIMEOUT / 4 {
        return Err(format!("rank {}: the error took {took:?} (deadline {OP_TIMEOUT:?})", rc.rank).into());
    }
    // Poisoned: nothing pairs with a later op.
    match f.run(comm, mech, N, ReduceOp::Sum, false) {
        Err(Error::Aborted(_)) => {}
        other => return Err(format!("rank {}: the op after the mismatch gave {other:?}", rc.rank).into()),
    }
    // Every rank done with the case before its communicator goes.
    rig.ready()?;
    Ok(format!("{got} in {:.1} ms", took.as_secs_f64() * 1e3))
}

fn gpu_mismatch(w: GpuWorld) {
    if !gate("gpu_mismatch", w) {
        return;
    }
    let t = Instant::now();
    let lines = run(w, |rc| {
        let mut lines = Vec::new();
        for (mech, class) in cases() {
            for graph in [false, true] {
                progress(&rc, "gpu_mismatch", &format!("{mech:?} {class:?} graph {graph}"));
                let line =
                    case(&rc, mech, class, graph).map_err(|e| format!("{mech:?} {class:?} graph {graph}: {e}"))?;
                lines.push(format!("{mech:?} {class:?} graph {graph}: {line}"));
            }
        }
        Ok(lines)
    });
    for l in &lines[0] {
        println!("  rank 0: {l}");
    }
    println!(
        "SUMMARY gpu_mismatch {} ok {} cases x eager/graph, every rank an error, never Ok, {:.1} s",
        w.label(),
        cases().len(),
        t.elapsed().as_secs_f64()
    );
}
symm_testkit::gpu_world_tests!(gpu_mismatch, gpu_mismatch);

#[test]
fn the_cases_cover_every_class_and_mechanism() {
    let c = cases();
    for m in MECHS {
        assert!(c.iter().any(|&(x, _)| x == m), "{m:?}");
    }
    for k in MISMATCH_CLASSES {
        assert!(c.iter().any(|&(_, x)| x == k), "{k:?}");
    }
}
