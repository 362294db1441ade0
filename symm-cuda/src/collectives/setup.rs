//! Setting a [`CudaCollectives`] up: its configuration ([`CollectivesConfig`] and the default
//! sizes), the tables of kernels it loads, the copy-engine paths' side streams and events, and
//! [`CudaCollectives::new`] / [`CudaCollectives::with_config`], which lay out, allocate, fill and
//! rendezvous the workspace and load the kernels.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream};
use symm_core::{get_allocator, Device, DeviceType, Error, Group, Result};

use super::geometry::PerDtype;
use super::{args, cfg, CudaCollectives, Epilogues, GridBudget, RingMode, Tuning, WorkspaceLayout};
use crate::driver::launch::{launch, Launch};
use crate::driver::{self, bind, from_driver};
use crate::{kernels, knobs};
use symm_core::coll::launch::{
    lamport_two_shot_names, lamport_two_shot_world, lamport_world_kind, mode_op_index, mode_op_names, Rig,
};
use symm_core::coll::registry::Registry;

pub use symm_core::coll::layout::{DEFAULT_LAMPORT_BYTES, DEFAULT_RING_SLOTS, DEFAULT_STAGING_BYTES};

/// Copy-engine all-reduce scratch slots (events per kind).
pub(super) const CE_EVENTS: usize = 16;

/// Setup parameters of a [`CudaCollectives`]; every rank must pass equal values.
///
/// Built with [`CollectivesConfig::new`] and field assignment (the struct is
/// `#[non_exhaustive]`: fields may be added). No `Default`: the bound of the device waits has no
/// value that suits every caller (symm-ops passes the group's timeout).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
    /// Launch the collective kernels with programmatic dependent launch (NOTE [pdl] in
    /// symm-core's `kernels/common.cuh`): a kernel may be scheduled while the kernel ahead of it on the
    /// stream is still running, and waits on the device for it, which hides most of the launch
    /// latency of back-to-back kernels. Applies on compute capability 9.0 or newer only.
    /// Default: on, unless `SYMM_PDL=0` is in the environment ([`knobs::pdl`]); 2 x H200
    /// passed every distinct-GPU suite with it and ran 0.84-0.99 of the time without it
    /// (graph replay; symm-ops/bench-notes.md, round 14).
    pub pdl: bool,
}

impl CollectivesConfig {
    /// `staging_bytes` of staging, device waits bounded by `timeout`, everything else the
    /// defaults: the Lamport buffers by world size, [`DEFAULT_RING_SLOTS`], [`Tuning::default`]
    /// and programmatic dependent launch unless `SYMM_PDL=0`.
    pub fn new(staging_bytes: usize, timeout: Duration) -> Self {
        CollectivesConfig {
            staging_bytes,
            lamport_bytes: None,
            ring_slots: DEFAULT_RING_SLOTS,
            timeout,
            tuning: Tuning::default(),
            pdl: knobs::pdl(),
        }
    }
}

