//! The CUDA engine's all-reduce epilogues (NOTE [fused-epilogue]): the fused Lamport kernel, or
//! an all-reduce (any, NCCL included) into the sum's place followed by the epilogue kernel.
#![allow(unsafe_code)] // two calls into symm-cuda's raw-address entry points, each with its reason

use cudarc::driver::CudaStream;
use symm_core::epilogue::Rows;
use symm_core::{Error, ReduceOp, Result};
use symm_cuda::collectives::Epilogue;

use super::CudaEngine;
use crate::buf::{Buf, BufMut, RawDevicePtr};
use crate::epilogue::{check_sum_place, EpiArgs, EpilogueAlgo, ResArg, SumAt, XArg};
use crate::select::Selector;

fn internal() -> Error {
    Error::InvalidArgument("internal: an epilogue buffer went missing".into())
}

impl CudaEngine {
    /// One epilogue op with the lock held, on `s`: the fused Lamport kernel, or the all-reduce
    /// `algo` names (as the planner plans it) followed by the epilogue kernel.
    pub(super) fn epilogue_locked(
        &self,
        s: &CudaStream,
        planner: &Selector,
        algo: EpilogueAlgo,
        a: EpiArgs<'_>,
        rows: Rows,
    ) -> Result<()> {
        let (op, sum_at, eps) = (a.op(), a.sum_at(), a.eps());
        let EpiArgs { x, residual, norm, .. } = a;
        let (x_in, mut x_mut) = match x {
            XArg::In(b) => (Some(b), None),
            XArg::Mut(b) => (None, Some(b)),
        };
        let (r_in, mut r_out) = match residual {
            ResArg::Apart(r, o) => (Some(r), o),
            ResArg::InPlace(r) => (None, r),
        };
        let (weight, mut n_out) = match norm {
            Some((w, _, o)) => (Some(w), o),
            None => (None, None),
        };
        let (x_ptr, _gx) = match (&x_in, &mut x_mut) {
            (Some(b), _) => self.src(s, b)?,
            (None, Some(b)) => self.dst(s, b)?,
            (None, None) => return Err(internal()),
        };
        let (ro_ptr, _gro) = self.dst(s, &mut r_out)?;
        let (r_ptr, _gr) = match &r_in {
            Some(b) => self.src(s, b)?,
            None => (ro_ptr, None),
        };
        let (w_ptr, _gw) = match &weight {
            Some(b) => {
                let (p, g) = self.src(s, b)?;
                (Some(p), g)
            }
            None => (None, None),
        };
        let (n_ptr, _gn) = match &mut n_out {
            Some(b) => self.dst(s, b)?,
            None => (x_ptr, None),
        };
        let norm = w_ptr.map(|w| (w, n_ptr, eps));
        // SAFETY: every address was resolved by `src` / `dst` from this op's buffers, checked
        // there against `rows` and held (guards above) until the op is enqueued (cuda/engine.rs
        // module docs, NOTE [raw-addresses]).
        let e = unsafe { Epilogue::new(op, x_ptr, rows, r_ptr, ro_ptr, norm) }?;
        check_sum_place(op, sum_at, r_ptr, ro_ptr)?;
        match algo {
            EpilogueAlgo::Separate(ar) => {
                let (count, dtype) = (rows.count(), rows.dtype());
                let target = match sum_at {
                    SumAt::X => x_ptr,
                    SumAt::NormOut => n_ptr,
                    SumAt::ResidualOut => ro_ptr,
                };
                let input = (target != x_ptr).then(|| Buf::Raw(RawDevicePtr::checked(x_ptr, count, dtype)));
                let output = BufMut::Raw(RawDevicePtr::checked(target, count, dtype));
                self.all_reduce_on(s, planner, ar, input, output, count, dtype, ReduceOp::Sum)?;
                // SAFETY: `target` is one of the op's checked outputs (or `x`), `rows` long.
                unsafe { self.epilogue_kernels()?.launch(s, target, &e) }
            }
            _ => self.coll()?.lamport_epilogue(s, &e),
        }
    }
}
