//! The conformance suite: what every backend's `SymmetricMemory` must do,
//! written once and instantiated per backend with [`conformance_tests!`](crate::conformance_tests).
//!
//! ```no_run
//! // symm-testkit/tests/host_conformance.rs
//! symm_testkit::conformance_tests!(host, symm_testkit::conformance::Backend::host(), [1, 2, 3, 5, 8]);
//! ```
//!
//! expands to one `#[test]` per case x {threads, processes} x world size,
//! named `<name>::<case>::<mode>::w<world>` (e.g. `host::barrier::threads::w3`).
//! Cases that need a peer are not generated for world size 1. A GPU backend
//! describes itself with a [`Backend`] (its device type, how a rank picks its
//! device, which modes it supports, its timeouts) and gets the same tests;
//! each test first passes [`crate::gate::gpu_gate`] (skip, or fail with
//! `SYMM_REQUIRE_GPUS=1`). World sizes from 1 to 8 are supported.
//!
//! Every case body is one rank's work ([`run_case`] launches the ranks):
//! a rank that gets a wrong result returns an error (thread mode) or fails
//! its process; fault cases check which ranks must die and that the
//! survivors fail within their deadline with the right error.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_core::pad::{self, NUM_CHANNELS};
use symm_core::symm_store::StoreError;
use symm_core::{
    empty_p2p, empty_strided_p2p, get_allocator, get_symmetric_memory, release_persistent, Allocation, Channel, DType,
    Device, DeviceType, Error, Group, Rank, SymmetricAllocator, SymmetricMemory, SymmetricMemoryExt,
};

use crate::fault::{is_injected, Fault, KILLED_STATUS};
use crate::gate::{gpu_gate, shared_gpu_gate};
use crate::launch::{
    child_ctx, is_child, is_isolated_child, report, run_isolated, run_processes_outcomes, run_threads_outcomes,
    ChildStatus, Mode, ProcessOptions, RankCtx, RankOutcome, TestResult, ThreadOptions,
};

/// A resource counter of this process (name, value) for leak checks.
pub type Resource = (&'static str, u64);

/// How a backend takes part in the suite.
#[derive(Debug, Clone)]
pub struct Backend {
    pub name: &'static str,
    pub device_type: DeviceType,
    /// The device a rank uses (global rank, local rank).
    pub device_for_rank: fn(usize, usize) -> Device,
    /// Devices needed for a world size (for the GPU gate).
    pub min_devices: fn(usize) -> usize,
    pub threads: bool,
    pub processes: bool,
    /// Every rank uses the same device, in groups that allow it (NOTE
    /// [shared-device]; threads only).
    pub shared_device: bool,
    /// Timeout of operations that must succeed.
    pub timeout: Duration,
    /// Timeout of operations expected to fail (a dead or absent peer).
    pub fault_timeout: Duration,
    /// Wall-clock limit of one launch.
    pub launch_limit: Duration,
    /// Process-wide resource counters and how much each may grow over the
    /// alloc/free cycles (None: no leak check).
    pub resources: Option<fn() -> Vec<Resource>>,
    pub resource_slack: fn(&str) -> u64,
    /// Alloc/rendezvous/free cycles of the leak case.
    pub cycles: usize,
    /// Called first in every test and child (a backend's `link()`).
    pub link: fn(),
}

fn host_device(rank: usize, _local: usize) -> Device {
    Device::host(rank as u32)
}

fn no_devices(_world: usize) -> usize {
    0
}

fn count_lines(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count() as u64)
        .unwrap_or(0)
}

/// Open fds (`/proc/self/fd`) and mappings (`/proc/self/maps` lines) of this process.
pub fn host_resources() -> Vec<Resource> {
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    vec![("open fds", fds), ("mappings", count_lines("/proc/self/maps"))]
}

fn host_slack(name: &str) -> u64 {
    // malloc may map a new arena or heap segment; a leak of the allocations
    // themselves would show as thousands.
    if name == "mappings" {
        16
    } else {
        0
    }
}

