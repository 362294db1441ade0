//! Launch planning for the collective kernels: grid shapes, chunking and sharding (which kernel
//! runs is not chosen here: symm-ops' planner names it). Pure functions of collectively agreed values (count,
//! dtype, world, layout, tuning), never of local pointers, so every rank plans the same number of
//! chunks.

#![forbid(unsafe_code)]

use crate::{DType, Error, ReduceOp, Result};

use super::layout::WorkspaceLayout;

/// Bytes of one vector access in the kernels.
pub const VEC_BYTES: usize = 16;
/// Most threads per block (`COLL_MAX_THREADS`, the kernels' launch bounds).
pub const MAX_THREADS: u32 = 512;

/// Ring kernel modes (`COLL_MODE_*`).
// Exhaustive: the kernels' modes are fixed by their source, and backends match on every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingMode {
    AllReduce = 0,
    ReduceScatter = 1,
    AllGather = 2,
}

/// Knobs of the kernels' launch shapes. Every rank must use the same values (they decide chunk
/// counts); the defaults suit H100/H200.
///
/// Start from [`Tuning::default`] and set fields (the struct is `#[non_exhaustive]`: fields may
/// be added).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Tuning {
    /// Most blocks of a grid (`None`: the device's SM count). Ring grids are at most this.
    pub max_blocks: Option<u32>,
    /// Threads per block of the Lamport, ring and reduce kernels (multiple of 32, 64..=512: the
    /// kernels' launch bounds).
    pub threads: u32,
    /// Smallest ring chunk, bytes (small messages are spread over blocks down to this).
    pub min_chunk_bytes: usize,
    /// Largest ring chunk, bytes (0: the ring slot size).
    pub max_chunk_bytes: usize,
    /// Ring chunks per sender block aimed at (more, smaller chunks let receivers reduce while
    /// later chunks are still on the wire), within the chunk bounds.
    pub chunks_per_block: u32,
    /// Copy-engine all-reduce: bytes per pipelined chunk and peer.
    pub ce_chunk_bytes: usize,
    /// Copy-engine all-reduce: the fraction of the message copied by the copy engine; the rest
    /// is read directly by the reduction kernel (SM pull) at the same time. Default 0 (pure SM
    /// pull): on 2 x H200 the pull alone is fastest (16 MiB: 59 us; frac 0.25: 68, 0.5: 71).
    pub ce_fraction: f32,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            max_blocks: None,
            threads: 512,
            min_chunk_bytes: 16 * 1024,
            max_chunk_bytes: 0,
            chunks_per_block: 4,
            ce_chunk_bytes: 4 << 20,
            ce_fraction: 0.0,
        }
    }
}

impl Tuning {
    /// Checks the knobs.
    pub fn validate(&self) -> Result<()> {
        if self.threads < 64 || self.threads > MAX_THREADS || !self.threads.is_multiple_of(32) {
            return Err(Error::InvalidArgument(format!(
                "threads per block must be a multiple of 32 in 64..={MAX_THREADS}, got {}",
                self.threads
            )));
        }
        if self.max_blocks == Some(0) {
            return Err(Error::InvalidArgument("max_blocks must be at least 1".into()));
        }
        if self.chunks_per_block == 0 {
            return Err(Error::InvalidArgument("chunks_per_block must be at least 1".into()));
        }
        if self.min_chunk_bytes < VEC_BYTES || self.ce_chunk_bytes < VEC_BYTES {
            return Err(Error::InvalidArgument("chunk sizes must be at least 16 bytes".into()));
        }
        if !(0.0..=1.0).contains(&self.ce_fraction) {
            return Err(Error::InvalidArgument(format!(
                "ce_fraction must lie in 0..=1, got {}",
                self.ce_fraction
            )));
        }
        Ok(())
    }

    /// Blocks available on a device with `sm_count` SMs (at most one block per SM, so every
    /// block of a ring grid is resident at once).
    pub fn blocks(&self, sm_count: u32) -> u32 {
        self.max_blocks.unwrap_or(sm_count).min(sm_count.max(1)).max(1)
    }
}

/// How many blocks one collective grid of this rank may have: NOTE [co-residency].
///
/// Ranks on distinct GPUs: the device's SM count (one block per SM, so a ring grid's senders and
/// receivers are resident together). Ranks sharing a GPU (`sharers` > 1): every rank's waiting
/// kernels must be resident at once, or one rank's kernel waits for a peer's kernel that cannot
/// start. A block of any collective kernel fits on an empty SM, so grids that together ask for at
/// most one block per SM are all resident: each rank gets `sm_count / sharers` SMs, less
/// [`GRID_RESERVE`] for its one-block barrier and signal kernels, divided by the grids it can
/// have in flight (2 with programmatic dependent launch, whose next kernel may sit resident in
/// `griddepcontrol.wait`; else 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridBudget {
    /// Most blocks of one grid (the planners' `sm_count`).
    pub blocks: u32,
    /// Whether the device is shared with other ranks of the group (kernels that wait on no peer
    /// are held to `blocks` too, instead of a multiple of it).
    pub shared: bool,
}

