//! An epilogue op's buffers as the device addresses the kernel engine hands to the kernels:
//! split by use, resolved by the engine's own input / output resolution ([`Resolve`]), and the
//! sum's place of the separate sequence chosen. The engine then builds its `Epilogue` from
//! [`Addresses`] where its ops cross into the raw-address entries (NOTE [raw-addresses]).

use symm_core::Result;

use super::{check_sum_place, EpiArgs, ResArg, SumAt, XArg};
use crate::buf::{Buf, BufMut};

/// How a GPU engine turns one buffer of an op into its device address (checked for its device,
/// alignment and length, as for any op), with what it must hold until the op is enqueued.
pub(crate) trait Resolve<'s> {
    /// Held until the op is enqueued (a cudarc buffer's stream guard; otherwise nothing).
    type Guard;
    /// An input's address.
    fn input(&'s self, b: &'s Buf<'_>) -> Result<(u64, Self::Guard)>;
    /// An output's address.
    fn output(&'s self, b: &'s mut BufMut<'_>) -> Result<(u64, Self::Guard)>;
}

/// What an engine holds while an epilogue op is enqueued: the guards of x, residual_out,
/// residual, weight and norm_out.
pub(crate) type Held<G> = [Option<G>; 5];

/// One epilogue op's buffers, split by how each is used.
pub(crate) struct EpiBufs<'a> {
    op: &'static str,
    sum_at: SumAt,
    eps: f32,
    /// `x`, read only or also written.
    x: XArg<'a>,
    /// The residual when apart from its output.
    residual: Option<Buf<'a>>,
    residual_out: BufMut<'a>,
    weight: Option<Buf<'a>>,
    /// The norm's output when apart from `x`.
    norm_out: Option<BufMut<'a>>,
}

impl<'a> From<EpiArgs<'a>> for EpiBufs<'a> {
    fn from(a: EpiArgs<'a>) -> EpiBufs<'a> {
        let (op, sum_at, eps) = (a.op(), a.sum_at(), a.eps());
        let (residual, residual_out) = match a.residual {
            ResArg::Apart(r, o) => (Some(r), o),
            ResArg::InPlace(r) => (None, r),
        };
        let (weight, norm_out) = match a.norm {
            Some((w, _, o)) => (Some(w), o),
            None => (None, None),
        };
        EpiBufs {
            op,
            sum_at,
            eps,
            x: a.x,
            residual,
            residual_out,
            weight,
            norm_out,
        }
    }
}

/// An epilogue op's device addresses, as `Epilogue::new` takes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addresses {
    pub op: &'static str,
    pub x: u64,
    pub residual: u64,
    pub residual_out: u64,
    /// `(weight, norm_out, eps)` with the RMSNorm (`norm_out` is `x` in place).
    pub norm: Option<(u64, u64, f32)>,
    sum_at: SumAt,
}

impl Addresses {
    /// Where the separate sequence all-reduces into (`x`, the norm output or the residual
    /// output), after [`check_sum_place`]: the out-of-place residual add's output must not be
    /// its residual. Every mechanism checks it, so a rank refuses alike whichever runs.
    pub fn sum_place(&self) -> Result<u64> {
        check_sum_place(self.op, self.sum_at, self.residual, self.residual_out)?;
        Ok(match self.sum_at {
            SumAt::X => self.x,
            SumAt::NormOut => self.norm.map_or(self.x, |(_, n, _)| n),
            SumAt::ResidualOut => self.residual_out,
        })
    }
}

impl EpiBufs<'_> {
    /// Every buffer's address through `r` (inputs as inputs, outputs and a written `x` as
    /// outputs; the in-place residual is its output, the in-place norm's output is `x`), in the
    /// order x, residual_out, residual, weight, norm_out, with the guards
    /// to hold until the op is enqueued.
    pub fn resolve<'s, R: Resolve<'s>>(&'s mut self, r: &'s R) -> Result<(Addresses, Held<R::Guard>)> {
        let EpiBufs {
            op,
            sum_at,
            eps,
            x,
            residual,
            residual_out,
            weight,
            norm_out,
        } = self;
        let (x, gx) = match x {
            XArg::In(b) => r.input(b)?,
            XArg::Mut(b) => r.output(b)?,
        };
        let (ro, gro) = r.output(residual_out)?;
        let (res, gr) = match residual {
            Some(b) => {
                let (p, g) = r.input(b)?;
                (p, Some(g))
            }
            None => (ro, None),
        };
        let (w, gw) = match weight {
            Some(b) => {
                let (p, g) = r.input(b)?;
                (Some(p), Some(g))
            }
            None => (None, None),
        };
        let (n, gn) = match norm_out {
            Some(b) => {
                let (p, g) = r.output(b)?;
                (p, Some(g))
            }
            None => (x, None),
        };
        let a = Addresses {
            op,
            x,
            residual: res,
            residual_out: ro,
            norm: w.map(|w| (w, n, *eps)),
            sum_at: *sum_at,
        };
        Ok((a, [Some(gx), Some(gro), gr, gw, gn]))
    }
}
