//! The collectives workspace layout (one symmetric allocation per rank), mirrored by the
//! `COLL_ST_*` / `COLL_OPS_*` defines in symm-core's `kernels/collectives.cu` (NOTE [collectives-protocols]).
//!
//! ```text
//! offset 0      STATE    4 KiB of u32 words, written only by this rank's kernels
//! flags_off     FLAGS    DATA[w1][S], ACK[w1][S] (peers write them), SENT[S] (local),
//!                        then (16-byte aligned) HDR[w1][S]: each ring chunk's op header
//! lamport_off   LAMPORT  3 buffers x w1 slots x lamport_slot_bytes, then HDR[3][w1] op headers
//!                        of 16 bytes, then HANDOFF (handoff_bytes: the handoff pair's sums,
//!                        NOTE [fused-epilogue] "handoff"), all pre-filled with the sentinel
//! ring_off      RING     w1 x S slots x slot_bytes: the staging area
//! ```
//! `w1 = world - 1` (a rank keeps no slot for itself), `S` = ring slots (a power of two).

#![forbid(unsafe_code)]

use crate::{Error, Result};

/// Default staging (ring) bytes.
pub const DEFAULT_STAGING_BYTES: usize = 10 << 20;
/// Default largest Lamport message for two ranks (smaller for more ranks: 16 MiB / (world-1)).
/// The workspace holds three such buffers (48 MiB per rank for two ranks): 2 x H200 measured the
/// pipelined Lamport kernel ahead of the zero-copy pull up to 16 MiB all-reduce and 32 MiB
/// reduce-scatter / all-gather (bench-notes.md, round 5).
pub const DEFAULT_LAMPORT_BYTES: usize = 16 << 20;
/// Default ring slots per peer.
pub const DEFAULT_RING_SLOTS: usize = 64;
/// Most bytes of the HANDOFF buffer, so the handoff pair's largest message (NOTE
/// [fused-epilogue] "handoff"), capped by the Lamport slot: the range measured (bench-notes
/// round 23: decode-sized epilogues up to 32 rows of hidden 8192 in bf16, 512 KiB).
pub const HANDOFF_MAX_BYTES: usize = 512 << 10;

/// Bytes of one Lamport slot: `asked`, else [`DEFAULT_LAMPORT_BYTES`] for two ranks and 16 MiB /
/// (world - 1) for more.
pub fn lamport_bytes_for(world: usize, asked: Option<usize>) -> usize {
    match asked {
        Some(b) => b,
        None if world <= 2 => DEFAULT_LAMPORT_BYTES,
        None => (16 << 20) / (world - 1),
    }
}

/// Word index of the Lamport buffer rotation (0, 1, 2) in STATE.
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const ST_LAM_IDX: usize = 0;
/// Word index of the Lamport kernel's arrival counter.
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const ST_LAM_ARRIVE: usize = 1;
/// Word index of `used`: 16-byte vectors per slot the previous Lamport op wrote (into buffer
/// `(idx + 2) % 3`, which the next op clears).
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const ST_LAM_USED: usize = 2;
/// Word index of the ring's chunk sequence number.
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const ST_RING_SEQ: usize = 8;
/// Word index of the ring kernel's arrival counter.
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const ST_RING_ARRIVE: usize = 9;
/// Word index of the fused pull kernel's finished-blocks counter.
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const ST_PULL_DONE: usize = 10;
/// Word index of `bar_cnt[64]`: barriers shared with each rank.
pub const ST_BAR_CNT: usize = 64;
/// Word index of the fused epilogue's split-row counters, one per row (`COLL_ST_EPI_ROWS`;
/// NOTE [fused-epilogue], "split rows").
pub const ST_EPI_ROWS: usize = 256;
/// Most rows the fused epilogue splits across blocks (`COLL_EPI_SPLIT_MAX_ROWS`).
pub const EPI_SPLIT_MAX_ROWS: usize = 256;
/// Word index of the tag the fused epilogue's last slot-rows op used (`COLL_ST_EPI_TAG`; NOTE
/// [fused-epilogue], "slot rows").
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const ST_EPI_TAG: usize = 11;
/// Word index of the fused epilogue's slot rows: [`EPI_SLOTS_MAX`] 64-bit slots, each a warp's
/// sum of squares and its op's tag (`COLL_ST_EPI_SLOTS`).
pub const ST_EPI_SLOTS: usize = 512;
/// Slots at [`ST_EPI_SLOTS`]: slot rows need `rows x big / 32` of them (`COLL_EPI_SLOTS_MAX`).
pub const EPI_SLOTS_MAX: usize = 256;
/// Word index of the error word copied out by `symm_coll_take_error`.
pub const ST_ERR_OUT: usize = 200;
/// Word index of what the kernel that latched a disagreement recorded (NOTE [op-agreement]):
/// `peer + 1 | kind << 16` ([`MISMATCH_HEADER`], [`MISMATCH_CHECK`], [`MISMATCH_REJECTED`]),
/// then the peer's four header words (or its check word) and this rank's.
pub const ST_MISMATCH: usize = 201;
/// Words of the record at [`ST_MISMATCH`].
pub const MISMATCH_WORDS: usize = 9;
/// [`ST_MISMATCH`] kinds: op headers differed (Lamport, ring) ...
pub const MISMATCH_HEADER: u32 = 0;
/// ... barrier or pull check words differed ...
pub const MISMATCH_CHECK: u32 = 1;
/// ... the peer rejected its own arguments.
pub const MISMATCH_REJECTED: u32 = 2;
/// Bytes of one op header (four u32 words, `OpDescriptor::header_words`).
pub const HEADER_BYTES: usize = 16;
/// Bytes of STATE.
pub const STATE_BYTES: usize = 4096;