/// Blocks each rank keeps for its one-block kernels (barriers, signals) on a shared GPU.
pub const GRID_RESERVE: u32 = 2;

impl GridBudget {
    /// The budget of a rank on a device of `sm_count` SMs used by `sharers` ranks of the group
    /// (itself included), launching with programmatic dependent launch when `pdl`. An error
    /// naming the limit when the device cannot hold every rank's kernels (the ring needs 2
    /// blocks per grid).
    pub fn new(sm_count: u32, sharers: usize, pdl: bool) -> Result<GridBudget> {
        let sm_count = sm_count.max(1);
        if sharers <= 1 {
            return Ok(GridBudget {
                blocks: sm_count,
                shared: false,
            });
        }
        let in_flight = if pdl { 2 } else { 1 };
        let per_rank = sm_count / u32::try_from(sharers).unwrap_or(u32::MAX);
        let blocks = per_rank.saturating_sub(GRID_RESERVE) / in_flight;
        if blocks < 2 {
            return Err(Error::OutOfRange {
                what: "ranks sharing one GPU (its SMs cannot hold every rank's collective kernels at once; \
                       NOTE [co-residency])",
                value: sharers as u64,
                limit: u64::from(sm_count / (in_flight * 2 + GRID_RESERVE)),
            });
        }
        Ok(GridBudget { blocks, shared: true })
    }

    /// Most blocks of a kernel that waits on no peer, given a grid of `blocks` (at most
    /// [`Self::blocks`]): `factor` times that on a GPU of its own, `blocks` on a shared one
    /// (with programmatic dependent launch such a kernel may sit resident behind a waiting one).
    pub fn independent(&self, blocks: u32, factor: u32) -> u32 {
        if self.shared {
            blocks
        } else {
            blocks.saturating_mul(factor)
        }
    }
}

/// Elements per 16-byte vector.
pub fn vec_elems(dtype: DType) -> usize {
    VEC_BYTES / dtype.size()
}

/// The element type a collective kernel entry is compiled for: the suffix of its name
/// (`symm_ring_bf16`). Every per-dtype kernel table ([`PerDtype`]) is indexed by it, in the
/// order of [`KernelDtype::ALL`] ([`KernelDtype::index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelDtype {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
}

impl KernelDtype {
    /// Every kernel element type, in table order.
    pub const ALL: [KernelDtype; 3] = [KernelDtype::F32, KernelDtype::F16, KernelDtype::Bf16];

    /// The suffix of the entries' names.
    pub fn suffix(self) -> &'static str {
        match self {
            KernelDtype::F32 => "f32",
            KernelDtype::F16 => "f16",
            KernelDtype::Bf16 => "bf16",
        }
    }

    /// The element type the entries read and write.
    pub fn dtype(self) -> DType {
        match self {
            KernelDtype::F32 => DType::F32,
            KernelDtype::F16 => DType::F16,
            KernelDtype::Bf16 => DType::BF16,
        }
    }

    /// Its position in [`KernelDtype::ALL`] and in every [`PerDtype`] table.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One value (a kernel entry, or a table of them) per [`KernelDtype`], indexed by it.
#[derive(Debug, Clone)]
pub struct PerDtype<T>([T; 3]);

impl<T> PerDtype<T> {
    /// The table of `load(d)` for every `d` of [`KernelDtype::ALL`], or the first error.
    pub fn try_new(mut load: impl FnMut(KernelDtype) -> Result<T>) -> Result<Self> {
        let [a, b, c] = KernelDtype::ALL;
        Ok(PerDtype([load(a)?, load(b)?, load(c)?]))
    }
}

impl<T> std::ops::Index<KernelDtype> for PerDtype<T> {
    type Output = T;
    fn index(&self, dtype: KernelDtype) -> &T {
        &self.0[dtype.index()]
    }
}

/// The kernels' element type for `dtype` (f32, f16, bf16), or an error for others.
pub fn kernel_dtype(dtype: DType, op: &'static str) -> Result<KernelDtype> {
    match dtype {
        DType::F32 => Ok(KernelDtype::F32),
        DType::F16 => Ok(KernelDtype::F16),
        DType::BF16 => Ok(KernelDtype::Bf16),
        other => Err(Error::UnsupportedDType {
            dtype: other.name().to_string(),
            op,
        }),
    }
}

