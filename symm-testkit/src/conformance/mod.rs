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

/// How soon ranks of one host notice a peer process that died during setup (the suites' bound;
/// NOTE [setup-liveness]).
pub const SETUP_LIVENESS: Duration = Duration::from_millis(1500);

mod faults;
mod healthy;

use faults::*;
use healthy::*;

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
