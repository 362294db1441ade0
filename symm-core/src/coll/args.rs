//! Argument lists of the collective kernels, built by pure functions so a unit test can check
//! them against the parameter lists NVRTC produced (`.param` lines of each `.entry` in the PTX)
//! without a GPU. Each function mirrors one `extern "C"` signature in symm-core's `kernels/collectives.cu`.

#![forbid(unsafe_code)]

use super::arg::KernelArg;

use super::geometry::{RingMode, RingPlan};
use super::layout::{WorkspaceLayout, MAX_WORLD};

/// The first four arguments of most kernels: device arrays of the peers' buffer and pad
/// addresses, rank, world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Common {
    pub bufs_dev: u64,
    pub pads_dev: u64,
    pub rank: u32,
    pub world: u32,
}

impl Common {
    fn args(&self) -> [KernelArg; 4] {
        [
            KernelArg::U64(self.bufs_dev),
            KernelArg::U64(self.pads_dev),
            KernelArg::U32(self.rank),
            KernelArg::U32(self.world),
        ]
    }
}

/// How every wait is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub timeout_ns: u64,
    pub abort_host: u64,
}

/// `symm_coll_init(ws, zero_words, fill_off, fill_bytes)`: the fill is the sentinel over
/// [`WorkspaceLayout::sentinel_bytes`] from `lamport_off`.
pub fn init(ws: u64, layout: &WorkspaceLayout) -> [KernelArg; 4] {
    [
        KernelArg::U64(ws),
        KernelArg::U64(layout.zero_words() as u64),
        KernelArg::U64(layout.lamport_off as u64),
        KernelArg::U64(layout.sentinel_bytes() as u64),
    ]
}

/// What the Lamport and pull kernels take as plain values instead of loading it from device
/// memory: every rank's workspace base and signal pad (index = rank; unused entries 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Direct {
    pub ws: [u64; MAX_WORLD],
    pub pads: [u64; MAX_WORLD],
}

/// Arguments of the Lamport head ([`Direct::lamport_head`]).
pub(crate) const LAMPORT_HEAD: usize = 11;

impl Direct {
    /// The first arguments of every Lamport kernel (`symm_lamport*`, `symm_lamport*_add_rms_*`):
    /// the eight workspace bases, this rank's signal pad, the rank and the world size.
    pub(crate) fn lamport_head(&self, c: &Common) -> [KernelArg; LAMPORT_HEAD] {
        const _: () = assert!(MAX_WORLD == 8, "the Lamport kernels take eight workspace bases");
        let w = &self.ws;
        [
            KernelArg::U64(w[0]),
            KernelArg::U64(w[1]),
            KernelArg::U64(w[2]),
            KernelArg::U64(w[3]),
            KernelArg::U64(w[4]),
            KernelArg::U64(w[5]),
            KernelArg::U64(w[6]),
            KernelArg::U64(w[7]),
            KernelArg::U64(self.pads[c.rank as usize % MAX_WORLD]),
            KernelArg::U32(c.rank),
            KernelArg::U32(c.world),
        ]
    }
}

/// One fused zero-copy pull (`symm_pull_{dt}`): what it reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pull {
    /// `RingMode::AllReduce` / `ReduceScatter`: reduce the sources into `out` (`n` elements);
    /// `RingMode::AllGather`: source `s` to `out + s * n` elements.
    pub mode: RingMode,
    pub op: u32,
    pub out: u64,
    pub n: usize,
    /// Every rank's source (index = rank; unused entries 0).
    pub srcs: [u64; MAX_WORLD],
    /// The two-shot pull (`COLL_MODE_AR2`, with `mode` = `AllReduce`): every rank's destination
    /// of the reduced sources (index = rank); `out` is unused then.
    pub dsts: Option<[u64; MAX_WORLD]>,
    /// Barrier check word every rank must pass alike (0: none).
    pub check: u32,
}

/// Every rank's address of one range of registered symmetric memory, indexed by rank: `own` (this
/// rank's own address of the range, as its caller passed it) at `rank`, a peer's mapping
/// `peers[s] + off` at every other `s < world`, 0 past `world`.
pub fn per_rank(rank: usize, world: usize, own: u64, peers: &[u64; MAX_WORLD], off: u64) -> [u64; MAX_WORLD] {
    let mut v = [0u64; MAX_WORLD];
    for (s, a) in v.iter_mut().enumerate().take(world) {
        *a = if s == rank { own } else { peers[s] + off };
    }
    v
}

