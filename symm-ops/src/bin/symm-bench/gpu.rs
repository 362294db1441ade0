//! (This module holds raw device addresses of the benchmark's own arenas: its few `unsafe`
//! blocks copy into them and hand them to the ops, each with its reason.)
#![allow(unsafe_code)]
use crate::{epilogue, probe};

use super::*;
use std::marker::PhantomData;

use symm_ops::cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use symm_ops::cudarc::driver::{
    sys::CUdeviceptr, CudaContext, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};
use symm_ops::cudarc::nccl::{Comm, Id, NcclType, ReduceOp as NcclOp};
use symm_ops::symm_core::{get_allocator, DeviceType, Rank, SymmetricMemory};
use symm_ops::symm_cuda::collectives::{
    AllGatherKernel, AllReduceKernel, CollectivesConfig, CudaCollectives, DeviceOp, ReduceScatterKernel, Tuning,
};
use symm_ops::symm_cuda::driver::mem::unchecked::{dtod_async, dtoh_sync, htod_sync, memset_d32_async};
use symm_ops::symm_cuda::probe::Delay;
use symm_ops::{CommConfig, Communicator, RawDevicePtr};

/// Rotating inputs per point.
pub(super) const K: usize = 4;

/// Where NCCL's library may be, for a clear skip message (dlopen also searches the loader cache).
fn nccl_library() -> Result<PathBuf, String> {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/cuda/lib64",
        "/usr/local/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    for d in &dirs {
        for name in ["libnccl.so.2", "libnccl.so"] {
            let p = d.join(name);
            if p.exists() {
                return Ok(p);
            }
        }
    }
    Err(
        "libnccl.so.2 not found on LD_LIBRARY_PATH or in the system library folders (pip install \
         nvidia-nccl-cu13 and add site-packages/nvidia/nccl/lib to LD_LIBRARY_PATH)"
            .into(),
    )
}

