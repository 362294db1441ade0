//! CUDA collectives over symmetric memory: all-reduce (Lamport one-shot, one-shot push, two-shot,
//! copy-engine pull), reduce-scatter, all-gather (SM push or copy engine) and a barrier over a
//! subset of ranks.
//!
//! A [`CudaCollectives`] belongs to one (group, device). At setup it allocates ONE symmetric
//! workspace (layout in [`layout`]) through the registered CUDA allocator, fills it and
//! rendezvouses; after that an op allocates nothing, talks to no store, never synchronises the
//! host, and only enqueues work on the caller's stream, so ops can be captured in CUDA graphs.
//! Epochs live in the workspace and are advanced by the kernels (NOTE [collectives-protocols] in
//! `kernels/collectives.cu`).
//!
//! Rules for callers:
//! - every rank of the group calls the same ops, in the same order, with the same count, dtype,
//!   algorithm and tuning (the chunk plan depends on them); ops of one object are ordered (one
//!   stream at a time, or streams ordered by events);
//! - inputs and outputs are device addresses in this device's context, aligned to the element
//!   size; the push algorithms (everything but the copy-engine paths) read the input only
//!   locally, so any device memory works and may be reused once the op's stream work is done;
//! - a device wait that times out or is aborted latches an error: [`CudaCollectives::check_error`]
//!   (after synchronising the stream) returns it; after an error the object should be dropped.

#![forbid(unsafe_code)]

mod agree;
pub mod args;
mod epilogue;
pub mod layout;
pub mod plan;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig};
use symm_core::{
    get_allocator, Allocation, DType, Device, DeviceType, Error, Group, OpKind, Rank, ReduceOp, Result, SymmetricMemory,
};

use crate::driver::launch::{launch, launch_with, KernelArg, Launch};
use crate::driver::mem::{dtod_async, dtoh_sync, memset_d32_async};
use crate::driver::{self, bind, from_driver};
use crate::{kernels, knobs};

pub use epilogue::{epilogue_threads, Epilogue, Epilogues};
pub use layout::WorkspaceLayout;
pub use plan::{AllGatherPath, AllReduceAlgo, GridBudget, ReduceScatterAlgo, RingMode, Selection, Tuning};

use agree::{checked, header, Mechanism};
use args::OpHeader;
use layout::{peer_index, MAX_WORLD, MISMATCH_WORDS, ST_ERR_OUT, ST_MISMATCH};
use plan::{ce_rs_chunks, ce_split, kernel_dtype, kernel_op, lamport_plan, ring_plan, two_shot_shard, RingPlan};
use symm_core::pad::{ERR_MISMATCH, ERR_OP_MISMATCH, ERR_PEER_REJECTED};

/// Default staging (ring) bytes.
pub const DEFAULT_STAGING_BYTES: usize = 10 << 20;
/// Default largest Lamport message for two ranks (smaller for more ranks: 16 MiB / (world-1)).
/// The workspace holds three such buffers (48 MiB per rank for two ranks): 2 x H200 measured the
/// pipelined Lamport kernel ahead of the zero-copy pull up to 16 MiB all-reduce and 32 MiB
/// reduce-scatter / all-gather (bench-notes.md, round 5).
pub const DEFAULT_LAMPORT_BYTES: usize = 16 << 20;
/// Default ring slots per peer.
pub const DEFAULT_RING_SLOTS: usize = 64;
/// Copy-engine all-reduce scratch slots (events per kind).
const CE_EVENTS: usize = 16;

/// Setup parameters of a [`CudaCollectives`]; every rank must pass equal values.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectivesConfig {
    /// Bytes of the ring / staging area (split over the peers).
    pub staging_bytes: usize,
    /// Largest Lamport message in bytes (`None`: [`DEFAULT_LAMPORT_BYTES`] for two ranks,
    /// 16 MiB / (world - 1) above; `Some(0)` disables Lamport).
    pub lamport_bytes: Option<usize>,
    /// Ring slots per peer (a power of two).
    pub ring_slots: usize,
    /// Bound of every device wait.
    pub timeout: Duration,
    /// Launch shapes (defaults for H100/H200).
    pub tuning: Tuning,
    /// Thresholds of [`AllReduceAlgo::Auto`].
    pub selection: Selection,
    /// Launch the collective kernels with programmatic dependent launch (NOTE [pdl] in
    /// `kernels/common.cuh`): a kernel may be scheduled while the kernel ahead of it on the
    /// stream is still running, and waits on the device for it, which hides most of the launch
    /// latency of back-to-back kernels. Applies on compute capability 9.0 or newer only.
    /// Default: `SYMM_PDL=1` in the environment ([`knobs::pdl`]); off otherwise until it is
    /// measured on two GPUs (symm-ops/bench-notes.md, round 6).
    pub pdl: bool,
}

impl CollectivesConfig {
    pub fn new(staging_bytes: usize, timeout: Duration) -> Self {
        CollectivesConfig {
            staging_bytes,
            lamport_bytes: None,
            ring_slots: DEFAULT_RING_SLOTS,
            timeout,
            tuning: Tuning::default(),
            selection: Selection::default(),
            pdl: knobs::pdl(),
        }
    }

    fn lamport_bytes_for(&self, world: usize) -> usize {
        match self.lamport_bytes {
            Some(b) => b,
            None if world <= 2 => DEFAULT_LAMPORT_BYTES,
            None => (16 << 20) / (world - 1),
        }
    }
}

/// The kernels, loaded once per object (the module is cached per context by `kernels::load`).
struct Fns {
    lamport: [CudaFunction; 3],
    /// Two-rank Lamport entries per dtype: all-reduce sum/avg/max/min, reduce-scatter
    /// sum/avg/max/min, all-gather (`lamport2_index`).
    lamport2: [Vec<CudaFunction>; 3],
    ring: [CudaFunction; 3],
    reduce_ptrs: [CudaFunction; 3],
    pull: [CudaFunction; 3],
    /// Two-rank pull entries per dtype, in `lamport2_index` order.
    pull2: [Vec<CudaFunction>; 3],
    /// The Lamport one-shot with the residual / RMSNorm epilogue, per dtype.
    lamport_epi: [CudaFunction; 3],
    barrier: CudaFunction,
    reject: CudaFunction,
    take_error: CudaFunction,
}

/// The side stream and events of the copy-engine paths.
struct CeState {
    /// The copy streams: the second one pushes while the first pulls (the copy-engine two-shot
    /// all-reduce). `None` on a device shared by ranks: the copies run on the op's own stream
    /// there (NOTE [stream-budget]).
    sides: Option<(Arc<CudaStream>, Arc<CudaStream>)>,
    fork: CudaEvent,
    join: CudaEvent,
    copied: Vec<CudaEvent>,
    reduced: Vec<CudaEvent>,
}

impl CeState {
    /// The stream the copies of an op on `op` run on.
    fn side<'a>(&'a self, op: &'a CudaStream) -> &'a CudaStream {
        self.sides.as_ref().map_or(op, |s| &*s.0)
    }
    /// The stream the pushes of an op on `op` run on.
    fn side2<'a>(&'a self, op: &'a CudaStream) -> &'a CudaStream {
        self.sides.as_ref().map_or(op, |s| &*s.1)
    }
}

/// One copy-engine pull-and-reduce ([`CudaCollectives::ce_pull_reduce`]), device addresses.
struct CePull {
    /// This rank's own contribution (`count` elements).
    own: u64,
    /// Where the peer's data lands and the result is reduced in place.
    out: u64,
    /// The peer's data.
    remote: u64,
    count: usize,
    /// The peer's output for this range: push each reduced chunk there.
    push_to: Option<u64>,
}

/// A symmetric allocation registered for zero-copy (copy-engine) paths.
struct Registered {
    mem: Arc<dyn SymmetricMemory>,
    base: u64,
    size: usize,
}

/// Where a zero-copy input lies: every rank's address of it (the first `world` entries), and its
/// offset in the allocation. A fixed array, so an op's launch path allocates nothing.
struct SymInput {
    ptrs: [u64; MAX_WORLD],
    offset: usize,
    alloc_size: usize,
}

/// Per (group, device) collectives over one symmetric workspace.
pub struct CudaCollectives {
    group: Arc<Group>,
    ctx: Arc<CudaContext>,
    mem: Arc<dyn SymmetricMemory>,
    _alloc: Arc<dyn Allocation>,
    layout: WorkspaceLayout,
    config: CollectivesConfig,
    rank: usize,
    world: usize,
    sm_count: u32,
    /// Most blocks of one grid (NOTE [co-residency]).
    grid: GridBudget,
    /// How the collective kernels are launched ([`CollectivesConfig::pdl`] where the device
    /// supports it).
    how: Launch,
    fns: Fns,
    ws: u64,
    /// Every rank's workspace base and pad, passed to the Lamport and pull kernels by value.
    direct: args::Direct,
    bufs_dev: u64,
    pads_dev: u64,
    abort_host: u64,
    err_word: u64,
    timeout_ns: u64,
    control: Arc<CudaStream>,
    ce: Mutex<CeState>,
    registered: RwLock<Vec<Registered>>,
    epilogues: Epilogues,
}

