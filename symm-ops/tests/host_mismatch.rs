//! Ranks that disagree on a collective never get `Ok` (NOTE [op-agreement]),
//! on the host engine, with threads and processes (worlds 2, 3 and 8): the
//! last rank differs in element count, in dtype with the same byte
//! count, in reduce operator, in the op itself, skips an op, or rejects its
//! own argument. Every rank gets an error well within the op's deadline (no
//! timeout: the disagreement is seen in the op's first exchange), the
//! communicator stays poisoned afterwards, and a fresh one works. Agreeing
//! ranks, including ranks that all reject the same op or all pass an empty
//! message, stay in step.

mod common;

use std::time::{Duration, Instant};

use half::f16;
use symm_core::{Device, Error, ReduceOp};
use symm_ops::{CommConfig, Communicator};
use symm_testkit::launch::{child_ctx, run_processes, run_threads, RankCtx, TestResult};

use common::{MismatchClass as Class, MISMATCH_CLASSES as CLASSES};

const LIMIT: Duration = Duration::from_secs(120);
/// The ops' deadline: a disagreement must be reported long before it.
const OP_TIMEOUT: Duration = Duration::from_secs(20);

fn comm(ctx: &RankCtx, name: &str) -> TestResult<Communicator> {
    let group = ctx.group(&ctx.unique(name))?;
    // Small staging: the larger messages run in several chunks.
    let config = CommConfig::default().with_timeout(OP_TIMEOUT).with_staging_bytes(4096);
    Ok(Communicator::new(&group, Device::host(ctx.rank as u32), config)?)
}

/// The disagreeing op of `class` on this rank (`odd`: the last rank).
fn disagree(c: &Communicator, class: Class, odd: bool) -> symm_core::Result<()> {
    let w = c.world_size();
    match class {
        Class::Count => {
            let mut x = vec![1.0f32; if odd { 2000 } else { 1000 }];
            c.all_reduce(&mut x[..], ReduceOp::Sum)
        }
        Class::DtypeSameBytes => {
            if odd {
                let mut x = vec![f16::ONE; 1000];
                c.all_reduce(&mut x[..], ReduceOp::Sum)
            } else {
                let mut x = vec![1.0f32; 500];
                c.all_reduce(&mut x[..], ReduceOp::Sum)
            }
        }
        Class::ReduceOp => {
            let mut x = vec![1.0f32; 1000];
            c.all_reduce(&mut x[..], if odd { ReduceOp::Max } else { ReduceOp::Sum })
        }
        Class::OpKind => {
            if odd {
                let x = vec![1.0f32; 1 << 18];
                let mut out = vec![0.0f32; (1 << 18) * w];
                c.all_gather_out(&x[..], &mut out[..])
            } else {
                let mut x = vec![1.0f32; 1 << 18];
                c.all_reduce(&mut x[..], ReduceOp::Sum)
            }
        }
        Class::SkipsAnOp => {
            // The others all-reduce and then all-gather; the last rank skips the all-reduce.
            let x = vec![1.0f32; 100];
            let mut out = vec![0.0f32; 100 * w];
            if !odd {
                let mut y = vec![1.0f32; 100];
                c.all_reduce(&mut y[..], ReduceOp::Sum)?;
            }
            c.all_gather_out(&x[..], &mut out[..])
        }
        Class::RejectsItsArgument => {
            let x = vec![1.0f32; 1000];
            // The last rank's output is one element short: it rejects the op itself.
            let mut out = vec![0.0f32; if odd { 999 } else { 1000 }];
            c.all_reduce_out(&x[..], &mut out[..], ReduceOp::Sum)
        }
    }
}

fn is_mismatch_or_rejection(e: &Error, odd: bool, class: Class) -> bool {
    match e {
        Error::Mismatch { .. } => true,
        Error::InvalidArgument(_) => odd && class == Class::RejectsItsArgument,
        _ => false,
    }
}

