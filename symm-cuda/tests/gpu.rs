//! GPU tests of the CUDA backend beyond the conformance suite. Each needs two
//! GPUs: it skips (printing why) without them, and fails instead with
//! `SYMM_REQUIRE_GPUS=1`. Each prints one `SUMMARY <test> ok ...` line to
//! stderr (not captured by the harness) for the run's notes.
//!
//! - `cuda_2gib_alloc`: a 2 GiB symmetric allocation (processes), written
//!   through the peer's mapping and read back both ways.
//! - `cuda_alloc_free_1000`: 1000 alloc/rendezvous/free cycles (processes);
//!   device memory (cuMemGetInfo) and open fds back at their baseline.
//! - `cuda_rank_killed_in_barrier`: a rank SIGKILLed while its kernel spins;
//!   the survivor's barrier ends with a timeout within the deadline, the
//!   context still works, and the process exits cleanly.
//! - `cuda_topology_fully_connected`: the NVLink detector on the machine.
//! - `cuda_stream_ordered_and_graph`: stream-ordered barrier/signals (eager
//!   and captured in a CUDA graph), a device timeout read by check_error, and
//!   a cudarc copy into a peer's buffer through a `SymmView` (threads).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use symm_core::{
    detect_topology, get_allocator, get_connectivity, Allocation, Channel, Device, DeviceType, Error, Group,
    SymmetricMemory, Topology,
};
use symm_cuda::streams::HostCopies;
use symm_cuda::{as_cuda, CudaSymmetricMemory};
use symm_testkit::launch::{
    child_ctx, report, run_processes_outcomes, run_threads, test_path, ChildStatus, ProcessOptions, RankCtx, TestResult,
};

const T: Duration = Duration::from_secs(60);

fn summary(line: &str) {
    // Straight to stderr: visible even when the harness captures output.
    let _ = writeln!(std::io::stderr(), "SUMMARY {line}");
}

fn gate(n: usize) -> bool {
    symm_cuda::link();
    symm_testkit::gpu_gate(DeviceType::Cuda, n).is_none()
}

fn ch(c: usize) -> Channel {
    Channel::new(c).expect("channel")
}

type Memory = (Arc<Group>, Arc<dyn Allocation>, Arc<dyn SymmetricMemory>);

fn memory(ctx: &RankCtx, name: &str, size: usize) -> TestResult<Memory> {
    let g = ctx.group(&ctx.unique(name))?;
    let a = get_allocator(DeviceType::Cuda)?.alloc(size, Device::cuda(ctx.local_rank as u32), &g)?;
    let m = a.rendezvous(T)?;
    Ok((g, a, m))
}

fn cuda(m: &Arc<dyn SymmetricMemory>) -> TestResult<&CudaSymmetricMemory> {
    as_cuda(m.as_ref()).ok_or_else(|| "not CUDA symmetric memory".into())
}

/// Runs `body` as two processes; the parent re-prints the children's
/// SUMMARY lines.
fn two_processes(test: &str, body: fn(&RankCtx) -> TestResult) {
    if let Some(ctx) = child_ctx().expect("child setup") {
        if let Err(e) = body(&ctx) {
            panic!("rank {}: {e}", ctx.rank);
        }
        return;
    }
    if !gate(2) {
        return;
    }
    let mut opts = ProcessOptions::new(test, 2, Duration::from_secs(480));
    opts.grace = Some(Duration::from_secs(20));
    let outcomes = run_processes_outcomes(&opts).expect("launch");
    let text = report(&outcomes);
    for l in text.lines().filter(|l| l.starts_with("SUMMARY ")) {
        let _ = writeln!(std::io::stderr(), "{l}");
    }
    assert!(outcomes.iter().all(|o| o.status.success()), "{test} failed:\n{text}");
}

// ------------------------------------------------------------- 2 GiB

/// Word `i` of the pattern rank `r` writes.
fn pattern_word(r: usize, i: u64) -> u64 {
    ((r as u64 + 1) << 56) ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i
}

fn fill(r: usize, first_word: u64, out: &mut [u8]) {
    for (k, c) in out.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&pattern_word(r, first_word + k as u64).to_le_bytes());
    }
}

fn check(r: usize, first_word: u64, got: &[u8]) -> Result<(), String> {
    for (k, c) in got.chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        let want = pattern_word(r, first_word + k as u64);
        if w != want {
            return Err(format!(
                "word {} reads {w:#x}, expected {want:#x}",
                first_word + k as u64
            ));
        }
    }
    Ok(())
}

