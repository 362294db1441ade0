//! The kernel engine's ops ([`Engine`]): each resolves its buffers and runs the plan the op
//! handed it: one of the backend's explicit kernels through [`symm_core::coll::Collectives`], or
//! NCCL (the CUDA extra). The all-reduce epilogues (NOTE [fused-epilogue]): the fused Lamport kernel,
//! or an all-reduce (any, NCCL included) into the sum's place followed by the epilogue kernel,
//! the buffers resolved by `crate::epilogue::EpiBufs`.
//!
//! The only place the engine's ops cross into the backends' raw-address entries (NOTE
//! [raw-addresses]; the addresses' provenance is in the module docs of `mod.rs`).
#![allow(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use symm_core::coll::add_rms::Epilogue;
use symm_core::coll::epilogue_check::Rows;
use symm_core::coll::Collectives;
use symm_core::{
    get_symmetric_memory, AllGatherKernel, AllReduceKernel, DType, Error, OpKind, Rank, ReduceOp, ReduceScatterKernel,
    Result, SymmTensor, SymmetricMemory,
};

use super::{At, Held, KernelEngine, Side};
use crate::buf::{Buf, BufMut, RawDevicePtr};
use crate::engine::{is_fatal, Caps, Cx, Engine, OpArgs, OpStream};
use crate::epilogue::{EpiArgs, EpiBufs, EpiPlan, Resolve};
use crate::select::Plan;

/// The engine's buffer resolution on one op's queue (`KernelEngine::src` / `dst`), for the
/// epilogues' buffers.
struct Resolver<'e> {
    engine: &'e KernelEngine,
    s: At<'e>,
}

impl<'s, 'e: 's> Resolve<'s> for Resolver<'e> {
    type Guard = Held<'s>;
    fn input(&'s self, b: &'s Buf<'_>) -> Result<(u64, Self::Guard)> {
        self.engine.src(self.s, b)
    }
    fn output(&'s self, b: &'s mut BufMut<'_>) -> Result<(u64, Self::Guard)> {
        self.engine.dst(self.s, b)
    }
}

impl KernelEngine {
    /// The all-reduce by `plan` with the lock held, on `s` (also the epilogues' first half).
    fn all_reduce_on(&self, s: At<'_>, plan: Plan<AllReduceKernel>, a: OpArgs<'_, Option<Buf<'_>>>) -> Result<()> {
        let OpArgs {
            input,
            mut output,
            count,
            dtype,
            op,
        } = a;
        let (d, _held) = self.resolve(s, input.as_ref(), &mut output, (count, dtype, op))?;
        match plan {
            Plan::Nccl => self.nccl(s, OpKind::AllReduce, d),
            // SAFETY: the addresses come from checked buffers, held until the op is enqueued
            // (module docs of mod.rs).
            Plan::Kernel(k) => unsafe { self.coll()?.all_reduce(s, k, d) },
        }
    }

    /// One epilogue op with the lock held, on `s`: the fused Lamport kernel, or the planned
    /// all-reduce followed by the epilogue kernel.
    fn epilogue_on(&self, s: At<'_>, plan: EpiPlan, a: EpiArgs<'_>, rows: Rows) -> Result<()> {
        let on = Resolver { engine: self, s };
        let mut bufs = EpiBufs::from(a);
        let (p, _held) = bufs.resolve(&on)?;
        // SAFETY: every address was resolved by `src` / `dst` from this op's buffers (checked
        // there for device and alignment; their lengths against `rows` by the op before, in
        // ops/epilogue.rs) and is held (`_held`) until the op is enqueued or done (module docs
        // of mod.rs, NOTE [raw-addresses]).
        let e = unsafe { Epilogue::new(p.op, p.x, rows, p.residual, p.residual_out, p.norm) }?;
        let sum = p.sum_place()?;
        match plan {
            EpiPlan::Separate(ar) => {
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
                self.all_reduce_on(s, ar, sum_args)?;
                self.separate_epilogue(s, sum, &e)
            }
            EpiPlan::Fused => self.coll()?.lamport_epilogue(s, &e),
        }
    }

    /// The separate epilogue kernel over `sum`: the collectives', or (NCCL only) the CUDA
    /// extra's own.
    fn separate_epilogue(&self, s: At<'_>, sum: u64, e: &Epilogue) -> Result<()> {
        if let Some(c) = &self.coll {
            // SAFETY: `sum` is one of the op's checked outputs (or `x`), `rows` long.
            return unsafe { c.epilogue(s, sum, e) };
        }
        if let Some(side) = &self.side {
            // SAFETY: as above.
            return unsafe { side.epilogue(s, sum, e) };
        }
        Err(Error::Unavailable("the all-reduce epilogue kernels".into()))
    }
}

impl Engine for KernelEngine {
    fn caps(&self) -> Caps {
        let (nccl, nccl_missing) = match &self.side {
            Some(side) => (side.has_nccl(), side.nccl_missing()),
            None => (false, None),
        };
        Caps {
            symm: self.coll.is_some(),
            nccl,
            lamport_slot: self.facts.lamport_slot,
            nccl_missing,
            copy_engine: self.facts.copy_engine,
            fused_epilogue: self.coll.is_some() && self.facts.fused_epilogue,
            handoff_bytes: if self.coll.is_some() {
                self.facts.handoff_bytes
            } else {
                0
            },
        }
    }