impl std::fmt::Debug for CudaCollectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCollectives")
            .field("group", &self.group.name())
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("layout", &self.layout)
            .finish()
    }
}

/// A checked reduce-scatter / all-gather: `part` holds `count` elements, `whole` holds `count *
/// world`; `own` is this rank's shard of the whole, `whole_bytes` the whole's size.
struct ShardGeometry {
    own: u64,
    whole_bytes: usize,
}

/// Checks the buffers of a reduce-scatter (`whole` = input, `part` = output) or an all-gather
/// (`part` = input, `whole` = output): aligned, sizes that do not overflow, and the part either
/// this rank's shard of the whole (in place) or apart from it.
fn shard_geometry(
    op: &'static str,
    (whole_name, whole): (&'static str, u64),
    (part_name, part): (&'static str, u64),
    count: usize,
    dtype: DType,
    (rank, world): (usize, usize),
) -> Result<ShardGeometry> {
    check_ptr(whole_name, whole, dtype)?;
    check_ptr(part_name, part, dtype)?;
    let bytes = byte_len(count, dtype)?;
    let total = count
        .checked_mul(world)
        .ok_or_else(|| Error::InvalidArgument(format!("{op} count overflows")))?;
    let whole_bytes = byte_len(total, dtype)?;
    let own = whole + (rank * bytes) as u64;
    if part != own && ranges_overlap(whole, whole_bytes, part, bytes) {
        return Err(Error::InvalidArgument(format!(
            "{part_name} overlaps the {whole_name} other than at this rank's shard"
        )));
    }
    Ok(ShardGeometry { own, whole_bytes })
}

fn ranges_overlap(a: u64, a_len: usize, b: u64, b_len: usize) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len as u64) && b < a.saturating_add(a_len as u64)
}

fn byte_len(count: usize, dtype: DType) -> Result<usize> {
    count
        .checked_mul(dtype.size())
        .ok_or_else(|| Error::InvalidArgument(format!("{count} elements of {dtype} overflow")))
}

fn check_ptr(what: &'static str, ptr: u64, dtype: DType) -> Result<()> {
    if ptr == 0 {
        return Err(Error::InvalidArgument(format!("{what} is a null device address")));
    }
    if ptr % dtype.size() as u64 != 0 {
        return Err(Error::Misaligned {
            what,
            value: ptr,
            align: dtype.size() as u64,
        });
    }
    Ok(())
}

/// The two-rank entries `symm_{kind}_...` (`lamport2`, `pull2`) of dtype suffix `dt`, in
/// `lamport2_index` order.
fn two_rank_names(kind: &str, dt: &str) -> Vec<String> {
    let mut v = Vec::with_capacity(9);
    for mode in ["ar", "rs"] {
        for op in ["sum", "avg", "max", "min"] {
            v.push(format!("symm_{kind}_{mode}_{op}_{dt}"));
        }
    }
    v.push(format!("symm_{kind}_ag_{dt}"));
    v
}

/// Index of the two-rank Lamport / pull entry for (mode, kernel op).
fn lamport2_index(mode: RingMode, op: u32) -> usize {
    match mode {
        RingMode::AllReduce => op as usize,
        RingMode::ReduceScatter => 4 + op as usize,
        RingMode::AllGather => 8,
    }
}

