//! What every engine of the all-reduce epilogues (residual add, RMSNorm) checks the same way:
//! the row geometry and which buffers may share memory (NOTE [fused-epilogue] in
//! `symm-core/kernels/epilogue.cuh`; docs/ops.md, "Fused epilogues").

#![forbid(unsafe_code)]

use crate::{DType, Error, Result};

/// Bytes every buffer of an epilogue op is aligned to, and that a row's bytes are a multiple of.
pub(crate) const ROW_ALIGN: usize = 16;
/// Most 16-byte vectors in one row: 512 threads of 8 vectors (bf16 / f16 rows of 32768
/// elements, f32 rows of 16384).
pub(crate) const MAX_ROW_VECTORS: usize = 512 * 8;

/// `[rows, hidden]` elements of `dtype`, checked: `hidden > 0`, `hidden` elements a whole
/// number of 16-byte vectors (a multiple of 8 for bf16 / f16, of 4 for f32) and at most
/// [`MAX_ROW_VECTORS`] of them, `count` a multiple of `hidden`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    rows: usize,
    hidden: usize,
    dtype: DType,
}

impl Rows {
    /// The rows of a `count`-element activation with rows of `hidden` elements.
    pub fn new(op: &'static str, count: usize, hidden: usize, dtype: DType) -> Result<Rows> {
        if !dtype.is_reducible_float() {
            return Err(Error::UnsupportedDType {
                dtype: dtype.to_string(),
                op,
            });
        }
        let row_bytes = hidden
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::InvalidArgument(format!("{op}: hidden size {hidden} overflows")))?;
        if hidden == 0 || row_bytes % ROW_ALIGN != 0 {
            return Err(Error::InvalidArgument(format!(
                "{op}: hidden size {hidden} is not a positive multiple of {} {dtype} elements (16 bytes)",
                ROW_ALIGN / dtype.size()
            )));
        }
        if row_bytes / ROW_ALIGN > MAX_ROW_VECTORS {
            return Err(Error::OutOfRange {
                what: "epilogue hidden size (elements)",
                value: hidden as u64,
                limit: (MAX_ROW_VECTORS * ROW_ALIGN / dtype.size()) as u64,
            });
        }
        if !count.is_multiple_of(hidden) {
            return Err(Error::InvalidArgument(format!(
                "{op}: {count} elements are not whole rows of {hidden}"
            )));
        }
        Ok(Rows {
            rows: count / hidden,
            hidden,
            dtype,
        })
    }

    /// Rows (tokens).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Elements per row.
    pub fn hidden(&self) -> usize {
        self.hidden
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Elements in all rows.
    pub fn count(&self) -> usize {
        self.rows * self.hidden
    }
    /// Bytes of all rows.
    pub fn bytes(&self) -> usize {
        self.count() * self.dtype.size()
    }
    /// 16-byte vectors per row.
    pub(crate) fn vectors_per_row(&self) -> usize {
        self.hidden * self.dtype.size() / ROW_ALIGN
    }
}

/// One buffer of an epilogue op: its address (device or host) and byte length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// What the caller called it (`"x"`, `"residual"`, ...).
    pub what: &'static str,
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub bytes: usize,
}

impl Span {
    fn overlaps(&self, o: &Span) -> bool {
        self.bytes > 0
            && o.bytes > 0
            && self.addr < o.addr.saturating_add(o.bytes as u64)
            && o.addr < self.addr.saturating_add(self.bytes as u64)
    }
}

/// The buffers of one epilogue op, as addresses.
#[derive(Debug, Clone, Copy)]
pub struct Buffers {
    /// This rank's partial sums.
    pub x: Span,
    /// The residual added to the all-reduced sum.
    pub residual: Span,
    /// The RMSNorm weight (`None`: the residual add alone).
    pub weight: Option<Span>,
    /// Where the sum plus residual goes.
    pub residual_out: Span,
    /// Where the normalised rows go (with `weight`).
    pub norm_out: Option<Span>,
}

