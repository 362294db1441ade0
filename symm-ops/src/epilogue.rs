//! All-reduce epilogues, the way tensor-parallel layers end: all-reduce the row-parallel GEMM's
//! partial sums `x`, add the residual, RMSNorm the sum (NOTE [fused-epilogue] in
//! `symm-core/kernels/epilogue.cuh`; docs/ops.md, "Fused epilogues").
//!
//! The kernel engine (CUDA, ROCm) runs the table's all-reduce (NCCL included, on CUDA) followed
//! by the separate epilogue kernel, or the Lamport one-shot with the epilogue fused in (the
//! planner's rule: `Selector::epilogue`), both planned by symm-core's `coll::add_rms`;
//! `addresses.rs` resolves an op's buffers to their addresses for it. The host engine runs its all-reduce and
//! the same arithmetic on the CPU.

use symm_core::epilogue::{Buffers, Rows, Span};
use symm_core::{DType, Error, ReduceOp, Result};

use crate::buf::{Buf, BufMut};
use crate::host::{In, Out};
use crate::ops::OnStream;
use crate::select::AllReduceAlgo;

mod addresses;
pub(crate) use addresses::{EpiBufs, Resolve};

/// How an all-reduce epilogue runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EpilogueAlgo {
    /// The planner (`Selector::epilogue`): [`EpilogueAlgo::Fused`] at world 1 on the GPU engines
    /// and on CUDA at two ranks up to `SelectionThresholds::epilogue_fused_max_bytes` where the
    /// all-reduce table picks Lamport; otherwise the table's pick for the message, then the
    /// epilogue kernel.
    Auto,
    /// One kernel: the Lamport one-shot with the epilogue applied to each row as it arrives
    /// (CUDA and ROCm; messages up to the Lamport buffers). The host engine runs its unfused
    /// sequence.
    Fused,
    /// The given all-reduce (into an output, or in place), then the separate epilogue kernel.
    Separate(AllReduceAlgo),
}

/// The RMSNorm half of an epilogue: `weight` (`hidden` elements, the row length) and `eps`.
/// Built with [`RmsNorm::new`] (the struct is `#[non_exhaustive]`: fields may be added).
#[derive(Debug)]
#[non_exhaustive]
pub struct RmsNorm<'a> {
    pub weight: Buf<'a>,
    pub eps: f32,
}

impl<'a> RmsNorm<'a> {
    pub fn new(weight: impl Into<Buf<'a>>, eps: f32) -> Self {
        RmsNorm {
            weight: weight.into(),
            eps,
        }
    }
}

/// `x`: read only, or also written (the in-place norm's output, or the in-place add's scratch).
pub(crate) enum XArg<'a> {
    In(Buf<'a>),
    Mut(BufMut<'a>),
}

/// `residual`: apart from its output, or updated in place.
pub(crate) enum ResArg<'a> {
    Apart(Buf<'a>, BufMut<'a>),
    InPlace(BufMut<'a>),
}

/// One epilogue op's arguments. `norm: Some((weight, eps, None))` writes the norm into `x`.
pub(crate) struct EpiArgs<'a> {
    pub x: XArg<'a>,
    pub residual: ResArg<'a>,
    pub norm: Option<(Buf<'a>, f32, Option<BufMut<'a>>)>,
    pub hidden: usize,
}

/// Where the all-reduced sum goes before the separate epilogue reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SumAt {
    /// `x` itself (in place).
    X,
    /// The norm output.
    NormOut,
    /// The residual output.
    ResidualOut,
}