/// `COLL_SUM` ... `COLL_MIN`.
pub fn kernel_op(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Avg => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
    }
}

/// Grid of the Lamport kernel for `count` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LamportPlan {
    pub blocks: u32,
    pub threads: u32,
    /// 16-byte vectors per peer slot (the two-shot: of one shard, each of a slot's two regions).
    pub vectors: usize,
}

/// Threads per Lamport block while one wave of such blocks covers the message: the smallest
/// of these (ascending) whose wave (the grid's blocks, at most one per SM) covers it, one
/// vector per thread, so the vectors' remote stores spread over as many SMs as they can.
/// Measured on 4 x H100 (graph, bf16, bench-notes.md round 22): 4 ranks 4-64 KiB 3.70-3.95 us
/// in blocks of 128 against 3.97-4.12 in blocks of 256, 256 KiB 5.40 against 5.53; 3 ranks
/// 0.05-0.12 us faster; 2 ranks within 0.06 to 16 KiB (4 KiB 0.03-0.04 slower) and 0.04-0.08
/// faster above. Blocks of 64 were level with 128 to 128 KiB; 256 stays for messages beyond
/// one wave of 128 (round 4 on 2 x H200: 256 beat 512). Measured on H100 only; ROCm devices
/// take the same plan.
pub const LAMPORT_WAVE_THREADS: [usize; 2] = [128, 256];
const _: () = assert!(LAMPORT_WAVE_THREADS[0] < LAMPORT_WAVE_THREADS[1]);

/// Plans a Lamport launch of `count` elements per peer slot (all-reduce: the message; reduce-scatter:
/// one shard; all-gather: one rank's input); an error when that exceeds a Lamport slot.
pub fn lamport_plan(
    count: usize,
    dtype: DType,
    layout: &WorkspaceLayout,
    tuning: &Tuning,
    sm_count: u32,
) -> Result<LamportPlan> {
    slot_holds(
        count.checked_mul(dtype.size()),
        "Lamport message bytes (per peer)",
        layout,
    )?;
    let vectors = count.div_ceil(vec_elems(dtype));
    let (blocks, threads) = lamport_grid(vectors, tuning, sm_count);
    Ok(LamportPlan {
        blocks,
        threads,
        vectors,
    })
}

/// Plans a Lamport two-shot all-reduce (NOTE [lamport-two-shot]) of `count` elements in the
/// group of `layout.world` ranks: the grid of the one-shot of the same message, `vectors` the
/// vectors of one shard ([`two_shot_shard`], one of the two regions a slot holds); an error
/// when a slot cannot hold two shards.
pub fn lamport_two_shot_plan(
    count: usize,
    dtype: DType,
    layout: &WorkspaceLayout,
    tuning: &Tuning,
    sm_count: u32,
) -> Result<LamportPlan> {
    let q = two_shot_shard(count, layout.world.max(1), dtype);
    slot_holds(
        q.checked_mul(2 * dtype.size()),
        "Lamport two-shot bytes of two shards (per peer slot)",
        layout,
    )?;
    let (blocks, threads) = lamport_grid(count.div_ceil(vec_elems(dtype)), tuning, sm_count);
    Ok(LamportPlan {
        blocks,
        threads,
        vectors: q / vec_elems(dtype),
    })
}

/// The largest all-reduce (bytes) the Lamport two-shot takes in a group of `world` ranks with
/// Lamport slots of `slot` bytes, whatever the element type: two shards of it, each rounded up
/// to whole vectors ([`two_shot_shard`]), fit a slot (0 for one rank).
pub fn lamport_two_shot_max_bytes(world: usize, slot: usize) -> usize {
    if world < 2 {
        return 0;
    }
    // k whole vectors a shard fit a slot twice (k = slot / 2 / VEC_BYTES). A message of at most
    // k * VEC_BYTES * world bytes has at most k * VE * world elements, so its shard
    // (`two_shot_shard`: the elements a rank rounded up to whole vectors) is at most k vectors.
    (slot / 2 / VEC_BYTES) * VEC_BYTES * world
}

/// Whether a Lamport slot holds `need` bytes (`None`: the count overflowed); `what` names them
/// in the error. Any size at one rank (nothing goes through the slots).
fn slot_holds(need: Option<usize>, what: &'static str, layout: &WorkspaceLayout) -> Result<()> {
    let need = need.ok_or_else(|| Error::InvalidArgument("count overflows".into()))?;
    if layout.world > 1 && need > layout.lamport_max_bytes() {
        return Err(Error::OutOfRange {
            what,
            value: need as u64,
            limit: layout.lamport_max_bytes() as u64,
        });
    }
    Ok(())
}