impl Buffers {
    /// Alignment and aliasing: every buffer aligned to [`ROW_ALIGN`] bytes; `norm_out` is `x`
    /// or apart from it, `residual_out` is `residual` or apart from it (the in-place forms);
    /// no output overlaps another output or an input otherwise; `x` and `residual` are apart.
    /// Inputs may overlap each other otherwise (they are only read).
    pub fn check(&self, op: &'static str) -> Result<()> {
        let all = [
            Some(self.x),
            Some(self.residual),
            self.weight,
            Some(self.residual_out),
            self.norm_out,
        ];
        for s in all.iter().flatten() {
            if s.addr % ROW_ALIGN as u64 != 0 {
                return Err(Error::Misaligned {
                    what: s.what,
                    value: s.addr,
                    align: ROW_ALIGN as u64,
                });
            }
        }
        let apart = |a: &Span, b: &Span| -> Result<()> {
            if a.overlaps(b) {
                return Err(Error::InvalidArgument(format!(
                    "{op}: {} overlaps {} ({:#x}+{} and {:#x}+{})",
                    a.what, b.what, a.addr, a.bytes, b.addr, b.bytes
                )));
            }
            Ok(())
        };
        let same_or_apart = |out: &Span, input: &Span| -> Result<()> {
            if out.addr == input.addr && out.bytes == input.bytes {
                Ok(())
            } else {
                apart(out, input)
            }
        };
        apart(&self.x, &self.residual)?;
        same_or_apart(&self.residual_out, &self.residual)?;
        apart(&self.residual_out, &self.x)?;
        if let Some(w) = &self.weight {
            apart(&self.residual_out, w)?;
        }
        if let Some(n) = &self.norm_out {
            same_or_apart(n, &self.x)?;
            apart(n, &self.residual)?;
            apart(n, &self.residual_out)?;
            if let Some(w) = &self.weight {
                apart(n, w)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(what: &'static str, addr: u64, bytes: usize) -> Span {
        Span { what, addr, bytes }
    }

    #[test]
    fn rows_geometry() {
        let r = Rows::new("t", 4096 * 7, 4096, DType::BF16).unwrap();
        assert_eq!((r.rows(), r.vectors_per_row(), r.bytes()), (7, 512, 4096 * 7 * 2));
        assert_eq!(Rows::new("t", 16, 4, DType::F32).unwrap().vectors_per_row(), 1);
        assert!(
            Rows::new("t", 12, 12, DType::BF16).is_err(),
            "12 bf16 is not whole vectors"
        );
        assert!(Rows::new("t", 0, 0, DType::F32).is_err());
        assert!(
            Rows::new("t", 4096 * 2 + 8, 4096, DType::BF16).is_err(),
            "a partial row"
        );
        assert!(matches!(
            Rows::new("t", 0, 32768 + 8, DType::BF16),
            Err(Error::OutOfRange { .. })
        ));
        assert!(Rows::new("t", 0, 32768, DType::BF16).is_ok());
        assert!(Rows::new("t", 0, 16384 + 4, DType::F32).is_err());
        assert!(matches!(
            Rows::new("t", 8, 8, DType::I32),
            Err(Error::UnsupportedDType { .. })
        ));
        assert_eq!(Rows::new("t", 0, 8, DType::F16).unwrap().rows(), 0);
    }

    #[test]
    fn aliasing_rules() {
        let n = 1024;
        let base = Buffers {
            x: span("x", 0x1000, n),
            residual: span("residual", 0x2000, n),
            weight: Some(span("weight", 0x3000, 64)),
            residual_out: span("residual_out", 0x4000, n),
            norm_out: Some(span("norm_out", 0x5000, n)),
        };
        base.check("t").unwrap();
        // The in-place forms.
        let mut b = base;
        b.norm_out = Some(b.x);
        b.residual_out = b.residual;
        b.check("t").unwrap();
        // Residual aliasing the input.
        let mut b = base;
        b.residual = span("residual", 0x1000 + 512, n);
        assert!(b.check("t").is_err());
        // A partial overlap of an in-place pair.
        let mut b = base;
        b.norm_out = Some(span("norm_out", 0x1010, n));
        assert!(b.check("t").is_err());
        // Two outputs in one place.
        let mut b = base;
        b.norm_out = Some(b.residual_out);
        assert!(b.check("t").is_err());
        // An output over the weight.
        let mut b = base;
        b.residual_out = span("residual_out", 0x3000, n);
        assert!(b.check("t").is_err());
        // The weight may overlap an input (both are only read).
        let mut b = base;
        b.weight = Some(span("weight", 0x1000, 64));
        b.check("t").unwrap();
        // Misaligned.
        let mut b = base;
        b.x = span("x", 0x1002, n);
        assert!(matches!(b.check("t"), Err(Error::Misaligned { what: "x", .. })));
    }
}