impl EpiArgs<'_> {
    pub fn op(&self) -> &'static str {
        if self.norm.is_some() {
            "all_reduce_residual_rms_norm"
        } else {
            "all_reduce_residual"
        }
    }
    fn x_len(&self) -> (usize, DType) {
        match &self.x {
            XArg::In(b) => (b.len(), b.dtype()),
            XArg::Mut(b) => (b.len(), b.dtype()),
        }
    }
    /// The rows, after every length and dtype was compared with `x`'s.
    pub fn rows(&self) -> Result<Rows> {
        let op = self.op();
        let (count, dtype) = self.x_len();
        let rows = Rows::new(op, count, self.hidden, dtype)?;
        let same = |what: &str, len: usize, dt: DType, want: usize| -> Result<()> {
            if dt != dtype {
                return Err(Error::InvalidArgument(format!("{op}: x is {dtype}, {what} is {dt}")));
            }
            if len != want {
                return Err(Error::InvalidArgument(format!(
                    "{op}: {what} has {len} elements, expected {want}"
                )));
            }
            Ok(())
        };
        match &self.residual {
            ResArg::Apart(r, o) => {
                same("residual", r.len(), r.dtype(), count)?;
                same("residual_out", o.len(), o.dtype(), count)?;
            }
            ResArg::InPlace(r) => same("residual", r.len(), r.dtype(), count)?,
        }
        if let Some((w, _, out)) = &self.norm {
            same("weight", w.len(), w.dtype(), self.hidden)?;
            if let Some(o) = out {
                same("norm_out", o.len(), o.dtype(), count)?;
            }
        }
        if matches!(self.x, XArg::In(_)) && self.sum_at() == SumAt::X {
            return Err(Error::InvalidArgument(format!("internal: {op} needs a writable x")));
        }
        let eps = self.eps();
        if !eps.is_finite() || eps < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "{op}: eps {eps} is not a finite non-negative number"
            )));
        }
        Ok(rows)
    }
    /// Where the unfused sequence all-reduces into.
    pub fn sum_at(&self) -> SumAt {
        match (&self.norm, &self.residual) {
            (Some((_, _, Some(_))), _) => SumAt::NormOut,
            (Some((_, _, None)), _) => SumAt::X,
            (None, ResArg::Apart(..)) => SumAt::ResidualOut,
            (None, ResArg::InPlace(_)) => SumAt::X,
        }
    }
    pub fn eps(&self) -> f32 {
        self.norm.as_ref().map_or(0.0, |n| n.1)
    }
}

/// The out-of-place residual add all-reduces into `residual_out` before it reads `residual`: the
/// two must not be one buffer there (the in-place form takes `x` as its scratch instead).
pub(crate) fn check_sum_place(op: &'static str, sum_at: SumAt, residual: u64, residual_out: u64) -> Result<()> {
    if sum_at == SumAt::ResidualOut && residual == residual_out {
        return Err(Error::InvalidArgument(format!(
            "{op}: out is residual; use all_reduce_residual_in_place for the in-place add"
        )));
    }
    Ok(())
}

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
            EpilogueAlgo::Auto => self.comm().selector.epilogue(rows.bytes()),
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
        self.comm()
            .run(|| self.comm().engine.epilogue(self.cx(), algo, a, rows))
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

// ---- host engine -----------------------------------------------------------

/// An epilogue op resolved for the host engine.
pub(crate) struct HostEpi<'a> {
    x: Option<In<'a>>,
    x_out: Option<Out<'a>>,
    residual: Option<In<'a>>,
    residual_out: Out<'a>,
    weight: Option<In<'a>>,
    norm_out: Option<Out<'a>>,
    sum_at: SumAt,
    eps: f32,
    spans: Buffers,
    op: &'static str,
}

fn span_in(what: &'static str, b: &Buf<'_>) -> Span {
    Span {
        what,
        addr: b.address(),
        bytes: b.len() * b.dtype().size(),
    }
}
fn span_out(what: &'static str, b: &BufMut<'_>) -> Span {
    Span {
        what,
        addr: b.address(),
        bytes: b.len() * b.dtype().size(),
    }
}