/// A device address as a cudarc `DevicePtr` without event tracking (ordered by our stream).
struct RawDev<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}
impl<T> DeviceSlice<T> for RawDev<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}
impl<T> DevicePtr<T> for RawDev<T> {
    fn device_ptr<'a>(&'a self, _s: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
impl<T> DevicePtrMut<T> for RawDev<T> {
    fn device_ptr_mut<'a>(&'a mut self, _s: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

fn nccl_run<T: NcclType>(
    comm: &Comm,
    op: Op,
    redop: ReduceOp,
    input: u64,
    output: u64,
    g: &Geometry,
    stream: &Arc<CudaStream>,
) -> BoxResult<()> {
    let src = RawDev::<T> {
        ptr: input,
        len: g.in_elems,
        stream: stream.clone(),
        _t: PhantomData,
    };
    let mut dst = RawDev::<T> {
        ptr: output,
        len: g.out_elems,
        stream: stream.clone(),
        _t: PhantomData,
    };
    let nop = match redop {
        ReduceOp::Sum => NcclOp::Sum,
        ReduceOp::Avg => NcclOp::Avg,
        ReduceOp::Max => NcclOp::Max,
        ReduceOp::Min => NcclOp::Min,
    };
    let r = match op {
        Op::AllReduce => comm.all_reduce(&src, &mut dst, &nop).map(|_| ()),
        Op::ReduceScatter => comm.reduce_scatter(&src, &mut dst, &nop).map(|_| ()),
        Op::AllGather => comm.all_gather(&src, &mut dst).map(|_| ()),
    };
    r.map_err(|e| format!("nccl {}: {:?}", op.name(), e.0).into())
}

fn parse_bytes(v: &str) -> BoxResult<usize> {
    Ok(parse_size(v)?)
}

/// Tuning from an algorithm spec's parameters (the keys of `args::TUNING_KEYS`).
fn tuning_of(spec: &AlgoSpec, base: &Tuning) -> BoxResult<Tuning> {
    let mut t = *base;
    for (k, v) in &spec.params {
        match k.as_str() {
            "chunk" => t.max_chunk_bytes = parse_bytes(v)?,
            "minchunk" => t.min_chunk_bytes = parse_bytes(v)?,
            "chunks_per_block" => t.chunks_per_block = v.parse()?,
            "blocks" => t.max_blocks = Some(v.parse()?),
            "threads" => t.threads = v.parse()?,
            "ce_fraction" => t.ce_fraction = v.parse()?,
            "ce_chunk" => t.ce_chunk_bytes = parse_bytes(v)?,
            _ => return Err(format!("unknown parameter {k}").into()),
        }
    }
    t.validate()?;
    Ok(t)
}

pub(super) struct RankState {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) coll: CudaCollectives,
    pub(super) comm: Option<Communicator>,
    pub(super) comm_err: String,
    pub(super) nccl: Option<Comm>,
    pub(super) nccl_err: String,
    pub(super) all: Vec<Rank>,
    /// `--skew-us`: rank 0's delay kernel and its length.
    pub(super) delay: Option<(Delay, Duration)>,
    pub(super) start: CudaEvent,
    pub(super) end: CudaEvent,
}

pub fn run(args: Args, world: usize) -> BoxResult<()> {
    let nccl_note = if args.nccl {
        nccl_library().err()
    } else {
        Some("--no-nccl".into())
    };
    if let Some(n) = &nccl_note {
        eprintln!("NCCL rows skipped: {n}");
    }
    let plan = args.plan(|op| args.algos_for(op).len());
    let store: Arc<dyn Store> = HashStore::new(T_STORE);
    let run_id = format!("symm-bench/gpu/{}", std::process::id());
    let shared = Arc::new(Shared::new(store, world, args.clone(), run_id, plan));
    let nccl_ok = nccl_note.is_none();
    let (rows, setup) = launch(shared, move |rank, sh| rank_body(rank, sh, nccl_ok))?;
    let ctx0 = symm_ops::symm_cuda::driver::context(0).ok();
    let name = ctx0
        .as_ref()
        .and_then(|c| c.name().ok())
        .unwrap_or_else(|| "CUDA".into());
    // The collective kernels ran with programmatic dependent launch: asked (the default; SYMM_PDL=0 turns it off) and
    // supported, the same test CudaCollectives makes.
    let pdl_ran = symm_ops::symm_cuda::knobs::pdl()
        && ctx0.is_some_and(|c| symm_ops::symm_cuda::driver::supports_pdl(c.cu_device()).unwrap_or(false));
    let pdl = if pdl_ran { ", PDL" } else { "" };
    report(&format!("{world} x {name}{pdl}"), world, &args, &rows, &setup)
}

fn setup_costs(
    rank: usize,
    sh: &Shared,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
) -> BoxResult<Vec<SetupCost>> {
    let world = sh.world;
    let mut out = Vec::new();
    let mut measure = |what: &str, bytes: usize, f: &mut dyn FnMut(usize) -> BoxResult<()>| -> BoxResult<()> {
        let mut ms = Vec::new();
        for i in 0..3 {
            let t = Instant::now();
            f(i)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mine = median(&mut ms);
        let key = sh.next_key(rank, &format!("setup-{what}-{bytes}"));
        let all = gather_f64s(sh, rank, &key, &[mine])?;
        out.push(SetupCost {
            what: what.to_string(),
            bytes,
            median_ms: all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max),
        });
        Ok(())
    };
    for bytes in [MIB, 1024 * MIB] {
        measure("symmetric alloc + rendezvous", bytes, &mut |i| {
            let g = Group::new(
                format!("{}-alloc-{bytes}-{i}", sh.run_id),
                rank,
                world,
                sh.store.clone(),
            )?;
            let a = get_allocator(DeviceType::Cuda)?.alloc(bytes, Device::cuda(rank as u32), &g)?;
            let _m = a.rendezvous(T_STORE)?;
            Ok(())
        })?;
    }
    measure("CudaCollectives::new (10 MiB staging)", 10 * MIB, &mut |i| {
        let g = Group::new(format!("{}-coll-{i}", sh.run_id), rank, world, sh.store.clone())?;
        let _c = CudaCollectives::new(&g, ctx, 10 * MIB, T_STORE)?;
        Ok(())
    })?;
    measure("Communicator::with_stream (no NCCL)", 10 * MIB, &mut |i| {
        let g = Group::new(format!("{}-comm-{i}", sh.run_id), rank, world, sh.store.clone())?;
        let cfg = CommConfig::default().with_nccl(false);
        let _c = Communicator::with_stream(&g, stream.clone(), cfg)?;
        Ok(())
    })?;
    Ok(out)
}

fn rank_body(rank: usize, sh: &Shared, nccl_ok: bool) -> BoxResult<(Vec<Row>, Vec<SetupCost>)> {
    let args = &sh.args;
    let world = sh.world;
    let ctx = symm_ops::symm_cuda::driver::context(rank)?;
    let stream = ctx.new_stream()?;
    // Warm up the kernel cache and the driver before timing setup.
    let group = Group::new(format!("{}-main", sh.run_id), rank, world, sh.store.clone())?;
    let mut config = CollectivesConfig::new(args.staging, Duration::from_secs(60));
    config.timeout = Duration::from_secs(60);
    if let Some(b) = args.lamport_bytes {
        config.lamport_bytes = Some(b);
    }
    let coll = CudaCollectives::with_config(&group, &ctx, config)?;
    let setup = if args.setup {
        setup_costs(rank, sh, &ctx, &stream)?
    } else {
        Vec::new()
    };
    let wants_auto = args
        .ops
        .iter()
        .any(|&op| args.algos_for(op).iter().any(|a| a.base == "auto"));
    let (comm, comm_err) = if wants_auto {
        let g = Group::new(format!("{}-comm", sh.run_id), rank, world, sh.store.clone())?;
        let cfg = CommConfig::default()
            .with_staging_bytes(args.staging)
            .with_nccl(nccl_ok);
        match Communicator::with_stream(&g, stream.clone(), cfg) {
            Ok(c) => (Some(c), String::new()),
            Err(e) => (None, format!("communicator: {e}")),
        }
    } else {
        (None, String::new())
    };
    let wants_nccl = args
        .ops
        .iter()
        .any(|&op| args.algos_for(op).iter().any(|a| a.base == "nccl"));
    let (nccl, nccl_err) = if wants_nccl && nccl_ok {
        match make_nccl(rank, sh, &stream) {
            Ok(c) => (Some(c), String::new()),
            Err(e) => (None, format!("nccl: {e}")),
        }
    } else {
        (None, "nccl unavailable".to_string())
    };
    let all: Vec<Rank> = (0..world).map(|r| Rank::new(r, world)).collect::<Result<_, _>>()?;
    let delay = if args.skew_us > 0 && rank == 0 {
        Some((Delay::new(&ctx)?, Duration::from_micros(args.skew_us)))
    } else {
        None
    };
    let st = RankState {
        rank,
        world,
        start: ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        end: ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        ctx,
        stream,
        coll,
        comm,
        comm_err,
        nccl,
        nccl_err,
        all,
        delay,
    };
    let mut rows = Vec::new();
    if args.probe {
        probe::probes(sh, &st)?;
        return Ok((rows, setup));
    }
    if args.probe_bw {
        probe::bandwidth_probes(sh, &st)?;
        return Ok((rows, setup));
    }
    if args.epilogue {
        epilogue::run(sh, &st, nccl_ok)?;
    }
    let mut disabled: Vec<(Op, String)> = Vec::new();
    'ops: for &op in &args.ops {
        for &size in &args.sizes {
            if !point(sh, &st, op, size, &mut rows, &mut disabled)? {
                eprintln!("\nrank {rank}: a collective failed with a timeout or abort: stopping the benchmark");
                break 'ops;
            }
        }
    }
    drop(st);
    Ok((rows, setup))
}

