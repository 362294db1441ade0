//! What a backend launches for the in-kernel mechanisms of the shared kernels, written once:
//! [`Rig`] (one rank's facts about its workspace) turns an op into [`Launch`]es (which entry,
//! what grid, which arguments), and a backend's [`Launcher`] runs each on its stream. The
//! Lamport one-shot, the ring (one-shot, two-shot as reduce-scatter then all-gather, the
//! reduce-scatter and all-gather), the fused zero-copy pulls (`pull.rs`, over a backend's
//! [`crate::coll::registry::Registry`]), the barrier and the empty op's agreement are planned
//! here for every vendor; the copy-engine paths, which need side streams and events, stay in
//! the backend that has them (symm-cuda). Nothing here allocates, so an op's path stays
//! allocation-free.

use super::kernels::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};
use std::time::Duration;

use crate::{DType, Error, OpKind, Rank, ReduceOp, Result, SymmetricMemory};

use super::arg::{KernelArg, MAX_ARGS};
use super::args::{self, Bound, Common, Direct, OpHeader};
use super::geometry::{
    kernel_dtype, kernel_op, lamport_plan, lamport_two_shot_plan, ring_plan, two_shot_shard, vec_elems, GridBudget,
    KernelDtype, LamportPlan, RingMode, Tuning,
};
use super::layout::WorkspaceLayout;
use super::op_agree::{checked, header, Mechanism};

/// The world sizes with Lamport entries of their own ([`Entry::LamportWorld`]).
pub const LAMPORT_WORLD_MIN: usize = 2;
/// See [`LAMPORT_WORLD_MIN`].
pub const LAMPORT_WORLD_MAX: usize = 8;

/// An entry point of the shared kernel source (`COLLECTIVE_ENTRIES`), as the host names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `symm_coll_barrier`.
    Barrier,
    /// `symm_coll_reject`.
    Reject,
    /// `symm_lamport_{dt}`.
    Lamport(KernelDtype),
    /// `symm_lamport{w}_{mode}_{op}_{dt}`: specialised for a world of `w` ranks
    /// ([`LAMPORT_WORLD_MIN`]..=[`LAMPORT_WORLD_MAX`]) and one (mode, kernel op) (NOTE
    /// [lamport-world-entries]).
    LamportWorld(KernelDtype, u8, RingMode, u32),
    /// `symm_lamport{w}_ar2_{op}_{dt}`: the Lamport two-shot all-reduce (NOTE
    /// [lamport-two-shot]) specialised for a world of `w` ranks ([`LAMPORT_TWO_SHOT_WORLD_MIN`]..=
    /// [`LAMPORT_WORLD_MAX`]) and one kernel op.
    LamportTwoShotWorld(KernelDtype, u8, u32),
    /// `symm_ring_{dt}`.
    Ring(KernelDtype),
    /// `symm_reduce_ptrs_{dt}`.
    ReducePtrs(KernelDtype),
    /// `symm_pull_{dt}`.
    Pull(KernelDtype),
    /// `symm_pull2_{mode}_{op}_{dt}`.
    PullTwoRank(KernelDtype, RingMode, u32),
    /// `symm_lamport_add_rms_{dt}`: the Lamport one-shot (sum) with the residual / RMSNorm
    /// epilogue fused in, any world (NOTE [fused-epilogue]).
    LamportAddRms(KernelDtype),
    /// `symm_lamport{w}_add_rms_{dt}`: its entry specialised for a world of `w` ranks
    /// ([`LAMPORT_WORLD_MIN`]..=[`LAMPORT_WORLD_MAX`]).
    LamportAddRmsWorld(KernelDtype, u8),
    /// `symm_add_rms_{dt}`: the epilogue alone, over an all-reduced sum.
    AddRms(KernelDtype),
}