/// Blocks and threads of a Lamport grid over `vectors` 16-byte vectors.
fn lamport_grid(vectors: usize, tuning: &Tuning, sm_count: u32) -> (u32, u32) {
    // Blocks of the smallest LAMPORT_WAVE_THREADS whose one wave covers the message (one
    // vector per thread, more SMs pushing and polling), `tuning.threads` above (2 x H200: 2.80
    // against 2.99 us at 16 KiB, 3.62 against 3.77 at 256 KiB; bench-notes.md, round 4).
    let wave = tuning.blocks(sm_count) as usize;
    let cap = LAMPORT_WAVE_THREADS
        .iter()
        .find(|&&t| vectors <= t * wave)
        .map_or(tuning.threads as usize, |&t| t.min(tuning.threads as usize));
    let threads = (vectors.div_ceil(32) * 32).clamp(64, cap.max(64)) as u32;
    let blocks = vectors.div_ceil(threads as usize).clamp(1, wave) as u32;
    (blocks, threads)
}

/// One ring kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingPlan {
    pub mode: RingMode,
    /// Elements of the whole vector (AR: the message; RS: the input; AG: the output).
    pub total: usize,
    /// Elements of a shard (RS / AG; AR: `total`).
    pub shard: usize,
    /// Elements per chunk (a multiple of the vector width).
    pub chunk: usize,
    pub nchunks: u32,
    pub nsend: u32,
    pub nrecv: u32,
    pub threads: u32,
}

impl RingPlan {
    pub fn blocks(&self) -> u32 {
        self.nsend + self.nrecv
    }
}

/// Ring grids of 3-4 ranks (the worlds measured) for messages from [`RING_WIDE_MIN_BYTES`] on
/// (unless the tuning names a grid): at most this many blocks (32 senders, 32 receivers). Measured on 4 x H200 (graph,
/// bench-notes round 15): the two-shot at 16 / 64 / 256 MiB 109 / 350 / 1302 us against the full
/// grid's (132) 140 / 410 / 1529, 48 blocks 119 / 392 / 1472, 32 blocks 134 / 462 / 1695; the
/// ring reduce-scatter 32 / 256 MiB 99.5 / 679 against 134 / 813, the all-gather 93.3 / 641
/// against 134 / 729. At 4 MiB the full grid is faster (37.0 against 40.9), at 8 MiB equal.
pub const RING_WIDE_BLOCKS: u32 = 64;
/// See [`RING_WIDE_BLOCKS`]: the message bytes (AR the message, RS the input, AG the output).
pub const RING_WIDE_MIN_BYTES: usize = 8 << 20;

/// Plans a ring launch. `part` (elements) is what each rank sends to each peer in total: AR the
/// message, RS/AG one shard.
pub fn ring_plan(
    mode: RingMode,
    total: usize,
    shard: usize,
    dtype: DType,
    layout: &WorkspaceLayout,
    tuning: &Tuning,
    sm_count: u32,
) -> Result<RingPlan> {
    let ve = vec_elems(dtype);
    let es = dtype.size();
    let part = match mode {
        RingMode::AllReduce => total,
        _ => shard,
    };
    if part == 0 {
        return Err(Error::InvalidArgument("empty ring launch".into()));
    }
    let world = layout.world;
    let mut blocks = tuning.blocks(sm_count).max(2);
    // Measured at 3-4 ranks only; 5-8 keep the full grid until measured.
    if tuning.max_blocks.is_none() && (3..=4).contains(&world) && total.saturating_mul(es) >= RING_WIDE_MIN_BYTES {
        blocks = blocks.min(RING_WIDE_BLOCKS);
    }
    // One block per SM at most; senders and receivers split the grid. Each block's copies keep
    // four vectors in flight per thread (NOTE [ring-unroll]).
    let pair = if world > 1 { blocks / 2 } else { blocks };
    let slot_elems = if world > 1 {
        layout.slot_bytes / es
    } else {
        usize::MAX / 2
    };
    let max_chunk = if tuning.max_chunk_bytes == 0 {
        slot_elems
    } else {
        (tuning.max_chunk_bytes / es).min(slot_elems)
    };
    let max_chunk = max_chunk / ve * ve;
    let min_chunk = (tuning.min_chunk_bytes / es).div_ceil(ve) * ve;
    if max_chunk == 0 {
        return Err(Error::InvalidArgument("ring chunk smaller than one vector".into()));
    }
    let per_chunk = (pair as usize).saturating_mul(tuning.chunks_per_block as usize);
    let chunk = part.div_ceil(per_chunk).div_ceil(ve) * ve;
    let chunk = chunk.max(min_chunk).min(max_chunk).max(ve);
    let nchunks = part.div_ceil(chunk);
    let nchunks = u32::try_from(nchunks).map_err(|_| Error::OutOfRange {
        what: "ring chunks",
        value: nchunks as u64,
        limit: u32::MAX as u64,
    })?;
    let n = nchunks.min(pair).max(1);
    let (nsend, nrecv) = if world > 1 { (n, n) } else { (0, n) };
    Ok(RingPlan {
        mode,
        total,
        shard,
        chunk,
        nchunks,
        nsend,
        nrecv,
        threads: tuning.threads,
    })
}