fn make_nccl(rank: usize, sh: &Shared, stream: &Arc<CudaStream>) -> BoxResult<Comm> {
    let ex = StoreExchange::new(sh.store.clone(), format!("{}/nccl-id", sh.run_id));
    let id_bytes: Vec<u8> = if rank == 0 {
        let id = catch_unwind(Id::new).map_err(|_| "loading libnccl failed")?;
        let id = id.map_err(|e| format!("ncclGetUniqueId: {:?}", e.0))?;
        id.internal().iter().map(|&c| c as u8).collect()
    } else {
        Vec::new()
    };
    let bytes = ex.broadcast(rank, sh.world, 0, &id_bytes, T_STORE)?;
    let mut internal = [0 as std::ffi::c_char; 128];
    for (d, s) in internal.iter_mut().zip(bytes.iter()) {
        *d = *s as std::ffi::c_char;
    }
    let c = catch_unwind(AssertUnwindSafe(|| {
        Comm::from_rank(stream.clone(), rank, sh.world, Id::uninit(internal))
    }))
    .map_err(|_| "loading libnccl failed")?;
    c.map_err(|e| format!("ncclCommInitRank: {:?}", e.0).into())
}

/// Buffers of one (op, size) point, in one symmetric arena registered with the collectives.
struct Arena {
    _mem: Arc<dyn SymmetricMemory>,
    base: u64,
    inputs: Vec<u64>,
    output: u64,
    _staged_input: Option<symm_ops::cudarc::driver::CudaSlice<u8>>,
    staged_ptr: u64,
}