impl Entry {
    /// The entry's name in the kernel source (one of `COLLECTIVE_ENTRIES`).
    pub fn name(&self) -> String {
        match *self {
            Entry::Barrier => "symm_coll_barrier".into(),
            Entry::Reject => "symm_coll_reject".into(),
            Entry::Lamport(dt) => format!("symm_lamport_{}", dt.suffix()),
            Entry::LamportWorld(dt, w, mode, op) => mode_op_name(&format!("lamport{w}"), dt, mode, op),
            Entry::LamportTwoShotWorld(dt, w, op) => format!("symm_lamport{w}_ar2_{}_{}", op_name(op), dt.suffix()),
            Entry::Ring(dt) => format!("symm_ring_{}", dt.suffix()),
            Entry::ReducePtrs(dt) => format!("symm_reduce_ptrs_{}", dt.suffix()),
            Entry::Pull(dt) => format!("symm_pull_{}", dt.suffix()),
            Entry::PullTwoRank(dt, mode, op) => mode_op_name("pull2", dt, mode, op),
            Entry::LamportAddRms(dt) => format!("symm_lamport_add_rms_{}", dt.suffix()),
            Entry::LamportAddRmsWorld(dt, w) => format!("symm_lamport{w}_add_rms_{}", dt.suffix()),
            Entry::AddRms(dt) => format!("symm_add_rms_{}", dt.suffix()),
        }
    }
}

fn mode_op_name(kind: &str, dt: KernelDtype, mode: RingMode, op: u32) -> String {
    let mode = match mode {
        RingMode::AllReduce => "ar",
        RingMode::ReduceScatter => "rs",
        RingMode::AllGather => return format!("symm_{kind}_ag_{}", dt.suffix()),
    };
    format!("symm_{kind}_{mode}_{}_{}", op_name(op), dt.suffix())
}

/// The entry-name part of kernel op `op` ([`super::geometry::kernel_op`]).
fn op_name(op: u32) -> &'static str {
    KERNEL_OP_NAMES.get(op as usize).copied().unwrap_or("unknown_op")
}

/// The entry-name parts of the kernel ops, in kernel-op order.
const KERNEL_OP_NAMES: [&str; 4] = ["sum", "avg", "max", "min"];

/// The smallest world with Lamport two-shot entries of its own ([`Entry::LamportTwoShotWorld`]):
/// at two ranks the two-shot moves as many bytes as the one-shot (the generic entry runs it).
pub const LAMPORT_TWO_SHOT_WORLD_MIN: usize = 3;

/// `w` for a group of `world` ranks with Lamport two-shot entries of its own
/// ([`Entry::LamportTwoShotWorld`], loaded by [`lamport_two_shot_names`]); `None` for a world
/// without them (one or two ranks: the generic entry runs it there).
pub fn lamport_two_shot_world(world: usize) -> Option<u8> {
    (LAMPORT_TWO_SHOT_WORLD_MIN..=LAMPORT_WORLD_MAX)
        .contains(&world)
        .then_some(world as u8)
}

/// The names of the Lamport two-shot entries of world `w` for one element type, in kernel-op
/// order (empty for a world without them).
pub fn lamport_two_shot_names(w: usize, dt: &str) -> Vec<String> {
    if lamport_two_shot_world(w).is_none() {
        return Vec::new();
    }
    KERNEL_OP_NAMES
        .iter()
        .map(|op| format!("symm_lamport{w}_ar2_{op}_{dt}"))
        .collect()
}

/// The kind (`"lamport{w}"`, for [`mode_op_names`]) of the Lamport entries a backend loads for
/// a group of `world` ranks, and `w`, which its [`Entry::LamportWorld`] launches name; `None`
/// for a world without them (one rank: the Lamport kernel never runs there).
pub fn lamport_world_kind(world: usize) -> Option<(u8, String)> {
    (LAMPORT_WORLD_MIN..=LAMPORT_WORLD_MAX)
        .contains(&world)
        .then(|| (world as u8, format!("lamport{world}")))
}

