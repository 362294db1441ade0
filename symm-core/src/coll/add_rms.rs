//! The launches of the all-reduce epilogue kernels (residual add and RMSNorm over `[rows,
//! hidden]`, NOTE [fused-epilogue] in `kernels/epilogue.cuh`), planned once for every backend
//! like the other shared kernels: the fused Lamport one-shot (`symm_lamport{,W}_add_rms_{dt}`,
//! [`Rig::fused_add_rms`]) and the separate kernel after any all-reduce (`symm_add_rms_{dt}`,
//! [`separate`], which needs no workspace: an NCCL-only communicator runs it too). An op's
//! buffers are an [`Epilogue`], checked once when built; the row layout is [`fused_geometry`]
//! (and [`epilogue_threads`], the row's block both kernels share). [`super::epilogue_check`] holds the
//! row and aliasing rules every engine checks alike.

// `Epilogue::new` declares the raw-address contract (NOTE [raw-addresses]); no unsafe block.
#![deny(unsafe_code)]

use super::epilogue_check::{Buffers, Rows, Span, MAX_ROW_VECTORS};
use crate::{Error, OpKind, ReduceOp, Result};

use super::args::{self, AddRms, LamportAddRms, RowArgs, EPI_CLUSTER, EPI_HANDOFF, EPI_NORM, EPI_SLOTS, EPI_SPREAD};
use super::geometry::{kernel_dtype, RingMode, Tuning, MAX_THREADS as COLL_MAX_THREADS};
use super::launch::{DeviceOp, Entry, Launch, Launcher, Rig, LAMPORT_WORLD_MAX, LAMPORT_WORLD_MIN};
use super::layout::{EPI_SLOTS_MAX, EPI_SPLIT_MAX_ROWS};
use super::op_agree::{header, Mechanism};

/// Most vectors of a row one thread holds (`EPI_MAXV` in epilogue.cuh).
const MAX_VECTORS_PER_THREAD: usize = 8;
/// Vectors of a row a thread holds in registers from the start (`EPI_PRE` in epilogue.cuh): the
/// handoff pair's epilogue half takes rows of at most this many a thread.
pub const PRELOADED_VECTORS: u32 = 2;
/// Most threads of an epilogue block (`COLL_MAX_THREADS`).
const MAX_THREADS: usize = COLL_MAX_THREADS as usize;
/// Most blocks of a cluster (the portable limit).
pub const MAX_CLUSTER: usize = 8;
/// Threads of a block of the fused kernel's split rows (at most: a divisor of the row's block,
/// [`fused_geometry`]).
const SPLIT_THREADS: usize = 128;
/// Most blocks one row is split into.
const MAX_PARTS: usize = 16;
/// Spread pushes: about this many vectors of a row per pushing block (a 256-thread block, one
/// vector each; measured so, round 20).
const SPREAD_VECTORS: usize = 256;
/// Most blocks that push one row.
const MAX_SPREAD: usize = 8;

const _: () = assert!(MAX_ROW_VECTORS == MAX_THREADS * MAX_VECTORS_PER_THREAD);

/// The block of one row: `(threads, vectors per thread)`, a function of the row's vector count
/// alone, so the fused and the separate kernel reduce a row's squares in the same order.
pub fn epilogue_threads(vectors_per_row: usize) -> (u32, u32) {
    let threads = vectors_per_row.div_ceil(32).max(1) * 32;
    let threads = threads.min(MAX_THREADS);
    (threads as u32, vectors_per_row.div_ceil(threads).max(1) as u32)
}

/// Whether the handoff pair (NOTE [fused-epilogue] "handoff") takes `rows` rows of
/// `vectors_per_row` 16-byte vectors with a HANDOFF buffer of `handoff_bytes` (0: the pair never
/// runs): some rows, the message within HANDOFF, and at most [`PRELOADED_VECTORS`] vectors a
/// thread in the row's block. [`Rig::fused_add_rms`] plans the pair exactly where this holds (and
/// the planner fuses there, symm-ops' `Selector::epilogue`).
pub fn handoff_fits(rows: usize, vectors_per_row: usize, handoff_bytes: usize) -> bool {
    rows > 0
        && rows
            .checked_mul(vectors_per_row)
            .and_then(|v| v.checked_mul(super::geometry::VEC_BYTES))
            .is_some_and(|b| b <= handoff_bytes)
        && epilogue_threads(vectors_per_row).1 <= PRELOADED_VECTORS
}