/// The collective kernels of one object, loaded at setup (the module is cached per context by
/// `kernels::load`; every function is loaded here, NOTE [co-residency]). Entries
/// compiled per element type are [`PerDtype`] tables, indexed by [`KernelDtype`] (from
/// [`super::geometry::kernel_dtype`]); the two-rank specialisations are in turn indexed by (mode,
/// op) ([`ModeOpEntries`]).
pub(super) struct KernelTable {
    /// `symm_lamport_{dt}`: the Lamport one-shot (data as flag), any world, mode and op.
    pub(super) lamport: PerDtype<CudaFunction>,
    /// `symm_lamport{w}_{mode}_{op}_{dt}` for this object's world `w` (2..=8, else `None`): the
    /// Lamport entries specialised for it and one (mode, op), which avoid the generic kernel's
    /// register spills and instruction-cache misses (NOTE [lamport-world-entries]).
    pub(super) lamport_world: Option<(u8, PerDtype<ModeOpEntries>)>,
    /// `symm_lamport{w}_ar2_{op}_{dt}` for this object's world `w` (3..=8, else `None`): the
    /// Lamport two-shot all-reduce (NOTE [lamport-two-shot]), one entry per kernel op in
    /// kernel-op order.
    pub(super) lamport_two_shot_world: Option<(u8, PerDtype<Vec<CudaFunction>>)>,
    /// `symm_ring_{dt}`: the chunked ring (one-shot, two-shot, ring reduce-scatter, SM
    /// all-gather).
    pub(super) ring: PerDtype<CudaFunction>,
    /// `symm_reduce_ptrs_{dt}`: reduces a list of sources into an output (the copy-engine paths).
    pub(super) reduce_ptrs: PerDtype<CudaFunction>,
    /// `symm_pull_{dt}`: the fused zero-copy pull, any world, mode and op.
    pub(super) pull: PerDtype<CudaFunction>,
    /// `symm_pull2_{mode}_{op}_{dt}`: the pull entries specialised for two ranks and one (mode,
    /// op).
    pub(super) pull_two_rank: PerDtype<ModeOpEntries>,
    /// `symm_lamport_add_rms_{dt}`: the Lamport one-shot with the residual / RMSNorm epilogue
    /// (NOTE [fused-epilogue]; [`Epilogues`] loads the separate `symm_add_rms_{dt}`).
    pub(super) lamport_epilogue: PerDtype<CudaFunction>,
    /// `symm_lamport{w}_add_rms_{dt}`: its entry for this object's world `w` (2..=8).
    pub(super) lamport_epilogue_world: Option<(u8, PerDtype<CudaFunction>)>,
    /// `symm_coll_barrier`: the (subset) barrier, with an optional check word.
    pub(super) barrier: CudaFunction,
    /// `symm_coll_reject`: tells every peer this rank rejected its op (NOTE [op-agreement]).
    pub(super) reject: CudaFunction,
    /// `symm_coll_take_error`: reads and clears the latched error.
    pub(super) take_error: CudaFunction,
}

/// The copy-engine paths' side streams and events.
pub(super) struct CeState {
    /// `None` on a device shared by ranks: the copies run on the op's own stream there (NOTE
    /// [stream-budget]).
    pub(super) streams: Option<CeStreams>,
    pub(super) fork: CudaEvent,
    pub(super) join: CudaEvent,
    pub(super) copied: Vec<CudaEvent>,
    pub(super) reduced: Vec<CudaEvent>,
}

/// The two side streams of the copy-engine paths.
pub(super) struct CeStreams {
    /// Every copy-engine path's copies: the all-gather's pushes into the peers' outputs (or its
    /// pulls, or its staged rounds), the copy-engine all-reduce's pulls into scratch, and the
    /// pulls of the pipelined copy-engine reduce-scatter and two-shot.
    pub(super) copies: Arc<CudaStream>,
    /// The copy-engine two-shot's pushes of each reduced chunk into the peer's output, while
    /// [`Self::copies`] pulls the chunks after it.
    pub(super) reduced_pushes: Arc<CudaStream>,
}

impl CeState {
    /// The stream the copies of an op on `op` run on ([`CeStreams::copies`]).
    pub(super) fn copy_stream<'a>(&'a self, op: &'a CudaStream) -> &'a CudaStream {
        self.streams.as_ref().map_or(op, |s| &*s.copies)
    }
    /// The stream the copy-engine two-shot pushes its reduced chunks on, for an op on `op`
    /// ([`CeStreams::reduced_pushes`]).
    pub(super) fn reduced_push_stream<'a>(&'a self, op: &'a CudaStream) -> &'a CudaStream {
        self.streams.as_ref().map_or(op, |s| &*s.reduced_pushes)
    }
}

/// The (mode, op) entries of one kernel kind (a world's Lamport, the two-rank pull) and element
/// type, one per (mode, reduce op) in
/// [`mode_op_index`] order: all-reduce sum / avg / max / min, reduce-scatter sum / avg / max /
/// min, all-gather (`COLL_MODE_OP_ENTRIES` in the kernels).
pub(super) struct ModeOpEntries(Vec<CudaFunction>);