/// The names of the (mode, op) entries of `kind` (`"lamport{W}"` for W in 2..=8, `"pull2"`) for
/// one element type, in the order [`mode_op_index`] indexes them.
pub fn mode_op_names(kind: &str, dt: &str) -> Vec<String> {
    let mut v = Vec::with_capacity(9);
    for mode in ["ar", "rs"] {
        for op in KERNEL_OP_NAMES {
            v.push(format!("symm_{kind}_{mode}_{op}_{dt}"));
        }
    }
    v.push(format!("symm_{kind}_ag_{dt}"));
    v
}

/// Where the entry for (`mode`, kernel op `op`) lies in [`mode_op_names`] (the all-gather has
/// one entry whatever the op).
pub fn mode_op_index(mode: RingMode, op: u32) -> usize {
    match mode {
        RingMode::AllReduce => op as usize,
        RingMode::ReduceScatter => 4 + op as usize,
        RingMode::AllGather => 8,
    }
}

/// A kernel's argument list, held inline (an op's path allocates nothing).
#[derive(Debug, Clone, Copy)]
pub struct ArgList {
    args: [KernelArg; MAX_ARGS],
    len: usize,
}

impl ArgList {
    fn new(a: &[KernelArg]) -> ArgList {
        debug_assert!(a.len() <= MAX_ARGS);
        let mut args = [KernelArg::U64(0); MAX_ARGS];
        let len = a.len().min(MAX_ARGS);
        args[..len].copy_from_slice(&a[..len]);
        ArgList { args, len }
    }
}

impl std::ops::Deref for ArgList {
    type Target = [KernelArg];
    fn deref(&self) -> &[KernelArg] {
        &self.args[..self.len]
    }
}

/// One kernel launch: the entry, a one-dimensional grid, the arguments.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub entry: Entry,
    pub blocks: u32,
    pub threads: u32,
    pub args: ArgList,
    /// Blocks per thread-block cluster along x; 0: no cluster attribute. Only the fused
    /// epilogue's cluster rows set it (NOTE [fused-epilogue]), and only on a [`Rig`] whose
    /// backend reported clusters ([`Rig::clusters`]); `blocks` is then a multiple of it.
    pub cluster: u32,
}

impl Launch {
    pub(crate) fn new(entry: Entry, blocks: u32, threads: u32, args: &[KernelArg]) -> Launch {
        Launch {
            entry,
            blocks: blocks.max(1),
            threads,
            args: ArgList::new(args),
            cluster: 0,
        }
    }
}

/// One collective's operands as its kernels see them, packed once at a backend's door and
/// passed down whole: the device addresses of the input and the output (equal: in place),
/// `count` elements (an all-reduce's whole vector; a reduce-scatter's output, one rank's shard;
/// an all-gather's input, one rank's part), their dtype and the reduction. The addresses are
/// plain numbers here: what they must point at is the contract of each backend's `unsafe`
/// entry that takes them (NOTE [raw-addresses]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceOp {
    pub input: u64,
    pub output: u64,
    pub count: usize,
    pub dtype: DType,
    /// The reduction; an all-gather reduces nothing and ignores it ([`DeviceOp::gather`]).
    pub op: ReduceOp,
}

impl DeviceOp {
    /// An all-gather's operands (its reduction unused: [`ReduceOp::Sum`]).
    pub fn gather(input: u64, output: u64, count: usize, dtype: DType) -> DeviceOp {
        DeviceOp {
            input,
            output,
            count,
            dtype,
            op: ReduceOp::Sum,
        }
    }
}

/// One ring launch's operands ([`Rig::ring`], NOTE [collectives-protocols]): the mode, the
/// reduction, the input and output addresses, `total` elements of the whole vector and `shard`
/// per rank; `in_place`: an all-reduce whose input is its output (the kernel's in-place flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOp {
    pub mode: RingMode,
    pub op: ReduceOp,
    pub input: u64,
    pub output: u64,
    pub total: usize,
    pub shard: usize,
    pub in_place: bool,
}