/// Bytes of the longest row [`handoff_fits`] takes: [`PRELOADED_VECTORS`] vectors a thread of the
/// widest row block ([`epilogue_threads`]), what symm-ops' selection table prints.
pub const fn handoff_max_row_bytes() -> usize {
    PRELOADED_VECTORS as usize * MAX_THREADS * super::geometry::VEC_BYTES
}

/// How the fused kernel lays out `rows` rows of `vectors_per_row` vectors at `world` ranks with at
/// most `blocks` blocks resident (NOTE [fused-epilogue], "split rows").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedGeometry {
    /// Blocks per row: 1 (a block takes whole rows) or more (each takes a part of one row).
    pub parts: u32,
    /// Threads of a block.
    pub threads: u32,
    /// Blocks of the launch.
    pub blocks: u32,
    /// The row's block (`epilogue_threads`), whose reduction order the split rows keep.
    pub big: u32,
    /// Vectors per thread of that block.
    pub k: u32,
    /// Cluster rows: one cluster of `parts` blocks per row (the launch's cluster size).
    pub cluster: bool,
    /// Spread pushes: whole rows of `big` threads, each row pushed by `parts` blocks (blocks 0 ..
    /// rows - 1 also receive).
    pub spread: bool,
    /// Slot rows: cluster rows' layout without a cluster, the warps' sums exchanged through
    /// tagged STATE slots.
    pub slots: bool,
}

/// The row layouts [`fused_geometry`] may choose, tried in this order: slot rows (`slots`: the
/// threads a block asks for, 0 off), cluster rows, spread pushes, split rows; whole rows
/// otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layouts {
    pub slots: u32,
    pub cluster: bool,
    pub spread: bool,
    pub split: bool,
}

/// The fused kernel's layout: rows are split while one wave of `rows x parts` blocks fits in
/// `blocks` (and rows <= [`EPI_SPLIT_MAX_ROWS`], the STATE counters), into parts of about
/// `SPLIT_THREADS` (128) vectors; each split block has a multiple of 32 threads that divides the row's
/// block (`big`), so the last block of a row can run its RMSNorm in `big`'s order. At world 1 (no
/// exchange), with `split` off ([`super::launch::Switches::epi_split`]) or with too many rows,
/// one block takes whole rows.
///
/// With `cluster` (the device has thread-block clusters and the switch is on, NOTE
/// [fused-epilogue] "cluster rows") and world > 1, a row's block of `big` threads is spread over
/// a cluster of up to [`MAX_CLUSTER`] blocks of `big / parts` threads (a multiple of 32), one
/// cluster per row, while `rows x parts` blocks fit in `blocks`; that layout comes first.
///
/// With `spread` (NOTE [fused-epilogue] "spread pushes") and world > 1, after cluster rows: whole
/// rows whose push is shared by `parts` blocks of `big` threads (about `SPREAD_VECTORS` vectors
/// each, at most `MAX_SPREAD`), while `rows x parts` blocks fit in `blocks`.
///
/// With `slots` (NOTE [fused-epilogue] "slot rows") and world > 1, before everything else: the
/// row's block of `big` threads cut into `parts` blocks of about `slots` threads (`big / parts`,
/// a multiple of 32; parts the largest divisor of big's warps within that, at least 2), while
/// `rows x parts` blocks fit in `blocks` and the rows' warps fit the STATE slots
/// ([`EPI_SLOTS_MAX`]).
pub fn fused_geometry(rows: usize, vectors_per_row: usize, world: usize, blocks: u32, allow: Layouts) -> FusedGeometry {
    let Layouts {
        slots,
        cluster,
        spread,
        split,
    } = allow;
    let (big, k) = epilogue_threads(vectors_per_row);
    let whole = FusedGeometry {
        parts: 1,
        threads: big,
        blocks: rows.min(blocks as usize).max(1) as u32,
        big,
        k,
        cluster: false,
        spread: false,
        slots: false,
    };
    let warps = big as usize / 32;
    // Cluster rows and slot rows cut the row's block into `c` blocks of whole warps: the
    // largest divisor of its warps up to `most` (at least 2) while `rows x c` blocks fit.
    let cut = |most: usize| {
        let fit = (blocks as usize / rows).min(warps).min(most);
        (2..=fit)
            .rev()
            .find(|c| warps.is_multiple_of(*c))
            .map(|c| FusedGeometry {
                parts: c as u32,
                threads: big / c as u32,
                blocks: (rows * c) as u32,
                ..whole
            })
    };
    let cut_rows = world > 1 && rows > 0;
    if slots > 0 && cut_rows && rows * warps <= EPI_SLOTS_MAX {
        if let Some(g) = cut((big as usize / (slots as usize).max(32)).max(2)) {
            return FusedGeometry { slots: true, ..g };
        }
    }
    if cluster && cut_rows {
        if let Some(g) = cut(MAX_CLUSTER) {
            return FusedGeometry { cluster: true, ..g };
        }
    }
    if spread && world > 1 && rows > 0 {
        let parts = vectors_per_row
            .div_ceil(SPREAD_VECTORS)
            .min(MAX_SPREAD)
            .min(blocks as usize / rows);
        if parts >= 2 {
            return FusedGeometry {
                parts: parts as u32,
                blocks: (rows * parts) as u32,
                spread: true,
                ..whole
            };
        }
    }
    if !split || world < 2 || rows == 0 || rows > EPI_SPLIT_MAX_ROWS {
        return whole;
    }
    // The largest multiple of 32 that divides `big` and is at most SPLIT_THREADS.
    let per = (1..=SPLIT_THREADS / 32)
        .rev()
        .find(|d| warps.is_multiple_of(*d))
        .unwrap_or(1);
    let threads = 32 * per;
    let parts = vectors_per_row
        .div_ceil(threads)
        .min(MAX_PARTS)
        .min(blocks as usize / rows);
    if parts < 2 {
        return whole;
    }
    FusedGeometry {
        parts: parts as u32,
        threads: threads as u32,
        blocks: (rows * parts) as u32,
        ..whole
    }
}

