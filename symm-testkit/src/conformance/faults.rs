//! The conformance cases of faults: out-of-range access, mismatched sizes, a rank that never
//! arrives or is killed at each step of setup, a peer dead in a barrier, and repeated
//! alloc/free cycles that must leak nothing.

use super::*;

pub(super) fn case_out_of_range(b: &Backend, ctx: &RankCtx) -> TestResult {
    let (me, w) = (ctx.rank, ctx.world);
    let s = setup(b, ctx, "range")?;
    let size = 1000usize;
    let (_a, mem) = s.memory(size, b.timeout)?;
    let t = b.timeout;
    ensure!(
        matches!(Channel::new(NUM_CHANNELS), Err(Error::OutOfRange { .. })),
        "channel {NUM_CHANNELS} accepted"
    );
    ensure!(
        matches!(Rank::new(w, w), Err(Error::OutOfRange { .. })),
        "rank {w} accepted"
    );
    let own = mem.rank();
    let fill: Vec<u8> = (0..size).map(|i| (i * 13 + me) as u8).collect();
    mem.write_bytes(own, 0, &fill)?;
    mem.barrier(ch(0)?, t)?;
    let pads_before: Vec<Vec<u8>> = (0..w)
        .map(|r| {
            let mut p = vec![0u8; pad::SIGNAL_PAD_SIZE];
            mem.read_signal_pad(own.peer(r)?, 0, &mut p).map(|_| p)
        })
        .collect::<symm_core::Result<_>>()?;
    let is_range = |r: symm_core::Result<()>| matches!(r, Err(Error::OutOfRange { .. }));
    if w < pad::MAX_WORLD_SIZE {
        let beyond = Rank::new(w, w + 1)?;
        ensure!(is_range(mem.put_signal(beyond, ch(1)?, t)), "put_signal to rank {w}");
        ensure!(
            is_range(mem.wait_signal(beyond, ch(1)?, t)),
            "wait_signal from rank {w}"
        );
        ensure!(is_range(mem.read_bytes(beyond, 0, &mut [0u8; 4])), "read of rank {w}");
        ensure!(is_range(mem.write_bytes(beyond, 0, &[1])), "write to rank {w}");
        ensure!(
            is_range(mem.read_signal_pad(beyond, 0, &mut [0u8; 4])),
            "pad of rank {w}"
        );
    }
    let peer = own.peer((me + 1) % w)?;
    ensure!(
        is_range(mem.read_bytes(own, size - 3, &mut [0u8; 4])),
        "read past the end"
    );
    ensure!(is_range(mem.write_bytes(peer, size, &[1])), "write at the end");
    ensure!(
        is_range(mem.write_bytes(peer, size - 1, &[1, 2])),
        "write across the end"
    );
    ensure!(is_range(mem.write_bytes(own, usize::MAX, &[1])), "write at usize::MAX");
    ensure!(
        is_range(mem.read_signal_pad(own, pad::SIGNAL_PAD_SIZE - 2, &mut [0u8; 4])),
        "pad read past the end"
    );
    ensure!(
        matches!(mem.get_buffer(w, &[1], DType::U8, 0), Err(Error::OutOfRange { .. })),
        "get_buffer of rank {w}"
    );
    ensure!(
        matches!(
            mem.get_buffer(0, &[size / 4 + 1], DType::U32, 0),
            Err(Error::OutOfRange { .. })
        ),
        "get_buffer past the end"
    );
    ensure!(
        matches!(mem.get_buffer(0, &[1], DType::U32, 2), Err(Error::Misaligned { .. })),
        "misaligned get_buffer"
    );
    ensure!(
        matches!(
            mem.get_buffer(0, &[usize::MAX, 2], DType::U32, 0),
            Err(Error::InvalidArgument(_))
        ),
        "overflowing get_buffer shape"
    );
    let other_type = if b.device_type == DeviceType::Host {
        Device::cuda(0)
    } else {
        Device::host(0)
    };
    ensure!(
        s.alloc.alloc(64, other_type, &s.group).is_err(),
        "alloc on a {other_type} device accepted"
    );
    ensure!(
        empty_strided_p2p(&[2, 2], &[1], DType::F32, s.device, &s.group, None).is_err(),
        "shape/stride of different lengths accepted"
    );
    // Nothing was done: buffers and pads unchanged, signalling still in step.
    mem.barrier(ch(0)?, t)?;
    let mut back = vec![0u8; size];
    mem.read_bytes(own, 0, &mut back)?;
    ensure!(back == fill, "a rejected write changed rank {me}'s buffer");
    for (r, before) in pads_before.iter().enumerate() {
        let mut p = vec![0u8; pad::SIGNAL_PAD_SIZE];
        mem.read_signal_pad(own.peer(r)?, 0, &mut p)?;
        // Barrier slots move with the barrier above; compare everything else.
        let changed = (0..pad::SIGNAL_PAD_SIZE / 4).find(|&i| {
            let barrier_region = i < pad::SIGNAL_BASE || (pad::LOCAL_BARRIER_EPOCH..pad::LOCAL_SENT).contains(&i);
            !barrier_region && p[i * 4..i * 4 + 4] != before[i * 4..i * 4 + 4]
        });
        ensure!(
            changed.is_none(),
            "a rejected call changed word {changed:?} of rank {r}'s pad"
        );
    }
    mem.barrier(ch(0)?, t)?; // everyone compared before anyone signals
    mem.put_signal(peer, ch(1)?, t)?;
    mem.wait_signal(own.peer((me + w - 1) % w)?, ch(1)?, t)?;
    mem.barrier(ch(0)?, t)?;
    Ok(())
}