/// One reduction over per-rank pointers ([`Rig::reduce_ptrs`]): `out[0..n] = op over ranks of
/// srcs[r][0..n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReducePtrs<'a> {
    pub op: ReduceOp,
    pub out: u64,
    pub n: usize,
    pub srcs: &'a [u64],
}

/// Runs a [`Launch`] on a backend: finds the entry's loaded function and enqueues it on the
/// stream this launcher was made for.
pub trait Launcher {
    fn launch(&self, l: &Launch) -> Result<()>;
}

/// The switches a backend passes to the kernels: diagnostics, and `epi_handoff`, a setting
/// (symm-cuda reads them from its environment table; defaults everywhere else).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Switches {
    /// Bits or'ed into the Lamport `mode` argument (`args::LAMPORT_*`).
    pub lamport_bits: u32,
    /// Bits or'ed into the ring `flags` argument (`args::RING_UNROLL1`).
    pub ring_flags: u32,
    /// Run the generic Lamport, pull and fused-epilogue entries, not the ones specialised for two
    /// ranks (Lamport, pull, fused epilogue) and for 3..=8 ranks (Lamport, fused epilogue).
    pub generic_entries: bool,
    /// The fused epilogue splits few rows across blocks (NOTE [fused-epilogue], "split rows").
    pub epi_split: bool,
    /// The fused epilogue runs cluster rows where they fit, on a device with clusters
    /// ([`Rig::clusters`]; NOTE [fused-epilogue], "cluster rows").
    pub epi_cluster: bool,
    /// The fused epilogue's rows are pushed by several blocks each (NOTE [fused-epilogue],
    /// "spread pushes").
    pub epi_spread: bool,
    /// Slot rows (NOTE [fused-epilogue], "slot rows"): 0 off, else the threads of a block, a
    /// multiple of 32 (the row's block is cut into blocks of about that many).
    pub epi_slots: u32,
    /// The fused epilogue runs as the handoff pair where its rows fit (NOTE [fused-epilogue],
    /// "handoff"): the plain Lamport all-reduce into the HANDOFF buffer, then the epilogue
    /// overlapping it. A setting, not a diagnostic: symm-cuda turns it on where the kernels launch
    /// with PDL (`SYMM_EPI_HANDOFF=0` off); the rocm engine never does (no PDL, and the half's
    /// sentinel test relies on NVIDIA's canonical NaNs: an AMD quieted sNaN can equal it).
    /// While it is on, the layout switches above apply to the rows the pair does not take.
    pub epi_handoff: bool,
}

/// One rank's facts about its collectives workspace, everything a launch's arguments are built
/// from: agreed at setup, fixed afterwards.
#[derive(Debug, Clone)]
pub struct Rig {
    pub rank: usize,
    pub world: usize,
    pub layout: WorkspaceLayout,
    pub common: Common,
    pub direct: Direct,
    pub bound: Bound,
    pub grid: GridBudget,
    pub switches: Switches,
    /// The device runs thread-block clusters (the backend reports it: CUDA on sm_90 and newer;
    /// never ROCm). [`Rig::new`] sets false; [`Rig::with_clusters`].
    pub clusters: bool,
}

/// The mechanism an all-reduce kernel runs, for its op header (`None`: not one of this
/// vocabulary's kernels a backend knows).
pub fn all_reduce_mechanism(kernel: AllReduceKernel) -> Option<Mechanism> {
    Some(match kernel {
        AllReduceKernel::Lamport => Mechanism::Lamport,
        AllReduceKernel::OneShot => Mechanism::Ring,
        AllReduceKernel::TwoShot => Mechanism::TwoShot,
        AllReduceKernel::CopyEnginePull => Mechanism::CopyEngine,
        AllReduceKernel::Pull | AllReduceKernel::PullTwoShot => Mechanism::Pull,
        AllReduceKernel::CopyEngineTwoShot => Mechanism::CeTwoShot,
        AllReduceKernel::LamportTwoShot => Mechanism::LamportTwoShot,
    })
}