/// One epilogue op's buffers (device addresses) and parameters, checked once when built
/// ([`Epilogue::new`]: null addresses, eps, then [`Buffers::check`]), so the launches take it as
/// it is.
#[derive(Debug, Clone, Copy)]
pub struct Epilogue {
    /// The op's input: this rank's partial sums.
    x: u64,
    rows: Rows,
    residual: u64,
    residual_out: u64,
    /// `(weight, norm_out, eps)` with the RMSNorm; `None`: the residual add alone.
    norm: Option<(u64, u64, f32)>,
}

impl Epilogue {
    /// The epilogue of `rows` of partial sums at `x`: `residual_out = residual + sum`, and with
    /// `norm = Some((weight, norm_out, eps))` the RMSNorm of that into `norm_out`. Errors name
    /// `op`.
    ///
    /// # Safety
    /// NOTE [raw-addresses]: `x`, `residual`, `residual_out` and `norm_out` each hold
    /// `rows.count()` elements of `rows.dtype()` and `weight` one row (`rows.hidden()`), in
    /// device memory of the device (CUDA: the context) the ops run on, allocated and untouched
    /// by anything but those ops until the work of every op launched with this `Epilogue` has
    /// completed.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn new(
        op: &'static str,
        x: u64,
        rows: Rows,
        residual: u64,
        residual_out: u64,
        norm: Option<(u64, u64, f32)>,
    ) -> Result<Epilogue> {
        let (w, n) = norm.map_or((None, None), |(w, n, _)| (Some(w), Some(n)));
        for (what, p) in [
            ("x", Some(x)),
            ("residual", Some(residual)),
            ("residual_out", Some(residual_out)),
            ("weight", w),
            ("norm_out", n),
        ] {
            if p == Some(0) {
                return Err(Error::InvalidArgument(format!("{op}: {what} is a null device address")));
            }
        }
        if let Some((_, _, eps)) = norm {
            if !eps.is_finite() || eps < 0.0 {
                return Err(Error::InvalidArgument(format!(
                    "{op}: eps {eps} is not a finite non-negative number"
                )));
            }
        }
        let bytes = rows.bytes();
        let span = |what, addr| Span { what, addr, bytes };
        Buffers {
            x: span("x", x),
            residual: span("residual", residual),
            weight: norm.map(|(w, _, _)| Span {
                what: "weight",
                addr: w,
                bytes: rows.hidden() * rows.dtype().size(),
            }),
            residual_out: span("residual_out", residual_out),
            norm_out: norm.map(|(_, n, _)| span("norm_out", n)),
        }
        .check(op)?;
        Ok(Epilogue {
            x,
            rows,
            residual,
            residual_out,
            norm,
        })
    }

    /// The rows.
    pub fn rows(&self) -> Rows {
        self.rows
    }

    /// Whether the op runs the RMSNorm (else the residual add alone).
    pub fn has_norm(&self) -> bool {
        self.norm.is_some()
    }

    /// The arguments every epilogue kernel takes: residual, weight, residual_out, norm_out, eps,
    /// flags ([`EPI_NORM`] with the norm).
    fn add_rms(&self) -> AddRms {
        let (weight, norm_out, eps) = self.norm.unwrap_or((0, 0, 0.0));
        AddRms {
            residual: self.residual,
            weight,
            residual_out: self.residual_out,
            norm_out,
            eps,
            flags: if self.norm.is_some() { EPI_NORM } else { 0 },
        }
    }

    /// The rows, their vectors and the vectors per thread of the row's block.
    fn row_args(&self) -> RowArgs {
        let vr = self.rows.vectors_per_row();
        RowArgs {
            rows: self.rows.rows() as u64,
            vr: vr as u32,
            k: epilogue_threads(vr).1,
        }
    }
}