fn body_2gib(ctx: &RankCtx) -> TestResult {
    const SIZE: usize = 2 << 30;
    const CHUNK: usize = 256 << 20;
    let (me, peer) = (ctx.rank, 1 - ctx.rank);
    let g = ctx.group(&ctx.unique("2gib"))?;
    let t0 = Instant::now();
    let a = get_allocator(DeviceType::Cuda)?.alloc(SIZE, Device::cuda(ctx.local_rank as u32), &g)?;
    let alloc_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let m = a.rendezvous(T)?;
    let rdv_ms = t1.elapsed().as_secs_f64() * 1e3;
    if m.buffer_size() != SIZE {
        return Err(format!("buffer size {}", m.buffer_size()).into());
    }
    let pr = m.rank().peer(peer)?;
    let own = m.rank();
    let mut buf = vec![0u8; CHUNK];
    // 1. Write my pattern into the PEER's buffer through my mapping of it.
    let t2 = Instant::now();
    for off in (0..SIZE).step_by(CHUNK) {
        fill(me, (off / 8) as u64, &mut buf);
        m.write_bytes(pr, off, &buf)?;
    }
    let write_s = t2.elapsed().as_secs_f64();
    m.barrier(ch(0), T)?;
    // 2. My own buffer holds the peer's pattern, everywhere.
    let t3 = Instant::now();
    for off in (0..SIZE).step_by(CHUNK) {
        m.read_bytes(own, off, &mut buf)?;
        check(peer, (off / 8) as u64, &buf).map_err(|e| format!("own buffer at {off}: {e}"))?;
    }
    let read_local_s = t3.elapsed().as_secs_f64();
    // 3. Read the peer's buffer back through the mapping: my pattern.
    let t4 = Instant::now();
    for off in (0..SIZE).step_by(CHUNK) {
        m.read_bytes(pr, off, &mut buf)?;
        check(me, (off / 8) as u64, &buf).map_err(|e| format!("peer buffer at {off}: {e}"))?;
    }
    let read_peer_s = t4.elapsed().as_secs_f64();
    // The pad right after the buffer is intact: the peer's barrier slot
    // counts the one barrier (or two: the peer may already have entered the
    // closing barrier below), this rank's own slot was never written.
    let word = |slot: usize| -> TestResult<u32> {
        let mut b = [0u8; 4];
        m.read_signal_pad(own, slot * 4, &mut b)?;
        Ok(u32::from_le_bytes(b))
    };
    let (ps, os) = (
        word(symm_core::pad::barrier_slot(0, peer))?,
        word(symm_core::pad::barrier_slot(0, me))?,
    );
    if !matches!((ps, os), (1, 0) | (2, 0)) {
        return Err(format!("pad after 2 GiB of writes: barrier slots {ps} (peer) and {os} (own)").into());
    }
    m.barrier(ch(0), T)?;
    let ca = a
        .as_any()
        .downcast_ref::<symm_cuda::CudaAllocation>()
        .ok_or("not a CUDA allocation")?;
    let gib = SIZE as f64 / (1u64 << 30) as f64;
    println!(
        "SUMMARY cuda_2gib_alloc ok rank {me} {SIZE} bytes mapped {} (granularity {}) alloc_ms={alloc_ms:.1} \
         rendezvous_ms={rdv_ms:.1} host_to_peer_GiBps={:.2} local_to_host_GiBps={:.2} peer_to_host_GiBps={:.2}",
        ca.mapped_size(),
        ca.granularity(),
        gib / write_s,
        gib / read_local_s,
        gib / read_peer_s
    );
    drop(m);
    drop(a);
    Ok(())
}

#[test]
fn cuda_2gib_alloc() {
    two_processes(&test_path(module_path!(), "cuda_2gib_alloc"), body_2gib);
}

// ------------------------------------------------------------- 1000 cycles

fn fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