/// What one rank runs for an all-reduce `kernel` (NOTE [one-planner]): with one rank every
/// kernel but the two-rank copy-engine two-shot is the ring kernel's local reduction.
pub fn all_reduce_at(kernel: AllReduceKernel, world: usize) -> AllReduceKernel {
    if world == 1 && kernel != AllReduceKernel::CopyEngineTwoShot {
        AllReduceKernel::OneShot
    } else {
        kernel
    }
}

/// As [`all_reduce_at`] for a reduce-scatter: with one rank the Lamport kernel is the ring
/// kernel's local copy (the zero-copy kernels keep their preconditions).
pub fn reduce_scatter_at(kernel: ReduceScatterKernel, world: usize) -> ReduceScatterKernel {
    if world == 1 && kernel == ReduceScatterKernel::Lamport {
        ReduceScatterKernel::Ring
    } else {
        kernel
    }
}

/// As [`all_reduce_at`] for an all-gather: with one rank every kernel is the ring's copy.
pub fn all_gather_at(kernel: AllGatherKernel, world: usize) -> AllGatherKernel {
    if world == 1 {
        AllGatherKernel::Ring
    } else {
        kernel
    }
}

/// A kernel of symm-core's vocabulary `backend` does not implement.
pub fn not_here(kernel: impl std::fmt::Display, backend: &str) -> Error {
    Error::Unavailable(format!("the {kernel} kernel is not implemented by {backend}"))
}

impl Rig {
    /// The facts of a rendezvoused workspace `mem` laid out as `layout`: this rank, every rank's
    /// workspace and pad (as mapped here), the wait bound (`timeout`, and the pinned host abort
    /// word `abort_host`, 0 for none), the grid budget and the switches.
    pub fn new(
        mem: &dyn SymmetricMemory,
        layout: WorkspaceLayout,
        timeout: Duration,
        abort_host: u64,
        grid: GridBudget,
        switches: Switches,
    ) -> Rig {
        let (rank, world) = (mem.rank().get(), mem.world_size());
        let mut direct = Direct::default();
        for (d, &b) in direct.ws.iter_mut().zip(mem.buffer_ptrs()) {
            *d = b;
        }
        for (d, &p) in direct.pads.iter_mut().zip(mem.signal_pad_ptrs()) {
            *d = p;
        }
        Rig {
            rank,
            world,
            layout,
            common: Common {
                bufs_dev: mem.buffer_ptrs_dev(),
                pads_dev: mem.signal_pad_ptrs_dev(),
                rank: rank as u32,
                world: world as u32,
            },
            direct,
            bound: Bound {
                timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
                abort_host,
            },
            grid,
            switches,
            clusters: false,
        }
    }

    /// The same facts on a device that runs thread-block clusters (`clusters`), as the backend
    /// found.
    pub fn with_clusters(mut self, clusters: bool) -> Rig {
        self.clusters = clusters;
        self
    }

    /// This rank's base of its own workspace (where the state words are).
    pub fn ws(&self) -> u64 {
        self.direct.ws.get(self.rank).copied().unwrap_or(0)
    }

    /// The barrier mask of `ranks` (which must include this rank; each of this group), or
    /// `None` when this rank is the only one (nothing to wait for).
    pub fn barrier_mask(&self, ranks: &[Rank]) -> Result<Option<u64>> {
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
        let me = 1u64 << self.rank;
        if mask & me == 0 {
            return Err(Error::InvalidArgument(format!(
                "barrier ranks {:?} do not include this rank ({})",
                ranks.iter().map(|r| r.get()).collect::<Vec<_>>(),
                self.rank
            )));
        }
        Ok((mask != me).then_some(mask))
    }