/// Two-shot all-reduce shard size: `count / world` rounded up to whole vectors, so every shard
/// starts 16-byte aligned relative to the buffer (the last shards may be shorter or empty).
pub fn two_shot_shard(count: usize, world: usize, dtype: DType) -> usize {
    let ve = vec_elems(dtype);
    count.div_ceil(world).div_ceil(ve) * ve
}

/// Elements of shard `t` when `total` elements are cut in shards of `shard` (the tests' check
/// of the sharding).
#[cfg(test)]
pub fn shard_len(total: usize, shard: usize, t: usize) -> usize {
    total.saturating_sub(t.saturating_mul(shard)).min(shard)
}

/// Copy-engine all-reduce split: `(ce_elems, chunk_elems, nchunks, scratch_slots)`: elements
/// `[0, ce_elems)` go through the copy engine in chunks of `chunk_elems` per peer, cycling over
/// `scratch_slots` scratch slots of the ring; the rest is pulled directly by SMs.
pub fn ce_split(
    count: usize,
    dtype: DType,
    layout: &WorkspaceLayout,
    tuning: &Tuning,
) -> Result<(usize, usize, usize, usize)> {
    let ve = vec_elems(dtype);
    let es = dtype.size();
    let ce_elems = ((count as f64 * tuning.ce_fraction as f64) as usize / ve * ve).min(count);
    if ce_elems == 0 || layout.world == 1 {
        return Ok((0, 0, 0, 0));
    }
    let w1 = layout.w1();
    let ring = layout.ring_bytes();
    // Each slot holds one chunk from every peer; at least two slots to overlap copy and reduce.
    let per_slot_max = ring / 2 / w1;
    let chunk_bytes = tuning.ce_chunk_bytes.min(per_slot_max) / VEC_BYTES * VEC_BYTES;
    if chunk_bytes < VEC_BYTES {
        return Err(Error::InvalidArgument(
            "staging area too small for the copy-engine path".into(),
        ));
    }
    let chunk = (chunk_bytes / es).min(ce_elems.div_ceil(ve) * ve);
    let nchunks = ce_elems.div_ceil(chunk);
    let slots = (ring / (w1 * chunk * es)).clamp(2, 16);
    Ok((ce_elems, chunk, nchunks, slots))
}

/// Most chunks [`ce_rs_chunks`] cuts.
pub const CE_RS_MAX_CHUNKS: usize = 8;

/// Chunks (elements) of the copy-engine reduce-scatter's shard of `count` elements, as
/// `(chunks, how many)` (no allocation on the launch path): at most `max_chunks` (and
/// [`CE_RS_MAX_CHUNKS`]), a quarter of the shard each for the first three, then halving, so the
/// last reduction (which nothing overlaps) is short while the copies stay large (the copy
/// engine reads a 32 MiB copy at ~356 GB/s, a 1 MiB one at ~156: docs/benchmarks.md). Every
/// chunk but the last is a whole number of 16-byte vectors; the chunks add up to `count`.
pub fn ce_rs_chunks(count: usize, dtype: DType, max_chunks: usize) -> ([usize; CE_RS_MAX_CHUNKS], usize) {
    let ve = vec_elems(dtype);
    // Fractions of the shard in 64ths: 16, 16, 16, 8, 4, 2, 1, 1.
    const PARTS: [usize; CE_RS_MAX_CHUNKS] = [16, 16, 16, 8, 4, 2, 1, 1];
    let max = max_chunks.clamp(1, CE_RS_MAX_CHUNKS);
    let mut out = [0usize; CE_RS_MAX_CHUNKS];
    let mut len = 0;
    let mut left = count;
    for &p in &PARTS {
        if left == 0 {
            break;
        }
        let n = if len + 1 == max {
            left
        } else {
            // At least one 4 MiB-ish copy per chunk; small shards take fewer chunks.
            let min = ((4 << 20) / dtype.size()).div_ceil(ve) * ve;
            ((count * p / 64).div_ceil(ve) * ve).max(min).min(left)
        };
        out[len] = n;
        len += 1;
        left -= n;
    }
    (out, len)
}

