//! The CUDA engine's all-reduce epilogues (NOTE [fused-epilogue]): the fused Lamport kernel, or
//! an all-reduce (any, NCCL included) into the sum's place followed by the epilogue kernel. The
//! buffers resolve as on the rocm engine (`crate::epilogue::EpiBufs`).
#![allow(unsafe_code)] // two calls into symm-cuda's raw-address entry points, each with its reason

use cudarc::driver::CudaStream;
use symm_core::coll::epilogue_check::Rows;
use symm_core::{ReduceOp, Result};
use symm_cuda::collectives::Epilogue;

use super::{CudaEngine, SyncOnDrop};
use crate::buf::{Buf, BufMut, RawDevicePtr};
use crate::engine::OpArgs;
use crate::epilogue::{EpiArgs, EpiBufs, EpilogueAlgo, Resolve};
use crate::select::Selector;

/// The CUDA engine's buffer resolution on one stream (`CudaEngine::src` / `dst`).
struct Resolver<'e> {
    engine: &'e CudaEngine,
    s: &'e CudaStream,
}

impl<'s, 'e: 's> Resolve<'s> for Resolver<'e> {
    type Guard = Option<SyncOnDrop<'s>>;
    fn input(&'s self, b: &'s Buf<'_>) -> Result<(u64, Self::Guard)> {
        self.engine.src(self.s, b)
    }
    fn output(&'s self, b: &'s mut BufMut<'_>) -> Result<(u64, Self::Guard)> {
        self.engine.dst(self.s, b)
    }
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
        let on = Resolver { engine: self, s };
        let mut bufs = EpiBufs::from(a);
        let (p, _held) = bufs.resolve(&on)?;
        // SAFETY: every address was resolved by `src` / `dst` from this op's buffers, checked
        // there against `rows` and held (`_held`) until the op is enqueued (cuda/engine.rs
        // module docs, NOTE [raw-addresses]).
        let e = unsafe { Epilogue::new(p.op, p.x, rows, p.residual, p.residual_out, p.norm) }?;
        let sum = p.sum_place()?;
        match algo {
            EpilogueAlgo::Separate(ar) => {
                let (count, dtype) = (rows.count(), rows.dtype());
                let input = (sum != p.x).then(|| Buf::Raw(RawDevicePtr::checked(p.x, count, dtype)));
                let output = BufMut::Raw(RawDevicePtr::checked(sum, count, dtype));
                let sum_args = OpArgs {
                    input,
                    output,
                    count,
                    dtype,
                    op: ReduceOp::Sum,
                };
                self.all_reduce_on(s, planner, ar, sum_args)?;
                // SAFETY: `sum` is one of the op's checked outputs (or `x`), `rows` long.
                unsafe { self.epilogue_kernels()?.launch(s, sum, &e) }
            }
            _ => self.coll()?.lamport_epilogue(s, &e),
        }
    }
}