    /// One Lamport launch in `mode` of `d` (its dtype is `dt`'s); `d.count` elements per peer
    /// slot (AR: the message, RS: one shard, AG: one rank's input).
    pub fn lamport(
        &self,
        dt: KernelDtype,
        mode: RingMode,
        d: DeviceOp,
        tuning: &Tuning,
        hdr: &OpHeader,
    ) -> Result<Launch> {
        let p = lamport_plan(d.count, dt.dtype(), &self.layout, tuning, self.grid.blocks)?;
        // The entry specialised for this world and (mode, op) (NOTE [lamport-world-entries]).
        let entry = match self.world {
            w @ LAMPORT_WORLD_MIN..=LAMPORT_WORLD_MAX if !self.switches.generic_entries => {
                Entry::LamportWorld(dt, w as u8, mode, kernel_op(d.op))
            }
            _ => Entry::Lamport(dt),
        };
        Ok(self.lamport_launch(entry, &p, mode, mode as u32, d, hdr))
    }

    /// The Lamport two-shot all-reduce of `d` (NOTE [lamport-two-shot]; its dtype is `dt`'s,
    /// `d.count` the message's elements): the entry of this world where it has one, else the
    /// generic Lamport entry in `COLL_MODE_AR2`.
    pub fn lamport_two_shot(&self, dt: KernelDtype, d: DeviceOp, tuning: &Tuning, hdr: &OpHeader) -> Result<Launch> {
        let p = lamport_two_shot_plan(d.count, dt.dtype(), &self.layout, tuning, self.grid.blocks)?;
        let entry = match self.world {
            w @ LAMPORT_TWO_SHOT_WORLD_MIN..=LAMPORT_WORLD_MAX if !self.switches.generic_entries => {
                Entry::LamportTwoShotWorld(dt, w as u8, kernel_op(d.op))
            }
            _ => Entry::Lamport(dt),
        };
        Ok(self.lamport_launch(entry, &p, RingMode::AllReduce, args::MODE_AR2, d, hdr))
    }

    /// A Lamport entry's launch over `p`'s grid: `d`'s operands, the kernel mode `mode_arg`
    /// (`mode`'s number, or `COLL_MODE_AR2`) with the switches' bits.
    fn lamport_launch(
        &self,
        entry: Entry,
        p: &LamportPlan,
        mode: RingMode,
        mode_arg: u32,
        d: DeviceOp,
        hdr: &OpHeader,
    ) -> Launch {
        let mut a = args::lamport(
            &self.common,
            &self.direct,
            &args::Lamport {
                mode,
                op: kernel_op(d.op),
                input: d.input,
                output: d.output,
                count: d.count,
            },
            &self.layout,
            &self.bound,
            hdr,
        );
        a[args::LAMPORT_MODE_ARG] = KernelArg::U32(mode_arg | self.switches.lamport_bits);
        Launch::new(entry, p.blocks, p.threads, &a)
    }

    /// One ring launch (NOTE [collectives-protocols]) of `r`.
    pub fn ring(&self, dt: KernelDtype, r: &RingOp, tuning: &Tuning, hdr: &OpHeader) -> Result<Launch> {
        let RingOp {
            mode,
            op,
            input,
            output,
            total,
            shard,
            in_place,
        } = *r;
        let p = ring_plan(mode, total, shard, dt.dtype(), &self.layout, tuning, self.grid.blocks)?;
        let flags = u32::from(in_place && mode == RingMode::AllReduce && self.world > 1) | self.switches.ring_flags;
        let o = args::Ring {
            op: kernel_op(op),
            input,
            output,
            flags,
        };
        let a = args::ring(&self.common, &o, &p, &self.layout, &self.bound, hdr);
        Ok(Launch::new(Entry::Ring(dt), p.blocks(), p.threads, &a))
    }

    /// `r.out[0..r.n] = reduce over ranks s of r.srcs[s][0..r.n]`; `None` when `r.n` is 0.
    pub fn reduce_ptrs(&self, dt: KernelDtype, r: &ReducePtrs<'_>, tuning: &Tuning) -> Option<Launch> {
        let ReducePtrs { op, out, n, srcs } = *r;
        if n == 0 {
            return None;
        }
        let vectors = n.div_ceil(vec_elems(dt.dtype()));
        let threads = tuning.threads;
        let blocks = vectors
            .div_ceil(threads as usize)
            .clamp(1, self.grid.independent(tuning.blocks(self.grid.blocks), 4) as usize) as u32;
        let a = args::reduce_ptrs(self.rank as u32, self.world as u32, kernel_op(op), out, n, srcs);
        Some(Launch::new(Entry::ReducePtrs(dt), blocks, threads, &a))
    }