/// The launches of one fused epilogue op, in stream order: the one fused kernel, or the handoff
/// pair (NOTE [fused-epilogue] "handoff": the Lamport all-reduce into the HANDOFF buffer, then
/// the epilogue half, which overlaps it).
#[derive(Debug, Clone, Copy)]
pub struct FusedLaunches {
    pub first: Launch,
    /// The handoff pair's epilogue half; `None` for the one fused kernel.
    pub then: Option<Launch>,
}

impl FusedLaunches {
    /// Enqueues the launches in order on `to`.
    pub fn run(&self, to: &dyn Launcher) -> Result<()> {
        to.launch(&self.first)?;
        match &self.then {
            Some(l) => to.launch(l),
            None => Ok(()),
        }
    }
}

impl Rig {
    /// Bytes of the largest message the fused epilogue runs as the handoff pair (with
    /// [`handoff_fits`]' row rule): the HANDOFF buffer where the switch is on and the group has
    /// peers, else 0 (the pair never runs).
    pub fn handoff_bytes(&self) -> usize {
        if self.switches.epi_handoff && self.world > 1 {
            self.layout.handoff_bytes
        } else {
            0
        }
    }

    /// The fused Lamport one-shot all-reduce (sum) of `e`'s input with the epilogue applied to
    /// each row as it completes (NOTE [fused-epilogue]). One kernel: the world's own entry at
    /// 2..=8 ranks unless [`super::launch::Switches::generic_entries`], the rows laid out by
    /// [`fused_geometry`] (cluster rows only where [`Rig::clusters`] and the switch allow it)
    /// within the grid budget (every block resident, NOTE [co-residency]). With
    /// [`super::launch::Switches::epi_handoff`], rows of at most [`PRELOADED_VECTORS`] a thread
    /// and a message within the HANDOFF buffer: the handoff pair, the Lamport all-reduce as
    /// [`Rig::lamport`] plans it (`tuning`) into HANDOFF, then the fused entry's epilogue half
    /// over whole rows. `None` for zero rows (nothing to launch). Every rank passes the same
    /// mechanism in the same op order (NOTE [op-agreement]: the header carries the op, a fused op
    /// against another op latches a mismatch; the pair's all-reduce carries the fused op's
    /// header, and its data exchange is the one kernel's, so the two layouts agree).
    pub fn fused_add_rms(&self, e: &Epilogue, tuning: &Tuning) -> Result<Option<FusedLaunches>> {
        let rows = e.rows;
        let dt = kernel_dtype(rows.dtype(), "all_reduce_residual_rms_norm")?;
        let bytes = rows.bytes();
        if self.world > 1 && bytes > self.layout.lamport_max_bytes() {
            return Err(Error::OutOfRange {
                what: "fused all-reduce epilogue bytes (the Lamport buffers)",
                value: bytes as u64,
                limit: self.layout.lamport_max_bytes() as u64,
            });
        }
        if rows.rows() == 0 {
            return Ok(None);
        }
        let mech = if e.has_norm() {
            Mechanism::LamportResidualNorm
        } else {
            Mechanism::LamportResidual
        };
        let hdr = header(OpKind::AllReduce, rows.dtype(), rows.count(), Some(ReduceOp::Sum), mech);
        // The entry specialised for this world (NOTE [lamport-world-entries]).
        let entry = match self.world {
            w @ LAMPORT_WORLD_MIN..=LAMPORT_WORLD_MAX if !self.switches.generic_entries => {
                Entry::LamportAddRmsWorld(dt, w as u8)
            }
            _ => Entry::LamportAddRms(dt),
        };
        let sw = &self.switches;
        let handoff = handoff_fits(rows.rows(), rows.vectors_per_row(), self.handoff_bytes());
        // The handoff pair's epilogue half takes whole rows (every layout switch off): its
        // all-reduce, planned as any Lamport all-reduce, goes first, into HANDOFF.
        let allow = if handoff {
            Layouts::default()
        } else {
            Layouts {
                slots: sw.epi_slots,
                cluster: sw.epi_cluster && self.clusters,
                spread: sw.epi_spread,
                split: sw.epi_split,
            }
        };
        let g = fused_geometry(rows.rows(), rows.vectors_per_row(), self.world, self.grid.blocks, allow);
        let mut epilogue = e.add_rms();
        for (on, bit) in [
            (g.cluster, EPI_CLUSTER),
            (g.spread, EPI_SPREAD),
            (g.slots, EPI_SLOTS),
            (handoff, EPI_HANDOFF),
        ] {
            if on {
                epilogue.flags |= bit;
            }
        }
        let (first, input) = if handoff {
            let hand = self.direct.ws[self.rank] + self.layout.handoff_off() as u64;
            let sum = DeviceOp {
                input: e.x,
                output: hand,
                count: rows.count(),
                dtype: rows.dtype(),
                op: ReduceOp::Sum,
            };
            (Some(self.lamport(dt, RingMode::AllReduce, sum, tuning, &hdr)?), hand)
        } else {
            (None, e.x)
        };
        let f = LamportAddRms {
            input,
            rows: e.row_args(),
            parts: g.parts,
            big: g.big,
            epilogue,
        };
        let a = args::lamport_add_rms(&self.common, &self.direct, &f, &self.layout, &self.bound, &hdr);
        let mut l = Launch::new(entry, g.blocks, g.threads, &a);
        l.cluster = if g.cluster { g.parts } else { 0 };
        Ok(Some(match first {
            Some(first) => FusedLaunches { first, then: Some(l) },
            None => FusedLaunches { first: l, then: None },
        }))
    }
}

/// The separate epilogue kernel over `sum` (the all-reduced rows; may be `x`, the norm output or
/// the residual output, which the kernel reads before it writes them): whole rows per block, the
/// row's block of [`epilogue_threads`], at most `blocks` blocks (the SM count, or the grid
/// budget on a GPU shared by ranks: NOTE [co-residency], its blocks may sit resident behind the
/// all-reduce before it). Needs no workspace. `None` for zero rows.
pub fn separate(sum: u64, e: &Epilogue, blocks: u32) -> Result<Option<Launch>> {
    let dt = kernel_dtype(e.rows.dtype(), "all-reduce epilogue")?;
    if !sum.is_multiple_of(16) {
        return Err(Error::Misaligned {
            what: "all-reduced sum",
            value: sum,
            align: 16,
        });
    }
    if e.rows.rows() == 0 {
        return Ok(None);
    }
    let g = e.row_args();
    let (threads, _) = epilogue_threads(g.vr as usize);
    let a = args::add_rms(sum, &e.add_rms(), &g);
    let blocks = e.rows.rows().min(blocks as usize) as u32;
    Ok(Some(Launch::new(Entry::AddRms(dt), blocks, threads, &a)))
}

#[cfg(test)]
mod tests;