fn body_cycles(ctx: &RankCtx) -> TestResult {
    const CYCLES: usize = 1000;
    let me = ctx.rank;
    let g = ctx.group(&ctx.unique("cycles"))?;
    let dev = Device::cuda(ctx.local_rank as u32);
    let alloc = get_allocator(DeviceType::Cuda)?;
    let cudactx = symm_cuda::driver::context(ctx.local_rank)?;
    let cycle = |i: usize| -> TestResult {
        // 1 MiB .. 9 MiB: several granules, varying.
        let a = alloc.alloc((1 << 20) + (i % 5) * (2 << 20) + 12, dev, &g)?;
        let m = a.rendezvous(T)?;
        if i.is_multiple_of(100) {
            m.write_bytes(m.rank(), 0, &(i as u64).to_le_bytes())?;
            m.barrier(ch(0), T)?;
            let mut x = [0u8; 8];
            m.read_bytes(m.rank().peer(1 - me)?, 0, &mut x)?;
            if u64::from_le_bytes(x) != i as u64 {
                return Err(format!("cycle {i}: stale data").into());
            }
            m.barrier(ch(0), T)?;
        }
        Ok(())
    };
    cycle(0)?; // warm-up: kernels loaded, streams made
    ctx.barrier("cycles-warm", T)?;
    let (free0, total) = symm_cuda::driver::mem_get_info(&cudactx)?;
    let fds0 = fds();
    let t0 = Instant::now();
    let mut low = free0;
    for i in 1..=CYCLES {
        cycle(i)?;
        if i % 250 == 0 {
            low = low.min(symm_cuda::driver::mem_get_info(&cudactx)?.0);
        }
    }
    let per_cycle_ms = t0.elapsed().as_secs_f64() * 1e3 / CYCLES as f64;
    ctx.barrier("cycles-done", T)?;
    let (free1, _) = symm_cuda::driver::mem_get_info(&cudactx)?;
    let fds1 = fds();
    let lost = free0.saturating_sub(free1);
    // A leaked allocation is >= 2 MiB; 1000 of them would be gigabytes.
    if lost > 8 << 20 {
        return Err(format!("device memory not back at baseline: {free0} free before, {free1} after").into());
    }
    if fds1 > fds0 + 4 {
        return Err(format!("open fds {fds0} before, {fds1} after {CYCLES} cycles").into());
    }
    println!(
        "SUMMARY cuda_alloc_free_1000 ok rank {me} cycles={CYCLES} free_before={free0} free_after={free1} \
         lost_bytes={lost} lowest_free={low} total={total} fds_before={fds0} fds_after={fds1} ms_per_cycle={per_cycle_ms:.2}"
    );
    Ok(())
}

#[test]
fn cuda_alloc_free_1000() {
    two_processes(&test_path(module_path!(), "cuda_alloc_free_1000"), body_cycles);
}

// ------------------------------------------------------------- killed rank

const VICTIM: usize = 1;
const DEVICE_TIMEOUT: Duration = Duration::from_secs(3);