    /// One fused zero-copy pull (NOTE [collectives-protocols], "Fused pull"): one wave, at most
    /// one block per SM.
    pub fn pull(&self, dt: KernelDtype, p: &args::Pull, tuning: &Tuning) -> Launch {
        let vectors = p.n.div_ceil(vec_elems(dt.dtype())).max(1);
        let threads = tuning.threads;
        let blocks = vectors
            .div_ceil(threads as usize)
            .clamp(1, tuning.blocks(self.grid.blocks) as usize) as u32;
        // The state words are at the start of the workspace.
        let a = args::pull(&self.common, &self.direct, self.ws(), p, &self.bound);
        let entry = if self.world == 2 && !self.switches.generic_entries && p.dsts.is_none() {
            Entry::PullTwoRank(dt, p.mode, p.op)
        } else {
            Entry::Pull(dt)
        };
        Launch::new(entry, blocks, threads.max(64), &a)
    }

    /// The subset barrier over the ranks of `mask`; `check`: a word every rank must pass alike
    /// (0: none).
    pub fn barrier(&self, mask: u64, check: u32) -> Launch {
        Launch::new(
            Entry::Barrier,
            1,
            64,
            &args::barrier(&self.common, mask, &self.bound, check),
        )
    }

    /// Tells every peer this rank rejected its own arguments for its next op (NOTE
    /// [op-agreement]).
    pub fn reject(&self) -> Launch {
        Launch::new(Entry::Reject, 1, 64, &args::reject(&self.common))
    }

    /// Every rank's bit.
    pub fn full_mask(&self) -> u64 {
        if self.world >= 64 {
            u64::MAX
        } else {
            (1u64 << self.world) - 1
        }
    }

    /// An op with nothing to move takes its place in the group's op sequence (NOTE
    /// [op-agreement]): a barrier over every rank whose check word is the op's header, so a peer
    /// that ran an op with data never pairs with it, then a closing barrier without one (a peer
    /// leaves the first as soon as it sees this rank's epoch, and its next checked barrier would
    /// otherwise overwrite the check word this rank has not read yet). Nothing at one rank.
    pub fn agree_empty(&self, to: &dyn Launcher, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        let hdr = header(kind, dtype, 0, reduce, Mechanism::Empty);
        to.launch(&self.barrier(self.full_mask(), checked(&hdr, &[])))?;
        to.launch(&self.barrier(self.full_mask(), 0))
    }

