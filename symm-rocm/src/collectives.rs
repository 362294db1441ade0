//! [`RocmCollectives`]: the collective kernels of symm-core's shared source
//! (`symm_core::kernel_source`, compiled by hiprtc with `kernels/vendor.hip.h`) on a symmetric
//! workspace, launched exactly as symm-cuda launches them: symm-core's `coll` plans every
//! launch (argument lists, workspace layout, grids, op headers, NOTE [one-planner]) and this
//! module only runs them on a HIP stream: the Lamport one-shot, the ring (one-shot, two-shot,
//! reduce-scatter, all-gather), the fused zero-copy pulls on allocations registered with
//! [`RocmCollectives::register_symmetric`] (one-shot and two-shot all-reduce, reduce-scatter,
//! all-gather), the all-reduce epilogues (the fused Lamport one and the separate kernel, NOTE
//! [fused-epilogue]), the subset barrier and the empty op's agreement. The
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
//!
//! Where each part lives, as in symm-cuda: every `impl RocmCollectives` block is in the file
//! named for what it does:
//! - this file: the type, its accessors, registration, running an op (`run`, the error word, the
//!   abort), `On` (the `Launcher` that maps symm-core's `Entry` to a loaded function), and the
//!   ops that move no data ([`RocmCollectives::barrier`], [`RocmCollectives::agree_empty`],
//!   [`RocmCollectives::reject`]);
//! - `setup.rs`: building one: [`RocmCollectivesConfig`], the kernel table it loads,
//!   [`RocmCollectives::new`];
//! - one file per op family: `all_reduce.rs`; `scatter_gather.rs` (reduce-scatter and
//!   all-gather); `add_rms.rs` (the all-reduce epilogues).

// No unsafe code: the entries that take raw device addresses only declare their contract
// (`unsafe fn`, NOTE [raw-addresses]); the driver layer does the rest.
#![deny(unsafe_code)]

mod add_rms;
mod all_reduce;
mod backend;
mod scatter_gather;
mod setup;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use backend::make_collectives;
pub use setup::RocmCollectivesConfig;
use symm_core::coll::args;
pub use symm_core::coll::launch::DeviceOp;
use symm_core::coll::launch::{mode_op_index, Entry, Launch, Launcher, Rig};
use symm_core::coll::layout::{MISMATCH_WORDS, ST_ERR_OUT, ST_MISMATCH};
use symm_core::coll::op_agree;
use symm_core::coll::registry::Registry;
use symm_core::{Allocation, DType, Device, Error, Group, OpKind, Rank, ReduceOp, Result, SymmetricMemory};

use crate::driver::runtime::{self, Stream};
use crate::symm_mem::HOST_MARGIN;
use setup::KernelTable;

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
            Entry::LamportTwoShotWorld(dt, w, op) => k
                .lamport_two_shot_world
                .as_ref()
                .filter(|(loaded, _)| *loaded == w)
                .and_then(|(_, f)| f[dt].get(op as usize))
                .ok_or_else(|| Error::InvalidArgument(format!("no {w}-rank Lamport two-shot entry for op {op}")))?,
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
        op_agree::code_result(
            u32::from_le_bytes(word),
            read_record,
            (self.group.name(), self.rig.rank),
            self.config.timeout,
            crate::driver::BACKEND,
        )
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
