//! [`Communicator`]: PyTorch's IntraNodeComm, generalised. One per group and
//! device, set up once (rendezvous, topology, persistent symmetric staging
//! buffer, engine); after that every op runs without talking to the store
//! and without allocating (except the out-of-place variants that return a
//! new result).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use symm_core::{
    detect_topology, empty_p2p, get_connectivity, DType, Device, DeviceType, Error, Group, OpKind, Rank, ReduceOp,
    Result, SymmTensor, Topology,
};

use crate::buf::{Buf, BufMut};
use crate::engine::{is_fatal, Engine, OpStream};
use crate::epilogue::{EpilogueAlgo, RmsNorm};
use crate::host::HostEngine;
use crate::kernel::KernelEngine;
use crate::ops::{NewOutput, OnStream};
use crate::select::{
    human, AllGatherAlgo, AllReduceAlgo, Bufs, EngineKind, Plan, ReduceScatterAlgo, SelectionThresholds, Selector,
};
use crate::setup::{self, PeerInfo};
use symm_core::coll::{make_collectives, CollectivesSetup, Queue};
use symm_core::watch::PeerWatch;
use symm_core::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};

mod config;
mod shorthand;

pub use config::{CommConfig, DEFAULT_STAGING_BYTES};

/// The collectives of one rank of a group on one device.
///
/// Ops take `&self` but must not run concurrently on one communicator
/// (a second concurrent op gets an error); every rank calls the same ops in
/// the same order with the same sizes. After an op fails with a timeout,
/// abort or lost peer, the communicator refuses further ops (its ranks'
/// protocol state is out of step): build a new one.
///
/// `Send + Sync`: an engine keeps it in its `Send + Sync` model structs (an `Arc` shared by
/// threads); ops from two threads at once are refused at run time, as above.
pub struct Communicator {
    group: Arc<Group>,
    device: Device,
    config: CommConfig,
    timeout: Duration,
    topology: Topology,
    same_host: bool,
    /// Ranks of the group on this rank's device, this one included (NOTE [shared-device]).
    device_sharers: usize,
    /// The watch on the peers (NOTE [peer-watch]); dropped first, which tells the peers this
    /// rank left.
    watch: PeerWatch,
    pub(crate) selector: Selector,
    /// Blocks of [`Communicator::alloc`] (dropped before the engine: fields drop in order).
    pub(crate) pool: crate::pool::Pool,
    pub(crate) engine: Arc<dyn Engine>,
    poisoned: AtomicBool,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("group", &self.group.name())
            .field("rank", &self.group.rank())
            .field("device", &self.device)
            .field("engine", &self.engine_kind())
            .field("topology", &self.topology)
            .finish()
    }
}

impl Communicator {
    /// Sets up a communicator (collective: every rank of `group` calls it).
    /// For CUDA devices the ops run on a new stream of the device's primary
    /// context; see `with_stream` to use your own.
    pub fn new(group: &Arc<Group>, device: Device, config: CommConfig) -> Result<Communicator> {
        Self::build(
            group,
            device,
            config,
            #[cfg(feature = "cuda")]
            None,
        )
    }

    /// Sets up a CUDA communicator whose ops run on `stream` (the caller's
    /// stream; every op is enqueued there, graph capture included).
    #[cfg(feature = "cuda")]
    pub fn with_stream(
        group: &Arc<Group>,
        stream: Arc<cudarc::driver::CudaStream>,
        config: CommConfig,
    ) -> Result<Communicator> {
        let device = Device::cuda(stream.context().ordinal() as u32);
        Self::build(group, device, config, Some(stream))
    }