/// `COLL_MODE_AR2` in collectives.cu: the two-shot all-reduce mode of the fused pull and of the
/// Lamport kernel (NOTE [lamport-two-shot]).
pub(crate) const MODE_AR2: u32 = 3;

/// `symm_pull_{dt}(p0..p7, s0..s7, d0..d7, state, rank, world, mode, op, out, n, check,
/// timeout_ns, abort_host)`.
pub fn pull(c: &Common, d: &Direct, state: u64, p: &Pull, bound: &Bound) -> [KernelArg; 34] {
    const _: () = assert!(
        MAX_WORLD == 8,
        "the pull kernel takes eight pads, sources and destinations"
    );
    let pad = |i: usize| KernelArg::U64(d.pads[i]);
    let src = |i: usize| KernelArg::U64(p.srcs[i]);
    let dsts = p.dsts.unwrap_or([0; MAX_WORLD]);
    let dst = |i: usize| KernelArg::U64(dsts[i]);
    let mode = if p.dsts.is_some() { MODE_AR2 } else { p.mode as u32 };
    [
        pad(0),
        pad(1),
        pad(2),
        pad(3),
        pad(4),
        pad(5),
        pad(6),
        pad(7),
        src(0),
        src(1),
        src(2),
        src(3),
        src(4),
        src(5),
        src(6),
        src(7),
        dst(0),
        dst(1),
        dst(2),
        dst(3),
        dst(4),
        dst(5),
        dst(6),
        dst(7),
        KernelArg::U64(state),
        KernelArg::U32(c.rank),
        KernelArg::U32(c.world),
        KernelArg::U32(mode),
        KernelArg::U32(p.op),
        KernelArg::U64(p.out),
        KernelArg::U64(p.n as u64),
        KernelArg::U32(p.check),
        KernelArg::U64(bound.timeout_ns),
        KernelArg::U64(bound.abort_host),
    ]
}

/// An op's header as the kernels take it (`OpDescriptor::header_words`, NOTE
/// [op-agreement]): words 0-1 in the first u64 (low half first), 2-3 in the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpHeader(pub [u32; 4]);

impl OpHeader {
    pub fn args(&self) -> [KernelArg; 2] {
        let w = self.0;
        [
            KernelArg::U64(u64::from(w[0]) | (u64::from(w[1]) << 32)),
            KernelArg::U64(u64::from(w[2]) | (u64::from(w[3]) << 32)),
        ]
    }
}

/// Index of `mode` in the Lamport argument list.
pub(crate) const LAMPORT_MODE_ARG: usize = 11;
/// `COLL_LAM_ACQREL_ARRIVE`: a bit of the Lamport `mode` argument.
pub const LAMPORT_ACQREL_ARRIVE: u32 = 0x100;
/// `COLL_FLAG_UNROLL1`: a bit of the ring kernel's `flags` argument (one vector in flight per
/// thread, the order before NOTE [ring-unroll]; a measurement switch).
pub const RING_UNROLL1: u32 = 2;
/// `COLL_LAM_HOST_EVERY_THREAD`: a bit of the Lamport `mode` argument (every polling thread
/// reads the host abort word, NOTE [host-abort-poll]; a measurement switch).
pub const LAMPORT_HOST_EVERY_THREAD: u32 = 0x200;
/// Bits 16-23 of the Lamport `mode` argument: the pipeline lag (0: the kernel's default;
/// `COLL_LAM_LAG_SHIFT` in collectives.cu).
pub const LAMPORT_LAG_SHIFT: u32 = 16;

/// One Lamport launch's own operands: the mode, the kernel op ([`super::geometry::kernel_op`]), the
/// input and output addresses and `count` elements per peer slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lamport {
    pub mode: RingMode,
    pub op: u32,
    pub input: u64,
    pub output: u64,
    pub count: usize,
}