    /// The all-reduce kernels that run in kernels alone: [`AllReduceKernel::Lamport`],
    /// [`AllReduceKernel::LamportTwoShot`] (NOTE [lamport-two-shot]),
    /// [`AllReduceKernel::OneShot`] (the ring over the whole message) and
    /// [`AllReduceKernel::TwoShot`] (ring reduce-scatter into this rank's shard of the output,
    /// then ring all-gather in place), on buffers [`super::check::all_reduce`] accepted. `kernel`
    /// is what runs at this world size ([`all_reduce_at`]); any other is refused.
    pub fn all_reduce(&self, to: &dyn Launcher, kernel: AllReduceKernel, tuning: &Tuning, d: DeviceOp) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        let dt = kernel_dtype(dtype, "all_reduce")?;
        let mech = all_reduce_mechanism(kernel).ok_or_else(|| not_here(kernel, "symm-core's launch plans"))?;
        let hdr = &header(OpKind::AllReduce, dtype, count, Some(op), mech);
        match kernel {
            AllReduceKernel::Lamport => to.launch(&self.lamport(dt, RingMode::AllReduce, d, tuning, hdr)?),
            AllReduceKernel::LamportTwoShot => to.launch(&self.lamport_two_shot(dt, d, tuning, hdr)?),
            AllReduceKernel::OneShot => {
                let r = RingOp {
                    mode: RingMode::AllReduce,
                    op,
                    input,
                    output,
                    total: count,
                    shard: count,
                    in_place: input == output,
                };
                to.launch(&self.ring(dt, &r, tuning, hdr)?)
            }
            AllReduceKernel::TwoShot => {
                let q = two_shot_shard(count, self.world, dtype);
                let my_out = output + (self.rank * q * dtype.size()) as u64;
                let rs = RingOp {
                    mode: RingMode::ReduceScatter,
                    op,
                    input,
                    output: my_out,
                    total: count,
                    shard: q,
                    in_place: false,
                };
                to.launch(&self.ring(dt, &rs, tuning, hdr)?)?;
                let ag = RingOp {
                    mode: RingMode::AllGather,
                    input: my_out,
                    output,
                    ..rs
                };
                to.launch(&self.ring(dt, &ag, tuning, hdr)?)
            }
            k => Err(not_here(k, "symm-core's in-kernel launch plans")),
        }
    }

    /// The in-kernel reduce-scatters ([`ReduceScatterKernel::Lamport`],
    /// [`ReduceScatterKernel::Ring`]) on buffers [`super::check::reduce_scatter`] accepted.
    pub fn reduce_scatter(
        &self,
        to: &dyn Launcher,
        kernel: ReduceScatterKernel,
        tuning: &Tuning,
        d: DeviceOp,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        let dt = kernel_dtype(dtype, "reduce_scatter")?;
        match kernel {
            ReduceScatterKernel::Lamport => {
                let hdr = &header(OpKind::ReduceScatter, dtype, count, Some(op), Mechanism::Lamport);
                to.launch(&self.lamport(dt, RingMode::ReduceScatter, d, tuning, hdr)?)
            }
            ReduceScatterKernel::Ring => {
                let hdr = &header(OpKind::ReduceScatter, dtype, count, Some(op), Mechanism::Ring);
                let r = RingOp {
                    mode: RingMode::ReduceScatter,
                    op,
                    input,
                    output,
                    total: count * self.world,
                    shard: count,
                    in_place: false,
                };
                to.launch(&self.ring(dt, &r, tuning, hdr)?)
            }
            k => Err(not_here(k, "symm-core's in-kernel launch plans")),
        }
    }

    /// The in-kernel all-gathers ([`AllGatherKernel::Lamport`], [`AllGatherKernel::Ring`]) on
    /// buffers [`super::check::all_gather`] accepted; `dt` the lanes it returned. `d.op` is
    /// not used.
    pub fn all_gather(
        &self,
        to: &dyn Launcher,
        kernel: AllGatherKernel,
        tuning: &Tuning,
        dt: KernelDtype,
        d: DeviceOp,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            ..
        } = d;
        match kernel {
            AllGatherKernel::Lamport => {
                let hdr = &header(OpKind::AllGather, dtype, count, None, Mechanism::Lamport);
                let dt = kernel_dtype(dtype, "the Lamport all-gather (f32, f16, bf16)")?;
                let d = DeviceOp::gather(input, output, count, dtype);
                to.launch(&self.lamport(dt, RingMode::AllGather, d, tuning, hdr)?)
            }
            AllGatherKernel::Ring => {
                let hdr = &header(OpKind::AllGather, dtype, count, None, Mechanism::Ring);
                let r = RingOp {
                    mode: RingMode::AllGather,
                    op: ReduceOp::Sum,
                    input,
                    output,
                    total: count * self.world,
                    shard: count,
                    in_place: false,
                };
                to.launch(&self.ring(dt, &r, tuning, hdr)?)
            }
            k => Err(not_here(k, "symm-core's in-kernel launch plans")),
        }
    }
}

mod pull;
#[cfg(test)]
pub(crate) mod tests;