fn arena(st: &RankState, g: &Geometry, dtype: DType, need_staged: bool, group: &Arc<Group>) -> BoxResult<Arena> {
    let es = dtype.size();
    let round = |b: usize| b.div_ceil(4096) * 4096;
    let in_b = round(g.in_elems * es);
    let out_b = round(g.out_elems * es);
    let total = K * in_b + out_b;
    let a = get_allocator(DeviceType::Cuda)?.alloc(total, Device::cuda(st.rank as u32), group)?;
    let m = a.rendezvous(T_STORE)?;
    st.coll.register_symmetric(m.clone())?;
    if let Some(c) = &st.comm {
        // auto goes through the Communicator: its zero-copy paths need the arena too.
        c.register_memory(m.clone())?;
    }
    let base = m.buffer_ptrs()[st.rank];
    let inputs: Vec<u64> = (0..K).map(|k| base + (k * in_b) as u64).collect();
    let output = base + (K * in_b) as u64;
    // Input 0 holds this rank's values; the other rotating inputs are copies.
    let data = encode(dtype, g.in_elems, |j| value(st.rank, j));
    // SAFETY: the inputs are disjoint ranges of `in_b >= g.in_elems * es` bytes in this rank's
    // arena `m`, which outlives every op of this size (the stream is synchronised before it goes).
    unsafe { htod_sync(&st.stream, inputs[0], &data)? };
    for &p in &inputs[1..] {
        // SAFETY: as above.
        unsafe { dtod_async(&st.stream, p, inputs[0], g.in_elems * es)? };
    }
    let (staged_input, staged_ptr) = if need_staged {
        let s = st.stream.clone_htod(&data)?;
        let p = {
            let (p, _g) = s.device_ptr(&st.stream);
            p
        };
        (Some(s), p)
    } else {
        (None, 0)
    };
    st.stream.synchronize()?;
    Ok(Arena {
        _mem: m,
        base,
        inputs,
        output,
        _staged_input: staged_input,
        staged_ptr,
    })
}

