//! GPU tests of the CUDA collectives (`symm_cuda::collectives`), ranks as threads of one process
//! (HashStore), at every world of `symm_testkit::GPU_WORLDS`: 2, 4 and 8 ranks on as many GPUs, and 2, 3, 4
//! and 8 ranks sharing GPU 0 (NOTE [shared-device]; tests `<name>::distinct_w2`,
//! `<name>::shared_w8`...). Each skips (printing why) without the GPUs it needs and fails instead
//! when `SYMM_REQUIRE_GPUS` says the machine has them; each prints `SUMMARY <test> ...` lines to
//! stderr for the run's notes.
//!
//! - `coll_all_reduce_matrix`: every algorithm x dtype x op at odd sizes and unaligned offsets
//!   (in and out of place), against a float64 reference, outputs poisoned first, guard bytes
//!   around the output untouched, results bitwise equal on both ranks; integer-valued sums exact;
//!   a second object with a tiny staging area makes the ring wrap many times per op.
//! - `coll_rs_ag_matrix`: reduce-scatter (Lamport, ring, auto) and all-gather (Lamport, SM ring,
//!   copy engine zero-copy and staged, auto), the same checks, in place too.
//! - `coll_stress_graph_delay`: 10,000 back-to-back ops on rotating payloads with no host sync
//!   inside a round; NaN written into zero-copy inputs right after each copy-engine op never
//!   reaches an output; 100 ops captured in one CUDA graph, replayed 100 times, equal to eager; a
//!   rank delayed 100 ms; subset barriers.
//! - `coll_errors`: a peer that never arrives gives a timeout (not a hang), abort, mismatched
//!   zero-copy offsets, bad arguments.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use symm_core::{get_allocator, DType, Device, DeviceType, Error, Rank, ReduceOp, SymmetricMemory};
use symm_cuda::collectives::{
    AllGatherKernel, AllReduceKernel, CollectivesConfig, CudaCollectives, DeviceOp, ReduceScatterKernel, Tuning,
};
use symm_cuda::streams::HostCopies;
use symm_testkit::launch::{RankCtx, TestResult};
use symm_testkit::GpuWorld;

/// Declares `trait Raw` with one safe `<entry>_t` method per raw-address entry point of
/// `CudaCollectives` listed, each calling its `unsafe fn` in one `unsafe` block.
macro_rules! raw_entries {
    ($($name:ident => $entry:ident($($arg:ident: $ty:ty),*);)*) => {
        trait Raw {
            $(
                fn $name(&self, s: &CudaStream, $($arg: $ty),*) -> symm_core::Result<()>;
            )*
        }
        impl Raw for CudaCollectives {
            $(
                fn $name(&self, s: &CudaStream, $($arg: $ty),*) -> symm_core::Result<()> {
                    // SAFETY: the test's own buffers (see the list of entries below).
                    unsafe { self.$entry(s, $($arg),*) }
                }
            )*
        }
    };
}

// The kernels' raw-address entry points (`unsafe fn`s, NOTE [raw-addresses]) for this file,
// whose every address is one of its own buffers: the payloads, the symmetric inputs and outputs
// of `Env` and the registered arenas, each sized for the op that gets it and alive until the
// test ends; the bad-argument cases are refused before any access.
raw_entries! {
    all_reduce_t => all_reduce(a: AllReduceKernel, d: DeviceOp);
    all_reduce_tuned_t => all_reduce_tuned(a: AllReduceKernel, t: &Tuning, d: DeviceOp);
    reduce_scatter_t => reduce_scatter(a: ReduceScatterKernel, d: DeviceOp);
    reduce_scatter_tuned_t => reduce_scatter_tuned(a: ReduceScatterKernel, t: &Tuning, d: DeviceOp);
    all_gather_t => all_gather(k: AllGatherKernel, d: DeviceOp);
}

const T: Duration = Duration::from_secs(60);
const GUARD: usize = 256;
const POISON: u8 = 0xFF;
const GUARD_BYTE: u8 = 0xA5;

fn summary(line: &str) {
    let _ = writeln!(std::io::stderr(), "SUMMARY {line}");
}

/// Runs `body` on every rank of `w` (after the GPU gate) and prints its SUMMARY line.
fn run_world<F>(name: &str, w: GpuWorld, limit: Duration, body: F)
where
    F: Fn(RankCtx) -> TestResult<String> + Send + Sync + 'static,
{
    symm_cuda::link();
    let t0 = Instant::now();
    if let Some(out) = w.run_threads(DeviceType::Cuda, limit, body) {
        summary(&format!(
            "{name} ok {} in {:.1} s: {}",
            w.label(),
            t0.elapsed().as_secs_f64(),
            out.join("; ")
        ));
    }
}

// ---------------------------------------------------------------- host-side values

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn encode(dtype: DType, vals: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * dtype.size());
    for &v in vals {
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
            _ => out.extend_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes()),
        }
    }
    out
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
            .collect(),
    }
}

/// Deterministic input of `rank` (every rank can compute every rank's input): small integers
/// when `exact`, else values in [-1, 1) rounded to the dtype; every 97th is -0.0. No NaNs.
fn gen_input(seed: u64, rank: usize, n: usize, dtype: DType, exact: bool) -> Vec<f64> {
    let mut x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03))
        | 1;
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 97 == 13 {
                return -0.0;
            }
            if exact {
                ((x >> 40) % 17) as f64 - 8.0
            } else {
                ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            }
        })
        .collect();
    decode(dtype, &encode(dtype, &vals))
}

fn reduce_ref(op: ReduceOp, vals: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Avg => vals.iter().sum::<f64>() / vals.len() as f64,
        ReduceOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
    }
}

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-6,
        DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

/// Max |got - want| (relative above 1), or an error naming the first bad element.
fn compare(what: &str, dtype: DType, got: &[f64], want: &[f64], exact: bool) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()));
    }
    let mut max_err = 0.0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        let bad = if exact {
            g != w
        } else {
            err.is_nan() || err > tol(dtype)
        };
        if bad {
            return Err(format!("{what}: element {i} is {g}, expected {w}"));
        }
        max_err = max_err.max(err);
    }
    Ok(max_err)
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

// ---------------------------------------------------------------- device buffers

/// A plain (non-symmetric) device buffer with guard bytes on both sides of a window.
struct Buf {
    slice: CudaSlice<u8>,
    base: u64,
    bytes: usize,
}

impl Buf {
    fn new(stream: &Arc<CudaStream>, bytes: usize) -> TestResult<Buf> {
        let slice = stream.alloc_zeros::<u8>(bytes + 2 * GUARD)?;
        let base = {
            let (p, _sync) = slice.device_ptr(stream);
            p
        };
        Ok(Buf { slice, base, bytes })
    }
    /// Device address of byte `off` of the window.
    fn at(&self, off: usize) -> u64 {
        self.base + (GUARD + off) as u64
    }
    /// Writes `data` at window offset `off`; the rest of the window is poisoned and the guards set.
    fn fill(&mut self, stream: &Arc<CudaStream>, off: usize, data: &[u8]) -> TestResult {
        let mut host = vec![GUARD_BYTE; self.bytes + 2 * GUARD];
        host[GUARD..GUARD + self.bytes].fill(POISON);
        host[GUARD + off..GUARD + off + data.len()].copy_from_slice(data);
        stream.synced_memcpy_htod(&host, &mut self.slice)?;
        Ok(())
    }
    /// Reads `len` bytes at window offset `off`, checking that every byte outside
    /// `[off, off+len)` still holds what `fill` put there (guards and poison).
    fn read(&self, stream: &Arc<CudaStream>, off: usize, len: usize, untouched_ok: bool) -> TestResult<Vec<u8>> {
        let host = stream.synced_clone_dtoh(&self.slice)?;
        for (i, b) in host.iter().enumerate() {
            let inside = i >= GUARD + off && i < GUARD + off + len;
            if inside {
                continue;
            }
            let want = if i < GUARD || i >= GUARD + self.bytes {
                GUARD_BYTE
            } else {
                POISON
            };
            if !untouched_ok && *b != want {
                return Err(format!("byte {} outside the output changed: {b:#x}", i as i64 - GUARD as i64).into());
            }
        }
        Ok(host[GUARD + off..GUARD + off + len].to_vec())
    }
}

