//! The conformance cases of a working group: rendezvous, signals, barriers, persistent
//! allocations, groups, abort.

use super::*;

pub(super) fn case_rendezvous(b: &Backend, ctx: &RankCtx) -> TestResult {
    let (me, w) = (ctx.rank, ctx.world);
    let s = setup(b, ctx, "rendezvous")?;
    let n = 1030usize; // u32 elements: an odd size in bytes (4120 + 4 spare)
    let size = n * 4 + 4;
    let a = s.alloc(size)?;
    ensure!(a.size() == size, "alloc size {} != {size}", a.size());
    ensure!(a.symmetric_memory().is_none(), "memory before rendezvous");
    let mem = a.rendezvous(b.timeout)?;
    let again = a.rendezvous(b.timeout)?;
    ensure!(Arc::ptr_eq(&mem, &again), "a second rendezvous gave another memory");
    ensure!(a.symmetric_memory().is_some(), "no memory after rendezvous");
    ensure!(
        mem.rank().get() == me && mem.world_size() == w,
        "rank/world {}",
        mem.rank()
    );
    ensure!(mem.buffer_size() == size, "buffer_size {}", mem.buffer_size());
    ensure!(
        mem.signal_pad_size() == pad::SIGNAL_PAD_SIZE,
        "pad size {}",
        mem.signal_pad_size()
    );
    ensure!(mem.device() == s.device, "device {}", mem.device());
    let (bp, pp) = (mem.buffer_ptrs(), mem.signal_pad_ptrs());
    ensure!(
        bp.len() == w && pp.len() == w,
        "pointer arrays of {} and {}",
        bp.len(),
        pp.len()
    );
    ensure!(
        bp[me] == a.ptr(),
        "own buffer {:#x} != alloc ptr {:#x}",
        bp[me],
        a.ptr()
    );
    let mut all: Vec<u64> = bp.iter().chain(pp).copied().collect();
    ensure!(all.iter().all(|&p| p != 0), "null pointer in {all:x?}");
    all.sort_unstable();
    all.dedup();
    ensure!(all.len() == 2 * w, "buffer and pad pointers are not distinct");
    ensure!(
        mem.buffer_ptrs_dev() != 0 && mem.signal_pad_ptrs_dev() != 0,
        "null device arrays"
    );
    // Pads start at zero, everywhere.
    for r in 0..w {
        let mut p = vec![1u8; pad::SIGNAL_PAD_SIZE];
        mem.read_signal_pad(Rank::new(r, w)?, 0, &mut p)?;
        ensure!(p.iter().all(|&x| x == 0), "rank {r}'s pad is not zero after rendezvous");
    }
    ctx.barrier("rendezvous-pads-checked", b.timeout)?; // before anyone signals
                                                        // Each rank fills its own buffer through a view; every rank reads every peer's.
    let own = mem.get_buffer(me, &[n], DType::U32, 0)?;
    ensure!(own.ptr() == bp[me] && own.nbytes() == n * 4, "own view {own:?}");
    let pattern = |r: usize| -> Vec<u32> { (0..n as u32).map(|i| (r as u32) * 100_000 + i * 7 + 1).collect() };
    own.write(&bytes_of(&pattern(me)))?;
    mem.barrier(ch(0)?, b.timeout)?;
    for (r, &ptr) in bp.iter().enumerate() {
        let v = mem.get_buffer(r, &[n], DType::U32, 0)?;
        ensure!(v.ptr() == ptr && v.rank().get() == r, "view of rank {r}: {v:?}");
        ensure!(
            u32s(&v.read()?) == pattern(r),
            "rank {me} reads a wrong buffer of rank {r}"
        );
        let tail = mem.get_buffer(r, &[3], DType::U8, 5)?;
        ensure!(
            tail.read()? == bytes_of(&pattern(r))[5..8],
            "odd-offset view of rank {r}"
        );
    }
    // Writes into a peer's buffer are seen by the peer.
    let next = (me + 1) % w;
    let inbox = mem.get_buffer(next, &[1], DType::U32, n * 4)?;
    inbox.write(&(me as u32 + 7).to_ne_bytes())?;
    mem.barrier(ch(0)?, b.timeout)?;
    let prev = (me + w - 1) % w;
    let got = u32s(&mem.get_buffer(me, &[1], DType::U32, n * 4)?.read()?)[0];
    ensure!(got == prev as u32 + 7, "rank {me}: peer {prev}'s write reads {got}");
    // Tensors: empty_p2p + rendezvous + get_symmetric_memory.
    let t = empty_p2p(&[5, 7], DType::F32, s.device, &s.group, None)?;
    ensure!(get_symmetric_memory(&t).is_none(), "tensor memory before rendezvous");
    let tm = t.rendezvous(b.timeout)?;
    ensure!(
        get_symmetric_memory(&t).is_some_and(|m| Arc::ptr_eq(&m, &tm)),
        "get_symmetric_memory differs from rendezvous"
    );
    ensure!(tm.buffer_ptrs()[me] == t.ptr(), "tensor ptr is not its own buffer");
    ensure!(tm.buffer_size() >= 5 * 7 * 4, "tensor buffer {}", tm.buffer_size());
    tm.barrier(ch(1)?, b.timeout)?;
    mem.barrier(ch(0)?, b.timeout)?;
    Ok(())
}