impl Backend {
    /// The host backend of this crate.
    pub fn host() -> Backend {
        Backend {
            name: "host",
            device_type: DeviceType::Host,
            device_for_rank: host_device,
            min_devices: no_devices,
            threads: true,
            processes: true,
            shared_device: false,
            timeout: Duration::from_secs(60),
            fault_timeout: Duration::from_secs(2),
            launch_limit: Duration::from_secs(180),
            resources: Some(host_resources),
            resource_slack: host_slack,
            cycles: 1000,
            link: crate::host::link,
        }
    }
}

/// The cases of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Case {
    /// Pointers, sizes, idempotent rendezvous, zeroed pads, get_buffer views,
    /// a peer's write seen through get_buffer, tensors.
    Rendezvous,
    /// put/wait on two channels at once from two threads (no cross-talk),
    /// barriers on two channels at once.
    Signals,
    /// Barriers order data (push, barrier, read); put/wait message passing
    /// with acknowledgements; a late rank.
    Barrier,
    /// Persistent alloc_id rules.
    PersistentAlloc,
    /// Subgroups, overlapping groups, a recycled group name.
    Groups,
    /// The abort word ends waits.
    Abort,
    /// Out-of-range channel, rank, offset, size: errors, nothing done.
    OutOfRange,
    /// Buffer sizes differ: every rank fails the same way.
    MismatchedSizes,
    /// A rank never arrives at rendezvous: an error naming it in time.
    NeverArrives,
    /// A rank dies before sending its handle.
    KilledBeforeSend,
    /// A rank dies after sending its handle.
    KilledAfterSend,
    /// A rank dies after mapping its peers.
    KilledAfterMap,
    /// A rank dies inside a barrier: the others time out (or see it lost).
    DeadPeerInBarrier,
    /// Many alloc/rendezvous/free cycles: resources back at their baseline.
    AllocFreeCycles,
}

impl Case {
    pub const ALL: [Case; 14] = [
        Case::Rendezvous,
        Case::Signals,
        Case::Barrier,
        Case::PersistentAlloc,
        Case::Groups,
        Case::Abort,
        Case::OutOfRange,
        Case::MismatchedSizes,
        Case::NeverArrives,
        Case::KilledBeforeSend,
        Case::KilledAfterSend,
        Case::KilledAfterMap,
        Case::DeadPeerInBarrier,
        Case::AllocFreeCycles,
    ];

    /// The smallest world size the case means anything at.
    pub fn min_world(self) -> usize {
        match self {
            Case::MismatchedSizes
            | Case::NeverArrives
            | Case::KilledBeforeSend
            | Case::KilledAfterSend
            | Case::KilledAfterMap
            | Case::DeadPeerInBarrier => 2,
            _ => 1,
        }
    }

    /// The fault the case injects at world size `world`.
    pub fn fault(self, world: usize) -> Option<Fault> {
        match self {
            Case::KilledBeforeSend => Some(Fault::kill(0, "rendezvous.before_send")),
            Case::KilledAfterSend => Some(Fault::kill(world - 1, "rendezvous.after_send")),
            Case::KilledAfterMap => Some(Fault::kill(world / 2, "rendezvous.after_map")),
            Case::DeadPeerInBarrier => Some(Fault::kill(world - 1, "barrier.mid")),
            _ => None,
        }
    }

    /// Whether the thread-mode run needs a process of its own (process-wide
    /// resource counters).
    fn isolated(self, backend: &Backend) -> bool {
        self == Case::AllocFreeCycles && backend.resources.is_some()
    }
}

fn fail(msg: String) -> TestResult {
    Err(msg.into())
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return fail(format!($($fmt)+));
        }
    };
}

/// True for the errors a survivor of a dead or absent peer may get.
pub fn is_peer_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::Timeout { .. }
            | Error::PeerLost { .. }
            | Error::Store(
                StoreError::Timeout { .. }
                    | StoreError::MissingRanks { .. }
                    | StoreError::PeerLost { .. }
                    | StoreError::Connection { .. }
            )
    )
}