/// Pad `OPS` slot of the subset barrier epochs.
// Only the tests read it here (against the kernels' define); the kernels use the define.
#[cfg_attr(not(test), allow(dead_code))]
pub const OPS_BAR: usize = 0;
/// Pad `OPS` slot of the barrier check word.
pub const OPS_CHECK: usize = 1;
/// First of the two pad `OPS` slots the fused pull uses as one 64-bit word per source rank.
pub const OPS_PULL64: usize = 2;

/// Largest world size the collective kernels support (`COLL_MAXW`).
pub const MAX_WORLD: usize = 8;

/// Alignment of every section.
pub const SECTION_ALIGN: usize = 4096;
/// Granularity of a ring slot and of a Lamport slot.
pub const SLOT_ALIGN: usize = 256;
/// Smallest ring slot the layout accepts (fewer slots are used before going below it).
pub const MIN_SLOT_BYTES: usize = 16 * 1024;

const _: () =
    assert!((ST_MISMATCH + MISMATCH_WORDS) * 4 <= STATE_BYTES && ST_BAR_CNT + crate::pad::MAX_WORLD_SIZE <= ST_ERR_OUT);
const _: () =
    assert!(ST_MISMATCH + MISMATCH_WORDS <= ST_EPI_ROWS && (ST_EPI_ROWS + EPI_SPLIT_MAX_ROWS) * 4 <= STATE_BYTES);
const _: () = assert!(
    (ST_EPI_ROWS + EPI_SPLIT_MAX_ROWS) <= ST_EPI_SLOTS
        && ST_EPI_SLOTS.is_multiple_of(2)
        && (ST_EPI_SLOTS + 2 * EPI_SLOTS_MAX) * 4 <= STATE_BYTES
        && ST_PULL_DONE < ST_EPI_TAG
        && ST_EPI_TAG < ST_BAR_CNT
);
const _: () = assert!(OPS_CHECK < crate::pad::OPS_SLOTS && OPS_PULL64 + 1 < crate::pad::OPS_SLOTS);
// The 64-bit words start 8-byte aligned.
const _: () = assert!((crate::pad::OPS_BASE + OPS_PULL64 * crate::pad::MAX_WORLD_SIZE).is_multiple_of(2));

/// Offsets and sizes of one rank's workspace (identical on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLayout {
    pub world: usize,
    pub flags_off: usize,
    pub flags_bytes: usize,
    pub lamport_off: usize,
    /// Bytes of one Lamport slot (the largest Lamport message, rounded up).
    pub lamport_slot_bytes: usize,
    pub ring_off: usize,
    /// Ring slots per peer (a power of two).
    pub ring_slots: usize,
    /// Bytes of one ring slot (a multiple of [`SLOT_ALIGN`]).
    pub slot_bytes: usize,
    /// Bytes of the HANDOFF buffer (after the Lamport headers; 0 for one rank).
    pub handoff_bytes: usize,
    /// Bytes of the whole workspace.
    pub total: usize,
}

fn round_up(x: usize, a: usize) -> Option<usize> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

fn too_big(what: &'static str, value: usize) -> Error {
    Error::OutOfRange {
        what,
        value: value as u64,
        limit: isize::MAX as u64,
    }
}