/// Everything a rank needs.
struct Env {
    ctx: RankCtx,
    cuda: Arc<CudaContext>,
    /// From the device's pool: ranks sharing a GPU keep the process's streams few and unchurned
    /// (NOTE [stream-budget]).
    stream: symm_cuda::streams::PooledStream,
    calls: AtomicUsize,
    started: Instant,
}

impl Env {
    fn new(ctx: RankCtx) -> TestResult<Env> {
        let cuda = symm_cuda::driver::context(ctx.gpu())?;
        let stream = symm_cuda::streams::pooled(&cuda)?;
        Ok(Env {
            ctx,
            cuda,
            stream,
            calls: AtomicUsize::new(0),
            started: Instant::now(),
        })
    }
    fn rank(&self) -> usize {
        self.ctx.rank
    }
    fn world(&self) -> usize {
        self.ctx.world
    }
    /// A progress line (shown with the output of a failing or `--nocapture` run): where a rank
    /// was when a run stopped.
    fn progress(&self, what: &str) {
        eprintln!(
            "[{:8.3} s] rank {}/{}: {what}",
            self.started.elapsed().as_secs_f64(),
            self.rank(),
            self.world()
        );
    }
    /// Ranks sharing a GPU: a store barrier between per-op setup and the op
    /// (`RankCtx::shared_ready`, NOTE [co-residency]). Distinct GPUs: nothing.
    fn ready(&self) -> TestResult {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(self.ctx.shared_ready(&format!("ready-{n}"), T)?)
    }
    /// True when every rank passes the same hash.
    fn same_everywhere(&self, h: u64) -> TestResult<bool> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let all = self.ctx.all_gather(&format!("cmp-{n}"), &h.to_le_bytes(), T)?;
        Ok(all.iter().all(|v| v.as_slice() == h.to_le_bytes()))
    }
    fn collectives(&self, name: &str, config: CollectivesConfig) -> TestResult<CudaCollectives> {
        let g = self.ctx.group(&self.ctx.unique(name))?;
        Ok(CudaCollectives::with_config(&g, &self.cuda, config)?)
    }
    /// A symmetric allocation of `bytes` on this group, registered with `c`.
    fn symmetric(&self, c: &CudaCollectives, bytes: usize) -> TestResult<Arc<dyn SymmetricMemory>> {
        let a = get_allocator(DeviceType::Cuda)?.alloc(bytes, Device::cuda(self.ctx.gpu() as u32), c.group())?;
        let m = a.rendezvous(T)?;
        c.register_symmetric(m.clone())?;
        Ok(m)
    }
}

fn config(staging: usize) -> CollectivesConfig {
    CollectivesConfig::new(staging, Duration::from_secs(20))
}

/// Collects failures instead of stopping, so both ranks keep issuing the same op sequence.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn check(&mut self, r: Result<f64, String>) -> f64 {
        match r {
            Ok(e) => e,
            Err(e) => {
                if self.0.len() < 20 {
                    self.0.push(e);
                }
                0.0
            }
        }
    }
    fn push(&mut self, e: String) {
        if self.0.len() < 20 {
            self.0.push(e);
        }
    }
    fn result(self, rank: usize) -> TestResult {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("rank {rank}: {}", self.0.join("\n")).into())
        }
    }
}

// ---------------------------------------------------------------- all-reduce matrix

const AR_SIZES: [usize; 8] = [1, 7, 8, 9, 1023, 4097, 65_537, (1 << 20) + 5];

/// One all-reduce checked against the reference. `sym` is the registered symmetric input for
/// the copy-engine algorithm.
#[allow(clippy::too_many_arguments)]
fn run_all_reduce(
    env: &Env,
    c: &CudaCollectives,
    algo: AllReduceKernel,
    dtype: DType,
    op: ReduceOp,
    count: usize,
    offset: usize,
    in_place: bool,
    seed: u64,
    sym: Option<&Arc<dyn SymmetricMemory>>,
    fails: &mut Failures,
) -> TestResult<f64> {
    let (me, world) = (env.rank(), env.world());
    let es = dtype.size();
    let bytes = count * es;
    let off = offset * es;
    let exact = op == ReduceOp::Sum && seed.is_multiple_of(2);
    let inputs: Vec<Vec<f64>> = (0..world).map(|r| gen_input(seed, r, count, dtype, exact)).collect();
    let want: Vec<f64> = (0..count)
        .map(|i| {
            let v: Vec<f64> = inputs.iter().map(|x| x[i]).collect();
            reduce_ref(op, &v)
        })
        .collect();
    let want = decode(dtype, &encode(dtype, &want));
    let data = encode(dtype, &inputs[me]);
    let mut out = Buf::new(&env.stream, bytes + off + 64)?;
    let mut inp = Buf::new(&env.stream, bytes + off + 64)?;
    let input = if let Some(m) = sym {
        env.stream.synchronize()?;
        m.write_bytes(m.rank(), off, &data)?;
        m.buffer_ptrs()[me] + off as u64
    } else if in_place {
        out.fill(&env.stream, off, &data)?;
        out.at(off)
    } else {
        inp.fill(&env.stream, off, &data)?;
        inp.at(off)
    };
    if !in_place {
        out.fill(&env.stream, off, &[])?;
    }
    // The copy-engine algorithm with half of the peers' data by the copy engine (its default
    // fraction, 0, is the fused pull, tested as `Pull`).
    let mut tuning = c.config().tuning;
    if algo == AllReduceKernel::CopyEnginePull {
        tuning.ce_fraction = 0.5;
    }
    let what = format!(
        "all_reduce {} {dtype} {op} count {count} offset {offset}{}",
        algo.name(),
        if in_place { " in place" } else { "" }
    );
    env.ready()?;
    let ran = c.all_reduce_tuned_t(
        &env.stream,
        algo,
        &tuning,
        DeviceOp {
            input,
            output: out.at(off),
            count,
            dtype,
            op,
        },
    );
    let synced = env.stream.synchronize();
    ran.and_then(|()| c.check_error())
        .map_err(|e| format!("rank {me}: {what}: {e}"))?;
    synced?;
    let got = match out.read(&env.stream, off, bytes, false) {
        Ok(g) => g,
        Err(e) => {
            fails.push(format!("{what}: {e}"));
            // Keep the ranks' exchanges in step: compare what there is.
            out.read(&env.stream, off, bytes, true)?
        }
    };
    if !in_place && sym.is_none() {
        // The input is never written.
        match inp.read(&env.stream, off, bytes, false) {
            Ok(g) if g == data => {}
            Ok(_) => fails.push(format!("{what}: the input changed")),
            Err(e) => fails.push(format!("{what}: input buffer: {e}")),
        }
    }
    let err = fails.check(compare(&what, dtype, &decode(dtype, &got), &want, exact));
    if !env.same_everywhere(fnv(&got))? {
        fails.push(format!("{what}: results differ between ranks"));
    }
    Ok(err)
}

