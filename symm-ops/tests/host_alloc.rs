//! Allocations sized by the user (issue #17): a staging size or an
//! allocation the machine cannot give is `Error::OutOfMemory` naming what
//! was asked, on every rank, never an abort ("memory allocation of N bytes
//! failed"). The sizes lie past any user address space, so they are refused
//! even where Linux overcommits memory.

use std::time::{Duration, Instant};

use symm_core::{get_allocator, Device, DeviceType, Error};
use symm_ops::{CommConfig, Communicator};
use symm_testkit::launch::{run_threads, RankCtx, TestResult};

const LIMIT: Duration = Duration::from_secs(60);
/// 1 PiB: past the 47-bit address space user mappings get.
const HUGE: usize = 1 << 50;

/// The premise: this machine refuses the scratch such a staging size needs
/// (else the test would only prove that the machine had the memory).
fn refused(bytes: usize) -> bool {
    Vec::<u8>::new().try_reserve_exact(bytes).is_err()
}

fn staging(bytes: usize) -> CommConfig {
    CommConfig::default().with_staging_bytes(bytes)
}

fn expect_oom(r: symm_core::Result<Communicator>, asked: usize) -> TestResult {
    match r {
        Err(Error::OutOfMemory { device, detail }) => {
            assert_eq!(device, "host");
            assert!(detail.contains(&format!("staging_bytes = {asked}")), "{detail}");
            Ok(())
        }
        Err(e) => panic!("staging_bytes {asked}: expected OutOfMemory, got {e}"),
        Ok(_) => panic!("staging_bytes {asked}: a communicator was built"),
    }
}

fn rank(ctx: &RankCtx) -> TestResult {
    symm_testkit::link();
    let group = ctx.group(&ctx.unique("huge-staging"))?;
    let dev = Device::host(ctx.rank as u32);
    expect_oom(Communicator::new(&group, dev, staging(HUGE)), HUGE)?;
    // Past isize::MAX: the allocator's capacity overflow, the same error.
    expect_oom(Communicator::new(&group, dev, staging(usize::MAX)), usize::MAX)?;
    // Nothing half set up: the group still builds a communicator and runs an op.
    let comm = Communicator::new(&group, dev, staging(4096))?;
    let mut v = vec![1.0f32 + ctx.rank as f32; 3000];
    comm.all_reduce(&mut v[..], symm_core::ReduceOp::Sum)?;
    let want: f32 = (0..ctx.world).map(|r| 1.0 + r as f32).sum();
    assert!(v.iter().all(|&x| x == want), "{:?}", &v[..4]);
    Ok(())
}

#[test]
fn huge_staging_is_out_of_memory_not_an_abort() {
    assert!(
        refused(HUGE),
        "this machine grants {HUGE} bytes; the test proves nothing here"
    );
    let start = Instant::now();
    run_threads(1, LIMIT, |ctx| rank(&ctx)).unwrap();
    // Every rank fails alike before the staging rendezvous: no rank waits
    // for a peer that gave up.
    run_threads(3, LIMIT, |ctx| rank(&ctx)).unwrap();
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
}

#[test]
fn huge_host_allocation_is_out_of_memory() {
    symm_testkit::link();
    run_threads(1, LIMIT, |ctx| {
        let group = ctx.group(&ctx.unique("huge-alloc"))?;
        let r = get_allocator(DeviceType::Host)?.alloc(HUGE, Device::host(0), &group);
        match r {
            Err(Error::OutOfMemory { device, detail }) => {
                assert_eq!(device, "host");
                // The buffer and its signal pad, in one mapping.
                let asked = HUGE + symm_core::pad::SIGNAL_PAD_SIZE;
                assert!(detail.contains(&asked.to_string()), "{detail}");
            }
            Err(e) => panic!("expected OutOfMemory, got {e}"),
            Ok(_) => panic!("a {HUGE}-byte allocation was granted"),
        }
        // usize::MAX overflows the page rounding: a range error, not an abort.
        assert!(get_allocator(DeviceType::Host)?
            .alloc(usize::MAX, Device::host(0), &group)
            .is_err());
        Ok(())
    })
    .unwrap();
}