pub(super) fn case_mismatched_sizes(b: &Backend, ctx: &RankCtx) -> TestResult {
    let (me, w) = (ctx.rank, ctx.world);
    let s = setup(b, ctx, "mismatch")?;
    let size = 4096 + if me == w - 1 { 64 } else { 0 };
    let a = s.alloc(size)?;
    let start = Instant::now();
    let err = match a.rendezvous(b.timeout) {
        Ok(_) => return fail("rendezvous of different sizes succeeded".into()),
        Err(e) => e,
    };
    ensure!(start.elapsed() < b.timeout, "the mismatch took {:?}", start.elapsed());
    ensure!(
        matches!(
            err,
            Error::Mismatch {
                what: "buffer size",
                ..
            }
        ),
        "rank {me}: {err}"
    );
    ensure!(a.symmetric_memory().is_none(), "a failed rendezvous left a memory");
    let text = err.to_string();
    let all = ctx.all_gather("mismatch-errors", text.as_bytes(), b.timeout)?;
    for (r, e) in all.iter().enumerate() {
        ensure!(
            e == text.as_bytes(),
            "rank {r} failed differently: {:?} vs {text:?}",
            String::from_utf8_lossy(e)
        );
    }
    drop(a);
    // The group still works.
    let (_a, mem) = s.memory(4096, b.timeout)?;
    mem.barrier(ch(0)?, b.timeout)?;
    Ok(())
}

fn deadline_slack(b: &Backend) -> Duration {
    b.fault_timeout + b.fault_timeout.max(Duration::from_secs(4))
}

pub(super) fn case_never_arrives(b: &Backend, ctx: &RankCtx) -> TestResult {
    let (me, w) = (ctx.rank, ctx.world);
    let absent = w - 1;
    let s = setup(b, ctx, "absent")?;
    if me == absent {
        return Ok(());
    }
    let a = s.alloc(4096)?;
    let start = Instant::now();
    let r = a.rendezvous(b.fault_timeout);
    let took = start.elapsed();
    match r {
        Ok(_) => fail(format!("rendezvous without rank {absent} succeeded")),
        Err(e) => {
            ensure!(
                names_rank(&e, absent),
                "rank {me}: the error does not name rank {absent}: {e}"
            );
            ensure!(took <= deadline_slack(b), "rank {me} failed after {took:?}");
            println!("rank {me}: failed as expected after {took:?}: {e}");
            Ok(())
        }
    }
}

