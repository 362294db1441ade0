//! Signal-pad layout shared by every backend and every kernel.
//!
//! NOTE [signal-pad-layout]
//! ========================
//! Every rank's allocation holds a buffer followed by a signal pad of
//! [`SIGNAL_PAD_SIZE`] bytes. The pad is an array of `u32` words laid out as
//! below (offsets in words). The kernels get them from [`c_defines`], compiled
//! before every kernel file; `symm-core/kernels/common.cuh` keeps a hand copy
//! (under `#ifndef`); the host backend (symm-testkit) implements the same
//! protocol with atomics. Change one, change all: `symm-cuda`'s tests compare
//! the two sets.
//!
//! Regions written by PEERS (each slot has exactly one writer, the peer `src`):
//! - `BARRIER[channel][src]` at [`BARRIER_BASE`]: the last barrier epoch `src`
//!   reached on `channel`.
//! - `SIGNAL[channel][src]` at [`SIGNAL_BASE`]: the count of `put_signal`s `src`
//!   sent to this rank on `channel`.
//! - `OPS[slot][src]` at [`OPS_BASE`]: epochs for collective kernels
//!   (symm-ops), [`OPS_SLOTS`] slots.
//!
//! Region written only by the OWNER (never by peers):
//! - `LOCAL` at [`LOCAL_BASE`]: `barrier_epoch[channel]`,
//!   `sent[channel][dst]`, `recv[channel][src]`, `ops_epoch[slot]`, then the
//!   `ABORT` word (host sets it non-zero to abort every device wait) and the
//!   `ERROR` word (a device wait that timed out writes a non-zero code).
//!
//! Protocol (epoch counters, no compare-and-swap):
//! - barrier(c): `e = ++barrier_epoch[c]`; for every peer p: release-store `e`
//!   into p's `BARRIER[c][me]`; then for every peer p acquire-poll own
//!   `BARRIER[c][p]` until `(i32)(v - e) >= 0`.
//! - put_signal(dst, c): `e = ++sent[c][dst]`; release-store `e` into dst's
//!   `SIGNAL[c][me]`.
//! - wait_signal(src, c): `e = ++recv[c][src]`; acquire-poll own
//!   `SIGNAL[c][src]` until `(i32)(v - e) >= 0`.
//! - Every poll gives up at a deadline (returning a timeout error) or when
//!   `ABORT` is non-zero. Epochs wrap modulo 2^32; comparisons are signed
//!   differences.
//! - The pad is zeroed, and the zeroing made visible (device synchronised /
//!   fenced), before the rank publishes its handle, so no peer can signal into a
//!   pad that is later cleared.

/// The largest world size a pad has slots for.
pub const MAX_WORLD_SIZE: usize = 64;
/// Channels for barrier / put_signal / wait_signal.
pub const NUM_CHANNELS: usize = 32;
/// Slots reserved for collective kernels.
pub const OPS_SLOTS: usize = 64;

/// Word offset of `BARRIER[channel][src]`.
pub const BARRIER_BASE: usize = 0;
/// Word offset of `SIGNAL[channel][src]`.
pub const SIGNAL_BASE: usize = BARRIER_BASE + NUM_CHANNELS * MAX_WORLD_SIZE;
/// Word offset of `OPS[slot][src]`.
pub const OPS_BASE: usize = SIGNAL_BASE + NUM_CHANNELS * MAX_WORLD_SIZE;
/// Word offset of the owner-only region.
pub const LOCAL_BASE: usize = OPS_BASE + OPS_SLOTS * MAX_WORLD_SIZE;
/// Word offset of `barrier_epoch[channel]`.
pub const LOCAL_BARRIER_EPOCH: usize = LOCAL_BASE;
/// Word offset of `sent[channel][dst]`.
pub const LOCAL_SENT: usize = LOCAL_BARRIER_EPOCH + NUM_CHANNELS;
/// Word offset of `recv[channel][src]`.
pub const LOCAL_RECV: usize = LOCAL_SENT + NUM_CHANNELS * MAX_WORLD_SIZE;
/// Word offset of `ops_epoch[slot]`.
pub const LOCAL_OPS_EPOCH: usize = LOCAL_RECV + NUM_CHANNELS * MAX_WORLD_SIZE;
/// Word offset of the abort word.
pub const ABORT_WORD: usize = LOCAL_OPS_EPOCH + OPS_SLOTS;
/// Word offset of the error word.
pub const ERROR_WORD: usize = ABORT_WORD + 1;
/// Words used.
pub const USED_WORDS: usize = ERROR_WORD + 1;
/// Bytes of a signal pad (a power of two covering [`USED_WORDS`]).
pub const SIGNAL_PAD_SIZE: usize = 64 * 1024;

