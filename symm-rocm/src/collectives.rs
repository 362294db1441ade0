//! [`RocmCollectives`]: the collective kernels of symm-core's shared source
//! (`symm_core::kernel_source`, compiled by hiprtc with `kernels/vendor.hip.h`) on a symmetric
//! workspace, launched exactly as symm-cuda launches them: symm-core's `coll` plans every
//! launch (argument lists, workspace layout, grids, op headers, NOTE [one-planner]) and this
//! file only runs them on a HIP stream: the Lamport one-shot, the ring (one-shot, two-shot,
//! reduce-scatter, all-gather), the fused zero-copy pulls on allocations registered with
//! [`RocmCollectives::register_symmetric`] (one-shot and two-shot all-reduce, reduce-scatter,
//! all-gather), the all-reduce epilogues (`add_rms.rs`: the fused Lamport one and the separate
//! kernel, NOTE [fused-epilogue]), the subset barrier and the empty op's agreement. The
//! copy-engine paths, which need side streams and events, are symm-cuda's only: an entry asked
//! for one refuses it ([`symm_core::Error::Unavailable`]).
//!
//! Every op is synchronous: its launches, then the `take_error` kernel, on this object's own
//! stream, waited for within the timeout plus a margin (never an unbounded synchronise); a
//! device error, a mismatch recorded by the kernels (NOTE [op-agreement]) or a wait the device
//! did not end in time is the op's error. So a caller's buffers are free again when an op
//! returns (unless its kernels did not end even after the abort: then the object is wedged,
//! refuses every later op, and the buffers stay in use until the device is idle), and the
//! caller orders its own streams around the call (synchronise before, as for any host-blocking
//! call).
//!
//! Nothing here has run on AMD hardware (no AMD GPU exists on the project's machines): what is
//! verified is that every entry compiles with hiprtc for gfx908 / gfx90a and that the launch
//! plans are the ones symm-cuda's GPU suites run (NOTE [collectives-protocols], "On ROCm").

// No unsafe code: the entries that take raw device addresses only declare their contract
// (`unsafe fn`, NOTE [raw-addresses]); the driver layer does the rest.
#![deny(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::coll::args;
pub use symm_core::coll::launch::DeviceOp;
use symm_core::coll::launch::{
    self, all_gather_at, all_reduce_at, lamport_world_kind, mode_op_index, mode_op_names, reduce_scatter_at, Entry,
    Launch, Launcher, Rig, Switches,
};
use symm_core::coll::layout::{self, WorkspaceLayout, MISMATCH_WORDS, ST_ERR_OUT, ST_MISMATCH};
use symm_core::coll::plan::{GridBudget, KernelDtype, PerDtype, Tuning};
use symm_core::coll::registry::Registry;
use symm_core::coll::{agree, check};
use symm_core::kernels::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};
use symm_core::{
    get_allocator, Allocation, DType, Device, DeviceType, Error, Group, OpKind, Rank, ReduceOp, Result, SymmetricMemory,
};

use crate::driver::runtime::{self, Function, Module, Stream};
use crate::kernels;
use crate::symm_mem::HOST_MARGIN;

/// How a [`RocmCollectives`] is built; every rank passes the same.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RocmCollectivesConfig {
    /// Bytes of the ring's staging area per peer and slot set (as symm-cuda's).
    pub staging_bytes: usize,
    /// Bytes of one Lamport slot (`None`: [`layout::lamport_bytes_for`]).
    pub lamport_bytes: Option<usize>,
    /// Ring slots (a power of two).
    pub ring_slots: usize,
    /// Every device wait's deadline (and, plus a margin, the host's wait for an op).
    pub timeout: Duration,
    /// Launch shapes (every rank the same). The defaults were measured on H100 / H200, not on
    /// AMD hardware: provisional on ROCm.
    pub tuning: Tuning,
}

impl RocmCollectivesConfig {
    pub fn new(staging_bytes: usize, timeout: Duration) -> Self {
        RocmCollectivesConfig {
            staging_bytes,
            lamport_bytes: None,
            ring_slots: layout::DEFAULT_RING_SLOTS,
            timeout,
            tuning: Tuning::default(),
        }
    }
}