/// One run of algorithm `spec` on rotating input `k`.
#[allow(clippy::too_many_arguments)]
fn run_once(
    sh: &Shared,
    st: &RankState,
    op: Op,
    spec: &AlgoSpec,
    tuning: &Tuning,
    g: &Geometry,
    ar: &Arena,
    k: usize,
) -> BoxResult<()> {
    let (dtype, redop) = (sh.args.dtype, sh.args.redop);
    let s = &st.stream;
    let input = ar.inputs[k % K];
    let out = ar.output;
    if let Some((d, t)) = &st.delay {
        d.launch(s, *t)?;
    }
    // SAFETY: the explicit kernels and the raw pointers below get `input`, `out` and
    // `ar.staged_ptr`: ranges of this rank's arena (or its staged cudarc copy) sized for this
    // geometry (`Arena::new`), alive until the stream is synchronised after the timing.
    unsafe {
        match (op, spec.base.as_str()) {
            (_, "nccl") => {
                let c = st.nccl.as_ref().ok_or_else(|| st.nccl_err.clone())?;
                match dtype {
                    DType::F32 => nccl_run::<f32>(c, op, redop, input, out, g, s),
                    DType::F16 => nccl_run::<half::f16>(c, op, redop, input, out, g, s),
                    _ => nccl_run::<half::bf16>(c, op, redop, input, out, g, s),
                }
            }
            (_, "auto") => {
                let c = st.comm.as_ref().ok_or_else(|| st.comm_err.clone())?;
                // (Inside the block's contract above: the same ranges.)
                let (i, o) = (
                    RawDevicePtr::new(input, g.in_elems, dtype),
                    RawDevicePtr::new(out, g.out_elems, dtype),
                );
                Ok(match op {
                    Op::AllReduce => c.all_reduce_out(i, o, redop),
                    Op::ReduceScatter => c.reduce_scatter_out(i, o, redop),
                    Op::AllGather => c.all_gather_out(i, o),
                }?)
            }
            (Op::AllReduce, base) => {
                let kernel = match base {
                    "lamport" => AllReduceKernel::Lamport,
                    "lamport_two_shot" => AllReduceKernel::LamportTwoShot,
                    "one_shot" => AllReduceKernel::OneShot,
                    "two_shot" => AllReduceKernel::TwoShot,
                    // The zero-copy pull the planner runs at this world size (both buffers are
                    // in the registered arena): one-shot at two ranks, two-shot from three.
                    "pull" if st.world >= 3 => AllReduceKernel::PullTwoShot,
                    "pull" => AllReduceKernel::Pull,
                    "ce_two_shot" => AllReduceKernel::CopyEngineTwoShot,
                    _ => AllReduceKernel::CopyEnginePull,
                };
                Ok(st.coll.all_reduce_tuned(
                    s,
                    kernel,
                    tuning,
                    DeviceOp {
                        input,
                        output: out,
                        count: g.count,
                        dtype,
                        op: redop,
                    },
                )?)
            }
            (Op::ReduceScatter, base) => {
                let kernel = match base {
                    "lamport" => ReduceScatterKernel::Lamport,
                    "pull" => ReduceScatterKernel::Pull,
                    "copy_engine" => ReduceScatterKernel::CopyEngine,
                    _ => ReduceScatterKernel::Ring,
                };
                Ok(st.coll.reduce_scatter_tuned(
                    s,
                    kernel,
                    tuning,
                    DeviceOp {
                        input,
                        output: out,
                        count: g.count,
                        dtype,
                        op: redop,
                    },
                )?)
            }
            (Op::AllGather, base) => {
                // The arena's output is registered: the copy engine pushes into it.
                let (kernel, inp) = match base {
                    "copy_engine" => (AllGatherKernel::CopyEnginePush, input),
                    "pull" => (AllGatherKernel::Pull, input),
                    "copy_engine_staged" => (AllGatherKernel::CopyEngineStaged, ar.staged_ptr),
                    "lamport" => (AllGatherKernel::Lamport, input),
                    _ => (AllGatherKernel::Ring, input),
                };
                Ok(st
                    .coll
                    .all_gather_tuned(s, kernel, tuning, DeviceOp::gather(inp, out, g.count, dtype))?)
            }
        }
    }
}