/// `symm_lamport_{dt}(COLL_LAMPORT_ARGS)`.
pub fn lamport(
    c: &Common,
    d: &Direct,
    l: &Lamport,
    layout: &WorkspaceLayout,
    bound: &Bound,
    hdr: &OpHeader,
) -> [KernelArg; 24] {
    let Lamport {
        mode,
        op,
        input,
        output,
        count,
    } = *l;
    let [h0, h1] = hdr.args();
    with_lamport_head(
        c,
        d,
        [
            KernelArg::U32(mode as u32),
            KernelArg::U32(op),
            KernelArg::U64(input),
            KernelArg::U64(output),
            KernelArg::U64(count as u64),
            KernelArg::U64(layout.lamport_off as u64),
            KernelArg::U64(layout.lamport_slot_bytes as u64),
            KernelArg::U64(0),
            KernelArg::U64(bound.timeout_ns),
            KernelArg::U64(bound.abort_host),
            KernelArg::U64(layout.lamport_headers_off() as u64),
            h0,
            h1,
        ],
    )
}

/// `d`'s Lamport head for `c` ([`Direct::lamport_head`]) followed by `tail`.
fn with_lamport_head<const T: usize, const N: usize>(c: &Common, d: &Direct, tail: [KernelArg; T]) -> [KernelArg; N] {
    const { assert!(N == LAMPORT_HEAD + T, "the list is the head and the tail") };
    let mut a = [KernelArg::U64(0); N];
    a[..LAMPORT_HEAD].copy_from_slice(&d.lamport_head(c));
    a[LAMPORT_HEAD..].copy_from_slice(&tail);
    a
}

/// One ring launch's own operands besides its [`RingPlan`]: the kernel op
/// ([`super::geometry::kernel_op`]), the input and output addresses and the `flags` word
/// ([`RING_UNROLL1`], bit 0 the in-place all-reduce).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    pub op: u32,
    pub input: u64,
    pub output: u64,
    pub flags: u32,
}

/// `symm_ring_{dt}(COLL_RING_ARGS)`.
pub fn ring(
    c: &Common,
    o: &Ring,
    p: &RingPlan,
    layout: &WorkspaceLayout,
    bound: &Bound,
    hdr: &OpHeader,
) -> [KernelArg; 24] {
    let Ring {
        op,
        input,
        output,
        flags,
    } = *o;
    let [a, b, r, w] = c.args();
    let [h0, h1] = hdr.args();
    [
        a,
        b,
        r,
        w,
        KernelArg::U32(p.mode as u32),
        KernelArg::U32(op),
        KernelArg::U64(input),
        KernelArg::U64(output),
        KernelArg::U64(p.total as u64),
        KernelArg::U64(p.shard as u64),
        KernelArg::U64(p.chunk as u64),
        KernelArg::U32(p.nchunks),
        KernelArg::U32(p.nsend),
        KernelArg::U32(layout.ring_slots as u32),
        KernelArg::U64(layout.slot_bytes as u64),
        KernelArg::U64(layout.flags_off as u64),
        KernelArg::U64(layout.ring_off as u64),
        KernelArg::U64(0),
        KernelArg::U64(bound.timeout_ns),
        KernelArg::U64(bound.abort_host),
        KernelArg::U32(flags),
        KernelArg::U64(layout.ring_headers_off() as u64),
        h0,
        h1,
    ]
}

/// `symm_reduce_ptrs_{dt}(rank, world, op, out, n, s0..s7)`; `srcs[r]` is rank r's source.
pub fn reduce_ptrs(rank: u32, world: u32, op: u32, out: u64, n: usize, srcs: &[u64]) -> [KernelArg; 13] {
    let s = |i: usize| KernelArg::U64(srcs.get(i).copied().unwrap_or(0));
    const _: () = assert!(MAX_WORLD == 8, "reduce_ptrs takes eight source pointers");
    [
        KernelArg::U32(rank),
        KernelArg::U32(world),
        KernelArg::U32(op),
        KernelArg::U64(out),
        KernelArg::U64(n as u64),
        s(0),
        s(1),
        s(2),
        s(3),
        s(4),
        s(5),
        s(6),
        s(7),
    ]
}

/// `symm_coll_barrier(bufs, pads, rank, world, mask, state_off, timeout_ns, abort_host, check)`.
pub fn barrier(c: &Common, mask: u64, bound: &Bound, check: u32) -> [KernelArg; 9] {
    let [a, b, r, w] = c.args();
    [
        a,
        b,
        r,
        w,
        KernelArg::U64(mask),
        KernelArg::U64(0),
        KernelArg::U64(bound.timeout_ns),
        KernelArg::U64(bound.abort_host),
        KernelArg::U32(check),
    ]
}