/// The entries this backend launches, loaded once (indexed as symm-cuda's table).
struct KernelTable {
    lamport: PerDtype<Function>,
    /// `symm_lamport{w}_{mode}_{op}_{dt}` for this object's world `w` (2..=8), NOTE
    /// [lamport-world-entries].
    lamport_world: Option<(u8, PerDtype<Vec<Function>>)>,
    ring: PerDtype<Function>,
    pull: PerDtype<Function>,
    pull_two_rank: PerDtype<Vec<Function>>,
    reduce_ptrs: PerDtype<Function>,
    /// `symm_lamport_add_rms_{dt}`, `symm_lamport{w}_add_rms_{dt}`: the fused all-reduce epilogue
    /// (NOTE [fused-epilogue]), generic and for this object's world (2..=8).
    lamport_add_rms: PerDtype<Function>,
    lamport_add_rms_world: Option<(u8, PerDtype<Function>)>,
    /// `symm_add_rms_{dt}`: the separate epilogue.
    add_rms: PerDtype<Function>,
    barrier: Function,
    reject: Function,
    take_error: Function,
    _module: Arc<Module>,
}

/// Per (group, device) collectives over one symmetric workspace on an AMD GPU.
pub struct RocmCollectives {
    group: Arc<Group>,
    device: u32,
    mem: Arc<dyn SymmetricMemory>,
    _alloc: Arc<dyn Allocation>,
    config: RocmCollectivesConfig,
    rig: Rig,
    kernels: KernelTable,
    /// Allocations registered for the zero-copy pulls.
    registry: Registry,
    err_word: u64,
    /// The ops' stream; one op at a time (the lock).
    stream: Mutex<Stream>,
    /// Host copies of the error words.
    ctl: Stream,
    /// The abort the caller asked for ([`Self::set_abort`]), restored after an op's own abort.
    user_abort: AtomicBool,
    /// Set when a timed-out op's kernels did not end even after the abort: the abort stays set,
    /// every later op is refused, and dropping the object leaks the workspace.
    wedged: AtomicBool,
}

impl std::fmt::Debug for RocmCollectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocmCollectives")
            .field("group", &self.group.name())
            .field("rank", &self.rig.rank)
            .field("world", &self.rig.world)
            .field("device", &self.device)
            .finish()
    }
}

/// Runs symm-core's planned launches on the ops' stream, counting them.
struct On<'a> {
    k: &'a KernelTable,
    stream: &'a Stream,
    launched: Cell<usize>,
}

impl Launcher for On<'_> {
    fn launch(&self, l: &Launch) -> Result<()> {
        let k = self.k;
        let f = match l.entry {
            Entry::Barrier => &k.barrier,
            Entry::Reject => &k.reject,
            Entry::Lamport(dt) => &k.lamport[dt],
            Entry::LamportWorld(dt, w, mode, op) => k
                .lamport_world
                .as_ref()
                .filter(|(loaded, _)| *loaded == w)
                .and_then(|(_, f)| f[dt].get(mode_op_index(mode, op)))
                .ok_or_else(|| Error::InvalidArgument(format!("no {w}-rank Lamport entry for {mode:?}, op {op}")))?,
            Entry::Ring(dt) => &k.ring[dt],
            Entry::ReducePtrs(dt) => &k.reduce_ptrs[dt],
            Entry::Pull(dt) => &k.pull[dt],
            Entry::PullTwoRank(dt, mode, op) => k.pull_two_rank[dt]
                .get(mode_op_index(mode, op))
                .ok_or_else(|| Error::InvalidArgument(format!("no two-rank pull entry for {mode:?}, op {op}")))?,
            Entry::LamportAddRms(dt) => &k.lamport_add_rms[dt],
            Entry::LamportAddRmsWorld(dt, w) => k
                .lamport_add_rms_world
                .as_ref()
                .filter(|(loaded, _)| *loaded == w)
                .map(|(_, f)| &f[dt])
                .ok_or_else(|| Error::InvalidArgument(format!("no {w}-rank fused epilogue entry")))?,
            Entry::AddRms(dt) => &k.add_rms[dt],
        };
        // No thread-block clusters on AMD GPUs (the Rig never reports them here).
        if l.cluster > 1 {
            return Err(Error::Unavailable(format!(
                "{}: a launch with clusters of {} blocks on ROCm",
                l.entry.name(),
                l.cluster
            )));
        }
        f.launch(self.stream, l.blocks, l.threads, &l.args)?;
        self.launched.set(self.launched.get() + 1);
        Ok(())
    }
}