pub(super) fn case_killed(b: &Backend, ctx: &RankCtx, case: Case) -> TestResult {
    let me = ctx.rank;
    let s = setup(b, ctx, "killed")?;
    let before = match (ctx.mode, b.resources) {
        (Mode::Processes, Some(f)) => Some(f()),
        _ => None,
    };
    let a = s.alloc(8192)?;
    let start = Instant::now();
    let r = a.rendezvous(b.fault_timeout);
    let took = start.elapsed();
    let victim = case.fault(ctx.world).map(|f| f.rank);
    match r {
        Err(e) if is_injected(&e) => return Err(e.into()),
        Ok(_) => return fail(format!("rank {me}: rendezvous succeeded although rank {victim:?} died")),
        Err(e) => {
            ensure!(is_peer_failure(&e), "rank {me}: {e}");
            ensure!(
                victim.is_some_and(|v| names_rank(&e, v)) || matches!(e, Error::Timeout { .. }),
                "rank {me}: the error does not name rank {victim:?}: {e}"
            );
            ensure!(took <= deadline_slack(b), "rank {me} failed after {took:?}: {e}");
            // Processes on one host: the dead process itself is noticed (NOTE [setup-liveness]),
            // well before the wait's timeout, and the error says which rank it was (a PeerLost
            // is not a Timeout, so the check above already made it name the victim).
            if ctx.mode == Mode::Processes {
                let lost = matches!(e, Error::PeerLost { .. } | Error::Store(StoreError::PeerLost { .. }));
                ensure!(
                    lost && took <= SETUP_LIVENESS,
                    "rank {me}: a dead process should be PeerLost naming rank {victim:?} within \
                     {SETUP_LIVENESS:?}; got after {took:?}: {e}"
                );
            }
            println!("rank {me}: failed as expected after {took:?}: {e}");
        }
    }
    drop(a);
    if let (Some(before), Some(f)) = (before, b.resources) {
        check_resources(b, &before, &f(), "after a failed rendezvous")?;
    }
    Ok(())
}

pub(super) fn case_dead_peer_in_barrier(b: &Backend, ctx: &RankCtx) -> TestResult {
    let me = ctx.rank;
    let s = setup(b, ctx, "dead-barrier")?;
    let (a, mem) = s.memory(4096, b.timeout)?;
    ctx.barrier("dead-barrier-ready", b.timeout)?;
    let start = Instant::now();
    let r = mem.barrier(ch(4)?, b.fault_timeout);
    let took = start.elapsed();
    match r {
        Err(e) if is_injected(&e) => return Err(e.into()),
        Ok(()) => return fail(format!("rank {me}: the barrier passed without the dead rank")),
        Err(e) => {
            ensure!(
                matches!(e, Error::Timeout { .. } | Error::PeerLost { .. }),
                "rank {me}: {e}"
            );
            ensure!(took <= deadline_slack(b), "rank {me} failed after {took:?}");
            println!("rank {me}: failed as expected after {took:?}: {e}");
        }
    }
    drop((mem, a)); // shuts down cleanly with a dead peer
    Ok(())
}

fn check_resources(b: &Backend, before: &[Resource], after: &[Resource], when: &str) -> TestResult {
    for ((name, v0), (_, v1)) in before.iter().zip(after) {
        let slack = (b.resource_slack)(name);
        ensure!(*v1 <= v0 + slack, "{name}: {v0} before, {v1} {when} (slack {slack})");
    }
    Ok(())
}

pub(super) fn case_alloc_free_cycles(b: &Backend, ctx: &RankCtx) -> TestResult {
    let me = ctx.rank;
    let t = b.timeout;
    let s = setup(b, ctx, "cycles")?;
    // Who measures: every process, or rank 0 for all the threads of one.
    let measures = ctx.mode == Mode::Processes || me == 0;
    let cycle = |i: usize| -> TestResult {
        let a = s.alloc(4096 + (i % 5) * 1000)?;
        let m = a.rendezvous(t)?;
        if i.is_multiple_of(100) {
            m.write_bytes(m.rank(), 0, &(i as u64).to_ne_bytes())?;
            m.barrier(ch(0)?, t)?;
            let mut x = [0u8; 8];
            m.read_bytes(m.rank().peer((me + 1) % ctx.world)?, 0, &mut x)?;
            ensure!(u64::from_ne_bytes(x) == i as u64, "cycle {i}: stale data");
            m.barrier(ch(0)?, t)?;
        }
        Ok(())
    };
    cycle(0)?; // warm up lazily built state
    ctx.barrier("cycles-0", t)?;
    let before = b.resources.filter(|_| measures).map(|f| f());
    ctx.barrier("cycles-1", t)?;
    for i in 1..=b.cycles {
        cycle(i)?;
    }
    ctx.barrier("cycles-2", t)?;
    if let (Some(before), Some(f)) = (before, b.resources) {
        check_resources(b, &before, &f(), &format!("after {} cycles", b.cycles))?;
    }
    ctx.barrier("cycles-3", t)?;
    Ok(())
}