/// `symm_coll_reject(bufs, pads, rank, world, state_off)`.
pub fn reject(c: &Common) -> [KernelArg; 5] {
    let [a, b, r, w] = c.args();
    [a, b, r, w, KernelArg::U64(0)]
}

/// `symm_coll_take_error(err, out)`.
pub fn take_error(err_word: u64, out: u64) -> [KernelArg; 2] {
    [KernelArg::U64(err_word), KernelArg::U64(out)]
}

/// `EPI_NORM` in epilogue.cuh: a bit of the epilogue kernels' `flags` (compute the RMSNorm).
pub(crate) const EPI_NORM: u32 = 1;
/// `EPI_CLUSTER` in epilogue.cuh: a bit of the fused epilogue's `flags` (cluster rows; the launch
/// has clusters of `parts` blocks).
pub const EPI_CLUSTER: u32 = 2;
/// `EPI_SPREAD` in epilogue.cuh: a bit of the fused epilogue's `flags` (spread pushes: `parts`
/// blocks push each row).
pub const EPI_SPREAD: u32 = 4;
/// `EPI_HANDOFF` in epilogue.cuh: a bit of the fused epilogue's `flags` (the handoff pair's
/// epilogue half: `input` is this rank's HANDOFF buffer; NOTE [fused-epilogue] "handoff").
pub const EPI_HANDOFF: u32 = 16;
/// `EPI_SLOTS` in epilogue.cuh: a bit of the fused epilogue's `flags` (slot rows: a row's block
/// cut into `parts` blocks that exchange their warps' sums through tagged STATE slots).
pub const EPI_SLOTS: u32 = 8;

/// The buffers and parameters every all-reduce epilogue kernel takes (NOTE [fused-epilogue]):
/// `res, weight, res_out, norm_out` (weight and norm_out 0 without the norm), `eps`, `flags`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AddRms {
    pub residual: u64,
    pub weight: u64,
    pub residual_out: u64,
    pub norm_out: u64,
    pub eps: f32,
    /// [`EPI_NORM`], [`EPI_CLUSTER`].
    pub flags: u32,
}

/// The row geometry an epilogue kernel takes: `rows` rows of `vr` 16-byte vectors, `k` vectors
/// per thread of the row's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowArgs {
    pub rows: u64,
    pub vr: u32,
    pub k: u32,
}

/// `symm_add_rms_{dt}(EPI_ARGS)`: `sum, res, weight, res_out, norm_out, rows, vr, k, eps, flags`.
pub fn add_rms(sum: u64, e: &AddRms, g: &RowArgs) -> [KernelArg; 10] {
    [
        KernelArg::U64(sum),
        KernelArg::U64(e.residual),
        KernelArg::U64(e.weight),
        KernelArg::U64(e.residual_out),
        KernelArg::U64(e.norm_out),
        KernelArg::U64(g.rows),
        KernelArg::U32(g.vr),
        KernelArg::U32(g.k),
        KernelArg::F32(e.eps),
        KernelArg::U32(e.flags),
    ]
}

/// What the fused epilogue (`symm_lamport{,W}_add_rms_{dt}`) takes besides the workspace, the
/// bound and the header: its input, rows and their layout over blocks (`parts` blocks a row,
/// `big` threads in the row's block), and the epilogue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LamportAddRms {
    pub input: u64,
    pub rows: RowArgs,
    pub parts: u32,
    pub big: u32,
    pub epilogue: AddRms,
}