fn body_all_reduce(ctx: RankCtx) -> TestResult<String> {
    let env = Env::new(ctx)?;
    let c = env.collectives("coll-ar", config(symm_cuda::collectives::DEFAULT_STAGING_BYTES))?;
    // 256 KiB of staging: 16 KiB slots, so 1 MiB messages wrap the ring many times.
    let small = env.collectives("coll-ar-small", {
        let mut k = config(256 << 10);
        k.lamport_bytes = Some(64 << 10);
        k
    })?;
    let max_bytes = ((1 << 20) + 64) * 4;
    let sym = env.symmetric(&c, max_bytes)?;
    let mut fails = Failures::default();
    let mut runs = 0usize;
    let mut worst = 0.0f64;
    let t0 = Instant::now();
    // Every kernel whose output may be anywhere; the two whose output is registered too (the
    // two-shot pull, the copy-engine two-shot) run below on registered outputs.
    let algos: Vec<AllReduceKernel> = AllReduceKernel::ALL
        .iter()
        .copied()
        .filter(|k| !matches!(k, AllReduceKernel::PullTwoShot | AllReduceKernel::CopyEngineTwoShot))
        .collect();
    let zero_copy = |a: AllReduceKernel| matches!(a, AllReduceKernel::CopyEnginePull | AllReduceKernel::Pull);
    let mut seed = 1u64;
    for (obj, name) in [(&c, "default"), (&small, "small-staging")] {
        for &algo in &algos {
            if name == "small-staging" && zero_copy(algo) {
                continue;
            }
            env.progress(&format!("all_reduce matrix: {} ({name})", algo.name()));
            for dtype in DTYPES {
                for op in ReduceOp::ALL {
                    for &count in &AR_SIZES {
                        if algo == AllReduceKernel::Lamport && count * dtype.size() > obj.lamport_max_bytes() {
                            continue;
                        }
                        // The Lamport two-shot: two shards a slot (NOTE [lamport-two-shot]).
                        let two_shot_max =
                            symm_core::coll::geometry::lamport_two_shot_max_bytes(env.world(), obj.lamport_max_bytes());
                        if algo == AllReduceKernel::LamportTwoShot
                            && env.world() > 1
                            && count * dtype.size() > two_shot_max
                        {
                            continue;
                        }
                        // The largest size only for sum, to keep the run short.
                        if count > 100_000 && op != ReduceOp::Sum {
                            continue;
                        }
                        for offset in [0usize, 1] {
                            for in_place in [false, true] {
                                // In place: aligned only (keeps the run short); never for the
                                // copy engine (peers read the input).
                                if in_place && (zero_copy(algo) || offset != 0) {
                                    continue;
                                }
                                let s = zero_copy(algo).then_some(&sym);
                                seed += 1;
                                let e = run_all_reduce(
                                    &env, obj, algo, dtype, op, count, offset, in_place, seed, s, &mut fails,
                                )?;
                                worst = worst.max(e);
                                runs += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    // ---- copy-engine two-shot (two ranks) / two-shot pull (more): input and output in one
    // registered buffer (odd sizes and offsets, several chunks at the largest size); the 64
    // bytes after the output stay poisoned.
    let big = 5_000_003usize;
    let region = (big + 64) * 4;
    let sym2 = env.symmetric(&c, 2 * region)?;
    let me = env.rank();
    if env.world() != 2 {
        // Two ranks only: anything else is refused before anything runs.
        let base = sym2.buffer_ptrs()[me];
        let r = c.all_reduce_t(
            &env.stream,
            AllReduceKernel::CopyEngineTwoShot,
            DeviceOp {
                input: base,
                output: base + region as u64,
                count: 1000,
                dtype: DType::F32,
                op: ReduceOp::Sum,
            },
        );
        if !matches!(r, Err(Error::InvalidArgument(_))) {
            fails.push(format!("copy-engine two-shot at world {}: {r:?}", env.world()));
        }
    }
    // The same buffers from three ranks on: the two-shot pull (`Pull` with the output registered
    // too), out of place and in place.
    let two_shot_pull = env.world() >= 3;
    let placements: &[bool] = if two_shot_pull { &[false, true] } else { &[false] };
    for dtype in DTYPES {
        for op in ReduceOp::ALL {
            for &count in AR_SIZES.iter().chain([big].iter()) {
                if count > 100_000 && op != ReduceOp::Sum {
                    continue;
                }
                if count == big && dtype == DType::F16 {
                    continue;
                }
                for (offset, &in_place) in [0usize, 1]
                    .into_iter()
                    .flat_map(|o| placements.iter().map(move |p| (o, p)))
                {
                    seed += 1;
                    let es = dtype.size();
                    let (bytes, off) = (count * es, offset * es);
                    let exact = op == ReduceOp::Sum && seed.is_multiple_of(2);
                    let inputs: Vec<Vec<f64>> = (0..env.world())
                        .map(|r| gen_input(seed, r, count, dtype, exact))
                        .collect();
                    let want: Vec<f64> = (0..count)
                        .map(|i| reduce_ref(op, &inputs.iter().map(|x| x[i]).collect::<Vec<_>>()))
                        .collect();
                    let want = decode(dtype, &encode(dtype, &want));
                    env.stream.synchronize()?;
                    // In place: the input is written where the output goes.
                    let out_at = if in_place { off } else { region + off };
                    sym2.write_bytes(sym2.rank(), out_at, &vec![POISON; bytes + 64])?;
                    sym2.write_bytes(sym2.rank(), off, &encode(dtype, &inputs[me]))?;
                    let base = sym2.buffer_ptrs()[me];
                    let (input, output) = (base + off as u64, base + out_at as u64);
                    // No host barrier: the op's opening barrier orders the peers' reads and
                    // pushes after these (synchronous) writes.
                    env.ready()?;
                    if two_shot_pull {
                        c.all_reduce_t(
                            &env.stream,
                            AllReduceKernel::PullTwoShot,
                            DeviceOp {
                                input,
                                output,
                                count,
                                dtype,
                                op,
                            },
                        )?;
                    } else {
                        c.all_reduce_t(
                            &env.stream,
                            AllReduceKernel::CopyEngineTwoShot,
                            DeviceOp {
                                input,
                                output,
                                count,
                                dtype,
                                op,
                            },
                        )?;
                    }
                    env.stream.synchronize()?;
                    c.check_error()?;
                    let what = format!(
                        "all_reduce {} {dtype} {op} count {count} offset {offset}{}",
                        if two_shot_pull {
                            "two-shot pull"
                        } else {
                            "copy-engine two-shot"
                        },
                        if in_place { " in place" } else { "" }
                    );
                    let mut got = vec![0u8; bytes + 64];
                    sym2.read_bytes(sym2.rank(), out_at, &mut got)?;
                    if got[bytes..].iter().any(|&b| b != POISON) {
                        fails.push(format!("{what}: bytes after the output changed"));
                    }
                    got.truncate(bytes);
                    let e = fails.check(compare(&what, dtype, &decode(dtype, &got), &want, exact));
                    worst = worst.max(e);
                    if !env.same_everywhere(fnv(&got))? {
                        fails.push(format!("{what}: results differ between ranks"));
                    }
                    runs += 1;
                }
            }
        }
    }
    fails.result(env.rank())?;
    Ok(format!(
        "rank {}: {runs} all-reduces ok, max rel err {worst:.2e}, {:.1} s",
        env.rank(),
        t0.elapsed().as_secs_f64()
    ))
}

fn all_reduce_matrix(w: GpuWorld) {
    run_world("coll_all_reduce_matrix", w, Duration::from_secs(900), body_all_reduce);
}
symm_testkit::gpu_world_tests!(coll_all_reduce_matrix, all_reduce_matrix);

// ---------------------------------------------------------------- reduce-scatter / all-gather

fn body_rs_ag(ctx: RankCtx) -> TestResult<String> {
    let env = Env::new(ctx)?;
    let (me, world) = (env.rank(), env.world());
    let c = env.collectives("coll-rsag", config(symm_cuda::collectives::DEFAULT_STAGING_BYTES))?;
    let small = env.collectives("coll-rsag-small", config(256 << 10))?;
    let sizes = [1usize, 3, 8, 9, 1000, 4097, 300_001];
    let sym = env.symmetric(&c, (300_001 + 64) * 4 * world)?;
    let mut fails = Failures::default();
    let mut runs = 0usize;
    let mut seed = 1000u64;
    if world != 2 {
        // The copy-engine reduce-scatter is a two-rank kernel: refused before anything runs.
        let base = sym.buffer_ptrs()[me];
        let r = c.reduce_scatter_t(
            &env.stream,
            ReduceScatterKernel::CopyEngine,
            DeviceOp {
                input: base,
                output: base + (1000 * world * 4) as u64,
                count: 1000,
                dtype: DType::F32,
                op: ReduceOp::Sum,
            },
        );
        if !matches!(r, Err(Error::InvalidArgument(_))) {
            fails.push(format!("copy-engine reduce-scatter at world {world}: {r:?}"));
        }
    }
    for (obj, name) in [(&c, "default"), (&small, "small")] {
        for dtype in DTYPES {
            for &count in &sizes {
                for offset in [0usize, 1] {
                    let es = dtype.size();
                    let off = offset * es;
                    // ---- reduce-scatter (out of place and in place), every op for small sizes
                    for (op, algo) in ReduceOp::ALL
                        .into_iter()
                        .flat_map(|o| [ReduceScatterKernel::Lamport, ReduceScatterKernel::Ring].map(|a| (o, a)))
                    {
                        if count > 5000 && op != ReduceOp::Sum {
                            continue;
                        }
                        for in_place in [false, true] {
                            if in_place && offset != 0 {
                                continue;
                            }
                            seed += 1;
                            let total = count * world;
                            let exact = op == ReduceOp::Sum;
                            let inputs: Vec<Vec<f64>> =
                                (0..world).map(|r| gen_input(seed, r, total, dtype, exact)).collect();
                            let want: Vec<f64> = (0..count)
                                .map(|i| {
                                    let v: Vec<f64> = inputs.iter().map(|x| x[me * count + i]).collect();
                                    reduce_ref(op, &v)
                                })
                                .collect();
                            let want = decode(dtype, &encode(dtype, &want));
                            let data = encode(dtype, &inputs[me]);
                            let mut inp = Buf::new(&env.stream, total * es + off)?;
                            inp.fill(&env.stream, off, &data)?;
                            let mut out = Buf::new(&env.stream, count * es + off)?;
                            out.fill(&env.stream, off, &[])?;
                            let (i_ptr, o_ptr) = if in_place {
                                (inp.at(off), inp.at(off + me * count * es))
                            } else {
                                (inp.at(off), out.at(off))
                            };
                            let tuning = obj.config().tuning;
                            env.ready()?;
                            obj.reduce_scatter_tuned_t(
                                &env.stream,
                                algo,
                                &tuning,
                                DeviceOp {
                                    input: i_ptr,
                                    output: o_ptr,
                                    count,
                                    dtype,
                                    op,
                                },
                            )?;
                            env.stream.synchronize()?;
                            obj.check_error()?;
                            let what = format!(
                                "reduce_scatter ({name}) {} {dtype} {op} count {count} offset {offset}{}",
                                algo.name(),
                                if in_place { " in place" } else { "" }
                            );
                            let got = if in_place {
                                inp.read(&env.stream, off + me * count * es, count * es, true)?
                            } else {
                                out.read(&env.stream, off, count * es, false)?
                            };
                            fails.check(compare(&what, dtype, &decode(dtype, &got), &want, exact));
                            runs += 1;
                        }
                    }
                    // ---- reduce-scatter zero-copy pull: the input in registered symmetric memory
                    // (out of place and in place at this rank's shard)
                    for op in ReduceOp::ALL {
                        if name != "default" || (count > 5000 && op != ReduceOp::Sum) {
                            continue;
                        }
                        // (in place, copy engine): the copy engine runs out of place only.
                        for (in_place, ce) in [(false, false), (true, false), (false, true)] {
                            // The copy engine is a two-rank kernel (refused elsewhere: below).
                            if (in_place && offset != 0) || (ce && world != 2) {
                                continue;
                            }
                            seed += 1;
                            let total = count * world;
                            let exact = op == ReduceOp::Sum;
                            let inputs: Vec<Vec<f64>> =
                                (0..world).map(|r| gen_input(seed, r, total, dtype, exact)).collect();
                            let want: Vec<f64> = (0..count)
                                .map(|i| {
                                    let v: Vec<f64> = inputs.iter().map(|x| x[me * count + i]).collect();
                                    reduce_ref(op, &v)
                                })
                                .collect();
                            let want = decode(dtype, &encode(dtype, &want));
                            env.stream.synchronize()?;
                            sym.write_bytes(sym.rank(), off, &encode(dtype, &inputs[me]))?;
                            let base = sym.buffer_ptrs()[me] + off as u64;
                            let shard = off + me * count * es;
                            let mut out = Buf::new(&env.stream, count * es + off)?;
                            out.fill(&env.stream, off, &[])?;
                            let o_ptr = if in_place {
                                base + (me * count * es) as u64
                            } else {
                                out.at(off)
                            };
                            env.ready()?;
                            if ce {
                                obj.reduce_scatter_t(
                                    &env.stream,
                                    ReduceScatterKernel::CopyEngine,
                                    DeviceOp {
                                        input: base,
                                        output: o_ptr,
                                        count,
                                        dtype,
                                        op,
                                    },
                                )?;
                            } else {
                                obj.reduce_scatter_t(
                                    &env.stream,
                                    ReduceScatterKernel::Pull,
                                    DeviceOp {
                                        input: base,
                                        output: o_ptr,
                                        count,
                                        dtype,
                                        op,
                                    },
                                )?;
                            }
                            env.stream.synchronize()?;
                            obj.check_error()?;
                            let what = format!(
                                "reduce_scatter ({name}) {} {dtype} {op} count {count} offset {offset}{}",
                                if ce { "copy engine" } else { "pull" },
                                if in_place { " in place" } else { "" }
                            );
                            let got = if in_place {
                                let mut g = vec![0u8; count * es];
                                sym.read_bytes(sym.rank(), shard, &mut g)?;
                                g
                            } else {
                                out.read(&env.stream, off, count * es, false)?
                            };
                            fails.check(compare(&what, dtype, &decode(dtype, &got), &want, exact));
                            runs += 1;
                        }
                    }
                    // ---- all-gather: SM, copy engine zero-copy, copy engine staged; in place (SM)
                    // (path, zero_copy, in_place, out_sym): zero_copy puts the input (in place:
                    // the whole output) in the registered buffer; out_sym puts only the output
                    // there (the copy engine then pushes into the peers' outputs).
                    for (kernel, zero_copy, in_place, out_sym) in [
                        (AllGatherKernel::Ring, false, false, false),
                        (AllGatherKernel::Ring, false, true, false),
                        (AllGatherKernel::Lamport, false, false, false),
                        (AllGatherKernel::Lamport, false, true, false),
                        (AllGatherKernel::CopyEnginePull, true, false, false),
                        (AllGatherKernel::CopyEngineStaged, false, false, false),
                        (AllGatherKernel::CopyEngineStaged, false, true, false),
                        (AllGatherKernel::CopyEnginePush, true, true, false),
                        (AllGatherKernel::CopyEnginePush, true, false, true),
                        (AllGatherKernel::Pull, true, false, false),
                        (AllGatherKernel::Pull, true, true, false),
                    ] {
                        if zero_copy && name == "small" {
                            continue;
                        }
                        seed += 1;
                        let inputs: Vec<Vec<f64>> =
                            (0..world).map(|r| gen_input(seed, r, count, dtype, false)).collect();
                        let want: Vec<f64> = inputs.concat();
                        let data = encode(dtype, &inputs[me]);
                        let mut out = Buf::new(&env.stream, count * world * es + off)?;
                        let mut inp = Buf::new(&env.stream, count * es + off)?;
                        // Zero-copy in place: the whole output lies in the symmetric buffer,
                        // this rank's slice holds the input.
                        let sym_out = zero_copy && (in_place || out_sym);
                        let input = if out_sym {
                            env.stream.synchronize()?;
                            sym.write_bytes(sym.rank(), off, &vec![POISON; count * world * es])?;
                            inp.fill(&env.stream, off, &data)?;
                            inp.at(off)
                        } else if sym_out {
                            env.stream.synchronize()?;
                            let mut host = vec![POISON; count * world * es];
                            host[me * count * es..(me + 1) * count * es].copy_from_slice(&data);
                            sym.write_bytes(sym.rank(), off, &host)?;
                            sym.buffer_ptrs()[me] + (off + me * count * es) as u64
                        } else if zero_copy {
                            env.stream.synchronize()?;
                            sym.write_bytes(sym.rank(), off, &data)?;
                            out.fill(&env.stream, off, &[])?;
                            sym.buffer_ptrs()[me] + off as u64
                        } else if in_place {
                            let mut host = vec![POISON; count * world * es];
                            host[me * count * es..(me + 1) * count * es].copy_from_slice(&data);
                            out.fill(&env.stream, off, &host)?;
                            out.at(off + me * count * es)
                        } else {
                            inp.fill(&env.stream, off, &data)?;
                            out.fill(&env.stream, off, &[])?;
                            inp.at(off)
                        };
                        let output = if sym_out {
                            sym.buffer_ptrs()[me] + off as u64
                        } else {
                            out.at(off)
                        };
                        env.ready()?;
                        obj.all_gather_t(&env.stream, kernel, DeviceOp::gather(input, output, count, dtype))?;
                        env.stream.synchronize()?;
                        obj.check_error()?;
                        let what = format!(
                            "all_gather ({name}) {} {dtype} count {count} offset {offset}{}{}",
                            kernel.name(),
                            if out_sym {
                                " zero-copy push"
                            } else if zero_copy {
                                " zero-copy"
                            } else {
                                ""
                            },
                            if in_place { " in place" } else { "" }
                        );
                        let got = if sym_out {
                            let mut g = vec![0u8; count * world * es];
                            sym.read_bytes(sym.rank(), off, &mut g)?;
                            g
                        } else {
                            out.read(&env.stream, off, count * world * es, false)?
                        };
                        // Bits, not values: compare the bytes exactly.
                        if got != encode(dtype, &want) {
                            fails.push(format!("{what}: wrong bytes"));
                        }
                        runs += 1;
                    }
                }
            }
        }
    }
    // ---- large copy-engine cases: several chunks of the copy-engine reduce-scatter (each
    // reduced as it lands), and the all-gather push, at odd sizes and offsets.
    let big = 5_000_003usize;
    let bsym = env.symmetric(&c, (big + 64) * 4 * world)?;
    for dtype in [DType::BF16, DType::F32] {
        let es = dtype.size();
        for offset in [0usize, 1] {
            let off = offset * es;
            let count = big / world;
            seed += 1;
            let total = count * world;
            let inputs: Vec<Vec<f64>> = (0..world).map(|r| gen_input(seed, r, total, dtype, true)).collect();
            let want: Vec<f64> = (0..count)
                .map(|i| {
                    reduce_ref(
                        ReduceOp::Sum,
                        &inputs.iter().map(|x| x[me * count + i]).collect::<Vec<_>>(),
                    )
                })
                .collect();
            let want = decode(dtype, &encode(dtype, &want));
            env.stream.synchronize()?;
            bsym.write_bytes(bsym.rank(), off, &encode(dtype, &inputs[me]))?;
            let mut out = Buf::new(&env.stream, count * es + off)?;
            out.fill(&env.stream, off, &[])?;
            let base = bsym.buffer_ptrs()[me] + off as u64;
            env.ready()?;
            // The copy engine at two ranks, the pull at more (what ran here before the copy
            // engine stopped falling back to the pull on its own).
            let kernel = if world == 2 {
                ReduceScatterKernel::CopyEngine
            } else {
                ReduceScatterKernel::Pull
            };
            c.reduce_scatter_t(
                &env.stream,
                kernel,
                DeviceOp {
                    input: base,
                    output: out.at(off),
                    count,
                    dtype,
                    op: ReduceOp::Sum,
                },
            )?;
            env.stream.synchronize()?;
            c.check_error()?;
            let got = out.read(&env.stream, off, count * es, false)?;
            let what = format!(
                "reduce_scatter {} {dtype} sum count {count} offset {offset}",
                kernel.name()
            );
            fails.check(compare(&what, dtype, &decode(dtype, &got), &want, true));
            runs += 1;
            // all-gather push: out of place (unregistered input), then in place.
            for in_place in [false, true] {
                seed += 1;
                let n = big / world;
                let inputs: Vec<Vec<f64>> = (0..world).map(|r| gen_input(seed, r, n, dtype, false)).collect();
                let data = encode(dtype, &inputs[me]);
                env.stream.synchronize()?;
                let mut host = vec![POISON; n * world * es];
                if in_place {
                    host[me * n * es..(me + 1) * n * es].copy_from_slice(&data);
                }
                bsym.write_bytes(bsym.rank(), off, &host)?;
                let mut inp = Buf::new(&env.stream, n * es + off)?;
                inp.fill(&env.stream, off, &data)?;
                let output = bsym.buffer_ptrs()[me] + off as u64;
                let input = if in_place {
                    output + (me * n * es) as u64
                } else {
                    inp.at(off)
                };
                env.ready()?;
                c.all_gather_t(
                    &env.stream,
                    AllGatherKernel::CopyEnginePush,
                    DeviceOp::gather(input, output, n, dtype),
                )?;
                env.stream.synchronize()?;
                c.check_error()?;
                let mut g = vec![0u8; n * world * es];
                bsym.read_bytes(bsym.rank(), off, &mut g)?;
                if g != encode(dtype, &inputs.concat()) {
                    fails.push(format!(
                        "all_gather copy engine push {dtype} count {n} offset {offset}{}: wrong bytes",
                        if in_place { " in place" } else { "" }
                    ));
                }
                runs += 1;
            }
        }
    }
    fails.result(me)?;
    Ok(format!("rank {me}: {runs} reduce-scatters / all-gathers ok"))
}

fn rs_ag_matrix(w: GpuWorld) {
    run_world("coll_rs_ag_matrix", w, Duration::from_secs(900), body_rs_ag);
}
symm_testkit::gpu_world_tests!(coll_rs_ag_matrix, rs_ag_matrix);

/// The worlds `gpu_world_tests!` has no case for, ranks sharing one GPU: every world size runs
/// Lamport entries of its own (NOTE [lamport-world-entries]), so 5, 6 and 7 ranks run the
/// all-reduce, reduce-scatter and all-gather matrices too.
mod coll_other_worlds {
    use super::*;

    #[test]
    fn shared_w5_w6_w7() {
        for w in 5..=7 {
            all_reduce_matrix(GpuWorld::shared(w));
            rs_ag_matrix(GpuWorld::shared(w));
        }
    }
}

/// Where `got` differs from `want` (elements of `dtype`): how many elements, the first one, and
/// how many of the wrong ones are the all-ones pattern (NaN written into an input).
fn describe_mismatch(what: &str, dtype: DType, got: &[u8], want: &[u8]) -> String {
    let es = dtype.size();
    let wrong: Vec<usize> = (0..want.len() / es)
        .filter(|&e| got[e * es..(e + 1) * es] != want[e * es..(e + 1) * es])
        .collect();
    let ones = wrong
        .iter()
        .filter(|&&e| got[e * es..(e + 1) * es].iter().all(|&b| b == 0xFF))
        .count();
    let first = wrong.first().copied().unwrap_or(0);
    format!(
        "{what}: {} of {} elements wrong ({ones} all-ones), first at {first}: got {:02x?} want {:02x?}, last at {}",
        wrong.len(),
        want.len() / es,
        &got[first * es..(first + 1) * es],
        &want[first * es..(first + 1) * es],
        wrong.last().copied().unwrap_or(0)
    )
}

// ---------------------------------------------------------------- stress, graphs, delay

/// Pool of `p` inputs (rank-specific payloads) and `q` outputs of `count` elements.
struct Pool {
    inputs: Vec<CudaSlice<u8>>,
    in_ptrs: Vec<u64>,
    outputs: CudaSlice<u8>,
    out_base: u64,
    payloads: Vec<Vec<Vec<f64>>>, // [input][rank]
}

fn pool(env: &Env, p: usize, q: usize, count: usize, dtype: DType, seed: u64) -> TestResult<Pool> {
    let mut inputs = Vec::new();
    let mut in_ptrs = Vec::new();
    let mut payloads = Vec::new();
    for k in 0..p {
        let per_rank: Vec<Vec<f64>> = (0..env.world())
            .map(|r| gen_input(seed + k as u64, r, count, dtype, true))
            .collect();
        let s = env.stream.synced_clone_htod(&encode(dtype, &per_rank[env.rank()]))?;
        let ptr = {
            let (p, _g) = s.device_ptr(&env.stream);
            p
        };
        in_ptrs.push(ptr);
        inputs.push(s);
        payloads.push(per_rank);
    }
    let outputs = env.stream.alloc_zeros::<u8>(q * count * dtype.size())?;
    let out_base = {
        let (p, _g) = outputs.device_ptr(&env.stream);
        p
    };
    Ok(Pool {
        inputs,
        in_ptrs,
        outputs,
        out_base,
        payloads,
    })
}

fn sum_ref(dtype: DType, per_rank: &[Vec<f64>]) -> Vec<u8> {
    let n = per_rank[0].len();
    let v: Vec<f64> = (0..n).map(|i| per_rank.iter().map(|x| x[i]).sum()).collect();
    encode(dtype, &v)
}

/// The stress suite; with `pdl`, every collective kernel is launched with programmatic dependent
/// launch (NOTE [pdl]), so each op may start while the one ahead of it still runs.
fn body_stress(ctx: RankCtx, pdl: bool) -> TestResult<String> {
    let env = Env::new(ctx)?;
    let me = env.rank();
    let mut cfg = config(symm_cuda::collectives::DEFAULT_STAGING_BYTES);
    cfg.pdl = pdl;
    let c = env.collectives("coll-stress", cfg)?;
    if c.pdl() != (pdl && symm_cuda::driver::supports_pdl(env.cuda.cu_device())?) {
        return Err(format!("pdl asked {pdl}, collectives report {}", c.pdl()).into());
    }
    let mut notes = vec![format!("pdl {}", c.pdl())];
    let dtype = DType::BF16;
    // ---- 10,000 back-to-back all-reduces per algorithm, rotating payloads, one host sync per
    // round of Q ops.
    for (algo, count, total_ops) in [
        (AllReduceKernel::Lamport, 2048usize, 10_000usize),
        (AllReduceKernel::OneShot, 65_536, 10_000),
        (AllReduceKernel::TwoShot, 65_536 + 5, 2_000),
    ] {
        const P: usize = 7;
        const Q: usize = 100;
        env.progress(&format!("stress: {total_ops} x {} of {count}", algo.name()));
        let pl = pool(&env, P, Q, count, dtype, 77)?;
        let bytes = count * dtype.size();
        let expected: Vec<Vec<u8>> = (0..P).map(|k| sum_ref(dtype, &pl.payloads[k])).collect();
        env.ready()?;
        let t0 = Instant::now();
        let mut bad = 0usize;
        for round in 0..total_ops / Q {
            for j in 0..Q {
                let i = round * Q + j;
                c.all_reduce_t(
                    &env.stream,
                    algo,
                    DeviceOp {
                        input: pl.in_ptrs[i % P],
                        output: pl.out_base + (j * bytes) as u64,
                        count,
                        dtype,
                        op: ReduceOp::Sum,
                    },
                )?;
            }
            let host = env.stream.synced_clone_dtoh(&pl.outputs)?;
            for j in 0..Q {
                let i = round * Q + j;
                if host[j * bytes..(j + 1) * bytes] != expected[i % P][..] {
                    bad += 1;
                }
            }
        }
        c.check_error()?;
        if bad > 0 {
            return Err(format!("{}: {bad} of {total_ops} back-to-back results wrong", algo.name()).into());
        }
        notes.push(format!(
            "{} x{total_ops} ok ({:.1} us/op incl. checks)",
            algo.name(),
            t0.elapsed().as_secs_f64() * 1e6 / total_ops as f64
        ));
        drop(pl.inputs);
    }

    // ---- zero-copy copy-engine ops: NaN written into the input right after each op returns
    // (stream-ordered) never reaches an output.
    {
        let count = 1 << 20;
        let bytes = count * dtype.size();
        let sym = env.symmetric(&c, 2 * bytes)?;
        // Outputs for the all-gather of count / 2 from every rank.
        let pl = pool(&env, 3, env.world().div_ceil(2), count, dtype, 555)?;
        let nan = env.stream.synced_clone_htod(&vec![0xFFu8; bytes])?;
        let nan_ptr = {
            let (p, _g) = nan.device_ptr(&env.stream);
            p
        };
        let sym_in = sym.buffer_ptrs()[me];
        env.ready()?;
        env.progress("stress: copy-engine ops with NaN after");
        let mut bad = 0;
        let mut first_bad = Vec::new();
        for i in 0..60 {
            let k = i % 3;
            // SAFETY: `sym_in` and the payloads are `bytes` long allocations of this rank's
            // context, alive until the end of the test.
            unsafe { symm_cuda::driver::mem::unchecked::dtod_async(&env.stream, sym_in, pl.in_ptrs[k], bytes)? };
            if i % 2 == 0 {
                c.all_reduce_t(
                    &env.stream,
                    AllReduceKernel::CopyEnginePull,
                    DeviceOp {
                        input: sym_in,
                        output: pl.out_base,
                        count,
                        dtype,
                        op: ReduceOp::Sum,
                    },
                )?;
            } else {
                c.all_gather_t(
                    &env.stream,
                    if i % 4 == 1 {
                        AllGatherKernel::CopyEnginePull
                    } else {
                        AllGatherKernel::Pull
                    },
                    DeviceOp::gather(sym_in, pl.out_base, count / 2, dtype),
                )?;
            }
            // SAFETY: as above; `nan` is `bytes` long.
            unsafe { symm_cuda::driver::mem::unchecked::dtod_async(&env.stream, sym_in, nan_ptr, bytes)? };
            let host = env.stream.synced_clone_dtoh(&pl.outputs)?;
            let want = if i % 2 == 0 {
                sum_ref(dtype, &pl.payloads[k])
            } else {
                let half_bytes = count / 2 * dtype.size();
                (0..env.world())
                    .flat_map(|r| encode(dtype, &pl.payloads[k][r])[..half_bytes].to_vec())
                    .collect()
            };
            if host[..want.len()] != want[..] {
                bad += 1;
                if first_bad.len() < 6 {
                    first_bad.push(describe_mismatch(
                        &format!(
                            "op {i} ({})",
                            if i % 2 == 0 {
                                "all-reduce"
                            } else if i % 4 == 1 {
                                "all-gather ce"
                            } else {
                                "all-gather pull"
                            }
                        ),
                        dtype,
                        &host[..want.len()],
                        &want,
                    ));
                }
            }
        }
        c.check_error()?;
        if bad > 0 {
            return Err(format!(
                "copy-engine ops with NaN written after them: {bad} of 60 wrong; {}",
                first_bad.join("; ")
            )
            .into());
        }
        notes.push("copy-engine x60 with NaN after each ok".into());
    }

    // ---- 100 ops captured in one graph, replayed 100 times, equal to eager.
    {
        env.progress("stress: graph");
        let count = 4099;
        let bytes = count * dtype.size();
        const OPS: usize = 100;
        let pl = pool(&env, 5, OPS, count, dtype, 999)?;
        let algos = [
            AllReduceKernel::Lamport,
            AllReduceKernel::OneShot,
            AllReduceKernel::TwoShot,
        ];
        env.ready()?;
        let issue = |stream: &Arc<CudaStream>| -> TestResult {
            for j in 0..OPS {
                c.all_reduce_t(
                    stream,
                    algos[j % algos.len()],
                    DeviceOp {
                        input: pl.in_ptrs[j % 5],
                        output: pl.out_base + (j * bytes) as u64,
                        count,
                        dtype,
                        op: ReduceOp::Sum,
                    },
                )?;
            }
            Ok(())
        };
        issue(&env.stream)?;
        let eager = env.stream.synced_clone_dtoh(&pl.outputs)?;
        for j in 0..OPS {
            if eager[j * bytes..(j + 1) * bytes] != sum_ref(dtype, &pl.payloads[j % 5])[..] {
                return Err(format!("eager op {j} before the graph is wrong").into());
            }
        }
        let cap = symm_cuda::streams::pooled(&env.cuda)?;
        cap.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        issue(&cap)?;
        let graph = cap
            .end_capture(CUgraphInstantiate_flags(0))?
            .ok_or("capture gave no graph")?;
        graph.upload()?;
        let zeros = vec![0u8; OPS * bytes];
        let mut outputs = pl.outputs;
        env.stream.synced_memcpy_htod(&zeros, &mut outputs)?;
        env.stream.synchronize()?;
        env.ready()?;
        let t0 = Instant::now();
        for _ in 0..100 {
            graph.launch()?;
        }
        cap.synchronize()?;
        let us = t0.elapsed().as_secs_f64() * 1e6 / (100 * OPS) as f64;
        c.check_error()?;
        let replayed = env.stream.synced_clone_dtoh(&outputs)?;
        if replayed != eager {
            return Err("graph replay results differ from eager".into());
        }
        notes.push(format!("graph 100 ops x 100 replays = eager ({us:.2} us/op)"));
        drop(graph);
    }

    // ---- a rank delayed 100 ms still completes; subset barriers.
    {
        env.progress("stress: delayed rank, barriers");
        let count = 1000;
        let pl = pool(&env, 1, 1, count, dtype, 4242)?;
        env.stream.synchronize()?;
        env.ctx.barrier("delay", T)?;
        if me == 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        for algo in [
            AllReduceKernel::Lamport,
            AllReduceKernel::OneShot,
            AllReduceKernel::TwoShot,
        ] {
            c.all_reduce_t(
                &env.stream,
                algo,
                DeviceOp {
                    input: pl.in_ptrs[0],
                    output: pl.out_base,
                    count,
                    dtype,
                    op: ReduceOp::Sum,
                },
            )?;
            env.stream.synchronize()?;
            if env.stream.synced_clone_dtoh(&pl.outputs)? != sum_ref(dtype, &pl.payloads[0]) {
                return Err(format!("{} with a delayed rank is wrong", algo.name()).into());
            }
        }
        let all: Vec<Rank> = (0..env.world())
            .map(|r| Rank::new(r, env.world()))
            .collect::<Result<_, _>>()?;
        let myself = [Rank::new(me, env.world())?];
        let t0 = Instant::now();
        for _ in 0..1000 {
            c.barrier(&env.stream, &all)?;
            c.barrier(&env.stream, &myself)?;
        }
        env.stream.synchronize()?;
        c.check_error()?;
        notes.push(format!(
            "delayed rank ok; 1000 barriers {:.2} us each (eager)",
            t0.elapsed().as_secs_f64() * 1e6 / 1000.0
        ));
    }
    Ok(format!("rank {me}: {}", notes.join(", ")))
}

fn stress(w: GpuWorld) {
    run_world("coll_stress_graph_delay", w, Duration::from_secs(900), |c| {
        body_stress(c, false)
    });
}
symm_testkit::gpu_world_tests!(coll_stress_graph_delay, stress);

/// The same suite with programmatic dependent launch (`CollectivesConfig::pdl`).
fn stress_pdl(w: GpuWorld) {
    run_world("coll_stress_graph_delay_pdl", w, Duration::from_secs(900), |c| {
        body_stress(c, true)
    });
}
symm_testkit::gpu_world_tests!(coll_stress_graph_delay_pdl, stress_pdl);

// ---------------------------------------------------------------- errors

fn body_errors(ctx: RankCtx) -> TestResult<String> {
    let env = Env::new(ctx)?;
    let me = env.rank();
    let dtype = DType::F32;
    let pl = pool(&env, 1, 2, 4096, dtype, 7)?;
    let (inp, out) = (pl.in_ptrs[0], pl.out_base);
    // A sum of `count` elements of this case's dtype.
    let sum = |input, output, count| DeviceOp {
        input,
        output,
        count,
        dtype,
        op: ReduceOp::Sum,
    };
    // ---- bad arguments: host-side errors, nothing launched.
    let c = env.collectives("coll-err", config(symm_cuda::collectives::DEFAULT_STAGING_BYTES))?;
    let s = &env.stream;
    let bad = [
        c.all_reduce_t(
            s,
            AllReduceKernel::OneShot,
            DeviceOp {
                input: inp + 2,
                output: out,
                count: 10,
                dtype,
                op: ReduceOp::Sum,
            },
        ),
        c.all_reduce_t(
            s,
            AllReduceKernel::OneShot,
            DeviceOp {
                input: inp,
                output: inp + 8,
                count: 100,
                dtype,
                op: ReduceOp::Sum,
            },
        ),
        c.all_reduce_t(
            s,
            AllReduceKernel::OneShot,
            DeviceOp {
                input: inp,
                output: out,
                count: 10,
                dtype: DType::F64,
                op: ReduceOp::Sum,
            },
        ),
        // In place (no overlap error first): one element past the 16 MiB Lamport buffers.
        c.all_reduce_t(s, AllReduceKernel::Lamport, sum(out, out, (4 << 20) + 1)),
        // The Lamport two-shot one vector a shard past two shards a slot (NOTE
        // [lamport-two-shot]).
        c.all_reduce_t(
            s,
            AllReduceKernel::LamportTwoShot,
            DeviceOp {
                input: out,
                output: out,
                count: symm_core::coll::geometry::lamport_two_shot_max_bytes(env.world(), c.lamport_max_bytes()) / 4
                    + 4 * env.world(),
                dtype,
                op: ReduceOp::Sum,
            },
        ),
        c.all_reduce_t(s, AllReduceKernel::CopyEnginePull, sum(inp, out, 10)),
        c.all_reduce_t(s, AllReduceKernel::Pull, sum(inp, out, 10)),
        c.all_gather_t(s, AllGatherKernel::Pull, DeviceOp::gather(inp, out, 10, dtype)),
        c.all_gather_t(s, AllGatherKernel::Ring, DeviceOp::gather(inp, inp + 4, 10, dtype)),
        c.barrier(s, &[Rank::new((me + 1) % env.world(), env.world())?]),
        // The copy-engine paths: unregistered buffers, and in place.
        c.reduce_scatter_t(s, ReduceScatterKernel::CopyEngine, sum(inp, out, 10)),
        c.all_reduce_t(s, AllReduceKernel::CopyEngineTwoShot, sum(inp, out, 10)),
        c.all_reduce_t(s, AllReduceKernel::CopyEngineTwoShot, sum(out, out, 10)),
    ];
    for (i, r) in bad.iter().enumerate() {
        if r.is_ok() {
            return Err(format!("bad argument case {i} was accepted").into());
        }
    }
    // ---- a peer that never arrives: timeout, not a hang (object with a 200 ms timeout).
    let short = env.collectives("coll-timeout", {
        let mut k = config(1 << 20);
        k.timeout = Duration::from_millis(200);
        k
    })?;
    env.ctx.barrier("timeout-start", T)?;
    if me == 0 {
        let t0 = Instant::now();
        // The first times out; with the timeout latched, the two-shot pushes its input, sends
        // no sums and ends (NOTE [latched-sends-nothing]), and the one-shot ring stops.
        for k in [
            AllReduceKernel::Lamport,
            AllReduceKernel::LamportTwoShot,
            AllReduceKernel::OneShot,
        ] {
            short.all_reduce_t(s, k, sum(inp, out, 1000))?;
        }
        let all = (0..env.world())
            .map(|r| Rank::new(r, env.world()))
            .collect::<Result<Vec<_>, _>>()?;
        short.barrier(s, &all)?;
        s.synchronize()?;
        let ms = t0.elapsed().as_millis();
        match short.check_error() {
            Err(Error::Timeout { .. }) => {}
            other => return Err(format!("a missing peer gave {other:?}").into()),
        }
        short.check_error()?;
        if ms > 5000 {
            return Err(format!("the timeouts took {ms} ms").into());
        }
    }
    env.ctx.barrier("timeout-end", T)?;
    // ---- abort: a wait on a peer that never comes ends at once with Aborted.
    let ab = env.collectives("coll-abort", config(1 << 20))?;
    env.ctx.barrier("abort-start", T)?;
    if me == 0 {
        ab.set_abort(true)?;
        ab.all_reduce_t(s, AllReduceKernel::OneShot, sum(inp, out, 1000))?;
        s.synchronize()?;
        ab.set_abort(false)?;
        match ab.check_error() {
            Err(Error::Aborted(_)) => {}
            other => return Err(format!("an aborted wait gave {other:?}").into()),
        }
    }
    env.ctx.barrier("abort-end", T)?;
    // ---- zero-copy inputs at different offsets on the two ranks: a mismatch error.
    let sym = env.symmetric(&c, 1 << 20)?;
    let base = sym.buffer_ptrs()[me];
    c.all_gather_t(
        s,
        AllGatherKernel::CopyEnginePull,
        DeviceOp::gather(base + (me as u64) * 4096, out, 100, dtype),
    )?;
    s.synchronize()?;
    match c.check_error() {
        Err(Error::Mismatch { .. }) => {}
        other => return Err(format!("mismatched zero-copy offsets gave {other:?}").into()),
    }
    c.check_error()?;
    // The fused pull checks the geometry the same way, and its closing barrier still completes.
    c.all_gather_t(
        s,
        AllGatherKernel::Pull,
        DeviceOp::gather(base + (me as u64) * 4096, out, 100, dtype),
    )?;
    s.synchronize()?;
    match c.check_error() {
        Err(Error::Mismatch { .. }) => {}
        other => return Err(format!("mismatched zero-copy offsets (pull) gave {other:?}").into()),
    }
    c.check_error()?;
    // The object still works afterwards (the barriers completed).
    c.all_reduce_t(s, AllReduceKernel::OneShot, sum(inp, out, 4096))?;
    s.synchronize()?;
    c.check_error()?;
    let got = s.synced_clone_dtoh(&pl.outputs)?;
    if got[..4096 * 4] != sum_ref(dtype, &pl.payloads[0])[..] {
        return Err("all-reduce after the mismatch is wrong".into());
    }
    Ok(format!(
        "rank {me}: bad arguments, timeout, abort and mismatch reported"
    ))
}

fn errors(w: GpuWorld) {
    run_world("coll_errors", w, Duration::from_secs(300), body_errors);
}
symm_testkit::gpu_world_tests!(coll_errors, errors);

/// Not a GPU test: the host-side helpers above agree with each other.
#[test]
fn helpers_round_trip() {
    for dtype in DTYPES {
        let v = gen_input(3, 1, 1000, dtype, false);
        assert_eq!(decode(dtype, &encode(dtype, &v)), v);
        let e = gen_input(3, 1, 1000, dtype, true);
        assert!(e.iter().all(|x| x.fract() == 0.0 && x.abs() <= 8.0));
        assert!(compare("x", dtype, &v, &v, true).is_ok());
        let mut w = v.clone();
        w[5] += 0.5;
        assert!(compare("x", dtype, &w, &v, false).is_err());
    }
    assert_eq!(reduce_ref(ReduceOp::Avg, &[1.0, 3.0]), 2.0);
    assert_eq!(reduce_ref(ReduceOp::Max, &[1.0, 3.0]), 3.0);
    assert_eq!(reduce_ref(ReduceOp::Min, &[1.0, -3.0]), -3.0);
    assert_ne!(fnv(b"ab"), fnv(b"ba"));
}
