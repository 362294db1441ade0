//! `symmrun` end to end: the ranks are this test binary again (each test
//! plays a rank when `SYMMRUN_TEST_MODE` is set), meeting through the store
//! symmrun hosts with `TcpStore::from_env`, as a torchrun script would.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_core::symm_store::{StoreExchange, TcpStore};
use symm_core::{get_allocator, Channel, Device, DeviceType, Group};

const MODE_ENV: &str = "SYMMRUN_TEST_MODE";

/// Runs symmrun with `args`, its ranks being this binary running test `test`
/// (which, seeing `SYMMRUN_TEST_MODE`, plays one rank).
fn symmrun(args: &[&str], test: &str) -> (i32, Duration, String) {
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_symmrun"))
        .args(args)
        .arg("--")
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(MODE_ENV, test)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), start.elapsed(), text)
}

fn rank_env() -> Option<(usize, usize)> {
    std::env::var(MODE_ENV).ok()?;
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let world: usize = std::env::var("WORLD_SIZE").unwrap().parse().unwrap();
    assert_eq!(std::env::var("LOCAL_RANK").unwrap(), rank.to_string());
    assert_eq!(std::env::var("TORCHELASTIC_USE_AGENT_STORE").unwrap(), "True");
    Some((rank, world))
}

#[test]
fn runs_ranks_that_meet_through_its_store() {
    if let Some((rank, world)) = rank_env() {
        symm_testkit::link();
        let store: Arc<TcpStore> = TcpStore::from_env(Duration::from_secs(30)).unwrap();
        assert!(!store.is_master(), "symmrun hosts the store, ranks are clients");
        let all = StoreExchange::new(store.clone(), "t")
            .all_gather(rank, world, &[rank as u8], Duration::from_secs(30))
            .unwrap();
        assert_eq!(all.concat(), (0..world as u8).collect::<Vec<_>>());
        let g = Group::new("symmrun", rank, world, store).unwrap();
        let a = get_allocator(DeviceType::Host)
            .unwrap()
            .alloc(64, Device::host(rank as u32), &g)
            .unwrap();
        let m = a.rendezvous(Duration::from_secs(30)).unwrap();
        m.barrier(Channel::new(0).unwrap(), Duration::from_secs(30)).unwrap();
        println!("rank {rank}/{world} done");
        return;
    }
    let (code, _, out) = symmrun(
        &["--nproc-per-node", "3", "--timeout", "120"],
        "runs_ranks_that_meet_through_its_store",
    );
    assert_eq!(code, 0, "{out}");
    for r in 0..3 {
        assert!(out.contains(&format!("rank {r}/3 done")), "{out}");
    }
}

#[test]
fn forwards_the_first_failure_and_kills_the_rest() {
    if let Some((rank, _)) = rank_env() {
        if rank == 1 {
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let (code, took, out) = symmrun(
        &["--nproc-per-node", "3", "--grace", "1", "--timeout", "120"],
        "forwards_the_first_failure_and_kills_the_rest",
    );
    assert_eq!(code, 3, "{out}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(out.contains("killed after another rank failed"), "{out}");
}

#[test]
fn kills_everything_at_the_timeout() {
    if rank_env().is_some() {
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let (code, took, out) = symmrun(
        &["--nproc-per-node", "2", "--timeout", "1"],
        "kills_everything_at_the_timeout",
    );
    assert_eq!(code, 124, "{out}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn store_only_and_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_symmrun"))
        .args(["--store-only", "--timeout", "0.2"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("MASTER_ADDR=127.0.0.1 MASTER_PORT="), "{text}");
    // The ids to give ranks started by hand: fresh, or the job id given.
    assert!(text.contains(" SYMM_JOB_ID=symmrun-"), "{text}");
    assert!(text.contains(" SYMM_LAUNCH_ID=symmrun-"), "{text}");
    let given = Command::new(env!("CARGO_BIN_EXE_symmrun"))
        .args(["--store-only", "--timeout", "0.2"])
        .env("SYMM_JOB_ID", "job-by-hand")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&given.stdout);
    assert!(
        text.contains(" SYMM_JOB_ID=job-by-hand SYMM_LAUNCH_ID=symmrun-"),
        "{text}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_symmrun"))
        .arg("--nproc-per-node")
        .arg("2")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// Runs a launch of 3 shell ranks printing their `SYMM_JOB_ID` and
/// `SYMM_LAUNCH_ID`, symmrun's own `SYMM_JOB_ID` being `job` (None: unset);
/// asserts every rank saw the same pair and returns it.
fn launch_ids(job: Option<&str>) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_symmrun"));
    cmd.args(["--nproc-per-node", "3", "--timeout", "60", "--", "sh", "-c"])
        .arg(r#"echo "ids $RANK ${SYMM_JOB_ID-unset} ${SYMM_LAUNCH_ID-unset}""#)
        .env_remove("SYMM_LAUNCH_ID");
    match job {
        Some(j) => cmd.env("SYMM_JOB_ID", j),
        None => cmd.env_remove("SYMM_JOB_ID"),
    };
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}\n{text}", out.status);
    let mut seen: Vec<(String, String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ids "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 3, "{l:?}");
            (f[0].to_string(), f[1].to_string(), f[2].to_string())
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        ["0", "1", "2"],
        "{text}"
    );
    for s in &seen {
        assert_eq!(
            (&s.1, &s.2),
            (&seen[0].1, &seen[0].2),
            "ranks of one launch differ\n{text}"
        );
    }
    (seen[0].1.clone(), seen[0].2.clone())
}

fn fresh(id: &str) -> bool {
    id.strip_prefix("symmrun-")
        .is_some_and(|h| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn every_launch_has_its_own_job_and_launch_ids() {
    let (job_a, launch_a) = launch_ids(None);
    let (job_b, launch_b) = launch_ids(None);
    for id in [&job_a, &launch_a, &job_b, &launch_b] {
        assert!(fresh(id), "{id:?}");
    }
    assert_ne!(job_a, job_b);
    assert_ne!(launch_a, launch_b);
    assert_ne!(job_a, launch_a);
}

#[test]
fn a_job_id_given_passes_through_and_launch_ids_still_differ() {
    let (job_a, launch_a) = launch_ids(Some("my/job:7"));
    let (job_b, launch_b) = launch_ids(Some("my/job:7"));
    assert_eq!(job_a, "my/job:7");
    assert_eq!(job_b, "my/job:7");
    assert!(fresh(&launch_a) && fresh(&launch_b), "{launch_a:?} {launch_b:?}");
    assert_ne!(launch_a, launch_b);
}

/// The test launcher passes its launch id to its children as symm-core's
/// `SYMM_LAUNCH_ID` too.
#[test]
fn run_processes_passes_its_launch_id_as_symm_launch_id() {
    if let Some(ctx) = symm_testkit::launch::child_ctx().unwrap() {
        assert_ne!(ctx.launch_id, 0);
        assert_eq!(std::env::var("SYMM_LAUNCH_ID").unwrap(), ctx.launch_id.to_string());
        return;
    }
    symm_testkit::run_processes(
        "run_processes_passes_its_launch_id_as_symm_launch_id",
        2,
        Duration::from_secs(60),
    )
    .unwrap();
}