/// `symm_lamport{,W}_add_rms_{dt}(COLL_LAMPORT_EPI_ARGS)`: `ws0..ws7, pad, rank, world, input,
/// rows, vr, k, parts, big, lam_off, slot_bytes, timeout_ns, abort_host, hdr_off, oph0, oph1, res,
/// weight, res_out, norm_out, eps, flags`.
pub fn lamport_add_rms(
    c: &Common,
    d: &Direct,
    f: &LamportAddRms,
    layout: &WorkspaceLayout,
    bound: &Bound,
    hdr: &OpHeader,
) -> [KernelArg; 30] {
    let [h0, h1] = hdr.args();
    let e = &f.epilogue;
    with_lamport_head(
        c,
        d,
        [
            KernelArg::U64(f.input),
            KernelArg::U64(f.rows.rows),
            KernelArg::U32(f.rows.vr),
            KernelArg::U32(f.rows.k),
            KernelArg::U32(f.parts),
            KernelArg::U32(f.big),
            KernelArg::U64(layout.lamport_off as u64),
            KernelArg::U64(layout.lamport_slot_bytes as u64),
            KernelArg::U64(bound.timeout_ns),
            KernelArg::U64(bound.abort_host),
            KernelArg::U64(layout.lamport_headers_off() as u64),
            h0,
            h1,
            KernelArg::U64(e.residual),
            KernelArg::U64(e.weight),
            KernelArg::U64(e.residual_out),
            KernelArg::U64(e.norm_out),
            KernelArg::F32(e.eps),
            KernelArg::U32(e.flags),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-rank layout, rank 0's common arguments and a bound, for the argument tests.
    fn fixture() -> (WorkspaceLayout, Common, Bound) {
        let layout = WorkspaceLayout::new(2, 10 << 20, 4 << 20, 64).unwrap();
        let c = Common {
            bufs_dev: 1,
            pads_dev: 2,
            rank: 0,
            world: 2,
        };
        let bound = Bound {
            timeout_ns: 1,
            abort_host: 0,
        };
        (layout, c, bound)
    }

    #[test]
    fn lamport_mode_argument_position() {
        let (layout, c, bound) = fixture();
        let mut d = Direct::default();
        for r in 0..MAX_WORLD {
            d.ws[r] = 0x1000 * (r as u64 + 1);
            d.pads[r] = 0x10_0000 * (r as u64 + 1);
        }
        let a = lamport(
            &c,
            &d,
            &Lamport {
                mode: RingMode::AllGather,
                op: 3,
                input: 0,
                output: 0,
                count: 10,
            },
            &layout,
            &bound,
            &OpHeader::default(),
        );
        assert_eq!(a[LAMPORT_MODE_ARG], KernelArg::U32(RingMode::AllGather as u32));
        // The eight workspace bases, then this rank's (rank 0's) pad.
        assert_eq!(a[0], KernelArg::U64(0x1000));
        assert_eq!(a[7], KernelArg::U64(0x8000));
        assert_eq!(a[8], KernelArg::U64(0x10_0000));
        let c1 = Common { rank: 1, ..c };
        let a = lamport(
            &c1,
            &d,
            &Lamport {
                mode: RingMode::AllGather,
                op: 3,
                input: 0,
                output: 0,
                count: 10,
            },
            &layout,
            &bound,
            &OpHeader::default(),
        );
        assert_eq!(a[8], KernelArg::U64(0x20_0000));
        let src = crate::kernel_source::COLLECTIVES;
        assert!(src.contains(&format!("#define COLL_LAM_ACQREL_ARRIVE {LAMPORT_ACQREL_ARRIVE:#x}u")));
        assert!(src.contains(&format!(
            "#define COLL_LAM_HOST_EVERY_THREAD {LAMPORT_HOST_EVERY_THREAD:#x}u"
        )));
        assert!(src.contains(&format!("#define COLL_FLAG_UNROLL1 {RING_UNROLL1}u")));
        assert!(src.contains(&format!("#define COLL_MODE_AR2 {MODE_AR2}\n")));
        assert!(src.contains(&format!("#define COLL_LAM_LAG_SHIFT {LAMPORT_LAG_SHIFT}\n")));
        let epi = crate::kernel_source::HEADERS
            .iter()
            .find(|h| h.file == "epilogue.cuh")
            .unwrap()
            .text;
        assert!(epi.contains(&format!("#define EPI_NORM {EPI_NORM}u\n")));
        assert!(epi.contains(&format!("#define EPI_CLUSTER {EPI_CLUSTER}u\n")));
        assert!(epi.contains(&format!("#define EPI_SPREAD {EPI_SPREAD}u\n")));
        assert!(epi.contains(&format!("#define EPI_HANDOFF {EPI_HANDOFF}u\n")));
        assert!(epi.contains(&format!(
            "#define EPI_PRE {}\n",
            crate::coll::add_rms::PRELOADED_VECTORS
        )));
        assert!(epi.contains(&format!("#define EPI_SLOTS {EPI_SLOTS}u\n")));
    }

    #[test]
    fn per_rank_addresses() {
        let mut peers = [0u64; MAX_WORLD];
        for (s, p) in peers.iter_mut().enumerate() {
            *p = 0x1000 * (s as u64 + 1);
        }
        let v = per_rank(1, 3, 0xABC0, &peers, 0x40);
        assert_eq!(v[..4], [0x1040, 0xABC0, 0x3040, 0]);
    }
}