impl ModeOpEntries {
    /// The entry for `mode` and kernel op `op` ([`super::geometry::kernel_op`]; the all-gather has
    /// one entry whatever `op`).
    pub(super) fn get(&self, mode: RingMode, op: u32) -> &CudaFunction {
        &self.0[mode_op_index(mode, op)]
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
        config.tuning.validate()?;
        let layout = WorkspaceLayout::for_group(
            "world size for the CUDA collectives",
            world,
            config.staging_bytes,
            config.lamport_bytes,
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
            cluster: 0,
        };

        let collectives_src = kernels::source("collectives")?;
        let module = kernels::load(ctx, collectives_src, kernels::defines_for(collectives_src))?;
        crate::trace::install(ctx, &module)?;
        let get = |name: &str| driver::load_function(&module, name);
        let per_dtype = |kind: &str| PerDtype::try_new(|d| get(&format!("symm_{kind}_{}", d.suffix())));
        // The functions of a list of entry names, in its order.
        let listed = |names: Vec<String>| names.iter().map(|n| get(n)).collect::<Result<Vec<_>>>();
        let two_rank = |kind: &str| PerDtype::try_new(|d| listed(mode_op_names(kind, d.suffix())).map(ModeOpEntries));
        let kernels = KernelTable {
            lamport: per_dtype("lamport")?,
            lamport_world: match lamport_world_kind(world) {
                Some((w, kind)) => Some((w, two_rank(&kind)?)),
                None => None,
            },
            lamport_two_shot_world: match lamport_two_shot_world(world) {
                Some(w) => Some((
                    w,
                    PerDtype::try_new(|d| listed(lamport_two_shot_names(world, d.suffix())))?,
                )),
                None => None,
            },
            ring: per_dtype("ring")?,
            reduce_ptrs: per_dtype("reduce_ptrs")?,
            pull: per_dtype("pull")?,
            pull_two_rank: two_rank("pull2")?,
            lamport_epilogue: per_dtype("lamport_add_rms")?,
            lamport_epilogue_world: match lamport_world_kind(world) {
                Some((w, kind)) => Some((w, per_dtype(&format!("{kind}_add_rms"))?)),
                None => None,
            },
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
            streams: if cuda.device_sharers() > 1 {
                None
            } else {
                let new_stream = || ctx.new_stream().map_err(|e| from_driver(e, "cuStreamCreate"));
                Some(CeStreams {
                    copies: new_stream()?,
                    reduced_pushes: new_stream()?,
                })
            },
            fork: new_event()?,
            join: new_event()?,
            copied: (0..CE_EVENTS).map(|_| new_event()).collect::<Result<_>>()?,
            reduced: (0..CE_EVENTS).map(|_| new_event()).collect::<Result<_>>()?,
        };
        // The separate epilogue kernel waits on no peer: held to the grid budget on a shared GPU.
        let epilogues = Epilogues::load(ctx, config.pdl)?.with_max_blocks(grid.blocks);
        // The fused epilogue's cluster rows need a device with clusters (and the switch, NOTE
        // [fused-epilogue]); its handoff pair needs PDL (without it the two halves run one after
        // the other: the separate path's cost).
        let mut switches = knobs::switches();
        switches.epi_handoff &= how.pdl;
        let rig = Rig::new(mem.as_ref(), layout, config.timeout, abort_host, grid, switches)
            .with_clusters(driver::supports_clusters(ctx.cu_device())?);
        Ok(CudaCollectives {
            group: group.clone(),
            ctx: ctx.clone(),
            mem,
            _alloc: alloc,
            config,
            rig,
            sm_count,
            how,
            kernels,
            err_word,
            control,
            ce: Mutex::new(ce),
            registry: Registry::default(),
            epilogues,
            typed_done: ctx.new_event(None).map_err(|e| from_driver(e, "cuEventCreate"))?,
        })
    }
}
