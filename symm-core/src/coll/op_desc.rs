//! What every rank of a collective must agree on, in one small record (NOTE
//! [op-agreement] in docs/architecture.md): the op's kind, element type,
//! element count, reduce operator, algorithm variant, and its sequence number
//! in the communicator. Engines exchange it inside the synchronisation an op
//! already does and compare it with every peer's, so ranks that disagree get
//! [`Error::Mismatch`] naming both sides instead of `Ok` with wrong data.

use std::fmt;

use crate::error::{Error, Result};
use crate::types::{DType, ReduceOp};

/// The collective an op descriptor describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum OpKind {
    AllReduce = 1,
    ReduceScatter = 2,
    AllGather = 3,
    Barrier = 4,
    /// The rank rejected its own arguments for this op: its peers fail too, so
    /// none of them pairs with the rank's next op.
    Rejected = 5,
}

impl OpKind {
    fn from_u8(v: u8) -> Option<OpKind> {
        Some(match v {
            1 => OpKind::AllReduce,
            2 => OpKind::ReduceScatter,
            3 => OpKind::AllGather,
            4 => OpKind::Barrier,
            5 => OpKind::Rejected,
            _ => return None,
        })
    }
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Barrier => "barrier",
            OpKind::Rejected => "an op whose arguments it rejected",
        }
    }
}

/// One op as every rank must see it. `variant` tells apart algorithms whose
/// synchronisation differs (an engine's own numbering); `count` is the
/// element count the engine moves per rank (all-reduce: the message;
/// reduce-scatter: one output; all-gather: one input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDescriptor {
    pub seq: u64,
    pub kind: OpKind,
    pub dtype: Option<DType>,
    pub count: u64,
    pub reduce: Option<ReduceOp>,
    pub variant: u8,
}

const MAGIC: u32 = 0x5359_4f50; // "SYOP"
/// Tags of the first two header words (top byte), so a header never equals the sentinel.
const HDR_TAG0: u32 = 0x5300_0000;
const HDR_TAG1: u32 = 0x4f00_0000;

impl OpDescriptor {
    /// Encoded size in bytes.
    pub const BYTES: usize = 32;

    /// The fixed little-endian encoding peers read.
    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self
            .dtype
            .and_then(|d| DType::ALL.iter().position(|&x| x == d))
            .map_or(0, |i| i as u8 + 1);
        b[6] = self
            .reduce
            .and_then(|r| ReduceOp::ALL.iter().position(|&x| x == r))
            .map_or(0, |i| i as u8 + 1);
        b[7] = self.variant;
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes a peer's record; `None` when it is not one (never written, or
    /// written by something else).
    pub fn decode(b: &[u8]) -> Option<OpDescriptor> {
        if b.len() < Self::BYTES || b[0..4] != MAGIC.to_le_bytes() {
            return None;
        }
        let pick = |v: u8, n: usize| (v as usize).checked_sub(1).filter(|&i| i < n);
        let dtype = match b[5] {
            0 => None,
            v => Some(DType::ALL[pick(v, DType::ALL.len())?]),
        };
        let reduce = match b[6] {
            0 => None,
            v => Some(ReduceOp::ALL[pick(v, ReduceOp::ALL.len())?]),
        };
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[8..16]);
        let count = u64::from_le_bytes(w);
        w.copy_from_slice(&b[16..24]);
        let seq = u64::from_le_bytes(w);
        Some(OpDescriptor {
            seq,
            kind: OpKind::from_u8(b[4])?,
            dtype,
            count,
            reduce,
            variant: b[7],
        })
    }

    /// The record as four 32-bit words for the collective kernels' in-band headers (NOTE
    /// [op-agreement]): everything but `seq`, which the device does not know. No word is ever
    /// `0xFFFF_FFFF` (the Lamport sentinel); `count` is kept modulo 2^62.
    pub fn header_words(&self) -> [u32; 4] {
        let b = self.encode();
        [
            HDR_TAG0 | (u32::from(b[4]) << 16) | (u32::from(b[5]) << 8) | u32::from(b[6]),
            HDR_TAG1 | u32::from(self.variant),
            (self.count & 0x7fff_ffff) as u32,
            ((self.count >> 31) & 0x7fff_ffff) as u32,
        ]
    }

    /// Decodes [`Self::header_words`] (`seq` 0); `None` when the words are not a header.
    pub(crate) fn from_header_words(w: [u32; 4]) -> Option<OpDescriptor> {
        if w[0] & 0xff00_0000 != HDR_TAG0 || w[1] & 0xffff_ff00 != HDR_TAG1 || (w[2] | w[3]) >> 31 != 0 {
            return None;
        }
        let mut b = OpDescriptor {
            seq: 0,
            kind: OpKind::Barrier,
            dtype: None,
            count: 0,
            reduce: None,
            variant: 0,
        }
        .encode();
        b[4] = (w[0] >> 16) as u8;
        b[5] = (w[0] >> 8) as u8;
        b[6] = w[0] as u8;
        b[7] = w[1] as u8;
        b[8..16].copy_from_slice(&(u64::from(w[2]) | (u64::from(w[3]) << 31)).to_le_bytes());
        OpDescriptor::decode(&b)
    }

    /// This record as `agree` names it in an error (the device form has no sequence number).
    pub fn describe(&self, variant_names: VariantNames) -> String {
        Show(self, variant_names, false).to_string()
    }

    /// Ok when `peer`'s record (as read from its memory) equals this rank's;
    /// else [`Error::Mismatch`] naming both sides. `variant_names` names the
    /// engine's variants of an op kind (`None`: the variant goes unsaid).
    pub fn agree(&self, me: usize, peer: usize, theirs: &[u8], variant_names: VariantNames) -> Result<()> {
        let mine = Show(self, variant_names, true);
        match OpDescriptor::decode(theirs) {
            Some(t) if t == *self => Ok(()),
            Some(t) => Err(Error::Mismatch {
                what: "the collective op",
                detail: format!(
                    "rank {peer} ran {}, rank {me} ran {mine}",
                    Show(&t, variant_names, true)
                ),
            }),
            None => Err(Error::Mismatch {
                what: "the collective op",
                detail: format!("rank {peer} published no op record, rank {me} ran {mine}"),
            }),
        }
    }
}