impl WorkspaceLayout {
    /// The workspace of a backend's collectives (`who` names them in the error) for a group of
    /// `world` ranks: at most [`MAX_WORLD`] ranks, Lamport slots of `lamport_bytes` or
    /// [`lamport_bytes_for`]'s default, then [`Self::new`].
    pub fn for_group(
        who: &'static str,
        world: usize,
        staging_bytes: usize,
        lamport_bytes: Option<usize>,
        ring_slots: usize,
    ) -> Result<Self> {
        if world > MAX_WORLD {
            return Err(Error::OutOfRange {
                what: who,
                value: world as u64,
                limit: MAX_WORLD as u64,
            });
        }
        Self::new(
            world,
            staging_bytes,
            lamport_bytes_for(world, lamport_bytes),
            ring_slots,
        )
    }

    /// Lays out a workspace for `world` ranks with `staging_bytes` of ring (split over the
    /// `world - 1` peers and up to `ring_slots` slots each, fewer when slots would fall below
    /// [`MIN_SLOT_BYTES`]) and Lamport buffers for messages up to `lamport_bytes`.
    pub fn new(world: usize, staging_bytes: usize, lamport_bytes: usize, ring_slots: usize) -> Result<Self> {
        if world == 0 || world > MAX_WORLD {
            return Err(Error::OutOfRange {
                what: "world size for the CUDA collectives",
                value: world as u64,
                limit: MAX_WORLD as u64,
            });
        }
        if ring_slots < 2 || !ring_slots.is_power_of_two() || ring_slots > 1024 {
            return Err(Error::InvalidArgument(format!(
                "ring_slots must be a power of two in 2..=1024, got {ring_slots}"
            )));
        }
        let w1 = world - 1;
        let mut slots = ring_slots;
        let (slot_bytes, ring_bytes) = if let Some(per_peer) = staging_bytes.checked_div(w1) {
            if per_peer < 2 * MIN_SLOT_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "staging area of {staging_bytes} bytes is too small: {} bytes needed for {world} ranks",
                    2 * MIN_SLOT_BYTES * w1
                )));
            }
            while slots > 2 && per_peer / slots < MIN_SLOT_BYTES {
                slots /= 2;
            }
            let slot = per_peer / slots / SLOT_ALIGN * SLOT_ALIGN;
            (slot, slot * slots * w1)
        } else {
            (0, 0)
        };
        let flags_off = STATE_BYTES;
        let flags_bytes = ring_header_rel(w1, slots) + w1 * slots * HEADER_BYTES;
        let lamport_off = round_up(flags_off + flags_bytes, SECTION_ALIGN).ok_or(too_big("flags", flags_bytes))?;
        let lamport_slot_bytes = if w1 == 0 {
            0
        } else {
            round_up(lamport_bytes, SLOT_ALIGN).ok_or(too_big("lamport_bytes", lamport_bytes))?
        };
        let lamport_total = lamport_slot_bytes
            .checked_mul(3 * w1)
            .and_then(|v| v.checked_add(3 * w1 * HEADER_BYTES))
            .ok_or(too_big("lamport_bytes", lamport_bytes))?;
        let handoff_bytes = lamport_slot_bytes.min(HANDOFF_MAX_BYTES);
        let ring_off = lamport_off
            .checked_add(lamport_total)
            .and_then(|v| v.checked_add(handoff_bytes))
            .and_then(|v| round_up(v, SECTION_ALIGN))
            .ok_or(too_big("lamport_bytes", lamport_bytes))?;
        let total = ring_off
            .checked_add(ring_bytes)
            .and_then(|v| round_up(v.max(1), SECTION_ALIGN))
            .ok_or(too_big("staging_bytes", staging_bytes))?;
        Ok(WorkspaceLayout {
            world,
            flags_off,
            flags_bytes,
            lamport_off,
            lamport_slot_bytes,
            ring_off,
            ring_slots: slots,
            slot_bytes,
            handoff_bytes,
            total,
        })
    }

    /// Peers per rank.
    pub fn w1(&self) -> usize {
        self.world - 1
    }

    /// Words zeroed at setup (STATE and FLAGS, contiguous from offset 0).
    pub fn zero_words(&self) -> usize {
        (self.flags_off + self.flags_bytes) / 4
    }

    /// Bytes of all Lamport buffers and their headers (filled with the sentinel at setup).
    pub fn lamport_total(&self) -> usize {
        (self.lamport_slot_bytes + HEADER_BYTES) * 3 * self.w1()
    }

    /// Offset of the HANDOFF buffer (after the Lamport headers, 16-byte aligned).
    pub fn handoff_off(&self) -> usize {
        self.lamport_off + self.lamport_total()
    }

    /// Bytes filled with the sentinel at setup from `lamport_off`: the Lamport buffers, their
    /// headers and HANDOFF.
    pub fn sentinel_bytes(&self) -> usize {
        self.lamport_total() + self.handoff_bytes
    }

    /// Offset of the op header `from` pushed into `at`'s Lamport buffer `buf`, as the kernel
    /// computes it (after the three buffers).
    pub fn lamport_header_offset(&self, buf: usize, at: usize, from: usize) -> usize {
        let l = peer_index(at, from, self.world);
        self.lamport_headers_off() + (buf * self.w1() + l) * HEADER_BYTES
    }

    /// Offset of the Lamport op headers `HDR[3][w1]` (after the three buffers; a kernel argument).
    pub fn lamport_headers_off(&self) -> usize {
        self.lamport_off + 3 * self.w1() * self.lamport_slot_bytes
    }

    /// Offset of the ring op headers `HDR[w1][S]` (in FLAGS after DATA, ACK and SENT, 16-byte
    /// aligned; a kernel argument).
    pub fn ring_headers_off(&self) -> usize {
        self.flags_off + ring_header_rel(self.w1(), self.ring_slots)
    }

    /// Offset of the op header of ring slot `slot` from `from` in `at`'s workspace.
    pub fn ring_header_offset(&self, at: usize, from: usize, slot: usize) -> usize {
        let l = peer_index(at, from, self.world);
        self.ring_headers_off() + (l * self.ring_slots + slot) * HEADER_BYTES
    }

    /// Bytes of the ring (the staging area).
    pub fn ring_bytes(&self) -> usize {
        self.slot_bytes * self.ring_slots * self.w1()
    }

    /// Largest message (bytes) the Lamport algorithm takes.
    pub fn lamport_max_bytes(&self) -> usize {
        self.lamport_slot_bytes
    }

    /// Offset of `rank`'s slot at `at` in Lamport buffer `buf` (0..3), as the kernel computes it.
    pub fn lamport_slot_offset(&self, buf: usize, at: usize, from: usize) -> usize {
        let l = peer_index(at, from, self.world);
        self.lamport_off + buf * self.w1() * self.lamport_slot_bytes + l * self.lamport_slot_bytes
    }

    /// Offset of ring slot `slot` holding data from `from` in `at`'s workspace.
    pub fn ring_slot_offset(&self, at: usize, from: usize, slot: usize) -> usize {
        let l = peer_index(at, from, self.world);
        self.ring_off + (l * self.ring_slots + slot) * self.slot_bytes
    }
}

