//! All-reduce epilogues, the way tensor-parallel layers end: all-reduce the row-parallel GEMM's
//! partial sums `x`, add the residual, RMSNorm the sum (NOTE [fused-epilogue] in
//! `symm-core/kernels/epilogue.cuh`; docs/ops.md, "Fused epilogues").
//!
//! The kernel engine (CUDA, ROCm) runs the table's all-reduce (NCCL included, on CUDA) followed
//! by the separate epilogue kernel, or the Lamport one-shot with the epilogue fused in (the
//! planner's rule: `Selector::epilogue`), both planned by symm-core's `coll::add_rms`;
//! `addresses.rs` resolves an op's buffers to their addresses for it. The host engine runs its
//! all-reduce and the same arithmetic on the CPU (`host/epilogue.rs`). The ops themselves, on
//! `OnStream`, are in `ops/epilogue.rs`; this file holds their arguments and the rules every
//! engine checks alike.

use symm_core::coll::epilogue_check::Rows;
use symm_core::{AllReduceKernel, DType, Error, Result};

use crate::buf::{Buf, BufMut};
use crate::select::{AllReduceAlgo, Plan};

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

/// How one epilogue op runs, as the op planned it: the fused kernel, or the planned all-reduce
/// into the sum's place followed by the separate epilogue kernel (the host engine runs its
/// unfused sequence for either).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EpiPlan {
    Fused,
    Separate(Plan<AllReduceKernel>),
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
    /// The known addresses (`crate::buf::Buf::known_address`) of `x` and of the sum's place of
    /// the separate sequence, and whether the sum goes to `x` itself (the same buffer).
    pub fn sum_addresses(&self) -> (Option<u64>, Option<u64>, bool) {
        let x = match &self.x {
            XArg::In(b) => b.known_address(),
            XArg::Mut(b) => b.known_address(),
        };
        match self.sum_at() {
            SumAt::X => (x, x, true),
            SumAt::NormOut => match &self.norm {
                Some((_, _, Some(o))) => (x, o.known_address(), false),
                _ => (x, x, true),
            },
            SumAt::ResidualOut => match &self.residual {
                ResArg::Apart(_, o) => (x, o.known_address(), false),
                ResArg::InPlace(r) => (x, r.known_address(), false),
            },
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
