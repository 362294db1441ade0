//! `symmrun` end to end: the ranks are this test binary again (running
//! `rank_body`), meeting through the store symmrun hosts with
//! `TcpStore::from_env`, as a torchrun script would.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_core::symm_store::{StoreExchange, TcpStore};
use symm_core::{get_allocator, Channel, Device, DeviceType, Group};

const MODE_ENV: &str = "SYMMRUN_TEST_MODE";

fn symmrun(args: &[&str], mode: &str) -> (i32, Duration, String) {
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_symmrun"))
        .args(args)
        .arg("--")
        .arg(exe)
        .args(["rank_body", "--exact", "--nocapture", "--test-threads=1"])
        .env(MODE_ENV, mode)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), start.elapsed(), text)
}

/// One rank under symmrun (does nothing when run directly by the harness).
#[test]
fn rank_body() {
    let Ok(mode) = std::env::var(MODE_ENV) else { return };
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let world: usize = std::env::var("WORLD_SIZE").unwrap().parse().unwrap();
    assert_eq!(std::env::var("LOCAL_RANK").unwrap(), rank.to_string());
    match mode.as_str() {
        "ok" => {
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
        }
        "fail" => {
            if rank == 1 {
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_secs(60));
        }
        "hang" => std::thread::sleep(Duration::from_secs(60)),
        m => panic!("unknown mode {m}"),
    }
}

#[test]
fn runs_ranks_that_meet_through_its_store() {
    let (code, _, out) = symmrun(&["--nproc-per-node", "3", "--timeout", "120"], "ok");
    assert_eq!(code, 0, "{out}");
    for r in 0..3 {
        assert!(out.contains(&format!("rank {r}/3 done")), "{out}");
    }
}

#[test]
fn forwards_the_first_failure_and_kills_the_rest() {
    let (code, took, out) = symmrun(&["--nproc-per-node", "3", "--grace", "1", "--timeout", "120"], "fail");
    assert_eq!(code, 3, "{out}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(out.contains("killed after another rank failed"), "{out}");
}

#[test]
fn kills_everything_at_the_timeout() {
    let (code, took, out) = symmrun(&["--nproc-per-node", "2", "--timeout", "1"], "hang");
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
    let bad = Command::new(env!("CARGO_BIN_EXE_symmrun"))
        .arg("--nproc-per-node")
        .arg("2")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