/// Where the ring headers start in FLAGS: after DATA, ACK and SENT, 16-byte aligned.
fn ring_header_rel(w1: usize, slots: usize) -> usize {
    ((2 * w1 + 1) * slots * 4).div_ceil(HEADER_BYTES) * HEADER_BYTES
}

/// Index of `from` among `at`'s peers: `(from - at - 1) mod world` (so the l-th peer of `at` is
/// `(at + 1 + l) % world`). `from != at`.
pub fn peer_index(at: usize, from: usize, world: usize) -> usize {
    (from + world - at - 1) % world
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_two_rank_layout() {
        let l = WorkspaceLayout::new(2, 10 << 20, 4 << 20, 64).unwrap();
        assert_eq!(l.ring_slots, 64);
        assert_eq!(l.slot_bytes, 160 * 1024);
        assert_eq!(l.ring_bytes(), 10 << 20);
        assert_eq!(l.lamport_total(), (12 << 20) + 3 * HEADER_BYTES);
        assert!(l.flags_off >= STATE_BYTES);
        assert!(l.lamport_off >= l.flags_off + l.flags_bytes);
        assert!(l.ring_off >= l.lamport_off + l.lamport_total());
        assert!(l.total >= l.ring_off + l.ring_bytes());
        for off in [l.flags_off, l.lamport_off, l.ring_off, l.total] {
            assert_eq!(off % SECTION_ALIGN, 0);
        }
        assert_eq!(l.zero_words() * 4, l.flags_off + l.flags_bytes);
    }

    #[test]
    fn handoff_sits_after_the_headers_inside_the_sentinel_fill() {
        for (world, lamport) in [(2, 4 << 20), (4, 64 << 10), (8, 3 << 20)] {
            let l = WorkspaceLayout::new(world, 10 << 20, lamport, 64).unwrap();
            assert_eq!(l.handoff_bytes, l.lamport_slot_bytes.min(HANDOFF_MAX_BYTES));
            assert_eq!(l.handoff_off(), l.lamport_headers_off() + 3 * l.w1() * HEADER_BYTES);
            assert!(l.handoff_off().is_multiple_of(16));
            assert_eq!(l.sentinel_bytes(), l.lamport_total() + l.handoff_bytes);
            assert!(l.handoff_off() + l.handoff_bytes <= l.ring_off, "{l:?}");
        }
        assert_eq!(WorkspaceLayout::new(1, 10 << 20, 4 << 20, 64).unwrap().handoff_bytes, 0);
    }

    #[test]
    fn slots_shrink_before_going_under_the_minimum() {
        let l = WorkspaceLayout::new(8, 1 << 20, 64 << 10, 64).unwrap();
        assert!(l.slot_bytes >= MIN_SLOT_BYTES, "{l:?}");
        assert!(l.ring_slots.is_power_of_two() && l.ring_slots >= 2);
        assert!(l.ring_bytes() <= 1 << 20);
        assert!(
            WorkspaceLayout::new(8, 100 << 10, 0, 64).is_err(),
            "too small a staging area"
        );
    }

    #[test]
    fn bad_arguments() {
        assert!(WorkspaceLayout::new(0, 10 << 20, 0, 64).is_err());
        assert!(WorkspaceLayout::new(9, 10 << 20, 0, 64).is_err());
        assert!(WorkspaceLayout::new(2, 10 << 20, 0, 48).is_err());
        assert!(WorkspaceLayout::new(2, 10 << 20, usize::MAX / 2, 64).is_err());
    }

    #[test]
    fn single_rank_has_no_peer_areas() {
        let l = WorkspaceLayout::new(1, 10 << 20, 4 << 20, 64).unwrap();
        assert_eq!(l.ring_bytes(), 0);
        assert_eq!(l.lamport_total(), 0);
        assert!(l.total >= STATE_BYTES);
    }

    #[test]
    fn peer_slots_are_disjoint_and_match_the_kernel_indexing() {
        for world in 2..=MAX_WORLD {
            let l = WorkspaceLayout::new(world, 4 << 20, 64 << 10, 16).unwrap();
            for at in 0..world {
                let mut seen = std::collections::HashSet::new();
                let mut headers = std::collections::HashSet::new();
                for from in (0..world).filter(|&f| f != at) {
                    let idx = peer_index(at, from, world);
                    assert!(idx < world - 1);
                    assert!(seen.insert(idx), "two peers share index {idx}");
                    // The kernel's sender l-th peer p = (from+1+l)%world writes at jr = world-2-l.
                    let l_from = peer_index(from, at, world);
                    assert_eq!((from + 1 + l_from) % world, at);
                    assert_eq!(world - 2 - l_from, idx);
                    for slot in [0, l.ring_slots - 1] {
                        let o = l.ring_slot_offset(at, from, slot);
                        assert!(o >= l.ring_off && o + l.slot_bytes <= l.ring_off + l.ring_bytes());
                    }
                    for buf in 0..3 {
                        let o = l.lamport_slot_offset(buf, at, from);
                        assert!(o >= l.lamport_off && o + l.lamport_slot_bytes <= l.ring_off);
                        let h = l.lamport_header_offset(buf, at, from);
                        assert!(h >= l.lamport_off + 3 * (world - 1) * l.lamport_slot_bytes);
                        assert!(
                            h.is_multiple_of(HEADER_BYTES) && h + HEADER_BYTES <= l.lamport_off + l.lamport_total()
                        );
                        assert!(headers.insert(h), "two Lamport headers share offset {h}");
                    }
                    for slot in 0..l.ring_slots {
                        let h = l.ring_header_offset(at, from, slot);
                        // After DATA, ACK and SENT, inside FLAGS (zeroed at setup).
                        assert!(h >= l.flags_off + (2 * (world - 1) + 1) * l.ring_slots * 4);
                        assert!(h.is_multiple_of(HEADER_BYTES) && h + HEADER_BYTES <= l.flags_off + l.flags_bytes);
                        assert!(headers.insert(h), "two ring headers share offset {h}");
                    }
                }
            }
        }
    }
}
