//! A dropped communicator tells its peers (NOTE [peer-watch], issue #39): the ranks all-reduce
//! in a loop; after a few ops the last rank drops its communicator (its thread or process stays
//! alive); every other rank's next op fails with `PeerLost` naming it within 1 s of the drop,
//! although the ops' timeout is 30 s. Worlds 2, 3 and 8; threads and processes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use symm_core::symm_store::StoreExchange;
use symm_core::{Device, Error, ReduceOp};
use symm_ops::{CommConfig, Communicator};
use symm_testkit::launch::{child_ctx, run_processes, run_threads, RankCtx, TestResult};

const LIMIT: Duration = Duration::from_secs(120);
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon the survivors must learn.
const WITHIN: Duration = Duration::from_secs(1);
/// Ops every rank runs before the last rank drops its communicator.
const TOGETHER: usize = 5;

fn now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

fn body(ctx: &RankCtx) -> TestResult<String> {
    symm_testkit::link();
    let group = ctx.group(&ctx.unique("drop"))?;
    let config = CommConfig::default().with_timeout(OP_TIMEOUT);
    let c = Communicator::new(&group, Device::host(ctx.rank as u32), config)?;
    let victim = ctx.world - 1;
    let key = format!("{}/dropped-at", ctx.unique("drop"));
    let mut x = vec![1.0f32; 1024];
    let line = if ctx.rank == victim {
        for _ in 0..TOGETHER {
            c.all_reduce(&mut x[..], ReduceOp::Sum)?;
        }
        drop(c);
        ctx.store.set(&key, now().as_nanos().to_string().as_bytes())?;
        format!("rank {victim} dropped its communicator")
    } else {
        let mut ops = 0;
        let e = loop {
            match c.all_reduce(&mut x[..], ReduceOp::Sum) {
                Ok(()) => ops += 1,
                Err(e) => break e,
            }
            if ops > TOGETHER {
                return Err(format!("rank {}: op {ops} succeeded without rank {victim}", ctx.rank).into());
            }
        };
        let at = now();
        if ops != TOGETHER {
            return Err(format!("rank {}: failed after {ops} ops (want {TOGETHER}): {e}", ctx.rank).into());
        }
        match &e {
            Error::PeerLost { rank, .. } if *rank == victim => {}
            other => return Err(format!("rank {}: {other} (want PeerLost naming rank {victim})", ctx.rank).into()),
        }
        let dropped: u128 = String::from_utf8(ctx.store.get(&key)?)?.parse()?;
        let took = at.as_nanos().saturating_sub(dropped);
        if took > WITHIN.as_nanos() {
            return Err(format!("rank {}: PeerLost {} ms after the drop", ctx.rank, took / 1_000_000).into());
        }
        format!("rank {}: {e} {:.1} ms after the drop", ctx.rank, took as f64 / 1e6)
    };
    // The victim stays alive (the drop, not an exit, told the peers) until everyone checked.
    StoreExchange::new(ctx.store.clone(), ctx.unique("drop-end")).barrier(ctx.rank, ctx.world, LIMIT)?;
    Ok(line)
}

fn threads(world: usize) {
    let lines = run_threads(world, LIMIT, |ctx| body(&ctx)).unwrap();
    println!("SUMMARY host_drop threads w{world}: {}", lines.join("; "));
}

fn processes(name: &str, world: usize) {
    if let Some(ctx) = child_ctx().unwrap() {
        println!("SUMMARY host_drop processes w{world}: {}", body(&ctx).unwrap());
        return;
    }
    run_processes(name, world, LIMIT).unwrap();
}

#[test]
fn drop_threads_w2() {
    threads(2);
}

#[test]
fn drop_threads_w3() {
    threads(3);
}

#[test]
fn drop_threads_w8() {
    threads(8);
}

#[test]
fn drop_processes_w2() {
    processes("drop_processes_w2", 2);
}

#[test]
fn drop_processes_w3() {
    processes("drop_processes_w3", 3);
}

#[test]
fn drop_processes_w8() {
    processes("drop_processes_w8", 8);
}
