//! Op agreement on the CUDA kernels (NOTE [op-agreement] in docs/architecture.md and in
//! symm-core's `kernels/collectives.cu`): the header every Lamport and ring launch carries in band, the
//! check words of the barrier and fused-pull paths, and the error a recorded disagreement
//! becomes.

#![forbid(unsafe_code)]

use std::time::Duration;

use crate::pad::{ERR_ABORTED, ERR_MISMATCH, ERR_OP_MISMATCH, ERR_PEER_REJECTED, ERR_TIMEOUT};
use crate::{DType, Error, OpDescriptor, OpKind, ReduceOp};

use super::args::OpHeader;
use super::geometry::check_word_of;
use super::layout::{MISMATCH_CHECK, MISMATCH_HEADER, MISMATCH_REJECTED, MISMATCH_WORDS};

/// The mechanism an op runs (its `OpDescriptor::variant` on the device): ranks whose ops
/// agree in every other field but run different mechanisms disagree too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mechanism {
    Lamport = 1,
    /// The ring kernel over the whole message (one-shot all-reduce, reduce-scatter, all-gather).
    Ring = 2,
    /// Ring reduce-scatter then ring all-gather.
    TwoShot = 3,
    /// Barrier, copy-engine copies (and SM reductions), barrier.
    CopyEngine = 4,
    /// The fused zero-copy pull kernel.
    Pull = 5,
    /// The two-rank copy-engine two-shot all-reduce.
    CeTwoShot = 6,
    /// Nothing to move: a barrier that compares the headers' check word.
    Empty = 7,
    /// The Lamport one-shot with the residual add (NOTE [fused-epilogue]).
    LamportResidual = 8,
    /// The Lamport one-shot with the residual add and RMSNorm.
    LamportResidualNorm = 9,
    /// The Lamport two-shot all-reduce (NOTE [lamport-two-shot]).
    LamportTwoShot = 10,
}

impl Mechanism {
    const ALL: [Mechanism; 10] = [
        Mechanism::Lamport,
        Mechanism::Ring,
        Mechanism::TwoShot,
        Mechanism::CopyEngine,
        Mechanism::Pull,
        Mechanism::CeTwoShot,
        Mechanism::Empty,
        Mechanism::LamportResidual,
        Mechanism::LamportResidualNorm,
        Mechanism::LamportTwoShot,
    ];

    fn name(self) -> &'static str {
        match self {
            Mechanism::Lamport => "lamport",
            Mechanism::Ring => "ring",
            Mechanism::TwoShot => "two_shot",
            Mechanism::CopyEngine => "copy_engine",
            Mechanism::Pull => "pull",
            Mechanism::CeTwoShot => "copy_engine_two_shot",
            Mechanism::Empty => "empty",
            Mechanism::LamportResidual => "lamport_residual",
            Mechanism::LamportResidualNorm => "lamport_residual_rms_norm",
            Mechanism::LamportTwoShot => "lamport_two_shot",
        }
    }
}

/// `OpDescriptor` variant names of this engine.
fn variant_name(_kind: OpKind, v: u8) -> Option<&'static str> {
    Mechanism::ALL.iter().find(|m| **m as u8 == v).map(|m| m.name())
}

/// The header of one op: what every rank must agree on (kind, dtype, element count as the op
/// counts it, reduce operator, mechanism).
pub fn header(kind: OpKind, dtype: DType, count: usize, reduce: Option<ReduceOp>, mech: Mechanism) -> OpHeader {
    OpHeader(
        OpDescriptor {
            seq: 0,
            kind,
            dtype: Some(dtype),
            count: count as u64,
            reduce,
            variant: mech as u8,
        }
        .header_words(),
    )
}

/// The check word of a barrier or fused pull: the header and the op's geometry (`parts`),
/// computed without allocating (it is on every op's launch path).
pub fn checked(hdr: &OpHeader, parts: &[u64]) -> u32 {
    check_word_of(hdr.0.iter().map(|&w| u64::from(w)).chain(parts.iter().copied()))
}

fn describe(w: [u32; 4]) -> String {
    OpDescriptor::from_header_words(w).map_or_else(
        || format!("an op with an unreadable header {w:08x?}"),
        |d| d.describe(variant_name),
    )
}

