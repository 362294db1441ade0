//! The all-reduce epilogues on the host engine (NOTE [fused-epilogue]): an op's buffers resolved
//! to host spans ([`HostEpi`]), and one row's epilogue as the kernels round it
//! ([`row_epilogue`]).

use symm_core::coll::epilogue_check::{Buffers, Rows, Span};
use symm_core::{DType, Error, ReduceOp, Result};

use super::{HostEngine, In, Out};
use crate::buf::{Buf, BufMut};
use crate::epilogue::{check_sum_place, EpiArgs, ResArg, SumAt, XArg};

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
    pub(crate) fn resolve(h: &HostEngine, a: EpiArgs<'a>) -> Result<HostEpi<'a>> {
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
    pub(crate) fn run(&mut self, h: &HostEngine, rows: &Rows) -> Result<()> {
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
