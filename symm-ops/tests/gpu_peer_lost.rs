//! A peer that leaves ends the survivors' GPU ops with `PeerLost` naming it, through the abort
//! word the kernels poll (NOTE [peer-watch], issue #39), long before the op timeout (30 s here):
//! - processes, one GPU each (2 and 4): after a few ops the last rank's process is killed with
//!   `kill -9` mid-loop; every survivor's op fails with `PeerLost` naming it within 200 ms;
//! - threads (every world of `gpu_world_tests!`, ranks sharing one GPU included): the last rank
//!   drops its communicator; the survivors likewise.
//!
//! The survivors all-reduce a symmetric buffer (the Lamport path) eagerly, synchronising each op
//! and asking for a latched error, as an engine's step does.
#![cfg(feature = "cuda")]

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::gpu::{gate, rig, run, Rig, LIMIT};
use symm_core::symm_store::StoreExchange;
use symm_core::{Error, ReduceOp};
use symm_ops::CommConfig;
use symm_testkit::launch::{child_ctx, run_processes_outcomes, ChildStatus, ProcessOptions, RankCtx, TestResult};
use symm_testkit::GpuWorld;

const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon the survivors must learn.
const WITHIN: Duration = Duration::from_millis(200);
/// Ops every rank runs before the last rank leaves.
const TOGETHER: usize = 20;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

fn key(rc: &RankCtx) -> String {
    format!("{}/left-at", rc.unique("gpu_peer_lost"))
}

/// One op as an engine's step runs it: all-reduce, synchronise, ask for a latched error.
fn step(rig: &Rig, buf: &mut symm_ops::SymmBuffer<f32>) -> symm_core::Result<()> {
    rig.comm.all_reduce(buf, ReduceOp::Sum)?;
    rig.stream
        .synchronize()
        .map_err(|e| Error::InvalidArgument(format!("synchronize: {e}")))?;
    rig.comm.check_error()
}

/// A survivor: ops until one fails; checks it is `PeerLost` naming the last rank, in time.
fn survive(rc: &RankCtx, rig: &Rig, buf: &mut symm_ops::SymmBuffer<f32>) -> TestResult<String> {
    let victim = rc.world - 1;
    let mut ops = 0;
    let e = loop {
        match step(rig, buf) {
            Ok(()) => ops += 1,
            Err(e) => break e,
        }
        if ops > TOGETHER {
            return Err(format!("rank {}: op {ops} succeeded without rank {victim}", rc.rank).into());
        }
    };
    let at = now_ns();
    match &e {
        Error::PeerLost { rank, .. } if *rank == victim => {}
        other => {
            return Err(format!(
                "rank {}: after {ops} ops: {other} (want PeerLost naming {victim})",
                rc.rank
            )
            .into())
        }
    }
    let left: u128 = String::from_utf8(rc.store.get(&key(rc))?)?.parse()?;
    let took = Duration::from_nanos(u64::try_from(at.saturating_sub(left)).unwrap_or(u64::MAX));
    if took > WITHIN {
        return Err(format!("rank {}: PeerLost {took:?} after rank {victim} left: {e}", rc.rank).into());
    }
    Ok(format!(
        "rank {}: {e} after {ops} ops, {:.1} ms after it left",
        rc.rank,
        took.as_secs_f64() * 1e3
    ))
}

fn setup(rc: &RankCtx) -> TestResult<(Rig, symm_ops::SymmBuffer<f32>)> {
    let rig = rig(rc, "gpu_peer_lost", CommConfig::default().with_timeout(OP_TIMEOUT))?;
    let buf = rig.comm.alloc::<f32>(4099)?;
    buf.copy_from_host(&vec![1.0f32; 4099])?;
    rig.ready()?;
    Ok((rig, buf))
}

/// Threads: the last rank drops its communicator.
fn body_drop(rc: RankCtx) -> TestResult<String> {
    let (rig, mut buf) = setup(&rc)?;
    let line = if rc.rank == rc.world - 1 {
        for _ in 0..TOGETHER {
            step(&rig, &mut buf)?;
        }
        drop(buf);
        drop(rig);
        rc.store.set(&key(&rc), now_ns().to_string().as_bytes())?;
        format!("rank {} dropped its communicator", rc.rank)
    } else {
        survive(&rc, &rig, &mut buf)?
    };
    StoreExchange::new(rc.store.clone(), rc.unique("gpu_peer_lost-end")).barrier(rc.rank, rc.world, LIMIT)?;
    Ok(line)
}

fn gpu_peer_drop(w: GpuWorld) {
    if !gate("gpu_peer_drop", w) {
        return;
    }
    let t = Instant::now();
    let out = run(w, body_drop);
    println!(
        "SUMMARY gpu_peer_drop {} pass {:.1}s; {}",
        w.label(),
        t.elapsed().as_secs_f64(),
        out.join("; ")
    );
}
symm_testkit::gpu_world_tests!(gpu_peer_drop, gpu_peer_drop);

/// Processes: the last rank's process is killed with `kill -9` mid-loop.
fn gpu_peer_killed(name: &str, world: usize) {
    if !gate(name, GpuWorld::distinct(world)) {
        return;
    }
    if let Some(rc) = child_ctx().unwrap() {
        let (rig, mut buf) = setup(&rc).unwrap();
        if rc.rank == world - 1 {
            for _ in 0..TOGETHER {
                step(&rig, &mut buf).unwrap();
            }
            rc.store.set(&key(&rc), now_ns().to_string().as_bytes()).unwrap();
            let me = std::process::id().to_string();
            let _ = std::process::Command::new("kill").args(["-9", &me]).status();
            std::thread::sleep(Duration::from_secs(60));
            panic!("rank {}: still alive after kill -9", rc.rank);
        }
        println!("SURVIVOR {}", survive(&rc, &rig, &mut buf).unwrap());
        return;
    }
    let t = Instant::now();
    let opts = ProcessOptions::new(name, world, LIMIT);
    let mut lines = Vec::new();
    for o in run_processes_outcomes(&opts).unwrap() {
        if o.rank == world - 1 {
            assert_eq!(o.status, ChildStatus::Signaled(9), "the victim");
        } else {
            assert!(o.status.success(), "rank {}: {:?}\n{}", o.rank, o.status, o.output);
            let line = o
                .output
                .lines()
                .find_map(|l| l.find("SURVIVOR").map(|i| l[i..].to_string()))
                .unwrap_or_default();
            assert!(line.contains("lost"), "rank {}: {}", o.rank, o.output);
            lines.push(line);
        }
    }
    println!(
        "SUMMARY {name} pass {:.1}s; {}",
        t.elapsed().as_secs_f64(),
        lines.join("; ")
    );
}

#[test]
fn gpu_peer_killed_processes_w2() {
    gpu_peer_killed("gpu_peer_killed_processes_w2", 2);
}

#[test]
fn gpu_peer_killed_processes_w4() {
    gpu_peer_killed("gpu_peer_killed_processes_w4", 4);
}