/// The error a latched disagreement becomes, from the `MISMATCH_WORDS` STATE words the kernel
/// recorded (`None` when no record was written, e.g. after the host cleared the error).
pub(crate) fn mismatch_error(me: usize, record: &[u32; MISMATCH_WORDS]) -> Option<Error> {
    let peer = (record[0] & 0xffff).checked_sub(1)? as usize;
    let words = |i: usize| [record[i], record[i + 1], record[i + 2], record[i + 3]];
    Some(match record[0] >> 16 {
        MISMATCH_HEADER => Error::Mismatch {
            what: "the collective op",
            detail: format!(
                "rank {peer} ran {}, rank {me} ran {}",
                describe(words(1)),
                describe(words(5))
            ),
        },
        MISMATCH_CHECK => Error::Mismatch {
            what: "the collective op",
            detail: format!(
                "rank {peer} passed check word {:#010x}, rank {me} {:#010x}: the ranks ran different ops \
                 (kind, dtype, count, reduce operator, mechanism) or passed symmetric buffers at different \
                 offsets",
                record[1], record[5]
            ),
        },
        MISMATCH_REJECTED => Error::Mismatch {
            what: "the collective op",
            detail: format!(
                "rank {peer} rejected its own arguments for an op, so rank {me}'s matching op cannot complete"
            ),
        },
        _ => return None,
    })
}

/// Whether an `ERROR`-word code says the ranks disagreed (a mismatch record may hold which).
pub(crate) fn is_mismatch(code: u32) -> bool {
    matches!(code, ERR_MISMATCH | ERR_OP_MISMATCH | ERR_PEER_REJECTED)
}