/// Error codes a device wait writes into the `ERROR` word.
pub const ERR_NONE: u32 = 0;
pub const ERR_TIMEOUT: u32 = 1;
pub const ERR_ABORTED: u32 = 2;
/// Ranks passed different check words to a barrier or a fused pull (op, geometry): that op's
/// barriers still complete, so the object stays in step.
pub const ERR_MISMATCH: u32 = 3;
/// A collective kernel saw a peer's op record differ from its own (NOTE [op-agreement]): the
/// ranks are out of step, so every later wait gives up at once.
pub const ERR_OP_MISMATCH: u32 = 4;
/// A peer rejected its own arguments for an op (NOTE [op-agreement]) and told this rank so:
/// every later wait gives up at once.
pub const ERR_PEER_REJECTED: u32 = 5;

const _: () = assert!(USED_WORDS * 4 <= SIGNAL_PAD_SIZE);

/// The error an `ERROR`-word `code` stands for (`None` for [`ERR_NONE`]), written once for every
/// backend: `what` names the wait (and the rank), `timeout` is the one it ran under, `backend`
/// names the backend in an unknown code's error. The mismatch codes give a generic
/// [`crate::Error::Mismatch`]; a backend that keeps a record of the mismatch (symm-cuda's
/// collectives, NOTE [op-agreement]) decodes that first.
pub fn code_error(
    code: u32,
    backend: &'static str,
    what: String,
    timeout: std::time::Duration,
) -> Option<crate::Error> {
    use crate::Error;
    Some(match code {
        ERR_NONE => return None,
        ERR_TIMEOUT => Error::Timeout { what, timeout },
        ERR_ABORTED => Error::Aborted(what),
        ERR_MISMATCH | ERR_OP_MISMATCH | ERR_PEER_REJECTED => Error::Mismatch {
            what: "a device wait",
            detail: format!("{what}: the ranks passed different ops or geometries (code {code})"),
        },
        other => Error::Backend {
            backend,
            call: what,
            detail: format!("unknown error code {other:#x} from the device"),
        },
    })
}

/// Word index of `BARRIER[channel][src]`.
pub const fn barrier_slot(channel: usize, src: usize) -> usize {
    BARRIER_BASE + channel * MAX_WORLD_SIZE + src
}
/// Word index of `SIGNAL[channel][src]`.
pub const fn signal_slot(channel: usize, src: usize) -> usize {
    SIGNAL_BASE + channel * MAX_WORLD_SIZE + src
}
/// Word index of `OPS[slot][src]`.
pub const fn ops_slot(slot: usize, src: usize) -> usize {
    OPS_BASE + slot * MAX_WORLD_SIZE + src
}
/// Word index of `sent[channel][dst]`.
pub const fn sent_slot(channel: usize, dst: usize) -> usize {
    LOCAL_SENT + channel * MAX_WORLD_SIZE + dst
}
/// Word index of `recv[channel][src]`.
pub const fn recv_slot(channel: usize, src: usize) -> usize {
    LOCAL_RECV + channel * MAX_WORLD_SIZE + src
}

/// `true` when epoch `v` has reached `target`, modulo 2^32.
pub const fn epoch_reached(v: u32, target: u32) -> bool {
    (v.wrapping_sub(target) as i32) >= 0
}