pub(super) fn case_signals(b: &Backend, ctx: &RankCtx) -> TestResult {
    let (me, w) = (ctx.rank, ctx.world);
    let s = setup(b, ctx, "signals")?;
    let (_a, mem) = s.memory(64, b.timeout)?;
    let (ca, cb) = (3usize, NUM_CHANNELS - 1);
    let dst = mem.rank().peer((me + 1) % w)?;
    let src = mem.rank().peer((me + w - 1) % w)?;
    let count_a = |r: usize| 3 + r as u32;
    let count_b = |r: usize| 5 + 2 * r as u32;
    let t = b.timeout;
    std::thread::scope(|sc| -> TestResult {
        let m = &mem;
        let ja = sc.spawn(move || -> symm_core::Result<()> {
            for _ in 0..count_a(me) {
                m.put_signal(dst, ch(ca)?, t)?;
            }
            for _ in 0..count_a(src.get()) {
                m.wait_signal(src, ch(ca)?, t)?;
            }
            Ok(())
        });
        let jb = sc.spawn(move || -> symm_core::Result<()> {
            for _ in 0..count_b(me) {
                m.put_signal(dst, ch(cb)?, t)?;
            }
            for _ in 0..count_b(src.get()) {
                m.wait_signal(src, ch(cb)?, t)?;
            }
            Ok(())
        });
        ja.join().map_err(|_| "channel A thread panicked")??;
        jb.join().map_err(|_| "channel B thread panicked")??;
        Ok(())
    })?;
    // No extra signal arrived on either channel.
    for c in [ca, cb] {
        match mem.wait_signal(src, ch(c)?, Duration::from_millis(50)) {
            Err(Error::Timeout { .. }) => {}
            other => return fail(format!("an extra wait on channel {c} gave {other:?}")),
        }
    }
    let sa = pad_word(&mem, me, pad::signal_slot(ca, src.get()))?;
    let sb = pad_word(&mem, me, pad::signal_slot(cb, src.get()))?;
    ensure!(
        sa == count_a(src.get()) && sb == count_b(src.get()),
        "signal slots {sa}, {sb}"
    );
    // Barriers on two channels at once, from two threads.
    let rounds = 25u32;
    std::thread::scope(|sc| -> TestResult {
        let m = &mem;
        let hs: Vec<_> = [1usize, 2]
            .into_iter()
            .map(|c| {
                sc.spawn(move || -> symm_core::Result<()> {
                    for _ in 0..rounds {
                        m.barrier(ch(c)?, t)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| "barrier thread panicked")??;
        }
        Ok(())
    })?;
    for c in [1usize, 2] {
        for p in (0..w).filter(|&p| p != me) {
            let v = pad_word(&mem, me, pad::barrier_slot(c, p))?;
            ensure!(v == rounds, "barrier slot [{c}][{p}] of rank {me} is {v}, not {rounds}");
        }
    }
    mem.barrier(ch(0)?, t)?;
    Ok(())
}

pub(super) fn case_barrier(b: &Backend, ctx: &RankCtx) -> TestResult {
    let (me, w) = (ctx.rank, ctx.world);
    let s = setup(b, ctx, "barrier")?;
    let (_a, mem) = s.memory(w * 8 + 8, b.timeout)?;
    let t = b.timeout;
    for it in 0..20u64 {
        if it == 7 && me == w - 1 {
            std::thread::sleep(Duration::from_millis(200)); // a late rank
        }
        let v = it * 1000 + me as u64;
        for p in 0..w {
            mem.write_bytes(mem.rank().peer(p)?, me * 8, &v.to_ne_bytes())?;
        }
        mem.barrier(ch(0)?, t)?;
        let mut buf = vec![0u8; w * 8];
        mem.read_bytes(mem.rank(), 0, &mut buf)?;
        for p in 0..w {
            let mut x = [0u8; 8];
            x.copy_from_slice(&buf[p * 8..p * 8 + 8]);
            let got = u64::from_ne_bytes(x);
            ensure!(
                got == it * 1000 + p as u64,
                "iteration {it}: rank {me} sees {got} from rank {p}"
            );
        }
        mem.barrier(ch(0)?, t)?;
    }
    // Message passing around the ring: data, signal; read, acknowledge.
    let dst = mem.rank().peer((me + 1) % w)?;
    let src = mem.rank().peer((me + w - 1) % w)?;
    for round in 0..30u64 {
        if round > 0 {
            mem.wait_signal(dst, ch(6)?, t)?; // dst read the previous message
        }
        mem.write_bytes(dst, w * 8, &(round * 31 + me as u64).to_ne_bytes())?;
        mem.put_signal(dst, ch(5)?, t)?;
        mem.wait_signal(src, ch(5)?, t)?;
        let mut x = [0u8; 8];
        mem.read_bytes(mem.rank(), w * 8, &mut x)?;
        let got = u64::from_ne_bytes(x);
        ensure!(
            got == round * 31 + src.get() as u64,
            "round {round}: message {got} from {src}"
        );
        mem.put_signal(src, ch(6)?, t)?;
    }
    mem.wait_signal(dst, ch(6)?, t)?;
    mem.barrier(ch(0)?, t)?;
    Ok(())
}

pub(super) fn case_persistent(b: &Backend, ctx: &RankCtx) -> TestResult {
    let me = ctx.rank;
    let s = setup(b, ctx, "persistent")?;
    let (g, dev) = (&s.group, s.device);
    let t1 = empty_p2p(&[256], DType::F32, dev, g, Some(7))?;
    let p1 = t1.ptr();
    let mem = t1.rendezvous(b.timeout)?;
    let mark = (0..64u32).map(|i| i * 3 + me as u32).collect::<Vec<_>>();
    mem.write_bytes(mem.rank(), 0, &bytes_of(&mark))?;
    match empty_p2p(&[256], DType::F32, dev, g, Some(7)) {
        Err(Error::AllocIdInUse { alloc_id: 7 }) => {}
        other => return fail(format!("alloc_id 7 while alive: {other:?}")),
    }
    drop(t1);
    let t2 = empty_p2p(&[256], DType::F32, dev, g, Some(7))?;
    ensure!(t2.ptr() == p1, "same alloc_id, new address {:#x} != {p1:#x}", t2.ptr());
    let m2 = get_symmetric_memory(&t2).ok_or("the reused allocation lost its rendezvous")?;
    ensure!(Arc::ptr_eq(&m2, &mem), "the reused allocation has another memory");
    let mut back = vec![0u8; 256];
    m2.read_bytes(m2.rank(), 0, &mut back)?;
    ensure!(u32s(&back) == mark, "contents changed across reuse");
    drop(t2);
    let t3 = empty_strided_p2p(&[10, 10], &[10, 1], DType::F32, dev, g, Some(7))?;
    ensure!(t3.ptr() == p1, "a smaller request moved the allocation");
    drop(t3);
    match empty_p2p(&[1024], DType::F32, dev, g, Some(7)) {
        Err(Error::Mismatch { .. }) => {}
        other => return fail(format!("a larger request for alloc_id 7: {other:?}")),
    }
    let t4 = empty_p2p(&[256], DType::F32, dev, g, Some(8))?;
    ensure!(t4.ptr() != p1, "alloc_id 8 got alloc_id 7's address");
    let t5 = empty_p2p(&[256], DType::F32, dev, g, Some(7))?;
    ensure!(t5.ptr() == p1, "alloc_id 7 moved after the failed larger request");
    mem.barrier(ch(0)?, b.timeout)?;
    drop((t4, t5, mem, m2));
    let released = release_persistent(g);
    ensure!(released == 2, "release_persistent released {released}, expected 2");
    Ok(())
}

pub(super) fn case_groups(b: &Backend, ctx: &RankCtx) -> TestResult {
    let (me, w) = (ctx.rank, ctx.world);
    let t = b.timeout;
    let s = setup(b, ctx, "groups-all")?;
    let dev = s.device;
    // Subgroup of the even ranks.
    let evens: Vec<usize> = (0..w).step_by(2).collect();
    let sub = s.group.subgroup(&ctx.unique("groups-even"), &evens)?;
    ensure!(sub.is_some() == (me % 2 == 0), "subgroup membership of rank {me}");
    // Overlapping groups: all ranks, all ranks reversed, the first half.
    let rev: Vec<usize> = (0..w).rev().collect();
    let half: Vec<usize> = (0..w.div_ceil(2)).collect();
    let ga = s.group.clone();
    let gb = s
        .group
        .subgroup(&ctx.unique("groups-rev"), &rev)?
        .ok_or("not in the reversed group")?;
    let gc = s.group.subgroup(&ctx.unique("groups-half"), &half)?;
    ensure!(gb.rank().get() == w - 1 - me, "reversed rank {}", gb.rank());
    type Member = (u32, Arc<Group>, Arc<dyn Allocation>, Arc<dyn SymmetricMemory>);
    let mut mems: Vec<Member> = Vec::new();
    for (i, g) in [Some(ga), Some(gb), sub, gc].into_iter().enumerate() {
        let Some(g) = g else { continue };
        let a = s.alloc.alloc(64, dev, &g)?;
        let m = a.rendezvous(t)?;
        // Mark each buffer with (group index, group rank).
        m.write_bytes(m.rank(), 0, &bytes_of(&[i as u32, m.rank().get() as u32]))?;
        mems.push((i as u32, g, a, m));
    }
    for round in 0..8 {
        for (_, _, _, m) in &mems {
            m.barrier(ch(round % 2)?, t)?;
        }
    }
    for (i, g, _, m) in &mems {
        for r in 0..g.world_size() {
            let mut x = [0u8; 8];
            m.read_bytes(m.rank().peer(r)?, 0, &mut x)?;
            let v = u32s(&x);
            ensure!(
                v == [*i, r as u32],
                "group {} rank {r}: buffer says group {} rank {}",
                g.name(),
                v[0],
                v[1]
            );
        }
        for p in (0..g.world_size()).filter(|&p| p != g.rank().get()) {
            let e0 = pad_word(m, g.rank().get(), pad::barrier_slot(0, p))?;
            let e1 = pad_word(m, g.rank().get(), pad::barrier_slot(1, p))?;
            ensure!(
                e0 == 4 && e1 == 4,
                "group {} pad epochs {e0}, {e1}: cross-talk",
                g.name()
            );
        }
    }
    // A recycled group name: keys and pads of the two generations stay apart.
    let name = ctx.unique("groups-recycled");
    let g0 = ctx.group(&name)?;
    let a0 = s.alloc.alloc(64, dev, &g0)?;
    let m0 = a0.rendezvous(t)?;
    let p0 = empty_p2p(&[4], DType::U32, dev, &g0, Some(1))?;
    ctx.barrier(&format!("{name}-built"), t)?;
    let g1 = ctx.group(&name)?;
    ensure!(
        g1.generation() == g0.generation() + 1 && g1.prefix() != g0.prefix(),
        "recycled name: generations {} and {}",
        g0.generation(),
        g1.generation()
    );
    let a1 = s.alloc.alloc(64, dev, &g1)?;
    let m1 = a1.rendezvous(t)?;
    let p1 = empty_p2p(&[4], DType::U32, dev, &g1, Some(1))?;
    ensure!(p0.ptr() != p1.ptr(), "alloc_id 1 shared across generations");
    for _ in 0..3 {
        m0.barrier(ch(0)?, t)?;
        m1.barrier(ch(0)?, t)?;
        m1.barrier(ch(0)?, t)?;
    }
    for p in (0..w).filter(|&p| p != me) {
        let (e0, e1) = (
            pad_word(&m0, me, pad::barrier_slot(0, p))?,
            pad_word(&m1, me, pad::barrier_slot(0, p))?,
        );
        ensure!(e0 == 3 && e1 == 6, "recycled group pads: epochs {e0} and {e1}");
    }
    drop((p0, p1));
    release_persistent(&g0);
    release_persistent(&g1);
    Ok(())
}

pub(super) fn case_abort(b: &Backend, ctx: &RankCtx) -> TestResult {
    let s = setup(b, ctx, "abort")?;
    let (_a, mem) = s.memory(64, b.timeout)?;
    let own = mem.rank();
    let long = Duration::from_secs(30);
    let start = Instant::now();
    let r = std::thread::scope(|sc| {
        let m = &mem;
        let h = sc.spawn(move || m.wait_signal(own, ch(9)?, long));
        std::thread::sleep(Duration::from_millis(100));
        let set = m.set_abort(true);
        (h.join(), set)
    });
    let (joined, set) = r;
    set?;
    match joined {
        Ok(Err(Error::Aborted(_))) => {}
        other => return fail(format!("a wait under abort gave {other:?}")),
    }
    ensure!(
        start.elapsed() < Duration::from_secs(10),
        "abort took {:?}",
        start.elapsed()
    );
    match mem.barrier(ch(10)?, long) {
        Err(Error::Aborted(_)) => {}
        other => return fail(format!("a barrier under abort gave {other:?}")),
    }
    mem.set_abort(false)?;
    ctx.barrier("abort-cleared", b.timeout)?;
    mem.barrier(ch(11)?, b.timeout)?;
    mem.put_signal(own, ch(12)?, b.timeout)?;
    mem.wait_signal(own, ch(12)?, b.timeout)?;
    mem.barrier(ch(11)?, b.timeout)?;
    Ok(())
}