fn cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaCollectives {
    /// Collective setup with the default configuration and `staging_bytes` of staging.
    pub fn new(group: &Arc<Group>, ctx: &Arc<CudaContext>, staging_bytes: usize, timeout: Duration) -> Result<Self> {
        Self::with_config(group, ctx, CollectivesConfig::new(staging_bytes, timeout))
    }

    /// Collective setup: lays out, allocates, fills and rendezvouses the workspace, loads the
    /// kernels. Every rank of `group` calls it with equal `config`.
    pub fn with_config(group: &Arc<Group>, ctx: &Arc<CudaContext>, config: CollectivesConfig) -> Result<Self> {
        let world = group.world_size();
        let rank = group.rank().get();
        if world > MAX_WORLD {
            return Err(Error::OutOfRange {
                what: "world size for the CUDA collectives",
                value: world as u64,
                limit: MAX_WORLD as u64,
            });
        }
        config.tuning.validate()?;
        let layout = WorkspaceLayout::new(
            world,
            config.staging_bytes,
            config.lamport_bytes_for(world),
            config.ring_slots,
        )?;
        bind(ctx)?;
        let sm_count = driver::attribute(
            ctx.cu_device(),
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        let sm_count = u32::try_from(sm_count).unwrap_or(1).max(1);
        let how = Launch {
            pdl: config.pdl && driver::supports_pdl(ctx.cu_device())?,
        };

        let module = kernels::load(ctx, kernels::source("collectives")?, "")?;
        let get = |name: &str| driver::load_function(&module, name);
        let dts = ["f32", "f16", "bf16"];
        let two_rank = |kind: &str| -> Result<[Vec<CudaFunction>; 3]> {
            let load = |dt: &str| {
                two_rank_names(kind, dt)
                    .iter()
                    .map(|n| get(n))
                    .collect::<Result<Vec<_>>>()
            };
            Ok([load(dts[0])?, load(dts[1])?, load(dts[2])?])
        };
        let fns = Fns {
            lamport: [
                get(&format!("symm_lamport_{}", dts[0]))?,
                get(&format!("symm_lamport_{}", dts[1]))?,
                get(&format!("symm_lamport_{}", dts[2]))?,
            ],
            lamport2: two_rank("lamport2")?,
            ring: [get("symm_ring_f32")?, get("symm_ring_f16")?, get("symm_ring_bf16")?],
            reduce_ptrs: [
                get("symm_reduce_ptrs_f32")?,
                get("symm_reduce_ptrs_f16")?,
                get("symm_reduce_ptrs_bf16")?,
            ],
            pull: [get("symm_pull_f32")?, get("symm_pull_f16")?, get("symm_pull_bf16")?],
            pull2: two_rank("pull2")?,
            lamport_epi: [
                get("symm_lamport_add_rms_f32")?,
                get("symm_lamport_add_rms_f16")?,
                get("symm_lamport_add_rms_bf16")?,
            ],
            barrier: get("symm_coll_barrier")?,
            reject: get("symm_coll_reject")?,
            take_error: get("symm_coll_take_error")?,
        };
        let init = get("symm_coll_init")?;

        let device = Device::new(DeviceType::Cuda, ctx.ordinal() as u32);
        let alloc = get_allocator(DeviceType::Cuda)?.alloc(layout.total, device, group)?;
        if alloc.size() < layout.total {
            return Err(Error::Mismatch {
                what: "workspace size",
                detail: format!("asked {} bytes, got {}", layout.total, alloc.size()),
            });
        }
        let control = crate::streams::control(ctx)?;
        // Fill STATE/FLAGS with zeros and the Lamport buffers with the sentinel, and wait for it,
        // before this rank publishes its handle in the rendezvous: no peer can write here earlier.
        let ws_local = alloc.ptr();
        launch(&control, &init, cfg(sm_count, 256), &args::init(ws_local, &layout))?;
        crate::streams::wait_idle(
            &control,
            crate::streams::HOST_COPY_TIMEOUT,
            "initialising the workspace",
        )?;
        let mem = alloc.rendezvous(config.timeout)?;
        let cuda = crate::as_cuda(mem.as_ref())
            .ok_or_else(|| Error::InvalidArgument("the CUDA allocator returned a non-CUDA symmetric memory".into()))?;
        let abort_host = cuda.abort_word_ptr();
        let err_word = cuda.error_word_ptr();
        let grid = GridBudget::new(sm_count, cuda.device_sharers(), how.pdl)?;
        let ws = mem.buffer_ptrs()[rank];
        if ws != ws_local {
            return Err(Error::Mismatch {
                what: "workspace address",
                detail: format!("{ws:#x} after rendezvous, {ws_local:#x} before"),
            });
        }
        let new_event = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(|e| from_driver(e, "cuEventCreate"))
        };
        let ce = CeState {
            sides: if cuda.device_sharers() > 1 {
                None
            } else {
                let new_stream = || ctx.new_stream().map_err(|e| from_driver(e, "cuStreamCreate"));
                Some((new_stream()?, new_stream()?))
            },
            fork: new_event()?,
            join: new_event()?,
            copied: (0..CE_EVENTS).map(|_| new_event()).collect::<Result<_>>()?,
            reduced: (0..CE_EVENTS).map(|_| new_event()).collect::<Result<_>>()?,
        };
        let timeout_ns = u64::try_from(config.timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut direct = args::Direct::default();
        for (d, &b) in direct.ws.iter_mut().zip(mem.buffer_ptrs()) {
            *d = b;
        }
        for (d, &p) in direct.pads.iter_mut().zip(mem.signal_pad_ptrs()) {
            *d = p;
        }
        // The separate epilogue kernel waits on no peer: held to the grid budget on a shared GPU.
        let epilogues = Epilogues::load(ctx, config.pdl)?.with_max_blocks(grid.blocks);
        Ok(CudaCollectives {
            direct,
            group: group.clone(),
            ctx: ctx.clone(),
            bufs_dev: mem.buffer_ptrs_dev(),
            pads_dev: mem.signal_pad_ptrs_dev(),
            mem,
            _alloc: alloc,
            layout,
            config,
            rank,
            world,
            sm_count,
            grid,
            how,
            fns,
            ws,
            abort_host,
            err_word,
            timeout_ns,
            control,
            ce: Mutex::new(ce),
            registered: RwLock::new(Vec::new()),
            epilogues,
        })
    }

    pub fn group(&self) -> &Arc<Group> {
        &self.group
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The workspace (symmetric memory of this object).
    pub fn workspace(&self) -> &Arc<dyn SymmetricMemory> {
        &self.mem
    }
    pub fn layout(&self) -> &WorkspaceLayout {
        &self.layout
    }
    pub fn config(&self) -> &CollectivesConfig {
        &self.config
    }
    /// SMs of the device.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }
    /// Most blocks of one collective grid: the SM count, or this rank's share of it when ranks of
    /// the group share the device (NOTE [co-residency]).
    pub fn grid_budget(&self) -> GridBudget {
        self.grid
    }
    /// Whether the collective kernels are launched with programmatic dependent launch
    /// ([`CollectivesConfig::pdl`] and a device that supports it).
    pub fn pdl(&self) -> bool {
        self.how.pdl
    }

    /// Launches one of the collective kernels on the caller's stream, the way [`Self::pdl`] says
    /// (every such kernel starts with `symm_pdl_prologue()`, NOTE [pdl]).
    fn launch_coll(&self, stream: &CudaStream, f: &CudaFunction, grid: LaunchConfig, a: &[KernelArg]) -> Result<()> {
        launch_with(stream, f, grid, a, self.how)
    }
    /// Largest message (bytes) [`AllReduceAlgo::Lamport`] takes.
    pub fn lamport_max_bytes(&self) -> usize {
        if self.world == 1 {
            usize::MAX
        } else {
            self.layout.lamport_max_bytes()
        }
    }

    /// The algorithm [`AllReduceAlgo::Auto`] runs for `count` elements of `dtype`.
    pub fn select_all_reduce(&self, count: usize, dtype: DType) -> AllReduceAlgo {
        plan::select_all_reduce(
            count.saturating_mul(dtype.size()),
            self.world,
            &self.layout,
            &self.config.selection,
        )
    }

    /// The path [`AllGatherPath::Auto`] takes for `count` input elements per rank.
    pub fn select_all_gather(&self, count: usize, dtype: DType) -> AllGatherPath {
        let part = count.saturating_mul(dtype.size());
        if dtype.is_reducible_float() && plan::rs_ag_use_lamport(part, self.world, &self.layout, &self.config.selection)
        {
            AllGatherPath::Lamport
        } else {
            AllGatherPath::Sm
        }
    }

    /// The algorithm [`ReduceScatterAlgo::Auto`] runs for `count` output elements per rank.
    pub fn select_reduce_scatter(&self, count: usize, dtype: DType) -> ReduceScatterAlgo {
        let part = count.saturating_mul(dtype.size());
        if plan::rs_ag_use_lamport(part, self.world, &self.layout, &self.config.selection) {
            ReduceScatterAlgo::Lamport
        } else {
            ReduceScatterAlgo::Ring
        }
    }

    /// Registers a symmetric allocation of the same group for the zero-copy copy-engine paths:
    /// an input lying inside it is read by the peers in place (every rank must then pass the
    /// same offset; a mismatch latches an error). Local, not collective.
    pub fn register_symmetric(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        if mem.world_size() != self.world || mem.rank().get() != self.rank {
            return Err(Error::Mismatch {
                what: "registered memory group",
                detail: format!(
                    "rank {}/{} registered in collectives of rank {}/{}",
                    mem.rank().get(),
                    mem.world_size(),
                    self.rank,
                    self.world
                ),
            });
        }
        if mem.device() != Device::new(DeviceType::Cuda, self.ctx.ordinal() as u32) {
            return Err(Error::Mismatch {
                what: "registered memory device",
                detail: format!("{} is not this object's device", mem.device()),
            });
        }
        let base = mem.buffer_ptrs()[self.rank];
        let size = mem.buffer_size();
        let mut reg = self.registered.write().unwrap_or_else(|e| e.into_inner());
        if !reg.iter().any(|r| r.base == base) {
            reg.push(Registered { mem, base, size });
        }
        Ok(())
    }

    /// Forgets the registered allocation whose local buffer starts at `base`; true if found.
    pub fn unregister_symmetric(&self, base: u64) -> bool {
        let mut reg = self.registered.write().unwrap_or_else(|e| e.into_inner());
        let before = reg.len();
        reg.retain(|r| r.base != base);
        reg.len() != before
    }

    /// True if `bytes` at `ptr` lie inside a registered symmetric allocation (the copy-engine
    /// paths then read them in place).
    pub fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        self.lookup_symmetric(ptr, bytes).is_some()
    }

    /// [`Self::lookup_symmetric`], or an `InvalidArgument` that says `needs` ("the ... needs its
    /// input") and what registration means.
    fn registered(&self, ptr: u64, bytes: usize, needs: &str) -> Result<SymInput> {
        self.lookup_symmetric(ptr, bytes).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{needs} in symmetric memory registered with register_symmetric (the same offset on every rank)"
            ))
        })
    }

    fn lookup_symmetric(&self, ptr: u64, bytes: usize) -> Option<SymInput> {
        let reg = self.registered.read().unwrap_or_else(|e| e.into_inner());
        reg.iter().find_map(|r| {
            let end = ptr.checked_add(bytes as u64)?;
            if ptr >= r.base && end <= r.base + r.size as u64 {
                let offset = (ptr - r.base) as usize;
                let mut ptrs = [0u64; MAX_WORLD];
                for (p, b) in ptrs.iter_mut().zip(r.mem.buffer_ptrs()) {
                    *p = b + offset as u64;
                }
                Some(SymInput {
                    ptrs,
                    offset,
                    alloc_size: r.size,
                })
            } else {
                None
            }
        })
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::InvalidArgument(
                "stream belongs to another CUDA context than these collectives".into(),
            ));
        }
        Ok(())
    }

    fn common(&self) -> args::Common {
        args::Common {
            bufs_dev: self.bufs_dev,
            pads_dev: self.pads_dev,
            rank: self.rank as u32,
            world: self.world as u32,
        }
    }

    fn bound(&self) -> args::Bound {
        args::Bound {
            timeout_ns: self.timeout_ns,
            abort_host: self.abort_host,
        }
    }

    fn full_mask(&self) -> u64 {
        if self.world >= 64 {
            u64::MAX
        } else {
            (1u64 << self.world) - 1
        }
    }

    // ------------------------------------------------------------------ all-reduce

    /// All-reduce of `count` elements from `input` into `output` (may be equal: in place).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        stream: &CudaStream,
        algo: AllReduceAlgo,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_tuned(stream, algo, &self.config.tuning, input, output, count, dtype, op)
    }

    /// [`Self::all_reduce`] with explicit launch tuning (every rank must pass the same).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_tuned(
        &self,
        stream: &CudaStream,
        algo: AllReduceAlgo,
        tuning: &Tuning,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let Some((dt, _bytes)) = self.all_reduce_args(stream, input, output, count, dtype)? else {
            return Ok(());
        };
        tuning.validate()?;
        let in_place = input == output;
        let algo = match algo {
            // Nothing to exchange: the ring kernel reduces the rank's own data (avg divides by 1).
            _ if self.world == 1 => AllReduceAlgo::OneShot,
            AllReduceAlgo::Auto => self.select_all_reduce(count, dtype),
            a => a,
        };
        let mech = match algo {
            AllReduceAlgo::Lamport => Mechanism::Lamport,
            AllReduceAlgo::OneShot | AllReduceAlgo::Auto => Mechanism::Ring,
            AllReduceAlgo::TwoShot => Mechanism::TwoShot,
            AllReduceAlgo::CopyEngine => Mechanism::CopyEngine,
            AllReduceAlgo::Pull => Mechanism::Pull,
        };
        let hdr = &header(OpKind::AllReduce, dtype, count, Some(op), mech);
        match algo {
            AllReduceAlgo::Lamport => {
                self.lamport(stream, dt, RingMode::AllReduce, op, input, output, count, tuning, hdr)
            }
            AllReduceAlgo::OneShot | AllReduceAlgo::Auto => self.launch_ring(
                stream,
                dt,
                op,
                RingMode::AllReduce,
                input,
                output,
                count,
                count,
                tuning,
                in_place,
                hdr,
            ),
            AllReduceAlgo::TwoShot => {
                let q = two_shot_shard(count, self.world, dtype);
                let es = dtype.size() as u64;
                let my_out = output + self.rank as u64 * q as u64 * es;
                // Reduce-scatter into this rank's shard of the output, then all-gather in place.
                self.launch_ring(
                    stream,
                    dt,
                    op,
                    RingMode::ReduceScatter,
                    input,
                    my_out,
                    count,
                    q,
                    tuning,
                    false,
                    hdr,
                )?;
                self.launch_ring(
                    stream,
                    dt,
                    op,
                    RingMode::AllGather,
                    my_out,
                    output,
                    count,
                    q,
                    tuning,
                    false,
                    hdr,
                )
            }
            AllReduceAlgo::CopyEngine | AllReduceAlgo::Pull => {
                let tuning = if algo == AllReduceAlgo::Pull {
                    Tuning {
                        ce_fraction: 0.0,
                        ..*tuning
                    }
                } else {
                    *tuning
                };
                self.all_reduce_ce(stream, dt, dtype, op, input, output, count, &tuning, hdr)
            }
        }
    }

    /// One Lamport launch; `count` elements per peer slot (AR: the message, RS: one shard, AG: one
    /// rank's input).
    #[allow(clippy::too_many_arguments)]
    fn lamport(
        &self,
        stream: &CudaStream,
        dt: usize,
        mode: RingMode,
        op: ReduceOp,
        input: u64,
        output: u64,
        count: usize,
        tuning: &Tuning,
        hdr: &OpHeader,
    ) -> Result<()> {
        let dtype = [DType::F32, DType::F16, DType::BF16][dt];
        let p = lamport_plan(count, dtype, &self.layout, tuning, self.grid.blocks)?;
        // Two ranks: the entry specialised for this (mode, op) (NOTE in collectives.cu).
        let f = if self.world == 2 && !knobs::lamport_generic() {
            &self.fns.lamport2[dt][lamport2_index(mode, kernel_op(op))]
        } else {
            &self.fns.lamport[dt]
        };
        let mut a = args::lamport(
            &self.common(),
            &self.direct,
            mode,
            kernel_op(op),
            input,
            output,
            count,
            &self.layout,
            &self.bound(),
            hdr,
        );
        let mut bits = mode as u32;
        if knobs::lamport_acq_rel_arrive() {
            bits |= args::LAMPORT_ACQREL_ARRIVE;
        }
        bits |= knobs::lamport_lag() << args::LAMPORT_LAG_SHIFT;
        a[args::LAMPORT_MODE_ARG] = KernelArg::U32(bits);
        self.launch_coll(stream, f, cfg(p.blocks, p.threads), &a)
    }

    /// One ring launch (see NOTE [collectives-protocols]).
    #[allow(clippy::too_many_arguments)]
    fn launch_ring(
        &self,
        stream: &CudaStream,
        dt: usize,
        op: ReduceOp,
        mode: RingMode,
        input: u64,
        output: u64,
        total: usize,
        shard: usize,
        tuning: &Tuning,
        in_place: bool,
        hdr: &OpHeader,
    ) -> Result<()> {
        let dtype = [DType::F32, DType::F16, DType::BF16][dt];
        let p: RingPlan = ring_plan(mode, total, shard, dtype, &self.layout, tuning, self.grid.blocks)?;
        let flags = u32::from(in_place && mode == RingMode::AllReduce && self.world > 1);
        let a = args::ring(
            &self.common(),
            kernel_op(op),
            input,
            output,
            &p,
            &self.layout,
            &self.bound(),
            flags,
            hdr,
        );
        self.launch_coll(stream, &self.fns.ring[dt], cfg(p.blocks(), p.threads), &a)
    }

    /// `out[0..n] = reduce over ranks of srcs[r][0..n]` on `stream`.
    #[allow(clippy::too_many_arguments)]
    fn launch_reduce_ptrs(
        &self,
        stream: &CudaStream,
        dt: usize,
        op: ReduceOp,
        out: u64,
        n: usize,
        srcs: &[u64],
        tuning: &Tuning,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let dtype = [DType::F32, DType::F16, DType::BF16][dt];
        let vectors = n.div_ceil(plan::vec_elems(dtype));
        let threads = tuning.threads;
        let blocks = vectors
            .div_ceil(threads as usize)
            .clamp(1, self.grid.independent(tuning.blocks(self.grid.blocks), 4) as usize) as u32;
        let a = args::reduce_ptrs(self.rank as u32, self.world as u32, kernel_op(op), out, n, srcs);
        self.launch_coll(stream, &self.fns.reduce_ptrs[dt], cfg(blocks, threads), &a)
    }

    fn launch_barrier(&self, stream: &CudaStream, mask: u64, check: u32) -> Result<()> {
        let a = args::barrier(&self.common(), mask, &self.bound(), check);
        self.launch_coll(stream, &self.fns.barrier, cfg(1, 64), &a)
    }

    /// One fused zero-copy pull (opening barrier, pull, closing barrier in one kernel; NOTE
    /// [collectives-protocols], "Fused pull"). One wave: at most one block per SM.
    fn launch_pull(&self, stream: &CudaStream, dt: usize, p: &args::Pull, tuning: &Tuning) -> Result<()> {
        let dtype = [DType::F32, DType::F16, DType::BF16][dt];
        let vectors = p.n.div_ceil(plan::vec_elems(dtype)).max(1);
        let threads = tuning.threads;
        let blocks = vectors
            .div_ceil(threads as usize)
            .clamp(1, tuning.blocks(self.grid.blocks) as usize) as u32;
        // The state words are at the start of the workspace.
        let a = args::pull(&self.common(), &self.direct, self.ws, p, &self.bound());
        let f = if self.world == 2 && !knobs::lamport_generic() {
            &self.fns.pull2[dt][lamport2_index(p.mode, p.op)]
        } else {
            &self.fns.pull[dt]
        };
        self.launch_coll(stream, f, cfg(blocks, threads.max(64)), &a)
    }

    #[allow(clippy::too_many_arguments)]
    fn all_reduce_ce(
        &self,
        stream: &CudaStream,
        dt: usize,
        dtype: DType,
        op: ReduceOp,
        input: u64,
        output: u64,
        count: usize,
        tuning: &Tuning,
        hdr: &OpHeader,
    ) -> Result<()> {
        let es = dtype.size();
        let bytes = count * es;
        let sym = self.registered(input, bytes, "the copy-engine all-reduce needs its input")?;
        if ranges_overlap(input, bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "the copy-engine all-reduce cannot run in place (peers read the input while the output is written)"
                    .into(),
            ));
        }
        let (ce_elems, chunk, nchunks, slots) = ce_split(count, dtype, &self.layout, tuning)?;
        let check = checked(hdr, &[3, sym.offset as u64, sym.alloc_size as u64]);
        if ce_elems == 0 {
            // Pure SM pull: one fused kernel.
            let mut srcs = [0u64; MAX_WORLD];
            for (s, src) in srcs.iter_mut().enumerate().take(self.world) {
                *src = if s == self.rank { input } else { sym.ptrs[s] };
            }
            let p = args::Pull {
                mode: RingMode::AllReduce,
                op: kernel_op(op),
                out: output,
                n: count,
                srcs,
                check,
            };
            return self.launch_pull(stream, dt, &p, tuning);
        }
        let mask = self.full_mask();
        self.launch_barrier(stream, mask, check)?;
        let ce = self.ce.lock().unwrap_or_else(|e| e.into_inner());
        if ce_elems > 0 {
            ce.fork.record(stream).map_err(|e| from_driver(e, "cuEventRecord"))?;
            ce.side(stream)
                .wait(&ce.fork)
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
        }
        // The part the SMs pull directly runs while the copy engine copies the rest.
        if ce_elems < count {
            let off = (ce_elems * es) as u64;
            let mut srcs = [0u64; MAX_WORLD];
            for (s, src) in srcs.iter_mut().enumerate().take(self.world) {
                *src = if s == self.rank { input + off } else { sym.ptrs[s] + off };
            }
            self.launch_reduce_ptrs(
                stream,
                dt,
                op,
                output + off,
                count - ce_elems,
                &srcs[..self.world],
                tuning,
            )?;
        }
        let w1 = self.world - 1;
        let chunk_bytes = chunk * es;
        for c in 0..nchunks {
            let k = c % slots.min(CE_EVENTS);
            let start = c * chunk;
            let n = chunk.min(ce_elems - start);
            if c >= slots.min(CE_EVENTS) {
                ce.side(stream)
                    .wait(&ce.reduced[k])
                    .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
            }
            let mut srcs = [0u64; MAX_WORLD];
            for (s, src) in srcs.iter_mut().enumerate().take(self.world) {
                if s == self.rank {
                    *src = input + (start * es) as u64;
                    continue;
                }
                let l = peer_index(self.rank, s, self.world);
                let scratch = self.ws + (self.layout.ring_off + (k * w1 + l) * chunk_bytes) as u64;
                dtod_async(ce.side(stream), scratch, sym.ptrs[s] + (start * es) as u64, n * es)?;
                *src = scratch;
            }
            ce.copied[k]
                .record(ce.side(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream
                .wait(&ce.copied[k])
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
            self.launch_reduce_ptrs(
                stream,
                dt,
                op,
                output + (start * es) as u64,
                n,
                &srcs[..self.world],
                tuning,
            )?;
            ce.reduced[k]
                .record(stream)
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
        }
        drop(ce);
        // Peers read this rank's input until here.
        self.launch_barrier(stream, mask, 0)
    }

    /// The checks every all-reduce entry makes: the stream, the dtype, the pointers' alignment,
    /// and input and output either equal or apart. `None` for an empty message (nothing to do),
    /// else the kernels' dtype index and the message's bytes.
    fn all_reduce_args(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
    ) -> Result<Option<(usize, usize)>> {
        self.check_stream(stream)?;
        let dt = kernel_dtype(dtype, "all_reduce")?;
        if count == 0 {
            return Ok(None);
        }
        check_ptr("all_reduce input", input, dtype)?;
        check_ptr("all_reduce output", output, dtype)?;
        let bytes = byte_len(count, dtype)?;
        if input != output && ranges_overlap(input, bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "all_reduce input and output overlap without being equal".into(),
            ));
        }
        Ok(Some((dt, bytes)))
    }

    /// Copy-engine two-shot all-reduce (two ranks; input and output both in registered
    /// symmetric memory, at the same offsets on every rank, out of place): after a barrier that
    /// checks the geometry, each rank owns half of the message. A copy stream pulls the peer's
    /// input for this rank's half straight into the output in chunks that shrink towards the end
    /// ([`ce_rs_chunks`]); the SMs reduce each chunk in place as it lands (`output = input +
    /// output`, fp32, rank order); a second copy stream pushes each reduced chunk into the
    /// peer's output at once. So pulls, reductions and pushes overlap, and both NVLink
    /// directions carry the whole message once (the minimum for two ranks) through the copy
    /// engines, which moved ~370 GB/s (reads) and ~389 GB/s (writes) per direction with both
    /// GPUs copying, against ~333 for the SM pull (docs/benchmarks.md). A closing barrier: the
    /// peer's pushes into this output have landed and the peer no longer reads this input.
    /// Other world sizes, or inputs / outputs outside registered memory, get an error naming
    /// the requirement. Stream-ordered, allocates nothing, graph-capturable.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_ce_two_shot(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let Some((dt, bytes)) = self.all_reduce_args(stream, input, output, count, dtype)? else {
            return Ok(());
        };
        let es = dtype.size();
        if self.world != 2 {
            return Err(Error::InvalidArgument(format!(
                "the copy-engine two-shot all-reduce runs on two ranks, this group has {}",
                self.world
            )));
        }
        if ranges_overlap(input, bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "the copy-engine two-shot all-reduce runs out of place (the peer's half lands in the output)".into(),
            ));
        }
        let sin = self.registered(input, bytes, "the copy-engine two-shot all-reduce needs its input")?;
        let sout = self.registered(output, bytes, "the copy-engine two-shot all-reduce needs its output")?;
        let peer = 1 - self.rank;
        let q = two_shot_shard(count, 2, dtype).min(count);
        let (start, n) = if self.rank == 0 { (0, q) } else { (q, count - q) };
        let hdr = &header(OpKind::AllReduce, dtype, count, Some(op), Mechanism::CeTwoShot);
        let check = checked(
            hdr,
            &[
                9,
                sin.offset as u64,
                sin.alloc_size as u64,
                sout.offset as u64,
                sout.alloc_size as u64,
                count as u64,
                dt as u64,
            ],
        );
        let mask = self.full_mask();
        self.launch_barrier(stream, mask, check)?;
        if n > 0 {
            let off = (start * es) as u64;
            self.ce_pull_reduce(
                stream,
                dt,
                dtype,
                op,
                CePull {
                    own: input + off,
                    out: output + off,
                    remote: sin.ptrs[peer] + off,
                    count: n,
                    push_to: Some(sout.ptrs[peer] + off),
                },
            )?;
        }
        // The peer's pushes into this output have landed; it no longer reads this input.
        self.launch_barrier(stream, mask, 0)
    }

    /// The copy-engine pipeline of [`Self::reduce_scatter_ce`] and
    /// [`Self::all_reduce_ce_two_shot`] (two ranks): the copy stream pulls `p.remote` into
    /// `p.out` in chunks ([`ce_rs_chunks`]); as each lands, the SMs reduce it in place with
    /// `p.own` (rank order); with `push_to`, a second copy stream then pushes each reduced chunk
    /// there. Returns with every copy joined into `stream`.
    fn ce_pull_reduce(&self, stream: &CudaStream, dt: usize, dtype: DType, op: ReduceOp, p: CePull) -> Result<()> {
        let es = dtype.size();
        let peer = 1 - self.rank;
        let tuning = self.config.tuning;
        let ce = self.ce.lock().unwrap_or_else(|e| e.into_inner());
        ce.fork.record(stream).map_err(|e| from_driver(e, "cuEventRecord"))?;
        ce.side(stream)
            .wait(&ce.fork)
            .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
        let mut at = 0usize;
        let (chunks, nchunks) = ce_rs_chunks(p.count, dtype, CE_EVENTS);
        for (k, &m) in chunks[..nchunks].iter().enumerate() {
            let off = (at * es) as u64;
            dtod_async(ce.side(stream), p.out + off, p.remote + off, m * es)?;
            ce.copied[k]
                .record(ce.side(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream
                .wait(&ce.copied[k])
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
            let mut srcs = [0u64; 2];
            srcs[self.rank] = p.own + off;
            srcs[peer] = p.out + off;
            self.launch_reduce_ptrs(stream, dt, op, p.out + off, m, &srcs, &tuning)?;
            if let Some(dst) = p.push_to {
                ce.reduced[k]
                    .record(stream)
                    .map_err(|e| from_driver(e, "cuEventRecord"))?;
                ce.side2(stream)
                    .wait(&ce.reduced[k])
                    .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
                dtod_async(ce.side2(stream), dst + off, p.out + off, m * es)?;
            }
            at += m;
        }
        if p.push_to.is_some() {
            ce.join
                .record(ce.side2(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream.wait(&ce.join).map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ reduce-scatter

    /// Reduce-scatter: `input` holds `count * world` elements, `output` receives this rank's
    /// `count` (in place when `output == input + rank * count` elements).
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let tuning = self.config.tuning;
        self.reduce_scatter_tuned(
            stream,
            ReduceScatterAlgo::Auto,
            &tuning,
            input,
            output,
            count,
            dtype,
            op,
        )
    }

    /// [`Self::reduce_scatter`] with an explicit algorithm and launch tuning (every rank must pass
    /// the same).
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter_tuned(
        &self,
        stream: &CudaStream,
        algo: ReduceScatterAlgo,
        tuning: &Tuning,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let Some((dt, _)) = self.reduce_scatter_geometry(stream, input, output, count, dtype)? else {
            return Ok(());
        };
        tuning.validate()?;
        let total = count * self.world;
        let algo = match algo {
            ReduceScatterAlgo::Auto => self.select_reduce_scatter(count, dtype),
            a => a,
        };
        let lamport = algo == ReduceScatterAlgo::Lamport && self.world > 1;
        let mech = if lamport { Mechanism::Lamport } else { Mechanism::Ring };
        let hdr = &header(OpKind::ReduceScatter, dtype, count, Some(op), mech);
        if lamport {
            return self.lamport(
                stream,
                dt,
                RingMode::ReduceScatter,
                op,
                input,
                output,
                count,
                tuning,
                hdr,
            );
        }
        self.launch_ring(
            stream,
            dt,
            op,
            RingMode::ReduceScatter,
            input,
            output,
            total,
            count,
            tuning,
            false,
            hdr,
        )
    }

    /// Checks a reduce-scatter's arguments (`count` output elements; the input holds `count *
    /// world`); `None` when there is nothing to do.
    /// The checks every reduce-scatter entry makes (the stream, the dtype, the shard geometry);
    /// `None` for an empty shard.
    fn reduce_scatter_geometry(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
    ) -> Result<Option<(usize, ShardGeometry)>> {
        self.check_stream(stream)?;
        let dt = kernel_dtype(dtype, "reduce_scatter")?;
        if count == 0 {
            return Ok(None);
        }
        let g = shard_geometry(
            "reduce_scatter",
            ("reduce_scatter input", input),
            ("reduce_scatter output", output),
            count,
            dtype,
            (self.rank, self.world),
        )?;
        Ok(Some((dt, g)))
    }

    /// Zero-copy reduce-scatter for an input in registered symmetric memory (the same offset on
    /// every rank, see [`Self::register_symmetric`]): every rank reads its shard straight from
    /// every peer's input and reduces it (PyTorch's `reduce_scatter_out` pattern). A barrier that
    /// also checks every rank passed the same geometry, the pull (the SM-pull kernel of the
    /// copy-engine all-reduce, on this rank's shard), and a closing barrier (peers read this
    /// rank's input until then, so the caller may overwrite it afterwards). `output` may be this
    /// rank's shard of `input` (in place: no peer reads that shard). Stream-ordered, allocates
    /// nothing, graph-capturable.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter_pull(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let Some((dt, g)) = self.reduce_scatter_geometry(stream, input, output, count, dtype)? else {
            return Ok(());
        };
        let own = g.own;
        let shard = own - input;
        let sym = self.registered(input, g.whole_bytes, "the zero-copy reduce-scatter needs its input")?;
        let hdr = &header(OpKind::ReduceScatter, dtype, count, Some(op), Mechanism::Pull);
        let check = checked(hdr, &[4, sym.offset as u64, sym.alloc_size as u64]);
        let mut srcs = [0u64; MAX_WORLD];
        for (s, src) in srcs.iter_mut().enumerate().take(self.world) {
            *src = if s == self.rank { own } else { sym.ptrs[s] + shard };
        }
        let p = args::Pull {
            mode: RingMode::ReduceScatter,
            op: kernel_op(op),
            out: output,
            n: count,
            srcs,
            check,
        };
        let tuning = self.config.tuning;
        self.launch_pull(stream, dt, &p, &tuning)
    }

    /// Copy-engine reduce-scatter for an input in registered symmetric memory and an output
    /// outside it (two ranks; more fall back to [`Self::reduce_scatter_pull`]): after a barrier
    /// that checks the geometry, the copy engine pulls this rank's shard of the peer's input
    /// straight into `output`, in chunks that shrink towards the end ([`ce_rs_chunks`]), on a side
    /// stream; as each chunk lands the SMs reduce it in place with this rank's own shard
    /// (`output = own + output`, fp32, rank order), overlapping the next copy; a closing barrier
    /// (the peer reads this rank's input until then). No staging, no scratch. Bare copy-engine
    /// reads run at ~370 GB/s per direction with both GPUs copying, against ~333 for SM reads,
    /// but with the gaps between its chunked copies this path measured 417 us against the SM
    /// pull's 409 at 256 MiB on 2 x H200 (docs/benchmarks.md), so `auto` does not take it.
    /// `output` must not overlap `input` (in place: use the pull). Stream-ordered, allocates
    /// nothing, graph-capturable.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter_ce(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let Some((dt, g)) = self.reduce_scatter_geometry(stream, input, output, count, dtype)? else {
            return Ok(());
        };
        if self.world != 2 {
            return self.reduce_scatter_pull(stream, input, output, count, dtype, op);
        }
        let es = dtype.size();
        let bytes = count * es;
        if ranges_overlap(input, g.whole_bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "the copy-engine reduce-scatter lands the peer's shard in its output: the output must not \
                 overlap the input (in place, use the pull)"
                    .into(),
            ));
        }
        let own = g.own;
        let shard = own - input;
        let sym = self.registered(input, g.whole_bytes, "the copy-engine reduce-scatter needs its input")?;
        let peer = 1 - self.rank;
        let hdr = &header(OpKind::ReduceScatter, dtype, count, Some(op), Mechanism::CopyEngine);
        let check = checked(hdr, &[8, sym.offset as u64, sym.alloc_size as u64]);
        let mask = self.full_mask();
        self.launch_barrier(stream, mask, check)?;
        self.ce_pull_reduce(
            stream,
            dt,
            dtype,
            op,
            CePull {
                own,
                out: output,
                remote: sym.ptrs[peer] + shard,
                count,
                push_to: None,
            },
        )?;
        // The peer reads this rank's input until here.
        self.launch_barrier(stream, mask, 0)
    }

    // ------------------------------------------------------------------ all-gather

    /// All-gather: `input` holds `count` elements, `output` receives `count * world` (in place
    /// when `input == output + rank * count` elements).
    #[allow(clippy::too_many_arguments)]
    pub fn all_gather(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        path: AllGatherPath,
    ) -> Result<()> {
        let tuning = self.config.tuning;
        self.all_gather_tuned(stream, &tuning, input, output, count, dtype, path)
    }

    /// [`Self::all_gather`] with explicit launch tuning.
    #[allow(clippy::too_many_arguments)]
    pub fn all_gather_tuned(
        &self,
        stream: &CudaStream,
        tuning: &Tuning,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        path: AllGatherPath,
    ) -> Result<()> {
        self.check_stream(stream)?;
        // The all-gather moves bits; any 2- or 4-byte type runs as f16 / f32 lanes.
        let dt = match dtype.size() {
            4 => 0,
            2 => 1,
            _ => {
                return Err(Error::UnsupportedDType {
                    dtype: dtype.name().to_string(),
                    op: "all_gather",
                })
            }
        };
        if count == 0 {
            return Ok(());
        }
        tuning.validate()?;
        shard_geometry(
            "all_gather",
            ("all_gather output", output),
            ("all_gather input", input),
            count,
            dtype,
            (self.rank, self.world),
        )?;
        let total = count * self.world;
        let path = match path {
            AllGatherPath::Auto => self.select_all_gather(count, dtype),
            p => p,
        };
        // In place in a registered output, the copy-engine path pushes (it writes each peer's
        // output slice, at the same offset on every rank); a registered input alone is pulled.
        let mech = match path {
            _ if self.world == 1 => Mechanism::Ring,
            AllGatherPath::CopyEngine => Mechanism::CopyEngine,
            AllGatherPath::Pull => Mechanism::Pull,
            AllGatherPath::Lamport => Mechanism::Lamport,
            _ => Mechanism::Ring,
        };
        let hdr = &header(OpKind::AllGather, dtype, count, None, mech);
        match path {
            AllGatherPath::CopyEngine if self.world > 1 => self.all_gather_ce(stream, input, output, count, dtype, hdr),
            AllGatherPath::Pull if self.world > 1 => {
                self.all_gather_pull(stream, dt, tuning, input, output, count, dtype, hdr)
            }
            AllGatherPath::Lamport if self.world > 1 => {
                let dt = kernel_dtype(dtype, "the Lamport all-gather (f32, f16, bf16)")?;
                self.lamport(
                    stream,
                    dt,
                    RingMode::AllGather,
                    ReduceOp::Sum,
                    input,
                    output,
                    count,
                    tuning,
                    hdr,
                )
            }
            _ => self.launch_ring(
                stream,
                dt,
                ReduceOp::Sum,
                RingMode::AllGather,
                input,
                output,
                total,
                count,
                tuning,
                false,
                hdr,
            ),
        }
    }

    /// Zero-copy all-gather for an input in registered symmetric memory: one fused kernel copies
    /// every peer's input straight into the output over NVLink between an opening barrier (with
    /// a geometry check) and a closing one.
    #[allow(clippy::too_many_arguments)]
    fn all_gather_pull(
        &self,
        stream: &CudaStream,
        dt: usize,
        tuning: &Tuning,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        hdr: &OpHeader,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let mut srcs = [0u64; MAX_WORLD];
        let in_place = input == output + (self.rank * bytes) as u64;
        let check = if let Some(sym) = in_place
            .then(|| self.lookup_symmetric(output, bytes * self.world))
            .flatten()
        {
            // In place in a registered output: rank s's input is slice s of its output, at the
            // same offset on every rank.
            for (s, src) in srcs.iter_mut().enumerate().take(self.world) {
                *src = sym.ptrs[s] + (s * bytes) as u64;
            }
            checked(hdr, &[6, sym.offset as u64, sym.alloc_size as u64])
        } else {
            let sym = self.registered(
                input,
                bytes,
                "the zero-copy all-gather pull needs its input (or, in place, its output)",
            )?;
            for (s, src) in srcs.iter_mut().enumerate().take(self.world) {
                *src = if s == self.rank { input } else { sym.ptrs[s] };
            }
            checked(hdr, &[5, sym.offset as u64, sym.alloc_size as u64])
        };
        let p = args::Pull {
            mode: RingMode::AllGather,
            op: 0,
            out: output,
            n: count,
            srcs,
            check,
        };
        self.launch_pull(stream, dt, &p, tuning)
    }

    fn all_gather_ce(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        hdr: &OpHeader,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let mask = self.full_mask();
        let own = output + (self.rank * bytes) as u64;
        let ce = self.ce.lock().unwrap_or_else(|e| e.into_inner());
        let fork = |ce: &CeState| -> Result<()> {
            ce.fork.record(stream).map_err(|e| from_driver(e, "cuEventRecord"))?;
            ce.side(stream)
                .wait(&ce.fork)
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))
        };
        let join = |ce: &CeState| -> Result<()> {
            ce.join
                .record(ce.side(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream.wait(&ce.join).map_err(|e| from_driver(e, "cuStreamWaitEvent"))
        };
        // Zero-copy, as (check word, per rank s: (destination, source) of its copy).
        let zero_copy = if let Some(o) = self.lookup_symmetric(output, bytes * self.world) {
            // Push: the output is registered (in place or not), so this rank's copy engine writes
            // its input into every peer's output slice between two barriers (the opening one:
            // every peer's output is free; the closing one: every write into this rank's output
            // has landed). Writes ran at ~389 GB/s per direction with both GPUs copying, reads at
            // ~370 (docs/benchmarks.md, bandwidth probes).
            let slice = (self.rank * bytes) as u64;
            let check = checked(hdr, &[7, o.offset as u64, o.alloc_size as u64]);
            Some((
                check,
                std::array::from_fn::<_, MAX_WORLD, _>(|s| (o.ptrs[s] + slice, input)),
            ))
        } else {
            // Pull: peers' inputs are read in place between two barriers.
            self.lookup_symmetric(input, bytes).map(|i| {
                let check = checked(hdr, &[1, i.offset as u64, i.alloc_size as u64]);
                (check, std::array::from_fn(|s| (output + (s * bytes) as u64, i.ptrs[s])))
            })
        };
        if let Some((check, copies)) = zero_copy {
            self.launch_barrier(stream, mask, check)?;
            fork(&ce)?;
            for s in (0..self.world).filter(|&s| s != self.rank) {
                dtod_async(ce.side(stream), copies[s].0, copies[s].1, bytes)?;
            }
            if own != input {
                dtod_async(stream, own, input, bytes)?;
            }
            join(&ce)?;
        } else {
            // Staged: rounds through the two halves of every rank's ring area. A round's barrier
            // also means every peer finished pulling the round before (its join precedes its
            // barrier), so the half written next is free.
            let half = self.layout.ring_bytes() / 2 / 16 * 16;
            if half == 0 {
                return Err(Error::InvalidArgument(
                    "staging area too small for the copy-engine path".into(),
                ));
            }
            let check = checked(hdr, &[2]);
            let ring_base = |rank: usize| self.mem.buffer_ptrs()[rank] + self.layout.ring_off as u64;
            let rounds = bytes.div_ceil(half);
            for r in 0..rounds {
                let off = r * half;
                let n = half.min(bytes - off);
                let h = ((r % 2) * half) as u64;
                dtod_async(stream, ring_base(self.rank) + h, input + off as u64, n)?;
                self.launch_barrier(stream, mask, check)?;
                fork(&ce)?;
                for s in (0..self.world).filter(|&s| s != self.rank) {
                    dtod_async(ce.side(stream), output + (s * bytes + off) as u64, ring_base(s) + h, n)?;
                }
                if own != input {
                    dtod_async(stream, own + off as u64, input + off as u64, n)?;
                }
                join(&ce)?;
            }
        }
        drop(ce);
        self.launch_barrier(stream, mask, 0)
    }

    // ------------------------------------------------------------------ barrier, errors

    /// Barrier on `stream` with the ranks listed (which must include this rank); ranks not
    /// listed do not take part. Ranks that share barriers must issue them in the same order.
    pub fn barrier(&self, stream: &CudaStream, ranks: &[Rank]) -> Result<()> {
        self.check_stream(stream)?;
        let mut mask = 0u64;
        for r in ranks {
            if r.world_size() != self.world || r.get() >= self.world {
                return Err(Error::OutOfRange {
                    what: "barrier rank",
                    value: r.get() as u64,
                    limit: self.world as u64,
                });
            }
            mask |= 1u64 << r.get();
        }
        if mask & (1u64 << self.rank) == 0 {
            return Err(Error::InvalidArgument(format!(
                "barrier ranks {:?} do not include this rank ({})",
                ranks.iter().map(|r| r.get()).collect::<Vec<_>>(),
                self.rank
            )));
        }
        if mask == 1u64 << self.rank {
            return Ok(());
        }
        self.launch_barrier(stream, mask, 0)
    }

    /// An op with nothing to move (`kind` over zero elements of `dtype`) still takes its place in
    /// the group's op sequence (NOTE [op-agreement]): a barrier over every rank whose check word is
    /// the op's header, so a peer that ran an op with data never pairs with it (both wait until
    /// the deadline), and ranks that all ran the same empty op stay in step.
    pub fn agree_empty(&self, stream: &CudaStream, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        self.check_stream(stream)?;
        if self.world == 1 {
            return Ok(());
        }
        let hdr = header(kind, dtype, 0, reduce, Mechanism::Empty);
        let mask = self.full_mask();
        self.launch_barrier(stream, mask, checked(&hdr, &[]))?;
        // A closing barrier without a check word, as every checked barrier has: a peer leaves the
        // first one as soon as it sees this rank's epoch, and its next checked barrier would
        // otherwise overwrite the check word this rank has not read yet.
        self.launch_barrier(stream, mask, 0)
    }

    /// Tells every peer, on `stream` (after this rank's earlier ops), that this rank rejected its
    /// own arguments for its next op (NOTE [op-agreement]): each peer latches
    /// [`symm_core::pad::ERR_PEER_REJECTED`], so its matching op gives up at once instead of
    /// pairing with this rank's following op, and its `check_error` names this rank. The group is
    /// out of step afterwards: build a new object.
    pub fn reject(&self, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        let a = args::reject(&self.common());
        self.launch_coll(stream, &self.fns.reject, cfg(1, 64), &a)
    }

    /// The error code this object's kernels latched and copied into pinned host memory (NOTE
    /// [error-mirror]), if any: a host load, no launch, no synchronisation, so an op can look
    /// before it runs. [`Self::check_error`] turns it into the error and clears it.
    pub fn pending_error(&self) -> Option<u32> {
        let cuda = crate::as_cuda(self.mem.as_ref())?;
        match cuda.error_mirror() {
            0 => None,
            code => Some(code),
        }
    }

    /// Reads and clears the error latched by this object's kernels: `Ok(())`, or
    /// [`Error::Timeout`] / [`Error::Aborted`] / [`Error::Mismatch`]. Call after synchronising the
    /// streams the ops ran on.
    pub fn check_error(&self) -> Result<()> {
        bind(&self.ctx)?;
        let out = self.ws + (ST_ERR_OUT * 4) as u64;
        launch(
            &self.control,
            &self.fns.take_error,
            cfg(1, 32),
            &args::take_error(self.err_word, out),
        )?;
        let mut word = [0u8; 4];
        dtoh_sync(&self.control, &mut word, out)?;
        if let Some(cuda) = crate::as_cuda(self.mem.as_ref()) {
            cuda.clear_error_mirror();
        }
        match u32::from_le_bytes(word) {
            0 => Ok(()),
            symm_core::pad::ERR_TIMEOUT => Err(Error::Timeout {
                what: format!(
                    "collective device wait (group {}, rank {})",
                    self.group.name(),
                    self.rank
                ),
                timeout: self.config.timeout,
            }),
            symm_core::pad::ERR_ABORTED => Err(Error::Aborted(format!(
                "collective aborted (group {}, rank {})",
                self.group.name(),
                self.rank
            ))),
            ERR_MISMATCH | ERR_OP_MISMATCH | ERR_PEER_REJECTED => {
                // What the kernel that latched it recorded (NOTE [op-agreement]); cleared for the
                // next error.
                let at = self.ws + (ST_MISMATCH * 4) as u64;
                let mut raw = [0u8; MISMATCH_WORDS * 4];
                dtoh_sync(&self.control, &mut raw, at)?;
                memset_d32_async(&self.control, at, 0, MISMATCH_WORDS)?;
                let mut record = [0u32; MISMATCH_WORDS];
                for (w, b) in record.iter_mut().zip(raw.chunks_exact(4)) {
                    *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                Err(
                    agree::mismatch_error(self.rank, &record).unwrap_or_else(|| Error::Mismatch {
                        what: "the collective op",
                        detail: "the ranks ran different ops, or passed symmetric buffers at different offsets \
                             (no record of which)"
                            .into(),
                    }),
                )
            }
            other => Err(Error::Backend {
                backend: driver::BACKEND,
                call: "collectives check_error".into(),
                detail: format!("unknown code {other} in the ERROR word"),
            }),
        }
    }

    /// Sets (or clears) the abort flag: every device wait of this object gives up (latching
    /// [`Error::Aborted`]) while it is set.
    pub fn set_abort(&self, abort: bool) -> Result<()> {
        self.mem.set_abort(abort)
    }
}

impl Drop for CudaCollectives {
    fn drop(&mut self) {
        // Ops in flight are bounded by their deadlines; let the side stream finish before the
        // workspace goes away (the caller's streams are the caller's to synchronise).
        if let Ok(CeState {
            sides: Some((side, side2)),
            ..
        }) = self.ce.get_mut()
        {
            for s in [side, side2] {
                if let Err(e) = crate::streams::wait_idle(s, crate::streams::HOST_COPY_TIMEOUT, "dropping collectives")
                {
                    eprintln!("symm-cuda collectives: dropping: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_math() {
        assert!(ranges_overlap(100, 10, 105, 10));
        assert!(!ranges_overlap(100, 10, 110, 10));
        assert!(!ranges_overlap(100, 0, 100, 10));
        assert!(ranges_overlap(100, 10, 90, 11));
        assert!(!ranges_overlap(100, 10, 90, 10));
    }

    #[test]
    fn config_defaults() {
        let c = CollectivesConfig::new(DEFAULT_STAGING_BYTES, Duration::from_secs(10));
        assert_eq!(c.lamport_bytes_for(2), 16 << 20);
        assert_eq!(c.lamport_bytes_for(8), (16 << 20) / 7);
        assert!(check_ptr("x", 0, DType::F32).is_err());
        assert!(check_ptr("x", 2, DType::F32).is_err());
        assert!(check_ptr("x", 2, DType::BF16).is_ok());
    }

    /// The kernel file compiles with NVRTC (when present; SYMM_REQUIRE_NVRTC=1 makes its absence
    /// a failure) and holds every entry point the host side loads, with the protocol's
    /// instructions and no trap / multicast.
    #[test]
    fn collectives_kernels_compile_with_nvrtc() {
        let src = kernels::source("collectives").unwrap();
        if let Err(e) = kernels::nvrtc_available() {
            assert!(!crate::knobs::require_nvrtc(), "SYMM_REQUIRE_NVRTC=1 but {e}");
            println!("SKIP collectives_kernels_compile_with_nvrtc: {e}");
            return;
        }
        let ptx = kernels::compile(src, "", "sm_90").unwrap_or_else(|e| panic!("collectives.cu: {e}"));
        for dt in ["f32", "f16", "bf16"] {
            for k in ["symm_lamport_", "symm_ring_", "symm_reduce_ptrs_"] {
                assert!(ptx.contains(&format!(".entry {k}{dt}(")), "{k}{dt} missing");
            }
        }
        for k in [
            "symm_coll_init",
            "symm_coll_barrier",
            "symm_coll_reject",
            "symm_coll_take_error",
        ] {
            assert!(ptx.contains(&format!(".entry {k}(")), "{k} missing");
        }
        // Every two-rank entry the host loads (COLL_TWO_RANK_ENTRIES), in `lamport2_index` order.
        for kind in ["lamport2", "pull2"] {
            for dt in ["f32", "f16", "bf16"] {
                let names = two_rank_names(kind, dt);
                assert_eq!(names.len(), 9);
                for n in &names {
                    assert!(ptx.contains(&format!(".entry {n}(")), "{n} missing");
                }
                assert_eq!(
                    names[lamport2_index(RingMode::AllReduce, 2)],
                    format!("symm_{kind}_ar_max_{dt}")
                );
                assert_eq!(
                    names[lamport2_index(RingMode::ReduceScatter, 1)],
                    format!("symm_{kind}_rs_avg_{dt}")
                );
                assert_eq!(
                    names[lamport2_index(RingMode::AllGather, 0)],
                    format!("symm_{kind}_ag_{dt}")
                );
            }
        }
        for needle in [
            "ld.acquire.sys",
            "st.release.sys",
            "ld.volatile.global.v4",
            "%globaltimer",
            "cvt.rn.bf16x2.f32",
        ] {
            assert!(ptx.contains(needle), "{needle} missing from the PTX");
        }
        assert!(!ptx.contains("trap;"));
        assert!(!ptx.contains("multimem"));
        // The Lamport and ring kernels keep their vectors in registers (no local-memory stack).
        for k in [
            "symm_lamport_bf16",
            "symm_ring_bf16",
            "symm_lamport_add_rms_bf16",
            "symm_add_rms_bf16",
        ] {
            let start = ptx.find(&format!(".entry {k}(")).unwrap();
            let body = &ptx[start..];
            let end = body[1..].find(".entry").map_or(body.len(), |e| e + 1);
            assert!(!body[..end].contains("__local_depot"), "{k} spills to local memory");
        }
        // NOTE [pdl]: every entry `launch_coll` may launch with PDL waits for the kernel ahead
        // before its first memory access and then releases the next one.
        let mut checked = 0;
        for (name, body) in ptx_entries(&ptx) {
            if matches!(name, "symm_coll_init" | "symm_coll_take_error") {
                continue;
            }
            let wait = body
                .find("griddepcontrol.wait")
                .unwrap_or_else(|| panic!("{name}: no griddepcontrol.wait"));
            assert!(
                body.contains("griddepcontrol.launch_dependents"),
                "{name}: no griddepcontrol.launch_dependents"
            );
            if let Some((at, ins)) = first_memory_access(body) {
                assert!(wait < at, "{name}: `{ins}` before griddepcontrol.wait");
            }
            checked += 1;
        }
        // 3 x (generic Lamport, ring, reduce_ptrs, generic pull) + 2 x 27 two-rank + the barrier
        // and the rejection + 3 x (fused Lamport epilogue, separate epilogue).
        assert_eq!(checked, 12 + 54 + 2 + 6);
        for dt in ["f32", "f16", "bf16"] {
            for k in ["symm_lamport_add_rms", "symm_add_rms"] {
                assert!(ptx.contains(&format!(".entry {k}_{dt}(")), "{k}_{dt} missing");
            }
        }
    }

    /// The `.entry` functions of a PTX text: (name, body up to the next entry).
    fn ptx_entries(ptx: &str) -> Vec<(&str, &str)> {
        let starts: Vec<usize> = ptx.match_indices(".entry ").map(|(i, _)| i).collect();
        starts
            .iter()
            .enumerate()
            .map(|(k, &s)| {
                let body = &ptx[s..starts.get(k + 1).copied().unwrap_or(ptx.len())];
                let name = body[".entry ".len()..].split('(').next().unwrap_or("").trim();
                (name, body)
            })
            .collect()
    }

    /// Byte offset and text of the first instruction of `body` that touches memory other than
    /// the kernel's parameters (loads, stores, atomics, reductions, async copies).
    fn first_memory_access(body: &str) -> Option<(usize, &str)> {
        let mut off = 0;
        for line in body.split_inclusive('\n') {
            let t = line.trim_start();
            // Skip a guard predicate (`@%p1 ld.global...`).
            let ins = match t.strip_prefix('@') {
                Some(rest) => rest.split_once(char::is_whitespace).map_or("", |(_, i)| i.trim_start()),
                None => t,
            };
            let is_mem = ["ld.", "ldu.", "st.", "atom.", "red.", "cp."]
                .iter()
                .any(|p| ins.starts_with(p))
                && !ins.starts_with("ld.param");
            if is_mem {
                return Some((off, ins.trim_end()));
            }
            off += line.len();
        }
        None
    }

    /// The `COLL_ST_*` / `COLL_OPS_*` defines of the kernel file match layout.rs.
    #[test]
    fn kernel_defines_match_layout() {
        let src = kernels::source("collectives").unwrap().source;
        let defs = [
            ("COLL_ST_LAM_IDX", layout::ST_LAM_IDX),
            ("COLL_ST_LAM_ARRIVE", layout::ST_LAM_ARRIVE),
            ("COLL_ST_LAM_USED", layout::ST_LAM_USED),
            ("COLL_ST_RING_SEQ", layout::ST_RING_SEQ),
            ("COLL_ST_RING_ARRIVE", layout::ST_RING_ARRIVE),
            ("COLL_ST_PULL_DONE", layout::ST_PULL_DONE),
            ("COLL_ST_BAR_CNT", layout::ST_BAR_CNT),
            ("COLL_OPS_BAR", layout::OPS_BAR),
            ("COLL_OPS_CHECK", layout::OPS_CHECK),
            ("COLL_OPS_PULL64", layout::OPS_PULL64),
            ("COLL_MAXW", layout::MAX_WORLD),
            ("COLL_MAX_THREADS", plan::MAX_THREADS as usize),
            ("COLL_ST_MISMATCH", layout::ST_MISMATCH),
            ("COLL_MISMATCH_HEADER", layout::MISMATCH_HEADER as usize),
            ("COLL_MISMATCH_CHECK", layout::MISMATCH_CHECK as usize),
            ("COLL_MISMATCH_REJECTED", layout::MISMATCH_REJECTED as usize),
            ("COLL_MODE_AR", RingMode::AllReduce as usize),
            ("COLL_MODE_RS", RingMode::ReduceScatter as usize),
            ("COLL_MODE_AG", RingMode::AllGather as usize),
        ];
        for (name, value) in defs {
            let line = format!("#define {name} {value}");
            assert!(src.lines().any(|l| l.trim() == line), "kernel lacks `{line}`");
        }
        for (op, v) in ReduceOp::ALL.iter().zip(0u32..) {
            assert_eq!(kernel_op(*op), v);
        }
    }
}