/// The `#define`s a kernel source needs for this layout, generated from the
/// constants above, so `.cu` files and Rust cannot drift.
pub fn c_defines() -> String {
    format!(
        "#define SYMM_MAX_WORLD_SIZE {MAX_WORLD_SIZE}\n\
         #define SYMM_NUM_CHANNELS {NUM_CHANNELS}\n\
         #define SYMM_OPS_SLOTS {OPS_SLOTS}\n\
         #define SYMM_BARRIER_BASE {BARRIER_BASE}\n\
         #define SYMM_SIGNAL_BASE {SIGNAL_BASE}\n\
         #define SYMM_OPS_BASE {OPS_BASE}\n\
         #define SYMM_LOCAL_BARRIER_EPOCH {LOCAL_BARRIER_EPOCH}\n\
         #define SYMM_LOCAL_SENT {LOCAL_SENT}\n\
         #define SYMM_LOCAL_RECV {LOCAL_RECV}\n\
         #define SYMM_LOCAL_OPS_EPOCH {LOCAL_OPS_EPOCH}\n\
         #define SYMM_ABORT_WORD {ABORT_WORD}\n\
         #define SYMM_ERROR_WORD {ERROR_WORD}\n\
         #define SYMM_SIGNAL_PAD_SIZE {SIGNAL_PAD_SIZE}\n\
         #define SYMM_ERR_TIMEOUT {ERR_TIMEOUT}\n\
         #define SYMM_ERR_ABORTED {ERR_ABORTED}\n\
         #define SYMM_ERR_MISMATCH {ERR_MISMATCH}\n\
         #define SYMM_ERR_OP_MISMATCH {ERR_OP_MISMATCH}\n\
         #define SYMM_ERR_PEER_REJECTED {ERR_PEER_REJECTED}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_decode_once() {
        use crate::Error;
        let t = std::time::Duration::from_secs(3);
        let e = |c| code_error(c, "test", "wait 1 (rank 0)".into(), t);
        assert!(e(ERR_NONE).is_none());
        assert!(matches!(e(ERR_TIMEOUT), Some(Error::Timeout { timeout, .. }) if timeout == t));
        assert!(matches!(e(ERR_ABORTED), Some(Error::Aborted(w)) if w.contains("rank 0")));
        for c in [ERR_MISMATCH, ERR_OP_MISMATCH, ERR_PEER_REJECTED] {
            assert!(matches!(e(c), Some(Error::Mismatch { .. })), "{c}");
        }
        assert!(matches!(e(77), Some(Error::Backend { backend: "test", .. })));
    }

    #[test]
    fn regions_do_not_overlap() {
        assert!(barrier_slot(NUM_CHANNELS - 1, MAX_WORLD_SIZE - 1) < SIGNAL_BASE);
        assert!(signal_slot(NUM_CHANNELS - 1, MAX_WORLD_SIZE - 1) < OPS_BASE);
        assert!(ops_slot(OPS_SLOTS - 1, MAX_WORLD_SIZE - 1) < LOCAL_BASE);
        assert!(sent_slot(NUM_CHANNELS - 1, MAX_WORLD_SIZE - 1) < LOCAL_RECV);
        assert!(recv_slot(NUM_CHANNELS - 1, MAX_WORLD_SIZE - 1) < LOCAL_OPS_EPOCH);
    }

    #[test]
    fn epochs_wrap() {
        assert!(epoch_reached(5, 5));
        assert!(epoch_reached(6, 5));
        assert!(!epoch_reached(4, 5));
        assert!(epoch_reached(2, u32::MAX));
        assert!(!epoch_reached(u32::MAX, 2));
    }

    #[test]
    fn defines_name_every_constant() {
        let d = c_defines();
        assert!(d.contains(&format!("SYMM_ERROR_WORD {ERROR_WORD}")));
        assert!(d.contains(&format!("SYMM_OPS_BASE {OPS_BASE}")));
    }
}
