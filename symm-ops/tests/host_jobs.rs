//! Two jobs that cannot mix data (NOTE [membership], issue #39): two launches of two ranks each
//! (A0, A1 and B0, B1) build a group of one name on one store, their ranks arriving in every
//! order that starts with A0, then all-reduce their own data. Threads and processes.
//!
//! - Distinct job ids (`GroupOptions::job`, `SYMM_JOB_ID`; symmrun sets one per launch): the jobs
//!   never meet, and each gets its own sum.
//! - One job id shared by hand, or none, with the launch ids symmrun sets: no rank ever returns
//!   `Ok` with the other job's data; every error is `Mismatch` (never a timeout), within a few
//!   seconds; a job that completes before the other arrives gets its own sum.
//!
//! Each rank of the launch plays one job rank: launch ranks 0, 1 are A0, A1; 2, 3 are B0, B1.

use std::time::{Duration, Instant};

use symm_core::symm_store::StoreExchange;
use symm_core::{Device, Error, Group, GroupOptions, JobId, ReduceOp};
use symm_ops::{CommConfig, Communicator};
use symm_testkit::launch::{child_ctx, run_processes, run_threads, RankCtx, TestResult};

const LIMIT: Duration = Duration::from_secs(240);
/// An error must come long before a timeout would.
const QUICK: Duration = Duration::from_secs(8);

/// Arrival orders (launch ranks), all starting with A0.
const ORDERS: [[usize; 4]; 6] = [
    [0, 1, 2, 3], // A0 A1 B0 B1: launch by launch
    [0, 2, 1, 3], // A0 B0 A1 B1: rank 0 claimed twice in one generation
    [0, 3, 1, 2], // A0 B1 A1 B0: each generation complete, of two launches
    [0, 2, 3, 1],
    [0, 3, 2, 1],
    [0, 1, 3, 2],
];

#[derive(Debug, Clone, Copy)]
enum Ids {
    /// Each job its own job id.
    DistinctJobs,
    /// One job id for both, by hand; symmrun's launch ids.
    SharedJob,
    /// No job id; symmrun's launch ids.
    NoJob,
}

fn options(ids: Ids, job: char, case: usize) -> GroupOptions {
    let launch = Some(JobId::new(&format!("launch-{job}-{case}")));
    let job_id = match ids {
        Ids::DistinctJobs => Some(JobId::new(&format!("job-{job}-{case}"))),
        Ids::SharedJob => Some(JobId::new(&format!("shared-{case}"))),
        Ids::NoJob => None,
    };
    GroupOptions {
        job: job_id,
        launch,
        ..GroupOptions::default()
    }
}

/// One case on this launch rank: join in `order`, build a communicator, all-reduce.
fn case(ctx: &RankCtx, n: usize, order: &[usize; 4], ids: Ids) -> TestResult<String> {
    let (job, rank) = (if ctx.rank < 2 { 'a' } else { 'b' }, ctx.rank % 2);
    let pos = order
        .iter()
        .position(|&r| r == ctx.rank)
        .ok_or("rank not in the order")?;
    let gate = |p: usize| format!("{}/case-{n}/joined-{p}", ctx.unique("jobs"));
    if pos > 0 {
        ctx.store.wait(&[&gate(pos - 1)], Some(LIMIT))?;
    }
    let t = Instant::now();
    let group = Group::with_options(
        ctx.unique(&format!("tp-{n}")),
        rank,
        2,
        ctx.store.clone(),
        options(ids, job, n),
    );
    ctx.store.set(&gate(pos), b"1")?;
    let base = if job == 'a' { 1.0 } else { 100.0 };
    let r = group.and_then(|g| {
        let c = Communicator::new(&g, Device::host(rank as u32), CommConfig::default().with_timeout(LIMIT))?;
        let mut x = vec![base * (rank + 1) as f32; 64];
        c.all_reduce(&mut x[..], ReduceOp::Sum)?;
        Ok(x)
    });
    let took = t.elapsed();
    let want = base * 3.0;
    let line = match (ids, r) {
        (_, Ok(x)) if x.iter().all(|&v| v == want) => format!("{job}{rank}: own sum"),
        (_, Ok(x)) => {
            return Err(format!("case {n} {ids:?} {order:?}: {job}{rank} returned Ok with {:?}", x[0]).into())
        }
        (Ids::DistinctJobs, Err(e)) => return Err(format!("case {n} distinct jobs: {job}{rank}: {e}").into()),
        (_, Err(Error::Mismatch { detail, .. })) if took < QUICK => {
            if !detail.contains("pid ") {
                return Err(format!("case {n}: the mismatch names no process: {detail}").into());
            }
            format!("{job}{rank}: mismatch in {:.0} ms", took.as_secs_f64() * 1e3)
        }
        (_, Err(e)) => {
            return Err(format!("case {n} {ids:?} {order:?}: {job}{rank} after {took:?}: {e} (want Mismatch)").into())
        }
    };
    // Every case ends together, so the next one's order holds.
    StoreExchange::new(ctx.store.clone(), format!("{}/case-{n}/end", ctx.unique("jobs")))
        .barrier(ctx.rank, 4, LIMIT)?;
    Ok(line)
}

fn body(ctx: &RankCtx) -> TestResult<Vec<String>> {
    symm_testkit::link();
    let mut lines = Vec::new();
    let mut n = 0;
    for ids in [Ids::DistinctJobs, Ids::SharedJob, Ids::NoJob] {
        for order in &ORDERS {
            lines.push(format!("{ids:?} {order:?} {}", case(ctx, n, order, ids)?));
            n += 1;
        }
    }
    Ok(lines)
}

#[test]
fn two_jobs_threads() {
    let per_rank = run_threads(4, LIMIT, |ctx| body(&ctx)).unwrap();
    println!("SUMMARY host_jobs threads: {}", per_rank[3].join("; "));
}

#[test]
fn two_jobs_processes() {
    if let Some(ctx) = child_ctx().unwrap() {
        let lines = body(&ctx).unwrap();
        println!("SUMMARY host_jobs processes rank {}: {}", ctx.rank, lines.join("; "));
        return;
    }
    run_processes("two_jobs_processes", 4, LIMIT).unwrap();
}
