//! CUDA collectives over symmetric memory: all-reduce (Lamport one-shot, one-shot push, two-shot,
//! copy-engine pull), reduce-scatter, all-gather (SM push or copy engine) and a barrier over a
//! subset of ranks.
//!
//! A [`CudaCollectives`] belongs to one (group, device). At setup it allocates ONE symmetric
//! workspace (layout in [`layout`]) through the registered CUDA allocator, fills it and
//! rendezvouses; after that an op allocates nothing, talks to no store, never synchronises the
//! host, and only enqueues work on the caller's stream, so ops can be captured in CUDA graphs.
//! Epochs live in the workspace and are advanced by the kernels (NOTE [collectives-protocols] in
//! symm-core's `kernels/collectives.cu`).
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
//!
//! Where each part lives: every `impl CudaCollectives` block is in the file named for what it
//! does, and symm-rocm's `RocmCollectives` keeps the same files (less `typed.rs`):
//! - this file: the type, its accessors, registration, the error word and the abort, `On` (the
//!   `Launcher` that maps symm-core's `Entry` to a loaded function), and the ops that move no
//!   data ([`CudaCollectives::barrier`], [`CudaCollectives::agree_empty`],
//!   [`CudaCollectives::reject`]);
//! - `setup.rs`: building one: [`CollectivesConfig`], the kernel table it loads, the copy-engine
//!   side streams, [`CudaCollectives::new`] / [`CudaCollectives::with_config`];
//! - one file per op family: `all_reduce.rs`; `scatter_gather.rs` (reduce-scatter and
//!   all-gather); `add_rms.rs` (the all-reduce epilogues, with [`Epilogues`], the separate
//!   kernel on its own);
//! - `typed.rs`: the safe typed entries over those families' raw-address ones; `tests.rs` the
//!   PTX checks.

// No unsafe code: the entry points that take raw device addresses only declare their contract
// (`unsafe fn`, NOTE [raw-addresses]); the driver layer does the rest.
#![deny(unsafe_code)]

mod add_rms;
mod all_reduce;
mod backend;
mod scatter_gather;
mod setup;
mod typed;

// The host side of the shared kernels (arguments, workspace layout, launch plans, op
// agreement) is symm-core's, written once for every vendor.
use symm_core::coll::launch::{
    self, all_gather_at, all_reduce_at, all_reduce_mechanism, reduce_scatter_at, Entry, Launcher, ReducePtrs, Rig,
};
use symm_core::coll::registry::Registry;
use symm_core::coll::{args, check, geometry, layout, op_agree};

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use symm_core::{Allocation, DType, Device, DeviceType, Error, Group, OpKind, Rank, ReduceOp, Result, SymmetricMemory};

use crate::driver::launch::{launch, launch_with, KernelArg, Launch};
use crate::driver::mem::{dtod_async, dtoh_sync, memset_d32_async};
use crate::driver::{self, bind, from_driver};
use check::{ranges_overlap, ShardGeometry};

pub use add_rms::{epilogue_threads, Epilogue, Epilogues};
pub(crate) use backend::make_collectives;
pub use geometry::{GridBudget, RingMode, Tuning};
pub use layout::WorkspaceLayout;
pub use setup::{CollectivesConfig, DEFAULT_LAMPORT_BYTES, DEFAULT_RING_SLOTS, DEFAULT_STAGING_BYTES};
pub use symm_core::coll::launch::DeviceOp;
pub use symm_core::coll::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};

use args::OpHeader;
use geometry::{ce_rs_chunks, ce_split, two_shot_shard, KernelDtype};
use layout::{peer_index, MAX_WORLD, MISMATCH_WORDS, ST_ERR_OUT, ST_MISMATCH};
use op_agree::{checked, header, Mechanism};
use setup::{CeState, KernelTable, CE_EVENTS};

/// The error the collectives' kernels latched, read from its pinned mirror (NOTE
/// [error-mirror]) without a launch, a synchronisation or clearing it: the next op (or
/// [`CudaCollectives::check_error`]) still takes it.
#[derive(Clone)]
pub struct ErrorProbe {
    mem: Arc<dyn SymmetricMemory>,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for ErrorProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorProbe").finish_non_exhaustive()
    }
}

impl ErrorProbe {
    /// The latched error, if the kernels latched one since it was last taken.
    pub fn pending(&self, what: &str) -> Option<Error> {
        let code = crate::as_cuda(self.mem.as_ref())?.error_mirror();
        symm_core::pad::code_error(code, "symm-cuda", what.to_string(), self.timeout)
    }
}

/// A kernel of symm-core's vocabulary this backend does not implement (one added after it).
fn not_here(kernel: impl std::fmt::Display) -> Error {
    launch::not_here(kernel, "symm-cuda")
}

/// Runs symm-core's planned launches ([`launch::Launch`]) on one stream of these collectives.
struct On<'a> {
    c: &'a CudaCollectives,
    stream: &'a CudaStream,
}