impl RocmCollectives {
    /// Collective setup: lays out, allocates, fills and rendezvouses the workspace, loads the
    /// kernels. Every rank of `group` calls it with equal `config`, each on its `device`, which
    /// `device_sharers` ranks of the group use (this one included; 1 unless the group shares
    /// devices, NOTE [shared-device]): their grids share its compute units.
    pub fn new(group: &Arc<Group>, device: u32, device_sharers: usize, config: RocmCollectivesConfig) -> Result<Self> {
        let world = group.world_size();
        let rank = group.rank().get();
        config.tuning.validate()?;
        let layout = WorkspaceLayout::for_group(
            "world size for the ROCm collectives",
            world,
            config.staging_bytes,
            config.lamport_bytes,
            config.ring_slots,
        )?;
        runtime::set_device(device)?;
        let module = kernels::load(device, &kernels::COLLECTIVES, &kernels::clock_defines()?)?;
        let get = |name: &str| module.function(name);
        let per_dtype = |kind: &str| PerDtype::try_new(|d: KernelDtype| get(&format!("symm_{kind}_{}", d.suffix())));
        let two_rank = |kind: &str| {
            PerDtype::try_new(|d: KernelDtype| {
                mode_op_names(kind, d.suffix())
                    .iter()
                    .map(|n| get(n))
                    .collect::<Result<Vec<_>>>()
            })
        };
        let kernels = KernelTable {
            lamport: per_dtype("lamport")?,
            lamport_world: match lamport_world_kind(world) {
                Some((w, kind)) => Some((w, two_rank(&kind)?)),
                None => None,
            },
            ring: per_dtype("ring")?,
            pull: per_dtype("pull")?,
            pull_two_rank: two_rank("pull2")?,
            reduce_ptrs: per_dtype("reduce_ptrs")?,
            lamport_add_rms: per_dtype("lamport_add_rms")?,
            lamport_add_rms_world: match lamport_world_kind(world) {
                Some((w, kind)) => Some((w, per_dtype(&format!("{kind}_add_rms"))?)),
                None => None,
            },
            add_rms: per_dtype("add_rms")?,
            barrier: get("symm_coll_barrier")?,
            reject: get("symm_coll_reject")?,
            take_error: get("symm_coll_take_error")?,
            _module: module.clone(),
        };
        let init = get("symm_coll_init")?;

        let alloc = get_allocator(DeviceType::Rocm)?.alloc(layout.total, Device::rocm(device), group)?;
        if alloc.size() < layout.total {
            return Err(Error::Mismatch {
                what: "workspace size",
                detail: format!("asked {} bytes, got {}", layout.total, alloc.size()),
            });
        }
        let stream = Stream::new()?;
        // Fill STATE/FLAGS with zeros and the Lamport buffers with the sentinel, and wait for it,
        // before this rank publishes its handle in the rendezvous: no peer can write here earlier.
        let ws = alloc.ptr();
        let cus = runtime::compute_units(device)?;
        init.launch(&stream, cus, 256, &args::init(ws, &layout))?;
        stream.wait(HOST_MARGIN, "initialising the collectives workspace")?;
        let mem = alloc.rendezvous(config.timeout)?;
        if mem.buffer_ptrs()[rank] != ws {
            return Err(Error::Mismatch {
                what: "workspace address",
                detail: format!("{:#x} after rendezvous, {ws:#x} before", mem.buffer_ptrs()[rank]),
            });
        }
        // Ranks sharing a device (NOTE [shared-device]) split its compute units (NOTE
        // [co-residency]); no programmatic dependent launch on HIP.
        let grid = GridBudget::new(cus, device_sharers, false)?;
        // No pinned host abort word (0): the kernels watch the pad's ABORT word, which
        // `set_abort` writes from the host on a stream of its own. No thread-block clusters
        // (`Rig::new` reports none): the fused epilogue takes whole rows.
        let rig = Rig::new(mem.as_ref(), layout, config.timeout, 0, grid, Switches::default());
        let err_word = mem.signal_pad_ptrs()[rank] + (symm_core::pad::ERROR_WORD * 4) as u64;
        Ok(RocmCollectives {
            group: group.clone(),
            device,
            mem,
            _alloc: alloc,
            config,
            rig,
            kernels,
            registry: Registry::default(),
            err_word,
            stream: Mutex::new(stream),
            ctl: Stream::new()?,
            user_abort: AtomicBool::new(false),
            wedged: AtomicBool::new(false),
        })
    }