/// An engine's name for variant `v` of an op kind.
pub type VariantNames = fn(OpKind, u8) -> Option<&'static str>;

/// A record as errors name it; the flag says whether to show the sequence number.
struct Show<'a>(&'a OpDescriptor, VariantNames, bool);

impl fmt::Display for Show<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if self.2 {
            write!(f, "op #{} ", d.seq)?;
        }
        write!(f, "{}", d.kind.name())?;
        if d.kind == OpKind::Rejected || d.kind == OpKind::Barrier {
            return Ok(());
        }
        write!(f, " of {} x {}", d.count, d.dtype.map_or("?", DType::name))?;
        if let Some(r) = d.reduce {
            write!(f, ", {r:?}")?;
        }
        match (self.1)(d.kind, d.variant) {
            Some(v) => write!(f, ", {v}"),
            None if d.variant == 0 => Ok(()),
            None => write!(f, ", variant {}", d.variant),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ar(count: u64) -> OpDescriptor {
        OpDescriptor {
            seq: 5,
            kind: OpKind::AllReduce,
            dtype: Some(DType::BF16),
            count,
            reduce: Some(ReduceOp::Sum),
            variant: 0,
        }
    }

    #[test]
    fn round_trips_and_rejects_garbage() {
        for d in [
            ar(1000),
            OpDescriptor {
                seq: u64::MAX,
                kind: OpKind::Rejected,
                dtype: None,
                count: 0,
                reduce: None,
                variant: 3,
            },
        ] {
            assert_eq!(OpDescriptor::decode(&d.encode()), Some(d));
        }
        assert_eq!(OpDescriptor::decode(&[0u8; 32]), None);
        let mut bad = ar(1).encode();
        bad[5] = 200;
        assert_eq!(OpDescriptor::decode(&bad), None);
        assert_eq!(OpDescriptor::decode(&ar(1).encode()[..31]), None);
    }

    #[test]
    fn header_words_round_trip_and_never_hold_the_sentinel() {
        for count in [0u64, 1, 1000, 0x7fff_ffff, 0x8000_0000, u32::MAX as u64, (1 << 62) - 1] {
            for kind in [OpKind::AllReduce, OpKind::AllGather, OpKind::Rejected] {
                let d = OpDescriptor {
                    seq: 0,
                    kind,
                    dtype: Some(DType::F16),
                    count,
                    reduce: Some(ReduceOp::Max),
                    variant: 4,
                };
                let w = d.header_words();
                assert!(w.iter().all(|&x| x != u32::MAX), "{w:x?}");
                assert_eq!(OpDescriptor::from_header_words(w), Some(d));
            }
        }
        assert_ne!(ar(1000).header_words(), ar(2000).header_words());
        assert_eq!(OpDescriptor::from_header_words([0; 4]), None);
        assert_eq!(OpDescriptor::from_header_words([u32::MAX; 4]), None);
    }

    #[test]
    fn disagreement_names_both_sides() {
        fn names(k: OpKind, v: u8) -> Option<&'static str> {
            (k == OpKind::AllReduce)
                .then(|| ["one_shot", "two_shot"].get(v as usize).copied())
                .flatten()
        }
        let names: VariantNames = names;
        assert!(ar(1000).agree(0, 1, &ar(1000).encode(), names).is_ok());
        let e = ar(1000).agree(0, 1, &ar(2000).encode(), names).unwrap_err().to_string();
        assert!(e.contains("rank 1 ran op #5 all_reduce of 2000 x bf16"), "{e}");
        assert!(
            e.contains("rank 0 ran op #5 all_reduce of 1000 x bf16, Sum, one_shot"),
            "{e}"
        );
        let mut other = ar(1000);
        other.reduce = Some(ReduceOp::Max);
        assert!(ar(1000).agree(0, 1, &other.encode(), names).is_err());
        other = ar(1000);
        other.seq = 6;
        assert!(ar(1000).agree(0, 1, &other.encode(), names).is_err());
        assert!(ar(1000).agree(0, 1, &[0u8; 32], names).is_err());
    }
}