fn body_killed(ctx: &RankCtx) -> TestResult {
    let (_g, a, m) = memory(ctx, "killed", 1 << 20)?;
    m.barrier(ch(0), T)?; // both alive and mapped
    let cm = cuda(&m)?;
    if ctx.rank == VICTIM {
        // Spin on the GPU (a wait nobody will satisfy), then die with the
        // kernel in flight and the peer's memory mapped.
        let s = symm_cuda::streams::pooled(cm.context())?;
        cm.wait_signal_on(&s, m.rank().peer(0)?, ch(2), Duration::from_secs(30))?;
        ctx.barrier("victim-spinning", T)?;
        std::thread::sleep(Duration::from_millis(200));
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        std::process::exit(137);
    }
    ctx.barrier("victim-spinning", T)?;
    // The survivor enters the barrier; the victim dies meanwhile.
    let start = Instant::now();
    let r = m.barrier(ch(1), DEVICE_TIMEOUT);
    let took = start.elapsed();
    match r {
        Err(Error::Timeout { .. }) => {}
        other => return Err(format!("the survivor's barrier gave {other:?} after {took:?}").into()),
    }
    if took > DEVICE_TIMEOUT + Duration::from_secs(4) {
        return Err(format!("the survivor's barrier took {took:?} (device timeout {DEVICE_TIMEOUT:?})").into());
    }
    // The error was latched and cleared; the context still works.
    cm.check_error()?;
    let g1 = Group::new(
        ctx.unique("after-death"),
        0,
        1,
        symm_core::symm_store::HashStore::new(T),
    )?;
    let a1 = get_allocator(DeviceType::Cuda)?.alloc(4096, Device::cuda(ctx.local_rank as u32), &g1)?;
    let m1 = a1.rendezvous(T)?;
    m1.barrier(ch(0), T)?;
    m1.write_bytes(m1.rank(), 0, &[7u8; 16])?;
    let mut back = [0u8; 16];
    m1.read_bytes(m1.rank(), 0, &mut back)?;
    if back != [7u8; 16] {
        return Err("the device misbehaves after the peer's death".into());
    }
    // Clean shutdown with a dead peer: unmap, release, exit 0.
    let t = Instant::now();
    drop((m1, a1, m, a));
    println!(
        "SUMMARY cuda_rank_killed_in_barrier ok survivor rank {} got Timeout after {:.3} s (device timeout {:.1} s), \
         freed in {:.1} ms, context usable afterwards",
        ctx.rank,
        took.as_secs_f64(),
        DEVICE_TIMEOUT.as_secs_f64(),
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

#[test]
fn cuda_rank_killed_in_barrier() {
    let test = test_path(module_path!(), "cuda_rank_killed_in_barrier");
    if let Some(ctx) = child_ctx().expect("child setup") {
        if let Err(e) = body_killed(&ctx) {
            panic!("rank {}: {e}", ctx.rank);
        }
        return;
    }
    if !gate(2) {
        return;
    }
    let mut opts = ProcessOptions::new(&test, 2, Duration::from_secs(240));
    opts.grace = Some(Duration::from_secs(30));
    let outcomes = run_processes_outcomes(&opts).expect("launch");
    let text = report(&outcomes);
    for l in text.lines().filter(|l| l.starts_with("SUMMARY ")) {
        let _ = writeln!(std::io::stderr(), "{l}");
    }
    for o in &outcomes {
        let ok = if o.rank == VICTIM {
            matches!(o.status, ChildStatus::Signaled(9) | ChildStatus::Exited(137))
        } else {
            o.status.success()
        };
        assert!(ok, "rank {} ended {}:\n{text}", o.rank, o.status);
    }
}

// ------------------------------------------------------------- topology

#[test]
fn cuda_topology_fully_connected() {
    if !gate(2) {
        return;
    }
    let c = get_connectivity(DeviceType::Cuda, "nvlink").expect("nvlink detection");
    let n = c.matrix.len();
    let devices: Vec<usize> = (0..n).collect();
    let topo = detect_topology(&c.matrix, &devices);
    let rows = c.matrix.rows();
    assert_eq!(topo, Topology::FullyConnected, "matrix {rows:?} from {}", c.detector);
    let min_links = (0..n)
        .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
        .map(|(a, b)| c.matrix.get(a, b))
        .min()
        .unwrap_or(0);
    assert!(min_links > 0, "{rows:?}");
    summary(&format!(
        "cuda_topology_fully_connected ok {n} GPUs {topo:?} links {rows:?} (detector {})",
        c.detector
    ));
}

// ------------------------------------------------------------- stream-ordered

fn body_stream_ordered(ctx: RankCtx) -> TestResult<String> {
    const EAGER: usize = 1000;
    const PER_GRAPH: usize = 10;
    const REPLAYS: usize = 100;
    let (me, peer) = (ctx.rank, 1 - ctx.rank);
    let (_g, _a, m) = memory(&ctx, "stream-ordered", 1 << 20)?;
    let cm = cuda(&m)?;
    let s = symm_cuda::streams::pooled(cm.context())?;
    let pr = m.rank().peer(peer)?;
    // Eager barriers on a stream: one host sync at the end.
    cm.barrier_on(&s, ch(3), T)?; // loads the kernels
    s.synchronize()?;
    ctx.barrier("eager-ready", T)?;
    let t0 = Instant::now();
    for _ in 0..EAGER {
        cm.barrier_on(&s, ch(3), T)?;
    }
    s.synchronize()?;
    let eager_us = t0.elapsed().as_secs_f64() * 1e6 / EAGER as f64;
    cm.check_error()?;
    // Signals, stream-ordered: ping-pong.
    for i in 0..100 {
        if (i + me) % 2 == 0 {
            cm.put_signal_on(&s, pr, ch(4), T)?;
        } else {
            cm.wait_signal_on(&s, pr, ch(4), T)?;
        }
    }
    s.synchronize()?;
    cm.check_error()?;
    // The same barriers captured in a CUDA graph and replayed.
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    for _ in 0..PER_GRAPH {
        cm.barrier_on(&s, ch(5), T)?;
    }
    let graph = s
        .end_capture(CUgraphInstantiate_flags(0))?
        .ok_or("capture gave no graph")?;
    graph.upload()?;
    ctx.barrier("graph-ready", T)?;
    let t1 = Instant::now();
    for _ in 0..REPLAYS {
        graph.launch()?;
    }
    s.synchronize()?;
    let graph_us = t1.elapsed().as_secs_f64() * 1e6 / (PER_GRAPH * REPLAYS) as f64;
    cm.check_error()?;
    // Epochs advanced on the device: exact counts in the pads.
    let word = |slot: usize| -> TestResult<u32> {
        let mut b = [0u8; 4];
        m.read_signal_pad(m.rank(), slot * 4, &mut b)?;
        Ok(u32::from_le_bytes(b))
    };
    let b3 = word(symm_core::pad::barrier_slot(3, peer))?;
    let b5 = word(symm_core::pad::barrier_slot(5, peer))?;
    if b3 != EAGER as u32 + 1 || b5 != (PER_GRAPH * REPLAYS) as u32 {
        return Err(format!(
            "barrier slots {b3} (want {}) and {b5} (want {})",
            EAGER + 1,
            PER_GRAPH * REPLAYS
        )
        .into());
    }
    // A device timeout: latched, reported once by check_error, then clear.
    ctx.barrier("timeout-test", T)?;
    cm.wait_signal_on(&s, pr, ch(6), Duration::from_millis(100))?;
    s.synchronize()?;
    match cm.check_error() {
        Err(Error::Timeout { .. }) => {}
        other => return Err(format!("a wait nobody signals gave {other:?}").into()),
    }
    cm.check_error()?;
    // cudarc interop: copy into the peer's buffer through a SymmView.
    let data: Vec<u32> = (0..256u32).map(|i| i * 3 + me as u32).collect();
    let mut view = cm.view::<u32>(peer, 4096, data.len(), &s)?;
    s.synced_memcpy_htod(&data, &mut view)?;
    s.synchronize()?;
    m.barrier(ch(0), T)?;
    let mut got = vec![0u8; data.len() * 4];
    m.read_bytes(m.rank(), 4096, &mut got)?;
    let want: Vec<u8> = (0..256u32).flat_map(|i| (i * 3 + peer as u32).to_le_bytes()).collect();
    if got != want {
        return Err("the peer's SymmView copy did not land in this buffer".into());
    }
    if cm.view::<u32>(peer, m.buffer_size() - 4, 2, &s).is_ok() || cm.view::<u32>(2, 0, 1, &s).is_ok() {
        return Err("an out-of-range view was accepted".into());
    }
    m.barrier(ch(0), T)?;
    Ok(format!(
        "rank {me}: eager_barrier_us={eager_us:.2} graph_barrier_us={graph_us:.2}"
    ))
}

#[test]
fn cuda_stream_ordered_and_graph() {
    if !gate(2) {
        return;
    }
    let out = run_threads(2, Duration::from_secs(240), body_stream_ordered).expect("ranks failed");
    summary(&format!(
        "cuda_stream_ordered_and_graph ok threads 2 {}",
        out.join("; ")
    ));
}

/// Not a GPU test: the helpers above agree with each other.
#[test]
fn pattern_helpers_agree() {
    let mut b = vec![0u8; 64];
    fill(1, 10, &mut b);
    assert!(check(1, 10, &b).is_ok());
    assert!(check(0, 10, &b).is_err());
    assert!(check(1, 11, &b).is_err());
}

/// Not a GPU test: `link()` makes the allocator and the NVLink detector
/// visible to symm-core's registries.
#[test]
fn backend_and_detector_are_registered() {
    symm_cuda::link();
    assert!(symm_core::has_allocator(DeviceType::Cuda));
    let a = get_allocator(DeviceType::Cuda).expect("allocator");
    assert_eq!(a.name(), "symm-cuda");
    assert!(!a.has_multicast_support(Device::cuda(0)));
    match get_connectivity(DeviceType::Cuda, "nvlink") {
        Err(Error::NoDetector { .. }) => panic!("the nvlink detector is not registered"),
        Ok(c) => println!("nvlink: {:?} ({})", c.matrix.rows(), c.detector),
        Err(e) => println!("nvlink detection unavailable here: {e}"),
    }
}