/// True if `e` names `rank` as the missing or lost one.
pub fn names_rank(e: &Error, rank: usize) -> bool {
    match e {
        Error::PeerLost { rank: r, .. } => *r == rank,
        Error::Store(StoreError::MissingRanks { missing, .. }) => missing == &[rank],
        Error::Store(StoreError::PeerLost { rank: r, .. }) => *r == rank,
        _ => false,
    }
}

fn ch(c: usize) -> symm_core::Result<Channel> {
    Channel::new(c)
}

struct Setup {
    group: Arc<Group>,
    device: Device,
    alloc: Arc<dyn SymmetricAllocator>,
}

fn setup(b: &Backend, ctx: &RankCtx, name: &str) -> TestResult<Setup> {
    let group = ctx.group(&ctx.unique(name))?;
    Ok(Setup {
        group,
        device: (b.device_for_rank)(ctx.rank, ctx.local_rank),
        alloc: get_allocator(b.device_type)?,
    })
}

impl Setup {
    fn alloc(&self, size: usize) -> TestResult<Arc<dyn Allocation>> {
        Ok(self.alloc.alloc(size, self.device, &self.group)?)
    }
    fn memory(&self, size: usize, timeout: Duration) -> TestResult<(Arc<dyn Allocation>, Arc<dyn SymmetricMemory>)> {
        let a = self.alloc(size)?;
        let m = a.rendezvous(timeout)?;
        Ok((a, m))
    }
}