    pub fn group(&self) -> &Arc<Group> {
        &self.group
    }

    /// The workspace's symmetric memory.
    pub fn workspace(&self) -> &Arc<dyn SymmetricMemory> {
        &self.mem
    }

    pub fn config(&self) -> &RocmCollectivesConfig {
        &self.config
    }

    /// Largest message (bytes) the Lamport kernels take (per rank's part for the
    /// reduce-scatter and all-gather).
    pub fn lamport_max_bytes(&self) -> usize {
        if self.rig.world == 1 {
            usize::MAX
        } else {
            self.rig.layout.lamport_max_bytes()
        }
    }

    /// Runs `launches` on the ops' stream, then takes the error the kernels latched: waits
    /// within the timeout plus a margin. A wait the device did not end in time is aborted (the
    /// pad's ABORT word), drained and reported as [`Error::Timeout`]; should the kernels not end
    /// even then, the abort stays set and the object is wedged (every later op refused, the
    /// workspace leaked when it drops). A refusal before anything was launched returns at once,
    /// leaving any error latched by the device for the next op.
    fn run(&self, what: &str, launches: impl FnOnce(&dyn Launcher) -> Result<()>) -> Result<()> {
        if self.wedged.load(Ordering::Acquire) {
            return Err(Error::Aborted(format!(
                "{what}: an earlier op of these ROCm collectives never ended (group {}, rank {}); build new ones",
                self.group.name(),
                self.rig.rank
            )));
        }
        runtime::set_device(self.device)?;
        let stream = self
            .stream
            .try_lock()
            .map_err(|_| Error::InvalidArgument("two ops ran at once on one set of ROCm collectives".into()))?;
        let on = On {
            k: &self.kernels,
            stream: &stream,
            launched: Cell::new(0),
        };
        let launched = launches(&on);
        if on.launched.get() == 0 {
            return launched;
        }
        let out = self.rig.ws() + (ST_ERR_OUT * 4) as u64;
        self.kernels
            .take_error
            .launch(&stream, 1, 32, &args::take_error(self.err_word, out))?;
        let timeout = self.config.timeout;
        match stream.wait(timeout.saturating_add(HOST_MARGIN), what) {
            Ok(()) => {}
            Err(Error::Timeout { .. }) => {
                self.mem.set_abort(true)?;
                if stream.wait(HOST_MARGIN, what).is_err() {
                    self.wedged.store(true, Ordering::Release);
                    return Err(Error::Timeout {
                        what: format!(
                            "{what} (group {}, rank {}): the device did not end its waits even after the abort; \
                             the abort stays set, these collectives refuse further ops, and the op's buffers \
                             stay in use until the device is idle",
                            self.group.name(),
                            self.rig.rank
                        ),
                        timeout,
                    });
                }
                self.mem.set_abort(self.user_abort.load(Ordering::Acquire))?;
                return Err(Error::Timeout {
                    what: format!("{what} (group {}, rank {})", self.group.name(), self.rig.rank),
                    timeout,
                });
            }
            Err(e) => return Err(e),
        }
        // The ERROR word is taken (and cleared) either way; a failed launch is the op's error.
        let device = self.take_error(out);
        launched?;
        device
    }

    /// The error word the `take_error` kernel copied to `out` (and cleared), decoded.
    fn take_error(&self, out: u64) -> Result<()> {
        let mut word = [0u8; 4];
        self.ctl.copy_from_device_sync(&mut word, out, HOST_MARGIN)?;
        // What the kernel that latched a mismatch recorded (NOTE [op-agreement]); cleared.
        let read_record = || {
            let at = self.rig.ws() + (ST_MISMATCH * 4) as u64;
            let mut raw = [0u8; MISMATCH_WORDS * 4];
            self.ctl.copy_from_device_sync(&mut raw, at, HOST_MARGIN)?;
            self.ctl.memset_sync(at, 0, MISMATCH_WORDS * 4, HOST_MARGIN)?;
            Ok(raw)
        };
        agree::code_result(
            u32::from_le_bytes(word),
            read_record,
            (self.group.name(), self.rig.rank),
            self.config.timeout,
            crate::driver::BACKEND,
        )
    }