    fn build(
        group: &Arc<Group>,
        device: Device,
        config: CommConfig,
        #[cfg(feature = "cuda")] stream: Option<Arc<cudarc::driver::CudaStream>>,
    ) -> Result<Communicator> {
        crate::link();
        if config.staging_bytes < 128 {
            return Err(Error::OutOfRange {
                what: "staging bytes (at least 128)",
                value: config.staging_bytes as u64,
                limit: 128,
            });
        }
        let timeout = config.timeout.unwrap_or_else(|| group.timeout());
        // CUDA: the stream (and so the context) first, for the device's UUID.
        #[cfg(feature = "cuda")]
        let stream = match (device.ty, stream) {
            (DeviceType::Cuda, Some(s)) => Some(s),
            (DeviceType::Cuda, None) => Some(crate::cuda::new_stream(device)?),
            _ => None,
        };
        let device_id = match device.ty {
            #[cfg(feature = "cuda")]
            DeviceType::Cuda => match &stream {
                Some(s) => crate::cuda::device_uuid(s)?,
                None => device.to_string(),
            },
            #[cfg(not(feature = "cuda"))]
            DeviceType::Cuda => {
                return Err(Error::Unavailable(
                    "CUDA devices: symm-ops was built without its `cuda` feature".into(),
                ))
            }
            _ => device.to_string(),
        };
        let me = PeerInfo {
            host: setup::host_id(),
            device_type: setup::device_type_name(device.ty),
            device_index: device.index,
            device_id,
            fingerprint: config.fingerprint(group),
        };
        let peers = setup::exchange(group, &me, timeout)?;
        setup::check_agreement(&peers, &me)?;
        let same_host = setup::same_host(&peers);
        let world = group.world_size();

        // Ranks per device (1 each unless the group shares devices, NOTE [shared-device]).
        let sharers = if same_host && device.ty != DeviceType::Host {
            let ids: Vec<String> = peers.iter().map(|p| p.device_id.clone()).collect();
            symm_core::check_device_sharing(&ids, &vec![group.options().shared_devices; world], None)?
        } else {
            vec![1; world]
        };
        let shared = sharers.iter().any(|&n| n > 1);
        let device_sharers = sharers[group.rank().get()];

        let (kind, topology) = match device.ty {
            DeviceType::Host => {
                if matches!(config.force_engine, Some(k) if k != EngineKind::Host) {
                    return Err(Error::Unavailable(format!(
                        "engine {:?} on a host device; the host backend runs the host engine",
                        config.force_engine
                    )));
                }
                if !same_host {
                    return Err(Error::NotSameHost(
                        "the host backend needs every rank on one host".into(),
                    ));
                }
                (EngineKind::Host, Topology::FullyConnected)
            }
            DeviceType::Cuda => {
                let topology = if same_host {
                    // One entry per distinct device (ranks sharing a device reach each other
                    // through its own memory). The link matrix is indexed by CUDA ordinal;
                    // ordinals that collide (per-process CUDA_VISIBLE_DEVICES) say nothing.
                    let mut distinct: Vec<(&str, usize)> = Vec::new();
                    for p in &peers {
                        if !distinct.iter().any(|(id, _)| *id == p.device_id) {
                            distinct.push((&p.device_id, p.device_index as usize));
                        }
                    }
                    let devices: Vec<usize> = distinct.iter().map(|&(_, d)| d).collect();
                    let mut sorted = devices.clone();
                    sorted.sort_unstable();
                    sorted.dedup();
                    match get_connectivity(DeviceType::Cuda, "nvlink") {
                        _ if devices.len() == 1 => Topology::FullyConnected,
                        Ok(c) if sorted.len() == devices.len() => detect_topology(&c.matrix, &devices),
                        _ => Topology::Unknown,
                    }
                } else {
                    Topology::Unknown
                };
                // Every rank must build the same engine: a rank whose own detection saw less
                // (NVML failing in one process, say) would otherwise skip the kernels' rendezvous
                // while the others wait in it. Agree on the verdict: the topology holds only if
                // every rank saw it.
                let verdict = format!("{topology:?}");
                let verdicts = group
                    .exchange(group.next_prefix("comm-topology"), timeout)?
                    .all_gather(group.rank().get(), world, verdict.as_bytes(), timeout)?;
                let topology = if verdicts.iter().all(|v| v.as_slice() == verdict.as_bytes()) {
                    topology
                } else {
                    Topology::Unknown
                };
                let kind = match config.force_engine {
                    Some(EngineKind::Host) => {
                        return Err(Error::Unavailable(
                            "the host engine on CUDA devices: use the cuda or nccl engine".into(),
                        ))
                    }
                    Some(k @ (EngineKind::Rocm | EngineKind::Kernels)) => {
                        return Err(Error::Unavailable(format!(
                            "the {k} engine on CUDA devices: use the cuda or nccl engine"
                        )))
                    }
                    Some(EngineKind::Nccl) if shared => {
                        return Err(Error::Unavailable(
                            "the nccl engine for ranks that share a GPU (NCCL refuses duplicate GPUs); \
                             use the cuda engine"
                                .into(),
                        ))
                    }
                    Some(k) => k,
                    None if same_host && topology == Topology::FullyConnected => EngineKind::Cuda,
                    None if shared => {
                        return Err(Error::Unavailable(format!(
                            "ranks share a GPU but the group's devices are not fully connected \
                             (topology {topology:?}); NCCL, the fallback, refuses duplicate GPUs"
                        )))
                    }
                    None => EngineKind::Nccl,
                };
                (kind, topology)
            }
            // ROCm and any other device type whose backend registered collectives
            // (`symm_core::coll::collectives_for`): the kernel engine (every rank on one host: the
            // peer mappings; at most `coll::layout::MAX_WORLD` ranks), by default where they are
            // registered; the generic engine serves the rest.
            // (`DeviceType` is non-exhaustive: a kind added later lands here too.)
            _ => {
                let kernels = if device.ty == DeviceType::Rocm {
                    EngineKind::Rocm
                } else {
                    EngineKind::Kernels
                };
                let (kind, topology) = match config.force_engine {
                    Some(EngineKind::Host) => (EngineKind::Host, Topology::Unknown),
                    Some(k) if k == kernels && same_host => (kernels, Topology::Unknown),
                    None if same_host
                        && symm_core::coll::has_collectives(device.ty)
                        && world <= symm_core::coll::layout::MAX_WORLD =>
                    {
                        (kernels, Topology::Unknown)
                    }
                    None => (EngineKind::Host, Topology::Unknown),
                    Some(k) => {
                        return Err(Error::Unavailable(format!(
                            "engine {k} on {} devices: they run the {kernels} engine (every rank on one host) or \
                             the host engine",
                            device.ty
                        )))
                    }
                };
                // Every rank must build the same engine: ranks linked with different backends
                // (one with this device type's collectives, one without) would otherwise meet in
                // different setups and wait there until the timeout. Agree on the choice.
                let mine = kind.to_string();
                let chosen = group.exchange(group.next_prefix("comm-engine"), timeout)?.all_gather(
                    group.rank().get(),
                    world,
                    mine.as_bytes(),
                    timeout,
                )?;
                if let Some((r, other)) = chosen.iter().enumerate().find(|(_, c)| c.as_slice() != mine.as_bytes()) {
                    return Err(Error::Mismatch {
                        what: "engine",
                        detail: format!(
                            "this rank chose the {mine} engine for {} devices, rank {r} the {} engine (are the \
                             ranks linked with the same backends?)",
                            device.ty,
                            String::from_utf8_lossy(other)
                        ),
                    });
                }
                (kind, topology)
            }
        };

        let setup = |queue| CollectivesSetup {
            group,
            device,
            device_sharers,
            staging_bytes: config.staging_bytes,
            lamport_bytes: config.lamport_bytes,
            timeout,
            pdl: config.pdl,
            queue,
        };
        let engine: Box<dyn Engine> = match kind {
            EngineKind::Host => Box::new(HostEngine::new(group, device, config.staging_bytes, timeout)?),
            #[cfg(feature = "cuda")]
            EngineKind::Cuda | EngineKind::Nccl => {
                let stream =
                    stream.ok_or_else(|| Error::InvalidArgument("internal: no stream for a CUDA engine".into()))?;
                let symm = kind == EngineKind::Cuda;
                if !symm && !config.nccl {
                    return Err(Error::Unavailable(
                        "the nccl engine with CommConfig::nccl = false: nothing could run the ops".into(),
                    ));
                }
                let coll = if symm {
                    Some(make_collectives(&setup(Queue::of(&*stream)))?)
                } else {
                    None
                };
                let side = crate::cuda::CudaSide::new(
                    group,
                    device,
                    stream,
                    &crate::cuda::CudaSetup {
                        timeout,
                        symm,
                        nccl: config.nccl,
                        no_nccl: shared.then_some("ranks of the group share a GPU (NCCL refuses duplicate GPUs)"),
                        pdl: config.pdl,
                    },
                )?;
                Box::new(KernelEngine::new(device, coll, Some(Box::new(side))))
            }
            #[cfg(not(feature = "cuda"))]
            EngineKind::Cuda | EngineKind::Nccl => {
                return Err(Error::Unavailable(
                    "symm-ops was built without its `cuda` feature".into(),
                ))
            }
            _ => {
                let coll = make_collectives(&setup(Queue::own()))?;
                let facts = coll.facts();
                if facts.stream_ordered {
                    // Only the CUDA side (cudarc streams) gives a stream-ordered backend its
                    // streams; another backend must run its ops on its own queue.
                    return Err(Error::Unavailable(format!(
                        "the {} collectives are stream-ordered, and symm-ops gives streams to CUDA's \
                         alone: a backend outside CUDA runs its ops on its own queue (CollFacts::stream_ordered \
                         false)",
                        facts.backend
                    )));
                }
                Box::new(KernelEngine::new(device, Some(coll), None))
            }
        };
        let engine: Arc<dyn Engine> = Arc::from(engine);
        // NOTE [peer-watch]: a peer that exits or drops its communicator stops the waits on it.
        let abort = Arc::downgrade(&engine);
        let watch = PeerWatch::start(
            group,
            group.next_prefix("comm-watch"),
            Box::new(move |lost| {
                if let Some(engine) = abort.upgrade() {
                    if let Err(e) = engine.abort_waits_on_lost_peer() {
                        log::debug!("symm-ops: rank {} is gone ({}); abort: {e}", lost.rank, lost.reason);
                    }
                }
            }),
        )?;
        let caps = engine.caps();
        let mut thresholds = config
            .selection
            .unwrap_or_else(|| SelectionThresholds::defaults(kind, world));
        if kind != EngineKind::Host {
            // Lamport takes what its buffers hold (the same on every rank).
            thresholds = thresholds.within_slots(world, caps.lamport_slot);
        }
        let selector = Selector {
            engine: kind,
            copy_engine: caps.copy_engine,
            fused_epilogue: caps.fused_epilogue,
            handoff_bytes: caps.handoff_bytes,
            symm: caps.symm,
            nccl: caps.nccl,
            thresholds,
            world,
            lamport_slot: caps.lamport_slot,
        };
        Ok(Communicator {
            group: group.clone(),
            device,
            config,
            timeout,
            topology,
            same_host,
            device_sharers,
            watch,
            selector,
            engine,
            pool: Default::default(),
            poisoned: AtomicBool::new(false),
        })
    }