fn u32s(v: &[u8]) -> Vec<u32> {
    v.chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes_of(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn pad_word(mem: &Arc<dyn SymmetricMemory>, rank: usize, word: usize) -> TestResult<u32> {
    let mut b = [0u8; 4];
    mem.read_signal_pad(mem.rank().peer(rank)?, word * 4, &mut b)?;
    Ok(u32::from_ne_bytes(b))
}

// ------------------------------------------------------------------ cases

fn case_rendezvous(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_signals(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_barrier(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_persistent(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_groups(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_abort(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_out_of_range(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_mismatched_sizes(b: &Backend, ctx: &RankCtx) -> TestResult {
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

/// How soon ranks of one host notice a peer process that died during setup (the suites' bound;
/// NOTE [setup-liveness]).
pub const SETUP_LIVENESS: Duration = Duration::from_millis(1500);

fn deadline_slack(b: &Backend) -> Duration {
    b.fault_timeout + b.fault_timeout.max(Duration::from_secs(4))
}

fn case_never_arrives(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_killed(b: &Backend, ctx: &RankCtx, case: Case) -> TestResult {
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

fn case_dead_peer_in_barrier(b: &Backend, ctx: &RankCtx) -> TestResult {
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

fn case_alloc_free_cycles(b: &Backend, ctx: &RankCtx) -> TestResult {
    let me = ctx.rank;
    let t = b.timeout;
    let s = setup(b, ctx, "cycles")?;
    // Who measures: every process, or rank 0 for all the threads of one.
    let measures = ctx.mode == Mode::Processes || me == 0;
    let cycle = |i: usize| -> TestResult {
        let a = s.alloc(4096 + (i % 5) * 1000)?;
        let m = a.rendezvous(t)?;
        if i % 100 == 0 {
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

/// Runs one rank of `case`.
pub fn case_body(b: &Backend, case: Case, ctx: &RankCtx) -> TestResult {
    match case {
        Case::Rendezvous => case_rendezvous(b, ctx),
        Case::Signals => case_signals(b, ctx),
        Case::Barrier => case_barrier(b, ctx),
        Case::PersistentAlloc => case_persistent(b, ctx),
        Case::Groups => case_groups(b, ctx),
        Case::Abort => case_abort(b, ctx),
        Case::OutOfRange => case_out_of_range(b, ctx),
        Case::MismatchedSizes => case_mismatched_sizes(b, ctx),
        Case::NeverArrives => case_never_arrives(b, ctx),
        Case::KilledBeforeSend | Case::KilledAfterSend | Case::KilledAfterMap => case_killed(b, ctx, case),
        Case::DeadPeerInBarrier => case_dead_peer_in_barrier(b, ctx),
        Case::AllocFreeCycles => case_alloc_free_cycles(b, ctx),
    }
}

fn run_threads_case(b: &Backend, case: Case, world: usize) {
    let mut opts = ThreadOptions::new(world, b.launch_limit);
    opts.store_timeout = b.timeout;
    opts.fault = case.fault(world);
    opts.shared_device = b.shared_device;
    let victim = opts.fault.as_ref().map(|f| f.rank);
    let bb = b.clone();
    let outcomes = run_threads_outcomes(&opts, move |ctx| case_body(&bb, case, &ctx));
    let mut bad = Vec::new();
    for (r, o) in outcomes.iter().enumerate() {
        let ok = match o {
            RankOutcome::Ok(()) => Some(r) != victim,
            RankOutcome::Err(e) => Some(r) == victim && e.contains(crate::fault::INJECTED_FAULT),
            _ => false,
        };
        if !ok {
            bad.push(format!("rank {r}: {o:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} {case:?} with {world} threads (victim {victim:?}):\n{}",
        b.name,
        bad.join("\n")
    );
}

fn run_processes_case(b: &Backend, case: Case, world: usize, test_path: &str) {
    let mut opts = ProcessOptions::new(test_path, world, b.launch_limit);
    opts.store_timeout = b.timeout;
    opts.fault = case.fault(world);
    let victim = opts.fault.as_ref().map(|f| f.rank);
    let outcomes = match run_processes_outcomes(&opts) {
        Ok(o) => o,
        Err(e) => panic!("{} {case:?} with {world} processes: {e}", b.name),
    };
    let bad: Vec<String> = outcomes
        .iter()
        .filter(|o| {
            let killed = matches!(o.status, ChildStatus::Exited(KILLED_STATUS) | ChildStatus::Signaled(9));
            if Some(o.rank) == victim {
                !killed
            } else {
                !o.status.success()
            }
        })
        .map(|o| format!("rank {}: {}", o.rank, o.status))
        .collect();
    assert!(
        bad.is_empty(),
        "{} {case:?} with {world} processes (victim {victim:?}): {}\n{}",
        b.name,
        bad.join(", "),
        report(&outcomes)
    );
    print!("{}", report(&outcomes));
}

/// One generated test: runs `case` on `backend` in `mode` with `world`
/// ranks. `test_path` is the test's own name (for re-execution). Panics on
/// failure; returns after printing `skipped: ...` when the backend cannot run
/// it here.
pub fn run_case(backend: &Backend, case: Case, mode: Mode, world: usize, test_path: &str) {
    (backend.link)();
    if is_child() {
        // One rank of a process launch.
        let ctx = match child_ctx() {
            Ok(Some(c)) => c,
            Ok(None) => panic!("not a child"),
            Err(e) => panic!("child setup: {e}"),
        };
        let r = case_body(backend, case, &ctx);
        if let Some(f) = case.fault(world).filter(|f| f.rank == ctx.rank) {
            panic!("rank {} should have died at {} but returned {r:?}", ctx.rank, f.point);
        }
        if let Err(e) = r {
            panic!("{} {case:?} rank {}/{world} (processes): {e}", backend.name, ctx.rank);
        }
        return;
    }
    if is_isolated_child() {
        run_threads_case(backend, case, world);
        return;
    }
    let supported = match mode {
        Mode::Threads => backend.threads,
        Mode::Processes => backend.processes,
    };
    if !supported {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: backend {} does not run ranks as {mode}{}",
            backend.name,
            if backend.shared_device {
                " (ranks that share a device must be threads of one process)"
            } else {
                ""
            }
        );
        return;
    }
    let gate = if backend.shared_device {
        shared_gpu_gate(backend.device_type)
    } else {
        gpu_gate(backend.device_type, (backend.min_devices)(world))
    };
    if gate.is_some() {
        return;
    }
    match mode {
        Mode::Threads if case.isolated(backend) => {
            if let Err(e) = run_isolated(test_path, backend.launch_limit) {
                panic!("{} {case:?} with {world} threads: {e}", backend.name);
            }
        }
        Mode::Threads => run_threads_case(backend, case, world),
        Mode::Processes => run_processes_case(backend, case, world, test_path),
    }
}

/// Instantiates the conformance suite for a backend: one `#[test]` per case
/// x {threads, processes} x world size (1 to 8), in `mod $name`.
///
/// ```no_run
/// symm_testkit::conformance_tests!(host, symm_testkit::conformance::Backend::host(), [1, 2, 3, 5, 8]);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, $backend:expr, [$($w:tt),+ $(,)?]) => {
        #[allow(unused_imports)]
        mod $name {
            use super::*;
            fn __backend() -> $crate::conformance::Backend {
                $backend
            }
            $crate::conformance_tests!(@case [$($w)+] rendezvous Rendezvous 1);
            $crate::conformance_tests!(@case [$($w)+] signals Signals 1);
            $crate::conformance_tests!(@case [$($w)+] barrier Barrier 1);
            $crate::conformance_tests!(@case [$($w)+] persistent_alloc PersistentAlloc 1);
            $crate::conformance_tests!(@case [$($w)+] groups Groups 1);
            $crate::conformance_tests!(@case [$($w)+] abort Abort 1);
            $crate::conformance_tests!(@case [$($w)+] out_of_range OutOfRange 1);
            $crate::conformance_tests!(@case [$($w)+] mismatched_sizes MismatchedSizes 2);
            $crate::conformance_tests!(@case [$($w)+] never_arrives NeverArrives 2);
            $crate::conformance_tests!(@case [$($w)+] killed_before_send KilledBeforeSend 2);
            $crate::conformance_tests!(@case [$($w)+] killed_after_send KilledAfterSend 2);
            $crate::conformance_tests!(@case [$($w)+] killed_after_map KilledAfterMap 2);
            $crate::conformance_tests!(@case [$($w)+] dead_peer_in_barrier DeadPeerInBarrier 2);
            $crate::conformance_tests!(@case [$($w)+] alloc_free_cycles AllocFreeCycles 1);
        }
    };
    (@case [$($w:tt)+] $case_mod:ident $case:ident $min:tt) => {
        mod $case_mod {
            mod threads {
                $( $crate::conformance_tests!(@world Threads $case $min $w); )+
            }
            mod processes {
                $( $crate::conformance_tests!(@world Processes $case $min $w); )+
            }
        }
    };
    // Cases that need a peer are not generated for one rank.
    (@world $mode:ident $case:ident 2 1) => {};
    (@world $mode:ident $case:ident $min:tt 1) => { $crate::conformance_tests!(@test $mode $case 1 w1); };
    (@world $mode:ident $case:ident $min:tt 2) => { $crate::conformance_tests!(@test $mode $case 2 w2); };
    (@world $mode:ident $case:ident $min:tt 3) => { $crate::conformance_tests!(@test $mode $case 3 w3); };
    (@world $mode:ident $case:ident $min:tt 4) => { $crate::conformance_tests!(@test $mode $case 4 w4); };
    (@world $mode:ident $case:ident $min:tt 5) => { $crate::conformance_tests!(@test $mode $case 5 w5); };
    (@world $mode:ident $case:ident $min:tt 6) => { $crate::conformance_tests!(@test $mode $case 6 w6); };
    (@world $mode:ident $case:ident $min:tt 7) => { $crate::conformance_tests!(@test $mode $case 7 w7); };
    (@world $mode:ident $case:ident $min:tt 8) => { $crate::conformance_tests!(@test $mode $case 8 w8); };
    (@test $mode:ident $case:ident $w:tt $fname:ident) => {
        #[test]
        fn $fname() {
            $crate::conformance::run_case(
                &super::super::__backend(),
                $crate::conformance::Case::$case,
                $crate::launch::Mode::$mode,
                $w,
                &$crate::launch::test_path(module_path!(), stringify!($fname)),
            );
        }
    };
}