/// The `MISMATCH_WORDS` STATE words of a mismatch record, from their little-endian bytes.
pub(crate) fn record_words(raw: &[u8; MISMATCH_WORDS * 4]) -> [u32; MISMATCH_WORDS] {
    let mut record = [0u32; MISMATCH_WORDS];
    for (w, b) in record.iter_mut().zip(raw.chunks_exact(4)) {
        *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    record
}

/// [`collective_error`] as a result, reading the mismatch record with `read_record` (the
/// `MISMATCH_WORDS` STATE words' bytes, which the backend also clears) only when the code is a
/// mismatch.
pub fn code_result(
    code: u32,
    read_record: impl FnOnce() -> crate::Result<[u8; MISMATCH_WORDS * 4]>,
    at: (&str, usize),
    timeout: Duration,
    backend: &'static str,
) -> crate::Result<()> {
    let record = if is_mismatch(code) {
        Some(record_words(&read_record()?))
    } else {
        None
    };
    match collective_error(code, record.as_ref(), at, timeout, backend) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// The error the collectives' `ERROR`-word `code` stands for (`None`: no error), written once for
/// every backend: `(group, rank)` name where it happened, `timeout` the deadline the kernels ran
/// under, `record` the mismatch record the backend read when [`is_mismatch`] (NOTE
/// [op-agreement]); an unknown code names `backend`.
pub(crate) fn collective_error(
    code: u32,
    record: Option<&[u32; MISMATCH_WORDS]>,
    (group, rank): (&str, usize),
    timeout: Duration,
    backend: &'static str,
) -> Option<Error> {
    Some(match code {
        0 => return None,
        ERR_TIMEOUT => Error::Timeout {
            what: format!("collective device wait (group {group}, rank {rank})"),
            timeout,
        },
        ERR_ABORTED => Error::Aborted(format!("collective aborted (group {group}, rank {rank})")),
        c if is_mismatch(c) => record
            .and_then(|r| mismatch_error(rank, r))
            .unwrap_or_else(|| Error::Mismatch {
                what: "the collective op",
                detail: "the ranks ran different ops, or passed symmetric buffers at different offsets \
                         (no record of which)"
                    .into(),
            }),
        other => Error::Backend {
            backend,
            call: "collectives check_error".into(),
            detail: format!("unknown code {other} in the ERROR word"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_record_names_both_sides() {
        let a = header(
            OpKind::AllReduce,
            DType::BF16,
            1000,
            Some(ReduceOp::Sum),
            Mechanism::Lamport,
        );
        let b = header(OpKind::AllGather, DType::F32, 500, None, Mechanism::Ring);
        let mut r = [0u32; MISMATCH_WORDS];
        r[0] = 3 | (MISMATCH_HEADER << 16);
        r[1..5].copy_from_slice(&b.0);
        r[5..9].copy_from_slice(&a.0);
        let e = mismatch_error(1, &r).unwrap().to_string();
        assert!(e.contains("rank 2 ran all_gather of 500 x f32, ring"), "{e}");
        assert!(e.contains("rank 1 ran all_reduce of 1000 x bf16, Sum, lamport"), "{e}");
    }

    #[test]
    fn check_and_reject_records() {
        let mut r = [0u32; MISMATCH_WORDS];
        assert!(mismatch_error(0, &r).is_none());
        r[0] = 1 | (MISMATCH_REJECTED << 16);
        assert!(mismatch_error(1, &r).unwrap().to_string().contains("rank 0 rejected"));
        r[0] = 2 | (MISMATCH_CHECK << 16);
        r[1] = 0xabc;
        assert!(mismatch_error(0, &r).unwrap().to_string().contains("0x00000abc"));
        r[0] = 2 | (7 << 16);
        assert!(mismatch_error(0, &r).is_none());
    }

    #[test]
    fn every_field_changes_the_header_and_the_check_word() {
        let base = header(OpKind::AllReduce, DType::F32, 500, Some(ReduceOp::Sum), Mechanism::Ring);
        let others = [
            header(
                OpKind::ReduceScatter,
                DType::F32,
                500,
                Some(ReduceOp::Sum),
                Mechanism::Ring,
            ),
            header(OpKind::AllReduce, DType::F16, 500, Some(ReduceOp::Sum), Mechanism::Ring),
            header(OpKind::AllReduce, DType::F32, 501, Some(ReduceOp::Sum), Mechanism::Ring),
            header(OpKind::AllReduce, DType::F32, 500, Some(ReduceOp::Max), Mechanism::Ring),
            header(
                OpKind::AllReduce,
                DType::F32,
                500,
                Some(ReduceOp::Sum),
                Mechanism::TwoShot,
            ),
        ];
        for o in others {
            assert_ne!(o, base);
            assert_ne!(checked(&o, &[1, 2]), checked(&base, &[1, 2]));
        }
        assert_ne!(checked(&base, &[1, 2]), checked(&base, &[1, 3]));
        let mut all: Vec<u64> = base.0.iter().map(|&w| u64::from(w)).collect();
        all.extend([1, 2]);
        assert_eq!(checked(&base, &[1, 2]), crate::coll::geometry::check_word(&all));
    }

    #[test]
    fn collective_errors_decode_once() {
        let t = Duration::from_millis(7);
        let at = ("g", 1);
        assert!(collective_error(0, None, at, t, "x").is_none());
        assert!(matches!(
            collective_error(ERR_TIMEOUT, None, at, t, "x"),
            Some(Error::Timeout { timeout, .. }) if timeout == t
        ));
        assert!(matches!(
            collective_error(ERR_ABORTED, None, at, t, "x"),
            Some(Error::Aborted(_))
        ));
        assert!(matches!(
            collective_error(0x7777, None, at, t, "rocm"),
            Some(Error::Backend { backend: "rocm", .. })
        ));
        // A mismatch with a record names the peer; without one it is still a mismatch.
        let mut raw = [0u8; MISMATCH_WORDS * 4];
        raw[..4].copy_from_slice(&((MISMATCH_REJECTED << 16) | 1).to_le_bytes());
        let record = record_words(&raw);
        for code in [ERR_MISMATCH, ERR_OP_MISMATCH, ERR_PEER_REJECTED] {
            assert!(is_mismatch(code));
            match collective_error(code, Some(&record), at, t, "x") {
                Some(Error::Mismatch { detail, .. }) => assert!(detail.contains("rank 0 rejected"), "{detail}"),
                other => panic!("{other:?}"),
            }
            assert!(matches!(
                collective_error(code, None, at, t, "x"),
                Some(Error::Mismatch { .. })
            ));
        }
        assert!(!is_mismatch(ERR_TIMEOUT));
    }
}