    fn all_reduce(&self, cx: Cx<'_>, plan: Plan<AllReduceKernel>, a: OpArgs<'_, Option<Buf<'_>>>) -> Result<()> {
        self.locked(cx.stream, |s| self.all_reduce_on(s, plan, a))
    }

    fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        KernelEngine::is_registered(self, ptr, bytes)
    }

    fn facts(&self) -> Option<symm_core::coll::CollFacts> {
        self.coll.as_ref().map(|_| self.facts)
    }

    fn reduce_scatter(&self, cx: Cx<'_>, plan: Plan<ReduceScatterKernel>, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        let OpArgs {
            input,
            mut output,
            count,
            dtype,
            op,
        } = a;
        self.locked(cx.stream, |s| {
            let (d, _held) = self.resolve(s, Some(&input), &mut output, (count, dtype, op))?;
            match plan {
                Plan::Nccl => self.nccl(s, OpKind::ReduceScatter, d),
                // SAFETY: the addresses come from checked buffers (module docs of mod.rs).
                Plan::Kernel(k) => unsafe { self.coll()?.reduce_scatter(s, k, d) },
            }
        })
    }

    fn all_gather(&self, cx: Cx<'_>, plan: Plan<AllGatherKernel>, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        let OpArgs {
            input,
            mut output,
            count,
            dtype,
            op,
        } = a;
        self.locked(cx.stream, |s| {
            // (`op` is `OpArgs::gather`'s unused Sum.)
            let (d, _held) = self.resolve(s, Some(&input), &mut output, (count, dtype, op))?;
            match plan {
                Plan::Nccl => self.nccl(s, OpKind::AllGather, d),
                // SAFETY: the addresses come from checked buffers (module docs of mod.rs).
                Plan::Kernel(k) => unsafe { self.coll()?.all_gather(s, k, d) },
            }
        })
    }

    fn barrier(&self, stream: OpStream<'_>, ranks: &[Rank]) -> Result<()> {
        let _l = self.lock()?;
        let s = self.begin(stream)?;
        if let Some(c) = &self.coll {
            return c.barrier(s, ranks);
        }
        if let Some(side) = &self.side {
            return side.nccl_barrier(s, ranks);
        }
        Err(Error::Unavailable("no engine for a barrier".into()))
    }

    fn epilogue(&self, cx: Cx<'_>, plan: EpiPlan, a: EpiArgs<'_>, rows: Rows) -> Result<()> {
        self.locked(cx.stream, |s| self.epilogue_on(s, plan, a, rows))
    }

    fn runs_empty_ops(&self) -> bool {
        true
    }

    /// An op with nothing to move: a checked barrier with the kernels, nothing without them.
    fn empty_op(&self, stream: OpStream<'_>, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        let _l = self.lock()?;
        let s = self.begin(stream)?;
        match &self.coll {
            Some(c) => c.agree_empty(s, kind, dtype, reduce),
            None => Ok(()),
        }
    }

    /// `Unavailable` is not a rejection here: every rank decides availability alike.
    fn reject(&self, stream: OpStream<'_>, e: &Error) -> bool {
        !matches!(e, Error::Unavailable(_)) && self.send_rejection(stream).map_or_else(|e2| is_fatal(&e2), |()| true)
    }

    fn take_told_peers(&self) -> bool {
        self.told_peers.swap(false, Ordering::AcqRel)
    }

    fn check_error(&self) -> Result<()> {
        match &self.coll {
            Some(c) => c.check_error(),
            None => Ok(()),
        }
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        match &self.coll {
            Some(c) => c.set_abort(abort),
            None => Err(Error::Unavailable("set_abort on an nccl-only communicator".into())),
        }
    }

    /// Where the backend has a host-only abort word (`CollFacts::host_abort`), that alone
    /// (kernels read it only once a wait has lasted, NOTE [host-abort-poll]; the pad's word
    /// stops kernels as they start). Elsewhere nothing: the pad's ABORT word would fail a
    /// lagging rank's ops whose data the departed peer had already sent (NOTE [peer-watch]); a
    /// wait on a lost peer ends at the op timeout, and the communicator then names the peer.
    fn abort_waits_on_lost_peer(&self) -> Result<()> {
        match &self.coll {
            Some(c) => {
                if self.facts.host_abort {
                    c.abort_long_waits();
                }
                Ok(())
            }
            None => Err(Error::Unavailable("aborting waits on an nccl-only communicator".into())),
        }
    }

    fn register(&self, t: &SymmTensor) -> Result<()> {
        match &self.coll {
            Some(c) => c.register_symmetric(get_symmetric_memory(t).ok_or(Error::NotRendezvoused)?),
            None => Ok(()),
        }
    }

    fn register_memory(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        match &self.coll {
            Some(c) => c.register_symmetric(mem),
            None => Ok(()),
        }
    }

    fn unregister_memory(&self, base: u64) -> bool {
        self.coll.as_ref().is_some_and(|c| c.unregister_symmetric(base))
    }

    fn side(&self) -> Option<&dyn Side> {
        self.side.as_deref()
    }

    fn collectives(&self) -> Option<&dyn Collectives> {
        self.coll.as_deref()
    }
}