    pub fn group(&self) -> &Arc<Group> {
        &self.group
    }
    pub fn rank(&self) -> Rank {
        self.group.rank()
    }
    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn config(&self) -> &CommConfig {
        &self.config
    }
    /// The bound on every wait of an op.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    pub fn topology(&self) -> Topology {
        self.topology
    }
    /// Whether every rank runs on this host.
    pub fn same_host(&self) -> bool {
        self.same_host
    }
    /// How many ranks of the group use this rank's device, this one included: 1 unless the
    /// group shares devices ([`symm_core::GroupOptions::shared_devices`], NOTE
    /// [shared-device]), where NCCL is off and timings say nothing about NVLink.
    pub fn device_sharers(&self) -> usize {
        self.device_sharers
    }
    /// The engine running the ops.
    pub fn engine_kind(&self) -> EngineKind {
        self.selector.engine
    }
    /// What the backend's collective kernels reported (copy engine, fused epilogue, programmatic
    /// dependent launch, Lamport slot, stream ordering); `None` where none run (the host engine,
    /// the NCCL engine).
    pub fn collective_facts(&self) -> Option<symm_core::coll::CollFacts> {
        self.engine.facts()
    }
    /// Whether NCCL is available as the fallback.
    pub fn has_nccl(&self) -> bool {
        self.selector.nccl
    }
    /// The thresholds in force.
    pub fn thresholds(&self) -> SelectionThresholds {
        self.selector.thresholds
    }

    /// The largest all-reduce (bytes) [`crate::AllReduceAlgo::LamportTwoShot`] takes here: two shards
    /// of it fit a Lamport slot (NOTE [lamport-two-shot]); 0 without the kernels' Lamport
    /// buffers (the host and NCCL engines, one rank).
    pub fn lamport_two_shot_max_bytes(&self) -> usize {
        symm_core::coll::geometry::lamport_two_shot_max_bytes(self.selector.world, self.selector.lamport_slot)
    }

    /// The stream the ops run on (CUDA engine).
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        crate::cuda::stream_of(&*self.engine)
    }

    /// Reads (and clears) an error a device wait latched (timeout, abort)
    /// since the last check; call after synchronising the stream. The host
    /// engine reports errors from the op itself, so this is always Ok there.
    pub fn check_error(&self) -> Result<()> {
        let r = self.engine.check_error().map_err(|e| self.watch.explain(e));
        if let Err(e) = &r {
            if is_fatal(e) {
                self.poisoned.store(true, Ordering::Release);
            }
        }
        r
    }

    /// The algorithm `all_reduce` picks for a payload of `bytes`.
    pub fn select_all_reduce(&self, bytes: usize) -> AllReduceAlgo {
        self.selector.all_reduce(bytes)
    }
    /// How an all-reduce epilogue of `tokens` rows of `hidden` elements of `dtype` runs
    /// ([`EpilogueAlgo::Auto`]'s choice: it depends on the row's shape, not only on the bytes,
    /// NOTE [fused-epilogue] "handoff").
    pub fn select_epilogue(&self, tokens: usize, hidden: usize, dtype: DType) -> EpilogueAlgo {
        self.selector.epilogue(tokens, hidden.saturating_mul(dtype.size()))
    }
    /// The algorithm `reduce_scatter` picks for an input of `bytes`.
    pub fn select_reduce_scatter(&self, bytes: usize) -> ReduceScatterAlgo {
        self.selector.reduce_scatter(bytes)
    }
    /// The algorithm `all_gather` picks for a gathered output of `bytes`.
    pub fn select_all_gather(&self, bytes: usize) -> AllGatherAlgo {
        self.selector.all_gather(bytes)
    }

    /// The plan `all_reduce` of `bytes` runs (the kernel, or NCCL) on buffers in registered
    /// symmetric memory (input and output, apart) when `registered`, else on any other buffers:
    /// a row of [`Self::selection_table`].
    pub fn plan_all_reduce(&self, bytes: usize, registered: bool) -> Plan<AllReduceKernel> {
        let b = Bufs {
            in_place: false,
            apart: true,
            registered: &|_| registered,
        };
        self.selector
            .plan_all_reduce(self.selector.all_reduce(bytes), bytes, &b)
    }
    /// The plan `reduce_scatter` of an input of `bytes` runs (see [`Self::plan_all_reduce`]).
    pub fn plan_reduce_scatter(&self, bytes: usize, registered: bool) -> Plan<ReduceScatterKernel> {
        self.selector
            .plan_reduce_scatter(self.selector.reduce_scatter(bytes), bytes, &|| registered)
    }
    /// The plan `all_gather` of a gathered output of `bytes` of `dtype` runs (see
    /// [`Self::plan_all_reduce`]; out of place).
    pub fn plan_all_gather(&self, bytes: usize, dtype: DType, registered: bool) -> Plan<AllGatherKernel> {
        let b = Bufs {
            in_place: false,
            apart: true,
            registered: &|_| registered,
        };
        self.selector
            .plan_all_gather(self.selector.all_gather(bytes), bytes, dtype, &b)
    }

    /// What `all_reduce` of `bytes` runs, as the selection table says: with `zero_copy`, for
    /// buffers that qualify for the zero-copy rows (registered symmetric memory, see
    /// [`AllReduceAlgo::Pull`]); without, for any other buffers.
    pub fn all_reduce_pick(&self, bytes: usize, zero_copy: bool) -> AllReduceAlgo {
        if zero_copy {
            self.selector.all_reduce(bytes)
        } else {
            self.selector.fallback_all_reduce(bytes)
        }
    }

    /// The selection table in force, as text.
    pub fn selection_table(&self) -> String {
        let header = format!(
            "symm-ops selection: group {:?}, world {}, device {}{}, engine {}{}, topology {:?}, {}, staging {}",
            self.group.name(),
            self.world_size(),
            self.device,
            if self.device_sharers > 1 {
                format!(" (shared by {} ranks)", self.device_sharers)
            } else {
                String::new()
            },
            self.selector.engine,
            if self.selector.nccl { " (nccl fallback)" } else { "" },
            self.topology,
            if self.same_host { "one host" } else { "several hosts" },
            human(self.config.staging_bytes),
        );
        let mut t = self.selector.table(&header);
        t.push_str(&self.selector.epilogue_table());
        if let Some(why) = self.engine.caps().nccl_missing {
            t.push_str(&format!("  (no nccl fallback: {why})\n"));
        }
        t
    }

    /// A symmetric tensor from the persistent pool (`alloc_id`), rendezvoused
    /// with the group, for callers who plan their buffers ahead (as
    /// torch.compile plans communication buffers): ops on it are zero-copy.
    /// Collective setup step (every rank calls it, in the same order); the
    /// same id gives the same memory once the previous tensor was dropped.
    pub fn persistent_buffer(&self, alloc_id: u64, shape: &[usize], dtype: DType) -> Result<SymmTensor> {
        let t = empty_p2p(shape, dtype, self.device, &self.group, Some(alloc_id))?;
        t.rendezvous(self.timeout)?;
        self.engine.register(&t)?;
        Ok(t)
    }

    /// Makes a rendezvoused symmetric tensor of this group known to the
    /// engine for the zero-copy copy-engine paths (CUDA; tensors from
    /// [`Self::persistent_buffer`] already are). Local, setup-time (it may
    /// allocate); a no-op on the host engine.
    pub fn register_buffer(&self, t: &SymmTensor) -> Result<()> {
        if symm_core::get_symmetric_memory(t).is_none() {
            return Err(Error::NotRendezvoused);
        }
        self.engine.register(t)
    }

    /// [`Self::register_buffer`] for a whole rendezvoused symmetric allocation of this group
    /// (for callers that manage raw allocations, e.g. the benchmark). A no-op on the host engine.
    pub fn register_memory(&self, mem: std::sync::Arc<dyn symm_core::SymmetricMemory>) -> Result<()> {
        self.engine.register_memory(mem)
    }

    /// Forgets an allocation registered with [`Self::register_memory`] (by its local base
    /// address); true if it was registered.
    pub fn unregister_memory(&self, base: u64) -> bool {
        self.engine.unregister_memory(base)
    }

    pub(crate) fn run(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Aborted(
                "an earlier op of this communicator failed (timeout, abort, lost peer or ranks that disagreed on an op); build a new one".into(),
            ));
        }
        // A peer found gone (NOTE [peer-watch]) set the abort word: what the op's waits then
        // report is named after it. An op whose data already arrived still completes.
        let r = f().map_err(|e| self.watch.explain(e));
        if let Err(e) = &r {
            // The engine's flag is taken (cleared) whatever the error.
            let told = self.engine_told_peers();
            if is_fatal(e) || told {
                self.poisoned.store(true, Ordering::Release);
            }
        }
        r
    }

    /// True when the CUDA engine told its peers it refused an op's arguments (NOTE
    /// [op-agreement]): the group is out of step.
    fn engine_told_peers(&self) -> bool {
        self.engine.take_told_peers()
    }

    /// An op with nothing to move (NOTE [op-agreement]): `None` on the host engine, whose op
    /// runs its own exchange with nothing to move; on the CUDA engine a barrier whose check
    /// word is the op's header, so it still takes its place in the group's op sequence (nothing
    /// on an nccl-only communicator).
    pub(crate) fn empty_op(
        &self,
        stream: OpStream<'_>,
        kind: OpKind,
        dtype: DType,
        reduce: Option<ReduceOp>,
    ) -> Option<Result<()>> {
        self.engine
            .runs_empty_ops()
            .then(|| self.run(|| self.engine.empty_op(stream, kind, dtype, reduce)))
    }

    /// `r`, unless it is this rank's rejection of its own arguments for an op
    /// (NOTE [op-agreement]): then the engine tells its peers ([`Engine::reject`];
    /// the engines' own refusals go the same way): on the host engine, the rejection takes the
    /// op's place in the group's sequence, so every peer's matching op fails
    /// with [`Error::Mismatch`] instead of pairing with this rank's next op;
    /// unless every rank rejected it, the communicator is poisoned. On the CUDA
    /// engine the rejection latches an error in every peer's kernels (their
    /// matching op gives up at once and `check_error` names this rank) and the
    /// communicator is poisoned, even when every rank rejected the op (the
    /// kernels cannot tell). `Unavailable` is not a rejection there: every rank
    /// decides availability alike.
    pub(crate) fn arg<T>(&self, stream: OpStream<'_>, r: Result<T>) -> Result<T> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if self.poisoned.load(Ordering::Acquire) {
            return Err(e);
        }
        // Poisoned only by what leaves the group out of step (a peer that did not reject
        // too, a timeout), not by a local refusal such as a second op at once.
        let told = self.engine.reject(stream, &e);
        if told {
            self.poisoned.store(true, Ordering::Release);
        }
        Err(e)
    }

    /// Sets (or clears) the abort word: every wait of this communicator's
    /// ops (host waits, device waits) ends with [`Error::Aborted`] while set.
    /// Not available on an nccl-only communicator.
    pub fn set_abort(&self, abort: bool) -> Result<()> {
        self.engine.set_abort(abort)
    }

    // ---- ops on the communicator's stream (bodies in ops.rs) ------------------

    pub(crate) fn check_algo(&self, algo: AllReduceAlgo) -> Result<()> {
        let ok = match algo {
            AllReduceAlgo::Nccl => self.selector.nccl,
            _ => self.selector.symm,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::Unavailable(format!(
                "{algo} all-reduce on a communicator running the {} engine{} (topology {:?}, {})",
                self.selector.engine,
                if self.selector.nccl {
                    " with nccl"
                } else {
                    " without nccl"
                },
                self.topology,
                if self.same_host { "one host" } else { "several hosts" }
            )))
        }
    }
}

// `Communicator` is `Send + Sync` (its docs); this stops the build if a field takes that away.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Communicator>();
};