    /// All-reduce of `d.count` elements from `d.input` into `d.output` (equal: in place) by
    /// `kernel`, exactly (NOTE [one-planner]): [`AllReduceKernel::Lamport`], [`AllReduceKernel::OneShot`],
    /// [`AllReduceKernel::TwoShot`], [`AllReduceKernel::Pull`] (input registered, apart from the
    /// output) or [`AllReduceKernel::PullTwoShot`] (input and output registered); a copy-engine
    /// kernel is refused, as is a zero-copy kernel whose buffers are not registered. Returns
    /// when the op is done.
    ///
    /// # Safety
    /// NOTE [raw-addresses]: `d.input` and `d.output` each hold `d.count` elements of `d.dtype`
    /// in device memory this rank's GPU can read and write, and stay allocated and untouched by
    /// anything but this op until it returns; should it return an error after launching (a
    /// timeout the device did not end), until the device has gone idle, as its kernels may
    /// still read and write them.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_reduce(&self, kernel: AllReduceKernel, d: DeviceOp) -> Result<()> {
        if check::all_reduce(d.input, d.output, d.count, d.dtype)?.is_none() {
            return self.agree_empty(OpKind::AllReduce, d.dtype, Some(d.op));
        }
        let tuning = &self.config.tuning;
        let (rig, reg) = (&self.rig, &self.registry);
        match all_reduce_at(kernel, self.rig.world) {
            k @ (AllReduceKernel::Lamport | AllReduceKernel::OneShot | AllReduceKernel::TwoShot) => {
                self.run("rocm all_reduce", |to| rig.all_reduce(to, k, tuning, d))
            }
            AllReduceKernel::Pull => self.run("rocm all_reduce (pull)", |to| rig.all_reduce_pull(to, reg, tuning, d)),
            AllReduceKernel::PullTwoShot => self.run("rocm all_reduce (two-shot pull)", |to| {
                rig.all_reduce_pull_two_shot(to, reg, tuning, d)
            }),
            k => Err(launch::not_here(k, crate::driver::BACKEND)),
        }
    }

    /// Reduce-scatter by `kernel` ([`ReduceScatterKernel::Lamport`], [`ReduceScatterKernel::Ring`]
    /// or [`ReduceScatterKernel::Pull`], the input registered): `d.input` holds `d.count * world`
    /// elements, `d.output` receives this rank's `d.count` (in place when `d.output == d.input +
    /// rank * d.count` elements).
    ///
    /// # Safety
    /// As [`Self::all_reduce`], with `d.input` holding `d.count * world` elements and `d.output`
    /// `d.count`.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn reduce_scatter(&self, kernel: ReduceScatterKernel, d: DeviceOp) -> Result<()> {
        let geometry = check::reduce_scatter(d.input, d.output, d.count, d.dtype, (self.rig.rank, self.rig.world))?;
        let Some((_, g)) = geometry else {
            return self.agree_empty(OpKind::ReduceScatter, d.dtype, Some(d.op));
        };
        let tuning = &self.config.tuning;
        let (rig, reg) = (&self.rig, &self.registry);
        match reduce_scatter_at(kernel, self.rig.world) {
            k @ (ReduceScatterKernel::Lamport | ReduceScatterKernel::Ring) => {
                self.run("rocm reduce_scatter", |to| rig.reduce_scatter(to, k, tuning, d))
            }
            ReduceScatterKernel::Pull => self.run("rocm reduce_scatter (pull)", |to| {
                rig.reduce_scatter_pull(to, reg, tuning, &g, d)
            }),
            k => Err(launch::not_here(k, crate::driver::BACKEND)),
        }
    }

    /// All-gather by `kernel` ([`AllGatherKernel::Lamport`], [`AllGatherKernel::Ring`] or
    /// [`AllGatherKernel::Pull`], the input registered or in place in a registered output):
    /// `d.input` holds `d.count` elements, `d.output` `d.count * world` (in place when `d.input`
    /// is this rank's part of `d.output`); `d.op` is not used ([`DeviceOp::gather`]).
    ///
    /// # Safety
    /// As [`Self::all_reduce`], with `d.input` holding `d.count` elements and `d.output`
    /// `d.count * world`.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_gather(&self, kernel: AllGatherKernel, d: DeviceOp) -> Result<()> {
        let Some(dt) = check::all_gather(d.input, d.output, d.count, d.dtype, (self.rig.rank, self.rig.world))? else {
            return self.agree_empty(OpKind::AllGather, d.dtype, None);
        };
        let tuning = &self.config.tuning;
        let (rig, reg) = (&self.rig, &self.registry);
        match all_gather_at(kernel, self.rig.world) {
            k @ (AllGatherKernel::Lamport | AllGatherKernel::Ring) => {
                self.run("rocm all_gather", |to| rig.all_gather(to, k, tuning, dt, d))
            }
            AllGatherKernel::Pull => self.run("rocm all_gather (pull)", |to| {
                rig.all_gather_pull(to, reg, tuning, dt, d)
            }),
            k => Err(launch::not_here(k, crate::driver::BACKEND)),
        }
    }

    /// Registers a symmetric allocation of the same group for the zero-copy pulls: an input
    /// lying inside it is read by the peers in place (every rank must then pass the same offset;
    /// a mismatch latches an error). Local, not collective.
    pub fn register_symmetric(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        self.registry
            .register(mem, (self.rig.rank, self.rig.world), Device::rocm(self.device))
    }

    /// Forgets the registered allocation whose local buffer starts at `base`; true if found.
    pub fn unregister_symmetric(&self, base: u64) -> bool {
        self.registry.unregister(base)
    }

    /// True if `bytes` at `ptr` lie inside a registered symmetric allocation.
    pub fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        self.registry.lookup(ptr, bytes).is_some()
    }

    /// Barrier with the ranks listed (which must include this rank); ranks not listed do not
    /// take part.
    pub fn barrier(&self, ranks: &[Rank]) -> Result<()> {
        match self.rig.barrier_mask(ranks)? {
            Some(mask) => self.run("rocm barrier", |to| to.launch(&self.rig.barrier(mask, 0))),
            None => Ok(()),
        }
    }

    /// An op with nothing to move still takes its place in the group's op sequence (NOTE
    /// [op-agreement]).
    pub fn agree_empty(&self, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        if self.rig.world == 1 {
            return Ok(());
        }
        self.run("rocm empty op", |to| self.rig.agree_empty(to, kind, dtype, reduce))
    }

    /// Tells every peer that this rank rejected its own arguments for its next op (NOTE
    /// [op-agreement]): each peer's matching op fails with a mismatch naming this rank. The group
    /// is out of step afterwards: build a new object.
    pub fn reject(&self) -> Result<()> {
        self.run("rocm reject", |to| to.launch(&self.rig.reject()))
    }

    /// Sets (or clears) the abort flag: every device wait of this object gives up (latching
    /// [`Error::Aborted`]) while it is set.
    pub fn set_abort(&self, abort: bool) -> Result<()> {
        self.user_abort.store(abort, Ordering::Release);
        self.mem.set_abort(abort)
    }
}

mod add_rms;
mod backend;
pub(crate) use backend::make_collectives;

impl Drop for RocmCollectives {
    fn drop(&mut self) {
        // Ops return when done, but a wedged one (or one still draining) may have kernels on the
        // stream that read and write the workspace: never free it under them.
        let busy = self.wedged.load(Ordering::Acquire)
            || match self.stream.get_mut() {
                Ok(s) => s.wait(HOST_MARGIN, "dropping ROCm collectives").is_err(),
                Err(_) => true,
            };
        if busy {
            log::warn!(
                "symm-rocm collectives (group {}, rank {}): kernels still running at drop; the workspace is leaked",
                self.group.name(),
                self.rig.rank
            );
            std::mem::forget(self.mem.clone());
            std::mem::forget(self._alloc.clone());
        }
    }
}
