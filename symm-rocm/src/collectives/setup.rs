//! Setting a [`RocmCollectives`] up: its configuration ([`RocmCollectivesConfig`]), the table
//! of kernels it loads, and [`RocmCollectives::new`], which lays out, allocates, fills and
//! rendezvouses the workspace and loads the kernels.

#![deny(unsafe_code)]

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::coll::args;
use symm_core::coll::geometry::{GridBudget, KernelDtype, PerDtype, Tuning};
use symm_core::coll::launch::{
    lamport_two_shot_names, lamport_two_shot_world, lamport_world_kind, mode_op_names, Rig, Switches,
};
use symm_core::coll::layout::{self, WorkspaceLayout};
use symm_core::coll::registry::Registry;
use symm_core::{get_allocator, Device, DeviceType, Error, Group, Result};

use crate::driver::runtime::{self, Function, Module, Stream};
use crate::kernels;
use crate::symm_mem::HOST_MARGIN;

use super::RocmCollectives;

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
pub(super) struct KernelTable {
    pub(super) lamport: PerDtype<Function>,
    /// `symm_lamport{w}_{mode}_{op}_{dt}` for this object's world `w` (2..=8), NOTE
    /// [lamport-world-entries].
    pub(super) lamport_world: Option<(u8, PerDtype<Vec<Function>>)>,
    pub(super) ring: PerDtype<Function>,
    pub(super) pull: PerDtype<Function>,
    pub(super) pull_two_rank: PerDtype<Vec<Function>>,
    /// `symm_lamport{w}_ar2_{op}_{dt}` for this object's world `w` (3..=8, else `None`): the
    /// Lamport two-shot all-reduce (NOTE [lamport-two-shot]) in kernel-op order.
    pub(super) lamport_two_shot_world: Option<(u8, PerDtype<Vec<Function>>)>,
    pub(super) reduce_ptrs: PerDtype<Function>,
    /// `symm_lamport_add_rms_{dt}`, `symm_lamport{w}_add_rms_{dt}`: the fused all-reduce epilogue
    /// (NOTE [fused-epilogue]), generic and for this object's world (2..=8).
    pub(super) lamport_add_rms: PerDtype<Function>,
    pub(super) lamport_add_rms_world: Option<(u8, PerDtype<Function>)>,
    /// `symm_add_rms_{dt}`: the separate epilogue.
    pub(super) add_rms: PerDtype<Function>,
    pub(super) barrier: Function,
    pub(super) reject: Function,
    pub(super) take_error: Function,
    pub(super) _module: Arc<Module>,
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
        // The functions of a list of entry names, in its order.
        let listed = |names: Vec<String>| names.iter().map(|n| get(n)).collect::<Result<Vec<_>>>();
        let two_rank = |kind: &str| PerDtype::try_new(|d: KernelDtype| listed(mode_op_names(kind, d.suffix())));
        let kernels = KernelTable {
            lamport: per_dtype("lamport")?,
            lamport_world: match lamport_world_kind(world) {
                Some((w, kind)) => Some((w, two_rank(&kind)?)),
                None => None,
            },
            lamport_two_shot_world: match lamport_two_shot_world(world) {
                Some(w) => Some((
                    w,
                    PerDtype::try_new(|d: KernelDtype| listed(lamport_two_shot_names(world, d.suffix())))?,
                )),
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
}