impl launch::Launcher for On<'_> {
    fn launch(&self, l: &launch::Launch) -> Result<()> {
        let k = &self.c.kernels;
        let f = match l.entry {
            Entry::Barrier => &k.barrier,
            Entry::Reject => &k.reject,
            Entry::Lamport(dt) => &k.lamport[dt],
            Entry::LamportWorld(dt, w, mode, op) => match &k.lamport_world {
                Some((loaded, f)) if *loaded == w => f[dt].get(mode, op),
                _ => return Err(not_here(l.entry.name())),
            },
            Entry::LamportTwoShotWorld(dt, w, op) => match &k.lamport_two_shot_world {
                Some((loaded, f)) if *loaded == w => match f[dt].get(op as usize) {
                    Some(f) => f,
                    None => return Err(not_here(l.entry.name())),
                },
                _ => return Err(not_here(l.entry.name())),
            },
            Entry::Ring(dt) => &k.ring[dt],
            Entry::ReducePtrs(dt) => &k.reduce_ptrs[dt],
            Entry::Pull(dt) => &k.pull[dt],
            Entry::PullTwoRank(dt, mode, op) => k.pull_two_rank[dt].get(mode, op),
            Entry::LamportAddRms(dt) => &k.lamport_epilogue[dt],
            Entry::LamportAddRmsWorld(dt, w) => match &k.lamport_epilogue_world {
                Some((loaded, f)) if *loaded == w => &f[dt],
                _ => return Err(not_here(l.entry.name())),
            },
            // The separate epilogue is `Epilogues`' (loaded without a workspace too).
            Entry::AddRms(dt) => &self.c.epilogues.add_rms[dt],
        };
        launch_planned(self.stream, f, l, self.c.how)
    }
}