/// A non-zero 32-bit check word (FNV-1a of the parts) the barrier compares across ranks (the
/// tests' form of [`check_word_of`]).
#[cfg(test)]
pub fn check_word(parts: &[u64]) -> u32 {
    check_word_of(parts.iter().copied())
}

/// `check_word` of parts given one at a time (no buffer to collect them in).
pub fn check_word_of(parts: impl IntoIterator<Item = u64>) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for p in parts {
        for b in p.to_le_bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ce_rs_chunks_cover_the_shard() {
        for dtype in [DType::BF16, DType::F32] {
            for count in [1usize, 7, 1000, 1 << 20, (64 << 20) + 3, 64 << 20, 100_000_001] {
                for max in [1usize, 3, 16] {
                    let (c, n) = ce_rs_chunks(count, dtype, max);
                    let c = &c[..n];
                    assert_eq!(c.iter().sum::<usize>(), count, "{count} {max}");
                    assert!(n <= max && n >= 1 && c.iter().all(|&x| x > 0), "{c:?}");
                    let ve = vec_elems(dtype);
                    assert!(c[..n - 1].iter().all(|x| x % ve == 0), "{c:?}");
                }
            }
        }
        // 128 MiB of bf16: 32, 32, 32, 16, 8, 4, 4 MiB (no chunk under 4 MiB).
        let (c, n) = ce_rs_chunks(64 << 20, DType::BF16, 16);
        assert_eq!(n, 7, "{c:?}");
        assert_eq!(c[0], 16 << 20);
        assert_eq!(c[n - 1], 2 << 20);
    }

    fn layout2() -> WorkspaceLayout {
        WorkspaceLayout::new(2, 10 << 20, 4 << 20, 64).unwrap()
    }

    /// Every element of the part lies in exactly one chunk, chunks are vector aligned and fit a
    /// slot, and the grid is at most one block per SM.
    #[test]
    fn ring_chunks_cover_exactly() {
        let t = Tuning::default();
        for world in [1usize, 2, 3, 8] {
            let l = WorkspaceLayout::new(world, 10 << 20, 1 << 20, 64).unwrap();
            for dtype in [DType::F32, DType::BF16] {
                for part in [1usize, 7, 8, 9, 1000, 4096, 65_537, 1 << 20, (64 << 20) + 3] {
                    let p = ring_plan(RingMode::AllReduce, part, part, dtype, &l, &t, 132).unwrap();
                    assert_eq!(p.chunk % vec_elems(dtype), 0);
                    if world > 1 {
                        assert!(p.chunk * dtype.size() <= l.slot_bytes);
                        assert_eq!(p.nsend, p.nrecv);
                    } else {
                        assert_eq!(p.nsend, 0);
                    }
                    assert!(p.blocks() <= 132);
                    assert!(p.nrecv >= 1 && p.nrecv <= p.nchunks);
                    let covered: usize = (0..p.nchunks as usize)
                        .map(|c| part.saturating_sub(c * p.chunk).min(p.chunk))
                        .sum();
                    assert_eq!(covered, part);
                    assert!((p.nchunks as usize - 1) * p.chunk < part, "an empty chunk");
                }
            }
        }
    }

    #[test]
    fn grid_budget_fits_every_sharing_rank() {
        // Distinct GPUs: one block per SM, unchanged.
        assert_eq!(
            GridBudget::new(132, 1, true).unwrap(),
            GridBudget {
                blocks: 132,
                shared: false
            }
        );
        for sms in [78u32, 108, 132, 144] {
            for sharers in 2..=8usize {
                for pdl in [false, true] {
                    let g = GridBudget::new(sms, sharers, pdl).unwrap();
                    let in_flight = if pdl { 2 } else { 1 };
                    // Every rank's grids in flight plus its reserved one-block kernels fit the SMs.
                    let demand = sharers as u32 * (g.blocks * in_flight + GRID_RESERVE);
                    assert!(demand <= sms, "{sms} SMs, {sharers} ranks, pdl {pdl}: {demand}");
                    assert!(g.blocks >= 2 && g.shared);
                    assert_eq!(g.independent(g.blocks, 4), g.blocks);
                }
            }
        }
        assert_eq!(GridBudget::new(132, 8, false).unwrap().blocks, 14);
        assert_eq!(GridBudget::new(132, 8, true).unwrap().blocks, 7);
        // Too many ranks for the device: an error that names the limit.
        let e = GridBudget::new(16, 8, true).unwrap_err();
        assert!(matches!(e, Error::OutOfRange { limit: 2, .. }), "{e}");
        assert_eq!(GridBudget::new(132, 1, false).unwrap().independent(132, 4), 528);
    }

    #[test]
    fn small_messages_spread_over_blocks_large_ones_use_slots() {
        let t = Tuning::default();
        let l = layout2();
        let small = ring_plan(RingMode::AllReduce, 512 << 10, 512 << 10, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!(small.chunk * 2, 16 << 10, "1 MiB over 64 chunks of the 16 KiB minimum");
        assert_eq!(small.nchunks, 64);
        let big = ring_plan(RingMode::AllReduce, 128 << 20, 128 << 20, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!(big.chunk * 2, l.slot_bytes);
        assert_eq!(big.nsend, 66);
        // 4 MiB: about four 16 KiB chunks per sender block.
        let mid = ring_plan(RingMode::AllReduce, 2 << 20, 2 << 20, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!(mid.chunk * 2, 16 << 10);
        assert_eq!((mid.nchunks, mid.nsend), (256, 66));
        let one = Tuning {
            chunks_per_block: 1,
            ..t
        };
        let mid1 = ring_plan(RingMode::AllReduce, 2 << 20, 2 << 20, DType::BF16, &l, &one, 132).unwrap();
        assert_eq!(mid1.nchunks, 66);
    }

    #[test]
    fn wide_rings_of_three_or_four_ranks_use_64_blocks_from_8_mib() {
        let t = Tuning::default();
        let l4 = WorkspaceLayout::new(4, 10 << 20, 1 << 20, 64).unwrap();
        let blocks = |l: &WorkspaceLayout, t: &Tuning, mode: RingMode, total: usize, shard: usize| {
            ring_plan(mode, total, shard, DType::BF16, l, t, 132).unwrap().blocks()
        };
        // bf16 elements: 4 Mi = 8 MiB.
        assert_eq!(
            blocks(&l4, &t, RingMode::ReduceScatter, 4 << 20, 1 << 20),
            RING_WIDE_BLOCKS
        );
        assert_eq!(
            blocks(&l4, &t, RingMode::AllGather, 64 << 20, 16 << 20),
            RING_WIDE_BLOCKS
        );
        assert!(
            blocks(&l4, &t, RingMode::ReduceScatter, 2 << 20, 512 << 10) > RING_WIDE_BLOCKS,
            "4 MiB: the full grid"
        );
        // Two ranks keep the full grid; a tuning that names a grid gets it.
        assert_eq!(blocks(&layout2(), &t, RingMode::AllReduce, 64 << 20, 64 << 20), 132);
        // Eight ranks are unmeasured: the full grid.
        let l8 = WorkspaceLayout::new(8, 10 << 20, 1 << 20, 64).unwrap();
        assert_eq!(blocks(&l8, &t, RingMode::ReduceScatter, 64 << 20, 8 << 20), 132);
        let named = Tuning {
            max_blocks: Some(96),
            ..t
        };
        assert_eq!(blocks(&l4, &named, RingMode::ReduceScatter, 64 << 20, 16 << 20), 96);
    }

    #[test]
    fn two_shot_shards_cover_and_align() {
        for world in 1..=8 {
            for count in [1usize, 2, 15, 16, 17, 1000, 1 << 20, (1 << 20) + 5] {
                for dtype in [DType::F32, DType::F16] {
                    let q = two_shot_shard(count, world, dtype);
                    assert_eq!(q % vec_elems(dtype), 0);
                    let total: usize = (0..world).map(|t| shard_len(count, q, t)).sum();
                    assert_eq!(total, count, "world {world} count {count}");
                }
            }
        }
    }

    #[test]
    fn lamport_two_shot_takes_what_its_bound_says_for_every_dtype_and_world() {
        let t = Tuning::default();
        for world in 2..=8 {
            for lamport_bytes in [64 << 10, (16 << 20) / (world - 1), 3 << 20] {
                let l = WorkspaceLayout::new(world, 1 << 20, lamport_bytes, 8).unwrap();
                let max = lamport_two_shot_max_bytes(world, l.lamport_max_bytes());
                assert!(max >= l.lamport_max_bytes() * world / 2 - VEC_BYTES * world, "{world}");
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    let count = max / dtype.size();
                    let p = lamport_two_shot_plan(count, dtype, &l, &t, 132).unwrap();
                    assert!(2 * p.vectors * VEC_BYTES <= l.lamport_max_bytes(), "{world} {dtype:?}");
                    // Past the slot: refused, never a wrong plan.
                    let over = (l.lamport_max_bytes() / 2 / VEC_BYTES + 1) * VEC_BYTES * world / dtype.size();
                    assert!(
                        lamport_two_shot_plan(over, dtype, &l, &t, 132).is_err(),
                        "{world} {dtype:?}"
                    );
                }
            }
        }
        assert_eq!(lamport_two_shot_max_bytes(1, 1 << 20), 0);
    }

    #[test]
    fn lamport_plan_bounds() {
        let t = Tuning::default();
        let l = layout2();
        let p = lamport_plan(512, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!((p.vectors, p.blocks, p.threads), (64, 1, 64));
        // 16 KiB: 1024 vectors in blocks of 128.
        let p = lamport_plan(8192, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!((p.vectors, p.blocks, p.threads), (1024, 8, 128));
        // 2 KiB: one block of 128; 256 KiB: one wave of 128-thread blocks.
        let p = lamport_plan(1024, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!((p.vectors, p.blocks, p.threads), (128, 1, 128));
        let p = lamport_plan(131072, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!((p.vectors, p.blocks, p.threads), (16384, 128, 128));
        // Beyond one wave of 128: blocks of 256 while their wave covers it (512 KiB).
        let p = lamport_plan(262144, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!((p.vectors, p.blocks, p.threads), (32768, 128, 256));
        // A tuning with fewer threads caps the wave's blocks.
        let small = Tuning { threads: 64, ..t };
        let p = lamport_plan(8192, DType::BF16, &l, &small, 132).unwrap();
        assert_eq!((p.blocks, p.threads), (16, 64));
        // The wave is the grid the tuning allows: 32 blocks cover 256 KiB in blocks of 512,
        // 4096 vectors in blocks of 128.
        let few = Tuning {
            max_blocks: Some(32),
            ..t
        };
        let p = lamport_plan(131072, DType::BF16, &l, &few, 132).unwrap();
        assert_eq!((p.blocks, p.threads), (32, 512));
        let p = lamport_plan(32768, DType::BF16, &l, &few, 132).unwrap();
        assert_eq!((p.blocks, p.threads), (32, 128));
        // Beyond one wave of 256-thread blocks: blocks of `tuning.threads`.
        let p = lamport_plan(132 * 256 * 8 + 8, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!((p.blocks, p.threads), (67, 512));
        let p = lamport_plan(2 << 20, DType::BF16, &l, &t, 132).unwrap();
        assert_eq!(p.blocks, 132);
        assert!(p.blocks as usize * p.threads as usize * 4 >= p.vectors);
        assert!(lamport_plan((4 << 20) / 2 + 1, DType::BF16, &l, &t, 132).is_err());
        let p = lamport_plan(3, DType::F32, &l, &t, 132).unwrap();
        assert_eq!(p.vectors, 1);
    }

    #[test]
    fn ce_split_covers() {
        let l = layout2();
        let mut t = Tuning::default();
        for frac in [0.0f32, 0.3, 0.5, 1.0] {
            t.ce_fraction = frac;
            for count in [1usize, 1000, 1 << 20, (128 << 20) + 7] {
                let (ce, chunk, n, slots) = ce_split(count, DType::BF16, &l, &t).unwrap();
                assert!(ce <= count);
                if ce > 0 {
                    assert!(chunk * n >= ce && chunk * (n - 1) < ce);
                    assert!(slots >= 2 && slots * chunk * 2 <= l.ring_bytes());
                    assert_eq!(ce % 8, 0);
                }
            }
        }
        assert_eq!(
            ce_split(1 << 20, DType::BF16, &l, &Tuning { ce_fraction: 0.0, ..t })
                .unwrap()
                .0,
            0
        );
    }

    #[test]
    fn tuning_validation_and_check_words() {
        assert!(Tuning::default().validate().is_ok());
        assert!(Tuning {
            threads: 100,
            ..Tuning::default()
        }
        .validate()
        .is_err());
        assert!(Tuning {
            ce_fraction: 1.5,
            ..Tuning::default()
        }
        .validate()
        .is_err());
        assert!(Tuning {
            max_blocks: Some(0),
            ..Tuning::default()
        }
        .validate()
        .is_err());
        assert_eq!(
            Tuning {
                max_blocks: Some(500),
                ..Tuning::default()
            }
            .blocks(132),
            132
        );
        assert_ne!(check_word(&[1, 2]), check_word(&[2, 1]));
        assert_eq!(check_word(&[]) & 1, 1);
        assert!(kernel_dtype(DType::F64, "x").is_err());
        assert_eq!(kernel_dtype(DType::BF16, "x").unwrap(), KernelDtype::Bf16);
        for (i, d) in KernelDtype::ALL.into_iter().enumerate() {
            assert_eq!(d.index(), i);
            assert_eq!(kernel_dtype(d.dtype(), "x").unwrap(), d);
            assert_eq!(d.suffix(), d.dtype().name());
        }
    }
}