/// Measures every algorithm of `op` at `size`; false when the ranks must stop (a timeout or
/// abort leaves the collectives' protocol state out of step). An algorithm that gave a wrong
/// result is disabled for the rest of the run (`disabled`), the others go on. Every rank takes
/// the same decisions (they are gathered).
fn point(
    sh: &Shared,
    st: &RankState,
    op: Op,
    size: usize,
    rows: &mut Vec<Row>,
    disabled: &mut Vec<(Op, String)>,
) -> BoxResult<bool> {
    let args = &sh.args;
    let dtype = args.dtype;
    let g = geometry(op, size, dtype, st.world);
    let specs: Vec<AlgoSpec> = args
        .algos_for(op)
        .into_iter()
        .filter(|s| !disabled.iter().any(|(o, l)| *o == op && *l == s.label))
        // The Lamport buffers bound its message (per peer: one rank's input for all-gather,
        // one shard for reduce-scatter): larger sizes have no Lamport row.
        .filter(|s| s.base != "lamport" || g.count * dtype.size() <= st.coll.lamport_max_bytes())
        // The Lamport two-shot: two shards of the message per slot, from two ranks on.
        .filter(|s| {
            s.base != "lamport_two_shot"
                || g.count * dtype.size()
                    <= symm_core::coll::geometry::lamport_two_shot_max_bytes(st.world, st.coll.lamport_max_bytes())
        })
        // The copy-engine two-shot all-reduce and the copy-engine reduce-scatter are two-rank
        // kernels (refused at other world sizes).
        .filter(|s| {
            let two_rank = s.base == "ce_two_shot" || (op == Op::ReduceScatter && s.base == "copy_engine");
            !two_rank || st.world == 2
        })
        .collect();
    let need_staged = specs.iter().any(|s| s.base == "copy_engine_staged");
    let ar = arena(st, &g, dtype, need_staged, st.coll.group())?;
    let iters = args.iters_for(g.bytes);
    for spec in &specs {
        sh.progress(
            st.rank,
            op,
            size,
            &format!("{} {} {}", op.name(), fmt_size(g.bytes), spec.label),
        );
        let tuning = tuning_of(spec, &st.coll.config().tuning)?;
        let path = path_of(st, op, spec, &g, dtype, &tuning);
        // ---- correctness first: poisoned output, one op, float64 reference.
        let key = sh.next_key(st.rank, "check");
        let checked: BoxResult<f64> = (|| {
            // SAFETY: `ar.output` is the arena's output range of at least `g.out_elems` elements.
            unsafe { memset_d32_async(&st.stream, ar.output, 0xFFFF_FFFF, g.out_elems * dtype.size() / 4)? };
            run_once(sh, st, op, spec, &tuning, &g, &ar, 0)?;
            st.stream.synchronize()?;
            st.coll.check_error()?;
            if let Some(c) = &st.comm {
                c.check_error()?;
            }
            let mut host = vec![0u8; g.out_elems * dtype.size()];
            // SAFETY: as above; `host` is `g.out_elems` elements long.
            unsafe { dtoh_sync(&st.stream, &mut host, ar.output)? };
            Ok(max_error(op, args.redop, dtype, &g, st.rank, st.world, &host))
        })();
        // 0: ok; 1: wrong result or a host-side error; 2: a device wait timed out or aborted.
        let (err, mut note, code) = match checked {
            Ok(e) => (e, String::new(), if e <= tolerance(dtype) { 0.0 } else { 1.0 }),
            Err(e) => {
                let fatal = e.downcast_ref::<symm_ops::symm_core::Error>().is_some_and(|x| {
                    matches!(
                        x,
                        symm_ops::symm_core::Error::Timeout { .. } | symm_ops::symm_core::Error::Aborted(_)
                    )
                });
                (f64::INFINITY, e.to_string(), if fatal { 2.0 } else { 1.0 })
            }
        };
        let ok_here = code == 0.0;
        // Every rank must agree before timing (a failed rank would leave its peers waiting).
        let agree = gather_f64s(sh, st.rank, &key, &[code])?;
        let worst = agree.iter().filter_map(|v| v.first().copied()).fold(0.0f64, f64::max);
        let all_ok = worst == 0.0;
        if !all_ok && note.is_empty() {
            note = if ok_here {
                "another rank failed the check".into()
            } else {
                format!("max error {err:.3e} above {:.1e}", tolerance(dtype))
            };
        }
        for &mode in &args.modes {
            let time = if all_ok {
                match time_mode(sh, st, op, spec, &tuning, &g, &ar, mode, iters) {
                    Ok(t) => t,
                    Err(e) => {
                        note = format!("{} timing failed: {e}", mode.name());
                        f64::NAN
                    }
                }
            } else {
                f64::NAN
            };
            let key = sh.next_key(st.rank, "row");
            let ok = all_ok && time.is_finite();
            rows.push(combine(
                sh,
                st.rank,
                &key,
                op,
                &g,
                &spec.label,
                &path,
                mode,
                time,
                err,
                ok,
                &note,
            )?);
        }
        if !all_ok {
            eprintln!(
                "\nrank {}: {} {} {} failed ({note}); {} disabled for the rest of the run",
                st.rank,
                op.name(),
                fmt_size(g.bytes),
                spec.label,
                spec.label
            );
            disabled.push((op, spec.label.clone()));
            if worst >= 2.0 {
                return Ok(false);
            }
        }
    }
    let base = ar.base;
    drop(ar);
    st.coll.unregister_symmetric(base);
    if let Some(c) = &st.comm {
        c.unregister_memory(base);
    }
    Ok(true)
}