/// Launches `f`, the function of `l.entry`, on `stream` with `l`'s grid, arguments and cluster
/// size, `how`'s programmatic dependent launch.
fn launch_planned(stream: &CudaStream, f: &CudaFunction, l: &launch::Launch, how: Launch) -> Result<()> {
    let how = Launch {
        cluster: l.cluster,
        ..how
    };
    launch_with(stream, f, cfg(l.blocks, l.threads), &l.args, how)
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

/// Per (group, device) collectives over one symmetric workspace.
pub struct CudaCollectives {
    group: Arc<Group>,
    ctx: Arc<CudaContext>,
    mem: Arc<dyn SymmetricMemory>,
    _alloc: Arc<dyn Allocation>,
    config: CollectivesConfig,
    /// What every launch's arguments are built from (symm-core's `coll::launch`): rank, world,
    /// the workspace layout and bases, every rank's workspace and pad, the wait bound, the
    /// grid budget (NOTE [co-residency]) and the diagnostic switches.
    rig: Rig,
    sm_count: u32,
    /// How the collective kernels are launched ([`CollectivesConfig::pdl`] where the device
    /// supports it); a planned launch's cluster size comes with it (`launch_planned`).
    how: Launch,
    kernels: KernelTable,
    err_word: u64,
    control: Arc<CudaStream>,
    ce: Mutex<CeState>,
    /// Allocations registered for the zero-copy kernels.
    registry: Registry,
    epilogues: Epilogues,
    /// Recorded after every op of the safe typed entries (`typed.rs`; complete while none ran):
    /// dropping these collectives waits for it, so their workspace outlives the work those ops
    /// queued.
    typed_done: cudarc::driver::CudaEvent,
}

impl std::fmt::Debug for CudaCollectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCollectives")
            .field("group", &self.group.name())
            .field("rank", &self.rig.rank)
            .field("world", &self.rig.world)
            .field("layout", &self.rig.layout)
            .finish()
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
        &self.rig.layout
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
        self.rig.grid
    }
    /// Whether the collective kernels are launched with programmatic dependent launch
    /// ([`CollectivesConfig::pdl`] and a device that supports it).
    pub fn pdl(&self) -> bool {
        self.how.pdl
    }

    /// Launches one of the collective kernels on the caller's stream, the way [`Self::pdl`] says
    /// (every such kernel starts with `symm_pdl_prologue()`, NOTE [pdl], but the fused
    /// epilogue's handoff half, which waits at its end: NOTE [pdl] "handoff").
    fn launch_coll(&self, stream: &CudaStream, f: &CudaFunction, grid: LaunchConfig, a: &[KernelArg]) -> Result<()> {
        launch_with(stream, f, grid, a, self.how)
    }
    /// Largest message (bytes) [`AllReduceKernel::Lamport`] takes (per rank's part for the
    /// reduce-scatter and all-gather Lamport kernels).
    pub fn lamport_max_bytes(&self) -> usize {
        if self.rig.world == 1 {
            usize::MAX
        } else {
            self.rig.layout.lamport_max_bytes()
        }
    }

    /// Registers a symmetric allocation of the same group for the zero-copy copy-engine paths:
    /// an input lying inside it is read by the peers in place (every rank must then pass the
    /// same offset; a mismatch latches an error). Local, not collective.
    pub fn register_symmetric(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        let device = Device::new(DeviceType::Cuda, self.ctx.ordinal() as u32);
        self.registry.register(mem, (self.rig.rank, self.rig.world), device)
    }

    /// Forgets the registered allocation whose local buffer starts at `base`; true if found.
    pub fn unregister_symmetric(&self, base: u64) -> bool {
        self.registry.unregister(base)
    }

    /// True if `bytes` at `ptr` lie inside a registered symmetric allocation (the zero-copy
    /// paths then read them in place).
    pub fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        self.registry.lookup(ptr, bytes).is_some()
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::InvalidArgument(
                "stream belongs to another CUDA context than these collectives".into(),
            ));
        }
        Ok(())
    }

    /// The launcher of symm-core's planned launches on `stream`.
    fn on<'a>(&'a self, stream: &'a CudaStream) -> On<'a> {
        On { c: self, stream }
    }

    // ------------------------------------------------------------------ barrier, errors

    /// Barrier on `stream` with the ranks listed (which must include this rank); ranks not
    /// listed do not take part. Ranks that share barriers must issue them in the same order.
    pub fn barrier(&self, stream: &CudaStream, ranks: &[Rank]) -> Result<()> {
        self.check_stream(stream)?;
        match self.rig.barrier_mask(ranks)? {
            Some(mask) => self.launch_barrier(stream, mask, 0),
            None => Ok(()),
        }
    }

    /// An op with nothing to move (`kind` over zero elements of `dtype`) still takes its place in
    /// the group's op sequence (NOTE [op-agreement]): a barrier over every rank whose check word is
    /// the op's header, so a peer that ran an op with data never pairs with it (both wait until
    /// the deadline), and ranks that all ran the same empty op stay in step.
    pub fn agree_empty(&self, stream: &CudaStream, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        self.check_stream(stream)?;
        if self.rig.world == 1 {
            return Ok(());
        }
        let hdr = header(kind, dtype, 0, reduce, Mechanism::Empty);
        let mask = self.rig.full_mask();
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
        let a = args::reject(&self.rig.common);
        self.launch_coll(stream, &self.kernels.reject, cfg(1, 64), &a)
    }

    /// A handle that reads [`Self::pending_error`] as an error (for host copies of buffers the
    /// ops wrote: a copy after a failed op must not return its stale data as `Ok`).
    pub fn error_probe(&self) -> ErrorProbe {
        ErrorProbe {
            mem: self.mem.clone(),
            timeout: std::time::Duration::from_nanos(self.rig.bound.timeout_ns),
        }
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
        let out = self.rig.ws() + (ST_ERR_OUT * 4) as u64;
        launch(
            &self.control,
            &self.kernels.take_error,
            cfg(1, 32),
            &args::take_error(self.err_word, out),
        )?;
        let mut word = [0u8; 4];
        dtoh_sync(&self.control, &mut word, out)?;
        if let Some(cuda) = crate::as_cuda(self.mem.as_ref()) {
            cuda.clear_error_mirror();
        }
        // What the kernel that latched a mismatch recorded (NOTE [op-agreement]); cleared for the
        // next error.
        let read_record = || {
            let at = self.rig.ws() + (ST_MISMATCH * 4) as u64;
            let mut raw = [0u8; MISMATCH_WORDS * 4];
            dtoh_sync(&self.control, &mut raw, at)?;
            memset_d32_async(&self.control, at, 0, MISMATCH_WORDS)?;
            Ok(raw)
        };
        op_agree::code_result(
            u32::from_le_bytes(word),
            read_record,
            (self.group.name(), self.rig.rank),
            self.config.timeout,
            driver::BACKEND,
        )
    }

    /// Sets (or clears) the abort flag: every device wait of this object gives up (latching
    /// [`Error::Aborted`]) while it is set.
    pub fn set_abort(&self, abort: bool) -> Result<()> {
        self.mem.set_abort(abort)
    }

    /// Sets the pinned host abort word alone (not the pad's ABORT word, which every kernel
    /// checks as it starts): a wait that has lasted (NOTE [host-abort-poll]) gives up, latching
    /// [`Error::Aborted`]; a kernel whose data arrives first completes. For a peer that is gone
    /// (NOTE [peer-watch]), which may have finished the ops this rank still runs. No driver call.
    pub fn abort_long_waits(&self) {
        if let Some(m) = crate::as_cuda(self.mem.as_ref()) {
            m.set_host_abort(true);
        }
    }
}

impl Drop for CudaCollectives {
    fn drop(&mut self) {
        // The safe typed entries' last op (bounded: its waits end at their deadline).
        let limit = self.config.timeout.saturating_add(crate::streams::HOST_COPY_TIMEOUT);
        if let Err(e) = crate::streams::wait_event(&self.typed_done, limit, "dropping collectives: the last typed op") {
            log::warn!("symm-cuda collectives: {e}");
        }
        // Ops in flight are bounded by their deadlines; let the side streams finish before the
        // workspace goes away (the caller's streams are the caller's to synchronise).
        if let Ok(CeState {
            streams: Some(streams), ..
        }) = self.ce.get_mut()
        {
            for s in [&streams.copies, &streams.reduced_pushes] {
                if let Err(e) = crate::streams::wait_idle(s, crate::streams::HOST_COPY_TIMEOUT, "dropping collectives")
                {
                    log::warn!("symm-cuda collectives: dropping: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