impl<'a> HostEpi<'a> {
    pub(crate) fn resolve(h: &crate::host::HostEngine, a: EpiArgs<'a>) -> Result<HostEpi<'a>> {
        let (sum_at, op) = (a.sum_at(), a.op());
        let eps = a.eps();
        let (x, x_out, x_span) = match a.x {
            XArg::In(b) => {
                let s = span_in("x", &b);
                (Some(h.resolve_in(b)?), None, s)
            }
            XArg::Mut(b) => {
                let s = span_out("x", &b);
                (None, Some(h.resolve_out(b, true)?), s)
            }
        };
        let (residual, residual_out, r_span, ro_span) = match a.residual {
            ResArg::Apart(r, o) => {
                let (rs, os) = (span_in("residual", &r), span_out("residual_out", &o));
                (Some(h.resolve_in(r)?), h.resolve_out(o, false)?, rs, os)
            }
            ResArg::InPlace(r) => {
                let s = span_out("residual", &r);
                (None, h.resolve_out(r, true)?, s, s)
            }
        };
        let (weight, norm_out, w_span, n_span) = match a.norm {
            Some((w, _, out)) => {
                let ws = span_in("weight", &w);
                let (o, os) = match out {
                    Some(o) => {
                        let s = span_out("norm_out", &o);
                        (Some(h.resolve_out(o, false)?), s)
                    }
                    None => (None, x_span),
                };
                (Some(h.resolve_in(w)?), o, Some(ws), Some(os))
            }
            None => (None, None, None, None),
        };
        Ok(HostEpi {
            x,
            x_out,
            residual,
            residual_out,
            weight,
            norm_out,
            sum_at,
            op,
            eps,
            spans: Buffers {
                x: x_span,
                residual: r_span,
                weight: w_span,
                residual_out: ro_span,
                norm_out: n_span,
            },
        })
    }

    /// The buffer rules (the shape and eps were checked with the arguments); none for zero rows,
    /// as on the CUDA engine, whose empty op reads no buffer.
    pub(crate) fn check(&self, rows: &Rows) -> Result<()> {
        if rows.count() == 0 {
            return Ok(());
        }
        self.spans.check(self.op)?;
        check_sum_place(
            self.op,
            self.sum_at,
            self.spans.residual.addr,
            self.spans.residual_out.addr,
        )
    }

    /// The host engine's all-reduce into the sum's place, then the epilogue on the CPU.
    pub(crate) fn run(&mut self, h: &crate::host::HostEngine, rows: &Rows) -> Result<()> {
        let (count, dtype) = (rows.count(), rows.dtype());
        let es = dtype.size();
        // 1. The all-reduce (one-shot: every rank reduces in rank order, as the kernels do).
        {
            let (input, out): (In<'_>, &mut Out<'_>) = match self.sum_at {
                SumAt::X => (In::Output, self.x_out.as_mut().ok_or_else(internal)?),
                SumAt::NormOut => (
                    self.x.as_ref().ok_or_else(internal)?.reborrow(),
                    self.norm_out.as_mut().ok_or_else(internal)?,
                ),
                SumAt::ResidualOut => (self.x.as_ref().ok_or_else(internal)?.reborrow(), &mut self.residual_out),
            };
            h.one_shot(&input, out, count, dtype, ReduceOp::Sum)?;
        }
        if count == 0 {
            return Ok(());
        }
        // 2. The epilogue, row by row.
        let hidden = rows.hidden();
        let nb = hidden * es;
        let mut sum = vec![0u8; nb];
        let mut res = vec![0u8; nb];
        let mut weight = vec![0u8; nb];
        if let Some(w) = &self.weight {
            w.load_bytes(0, hidden, dtype, &mut weight)?;
        }
        for row in 0..rows.rows() {
            let e0 = row * hidden;
            let sum_src = match self.sum_at {
                SumAt::X => self.x_out.as_ref(),
                SumAt::NormOut => self.norm_out.as_ref(),
                SumAt::ResidualOut => Some(&self.residual_out),
            }
            .ok_or_else(internal)?;
            sum_src.load_bytes(e0, hidden, dtype, &mut sum)?;
            match &self.residual {
                Some(r) => r.load_bytes(e0, hidden, dtype, &mut res)?,
                None => self.residual_out.load_bytes(e0, hidden, dtype, &mut res)?,
            }
            let norm = self.weight.as_ref().map(|_| (&weight[..], self.eps));
            let (s, n) = row_epilogue(dtype, &sum, &res, norm);
            self.residual_out.store_bytes(e0, &s, dtype)?;
            if let Some(n) = n {
                let dst = match &mut self.norm_out {
                    Some(o) => o,
                    None => self.x_out.as_mut().ok_or_else(internal)?,
                };
                dst.store_bytes(e0, &n, dtype)?;
            }
        }
        Ok(())
    }
}

fn internal() -> Error {
    Error::InvalidArgument("internal: an epilogue buffer went missing".into())
}

/// One row's epilogue on the CPU, as the kernels round (NOTE [fused-epilogue]): `sum` (the
/// all-reduced row, already in the element type) plus `res`, rounded; with `norm`, the RMSNorm
/// of that, times the weight, rounded. Returns the two rows' bytes.
pub(crate) fn row_epilogue(
    dtype: DType,
    sum: &[u8],
    res: &[u8],
    norm: Option<(&[u8], f32)>,
) -> (Vec<u8>, Option<Vec<u8>>) {
    let n = sum.len() / dtype.size();
    let mut a = vec![0f32; n];
    let mut r = vec![0f32; n];
    crate::reduce::load(dtype, sum, &mut a);
    crate::reduce::load(dtype, res, &mut r);
    a.iter_mut().zip(&r).for_each(|(a, r)| *a += r);
    let mut s = vec![0u8; sum.len()];
    crate::reduce::narrow(dtype, &a, &mut s);
    let norm = norm.map(|(w, eps)| {
        // The rounded sum is what the norm reads (as the unfused sequence's norm would).
        crate::reduce::load(dtype, &s, &mut a);
        let ssq: f32 = a.iter().map(|v| v * v).sum();
        let rstd = 1.0 / (ssq / n as f32 + eps).sqrt();
        let mut g = vec![0f32; n];
        crate::reduce::load(dtype, w, &mut g);
        a.iter_mut().zip(&g).for_each(|(a, g)| *a = (*a * rstd) * g);
        let mut out = vec![0u8; sum.len()];
        crate::reduce::narrow(dtype, &a, &mut out);
        out
    });
    (s, norm)
}