/// Every class in turn on one rank; returns one line per class.
fn body(ctx: &RankCtx) -> TestResult<Vec<String>> {
    symm_testkit::link();
    let odd = ctx.rank == ctx.world - 1;
    let mut lines = Vec::new();
    for class in CLASSES {
        let c = comm(ctx, &format!("mismatch-{class:?}"))?;
        // In step first: a few agreeing ops, an empty one, an op every rank rejects.
        let mut x = [ctx.rank as f32; 33];
        c.all_reduce(&mut x[..], ReduceOp::Sum)?;
        let want = (ctx.world * (ctx.world - 1) / 2) as f32;
        if x.iter().any(|&v| v != want) {
            return Err(format!("{class:?}: warm-up all_reduce gave {:?}, want {want}", x[0]).into());
        }
        c.all_reduce(&mut [0.0f32; 0][..], ReduceOp::Sum)?;
        let mut short = [0.0f32; 1];
        match c.all_reduce_out(&[1.0f32; 2][..], &mut short[..], ReduceOp::Sum) {
            Err(Error::InvalidArgument(_)) => {}
            other => return Err(format!("{class:?}: a rejection every rank made gave {other:?}").into()),
        }
        c.barrier(None)?;
        let t = Instant::now();
        let r = disagree(&c, class, odd);
        let took = t.elapsed();
        match &r {
            Err(e) if is_mismatch_or_rejection(e, odd, class) => {}
            other => {
                return Err(format!("{class:?} rank {}: {other:?} after {took:?}, want a mismatch", ctx.rank).into())
            }
        }
        if took > OP_TIMEOUT / 4 {
            return Err(format!("{class:?}: the error took {took:?} (deadline {OP_TIMEOUT:?})").into());
        }
        // Poisoned: nothing pairs with a later op.
        let mut y = [1.0f32; 10];
        match c.all_reduce(&mut y[..], ReduceOp::Sum) {
            Err(Error::Aborted(_)) => {}
            other => return Err(format!("{class:?}: the op after the mismatch gave {other:?}").into()),
        }
        lines.push(format!(
            "{class:?}: {} in {:.1} ms",
            r.unwrap_err(),
            took.as_secs_f64() * 1e3
        ));
    }
    // A fresh communicator works.
    let c = comm(ctx, "mismatch-after")?;
    let mut x = vec![1.0f32; 1000];
    c.all_reduce(&mut x[..], ReduceOp::Sum)?;
    if x.iter().any(|&v| v != ctx.world as f32) {
        return Err("a fresh communicator after the mismatches is wrong".into());
    }
    Ok(lines)
}

fn threads(world: usize) {
    let t = Instant::now();
    let per_rank = run_threads(world, LIMIT, |ctx| body(&ctx)).unwrap();
    println!(
        "SUMMARY host_mismatch_w{world} ok in {:.1} s; rank 0: {}",
        t.elapsed().as_secs_f64(),
        per_rank[0].join("; ")
    );
}

#[test]
fn mismatch_threads_w2() {
    threads(2);
}

#[test]
fn mismatch_threads_w3() {
    threads(3);
}

#[test]
fn mismatch_threads_w8() {
    threads(8);
}

/// Every class with the ranks as processes of `world` (each re-executes this test binary).
fn processes(name: &str, world: usize) {
    if let Some(ctx) = child_ctx().unwrap() {
        let lines = body(&ctx).unwrap();
        println!("SUMMARY host_{name} rank {} ok: {}", ctx.rank, lines.join("; "));
        return;
    }
    run_processes(name, world, LIMIT).unwrap();
}

#[test]
fn mismatch_processes_w2() {
    processes("mismatch_processes_w2", 2);
}

#[test]
fn mismatch_processes_w3() {
    processes("mismatch_processes_w3", 3);
}

#[test]
fn mismatch_processes_w8() {
    processes("mismatch_processes_w8", 8);
}