/// The plan an `auto` row runs (the planner's, for the arena's registered buffers).
fn path_of(st: &RankState, op: Op, spec: &AlgoSpec, g: &Geometry, dtype: DType, tuning: &Tuning) -> String {
    if let ("auto", Some(c)) = (spec.base.as_str(), st.comm.as_ref()) {
        return match op {
            Op::AllReduce => c.plan_all_reduce(g.bytes, true).to_string(),
            Op::ReduceScatter => c.plan_reduce_scatter(g.bytes, true).to_string(),
            Op::AllGather => c.plan_all_gather(g.bytes, dtype, true).to_string(),
        };
    }
    match (op, spec.base.as_str()) {
        (Op::AllReduce, "copy_engine") => format!("{:.0}% by copy engine", tuning.ce_fraction * 100.0),
        _ => String::new(),
    }
}

/// Median microseconds per op of `iters` back-to-back ops (rotating inputs), over the rounds.
#[allow(clippy::too_many_arguments)]
fn time_mode(
    sh: &Shared,
    st: &RankState,
    op: Op,
    spec: &AlgoSpec,
    tuning: &Tuning,
    g: &Geometry,
    ar: &Arena,
    mode: Mode,
    iters: usize,
) -> BoxResult<f64> {
    let mut times = time_rounds(st, mode, iters, sh.args.rounds, &mut |i| {
        run_once(sh, st, op, spec, tuning, g, ar, i)
    })?;
    st.coll.check_error()?;
    Ok(median(&mut times))
}

/// Microseconds per launch of `iters` back-to-back calls of `launch(i)` on the rank's
/// stream, one value per round (after one round of warm-up): a host loop (eager) or one
/// captured CUDA graph replayed (graph). The ranks meet in a barrier before every round.
pub(super) fn time_rounds(
    st: &RankState,
    mode: Mode,
    iters: usize,
    rounds: usize,
    launch: &mut dyn FnMut(usize) -> BoxResult<()>,
) -> BoxResult<Vec<f64>> {
    let s = &st.stream;
    let mut times = Vec::with_capacity(rounds);
    let mut timed = |run: &mut dyn FnMut() -> BoxResult<()>| -> BoxResult<()> {
        for round in 0..=rounds {
            st.coll.barrier(s, &st.all)?;
            st.start.record(s)?;
            run()?;
            st.end.record(s)?;
            let ms = st.start.elapsed_ms(&st.end)?;
            if round > 0 {
                times.push(ms as f64 * 1e3 / iters as f64);
            }
        }
        Ok(())
    };
    match mode {
        Mode::Eager => timed(&mut || (0..iters).try_for_each(&mut *launch))?,
        Mode::Graph => {
            s.synchronize()?;
            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let captured = (0..iters).try_for_each(&mut *launch);
            let graph = s.end_capture(CUgraphInstantiate_flags(0));
            captured?;
            let graph = graph?.ok_or("stream capture gave no graph")?;
            graph.upload()?;
            timed(&mut || Ok(graph.launch()?))?;
            s.synchronize()?;
        }
    }
    let _ = &st.ctx;
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key the parser accepts sets its own field of the tuning.
    #[test]
    fn every_tuning_key_sets_a_field() {
        let base = Tuning::default();
        let value = |k: &str| match k {
            "ce_fraction" => "0.5",
            "threads" => "256",
            "blocks" | "chunks_per_block" => "3",
            _ => "64K",
        };
        let mut changed = Vec::new();
        for k in TUNING_KEYS {
            let spec = AlgoSpec::parse(&format!("one_shot:{k}={}", value(k))).unwrap();
            let t = tuning_of(&spec, &base).unwrap();
            assert_ne!(t, base, "{k} changed nothing");
            changed.push(t);
        }
        for (i, a) in changed.iter().enumerate() {
            assert!(changed[i + 1..].iter().all(|b| b != a), "two keys set the same field");
        }
    }
}
