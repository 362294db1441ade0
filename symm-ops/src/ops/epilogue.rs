//! The all-reduce epilogue ops on [`OnStream`] (NOTE [fused-epilogue]; their arguments and the
//! planner's rule in `crate::epilogue`).

use symm_core::{ReduceOp, Result};

use super::OnStream;
use crate::buf::{Buf, BufMut};
use crate::epilogue::{EpiArgs, EpiPlan, EpilogueAlgo, ResArg, RmsNorm, XArg};
use crate::select::Placement;

impl OnStream<'_> {
    /// `residual_out = residual + all_reduce_sum(x)`; `norm_out = RMSNorm(residual_out) * weight`
    /// per row of `norm.weight.len()` elements (the hidden size): the all-reduce table's pick and
    /// the epilogue kernel, or one fused kernel (`EpilogueAlgo::Auto`). Rounding and tolerance:
    /// docs/ops.md, "Fused epilogues".
    pub fn all_reduce_residual_rms_norm<'a>(
        &self,
        x: impl Into<Buf<'a>>,
        residual: impl Into<Buf<'a>>,
        norm: RmsNorm<'a>,
        norm_out: impl Into<BufMut<'a>>,
        residual_out: impl Into<BufMut<'a>>,
    ) -> Result<()> {
        self.all_reduce_residual_rms_norm_with(EpilogueAlgo::Auto, x, residual, norm, norm_out, residual_out)
    }

    /// [`Self::all_reduce_residual_rms_norm`] in place: `x` becomes the norm, `residual` the
    /// residual sum.
    pub fn all_reduce_residual_rms_norm_in_place<'a>(
        &self,
        x: impl Into<BufMut<'a>>,
        residual: impl Into<BufMut<'a>>,
        norm: RmsNorm<'a>,
    ) -> Result<()> {
        let hidden = norm.weight.len();
        self.epilogue_with(
            EpilogueAlgo::Auto,
            EpiArgs {
                x: XArg::Mut(x.into()),
                residual: ResArg::InPlace(residual.into()),
                norm: Some((norm.weight, norm.eps, None)),
                hidden,
            },
        )
    }

    /// `out = residual + all_reduce_sum(x)`, rows of `hidden` elements (the last layer, or a
    /// model that norms otherwise).
    pub fn all_reduce_residual<'a>(
        &self,
        x: impl Into<Buf<'a>>,
        residual: impl Into<Buf<'a>>,
        out: impl Into<BufMut<'a>>,
        hidden: usize,
    ) -> Result<()> {
        self.all_reduce_residual_with(EpilogueAlgo::Auto, x, residual, out, hidden)
    }

    /// [`Self::all_reduce_residual`] in place: `residual += all_reduce_sum(x)`. `x` is scratch:
    /// its contents afterwards are unspecified.
    pub fn all_reduce_residual_in_place<'a>(
        &self,
        x: impl Into<BufMut<'a>>,
        residual: impl Into<BufMut<'a>>,
        hidden: usize,
    ) -> Result<()> {
        self.epilogue_with(
            EpilogueAlgo::Auto,
            EpiArgs {
                x: XArg::Mut(x.into()),
                residual: ResArg::InPlace(residual.into()),
                norm: None,
                hidden,
            },
        )
    }

    /// An epilogue op with an explicit [`EpilogueAlgo`] (benchmarks, tests).
    pub(crate) fn epilogue_with(&self, algo: EpilogueAlgo, a: EpiArgs<'_>) -> Result<()> {
        let rows = self.arg(a.rows())?;
        let algo = match algo {
            EpilogueAlgo::Auto => self
                .comm()
                .selector
                .epilogue(rows.rows(), rows.hidden() * rows.dtype().size()),
            a => a,
        };
        if let EpilogueAlgo::Separate(ar) = algo {
            self.arg(self.comm().check_algo(ar))?;
        }
        if rows.count() == 0 {
            let kind = symm_core::OpKind::AllReduce;
            if let Some(r) = self
                .comm()
                .empty_op(self.stream_arg(), kind, rows.dtype(), Some(ReduceOp::Sum))
            {
                return r;
            }
        }
        // The separate sequence's all-reduce, planned on the sum's place: in place when the sum
        // goes to `x`, else from `x` into it.
        let (x, sum, same) = a.sum_addresses();
        let at = if same {
            Placement::all_reduce(None, x, rows.bytes())
        } else {
            Placement::all_reduce(Some(x), sum, rows.bytes())
        };
        self.comm().run(|| {
            let plan = match algo {
                EpilogueAlgo::Separate(ar) => {
                    EpiPlan::Separate(self.plan_all_reduce(ar, at, rows.count(), rows.dtype()))
                }
                _ => EpiPlan::Fused,
            };
            self.comm().engine.epilogue(self.cx(), plan, a, rows)
        })
    }
}

/// The public form of [`OnStream::epilogue_with`]: every op above with an explicit algorithm.
impl OnStream<'_> {
    /// [`Self::all_reduce_residual_rms_norm`] run by `algo`.
    pub fn all_reduce_residual_rms_norm_with<'a>(
        &self,
        algo: EpilogueAlgo,
        x: impl Into<Buf<'a>>,
        residual: impl Into<Buf<'a>>,
        norm: RmsNorm<'a>,
        norm_out: impl Into<BufMut<'a>>,
        residual_out: impl Into<BufMut<'a>>,
    ) -> Result<()> {
        let hidden = norm.weight.len();
        self.epilogue_with(
            algo,
            EpiArgs {
                x: XArg::In(x.into()),
                residual: ResArg::Apart(residual.into(), residual_out.into()),
                norm: Some((norm.weight, norm.eps, Some(norm_out.into()))),
                hidden,
            },
        )
    }

    /// [`Self::all_reduce_residual`] run by `algo`.
    pub fn all_reduce_residual_with<'a>(
        &self,
        algo: EpilogueAlgo,
        x: impl Into<Buf<'a>>,
        residual: impl Into<Buf<'a>>,
        out: impl Into<BufMut<'a>>,
        hidden: usize,
    ) -> Result<()> {
        self.epilogue_with(
            algo,
            EpiArgs {
                x: XArg::In(x.into()),
                residual: ResArg::Apart(residual.into(), out.into()),
                norm: None,
                hidden,
            },
        )
    }
}
