//! The CUDA engine's ops ([`Engine`]): each resolves its buffers, asks the planner and runs the
//! plan: one of symm-cuda's explicit kernels, or NCCL on the NCCL communicator's stream.
//!
//! The unsafe boundary of the CUDA engine (NOTE [raw-addresses]): symm-cuda's entry points
//! take raw device addresses, so they are `unsafe fn`s. Every address that reaches them here
//! comes from `CudaEngine::src` / `dst` (mod.rs): a symmetric tensor of the communicator, a
//! cudarc slice held (with its stream guard) for the op, the workspace's staging area, or a
//! `RawDevicePtr` whose `unsafe` constructor carries the caller's promise; each was checked
//! there against the op's element count and dtype and for alignment, and the op holds them
//! until its work is enqueued (the stream keeps the memory's users ordered after it).
#![allow(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use symm_core::coll::epilogue_check::Rows;
use symm_core::{get_symmetric_memory, DType, Error, OpKind, Rank, ReduceOp, Result, SymmTensor, SymmetricMemory};

use symm_cuda::collectives::DeviceOp;

use super::CudaEngine;
use crate::buf::Buf;
use crate::engine::{Caps, Cx, Engine, OpArgs};
use crate::epilogue::{EpiArgs, EpilogueAlgo};
use crate::ops::OpStream;
use crate::select::{AllGatherAlgo, AllReduceAlgo, Bufs, Plan, ReduceScatterAlgo, Selector, Side};

impl CudaEngine {
    /// Whether `bytes` at `ptr` lie in symmetric memory registered with the kernels.
    fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        self.coll.as_ref().is_some_and(|c| c.is_registered(ptr, bytes))
    }

    /// The all-reduce with the lock held, on `s` (also the epilogues' first half).
    pub(super) fn all_reduce_on(
        &self,
        s: &CudaStream,
        planner: &Selector,
        req: AllReduceAlgo,
        a: OpArgs<'_, Option<Buf<'_>>>,
    ) -> Result<()> {
        let OpArgs {
            input,
            mut output,
            count,
            dtype,
            op,
        } = a;
        let (out_ptr, _g_out) = self.dst(s, &mut output)?;
        let (in_ptr, _g_in) = match &input {
            Some(b) => self.src(s, b)?,
            None => (out_ptr, None),
        };
        let bytes = count * dtype.size();
        let bufs = Bufs {
            in_place: in_ptr == out_ptr,
            apart: in_ptr.saturating_add(bytes as u64) <= out_ptr || out_ptr.saturating_add(bytes as u64) <= in_ptr,
            registered: &|side| match side {
                Side::Input => self.is_registered(in_ptr, bytes),
                Side::Output => self.is_registered(out_ptr, bytes),
            },
        };
        match planner.plan_all_reduce(req, bytes, &bufs) {
            Plan::Nccl => self.nccl_on(s, |n| n.all_reduce(in_ptr, out_ptr, count, dtype, op)),
            Plan::Kernel(k) => {
                let d = DeviceOp {
                    input: in_ptr,
                    output: out_ptr,
                    count,
                    dtype,
                    op,
                };
                // SAFETY: the addresses come from checked buffers (module docs).
                unsafe { self.coll()?.all_reduce(s, k, d) }
            }
        }
    }

    /// One op: the communicator's lock and the op's stream ([`Self::begin`]), then `f` on it; an
    /// argument it refuses is told to the peers ([`Self::refused`]).
    fn locked(&self, stream: OpStream<'_>, f: impl FnOnce(&CudaStream) -> Result<()>) -> Result<()> {
        let (_l, s) = self.begin(stream)?;
        self.refused(s, f(s))
    }

    /// This rank refused its own arguments for an op (NOTE [op-agreement]): the kernels' peers
    /// learn it at once. Without kernels nothing is sent (NCCL does not check), but the
    /// communicator still poisons itself, so this rank never pairs its next op with the peers'
    /// current one. Refused, and nothing sent, while another op of this communicator runs (a
    /// local refusal).
    fn send_rejection(&self, stream: OpStream<'_>) -> Result<()> {
        let _l = self.lock()?;
        self.tell_peers(self.telling_stream(stream))
    }
}

impl Engine for CudaEngine {
    fn caps(&self) -> Caps {
        Caps {
            symm: self.coll.is_some(),
            nccl: self.nccl.is_some(),
            lamport_slot: self.coll.as_ref().map_or(0, |c| c.lamport_max_bytes()),
            nccl_missing: self.nccl_missing.clone(),
        }
    }

    fn all_reduce(&self, cx: Cx<'_>, req: AllReduceAlgo, a: OpArgs<'_, Option<Buf<'_>>>) -> Result<()> {
        self.locked(cx.stream, |s| self.all_reduce_on(s, cx.planner, req, a))
    }

    fn reduce_scatter(&self, cx: Cx<'_>, req: ReduceScatterAlgo, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        let OpArgs {
            input,
            mut output,
            count,
            dtype,
            op,
        } = a;
        self.locked(cx.stream, |s| {
            let (out_ptr, _g_out) = self.dst(s, &mut output)?;
            let (in_ptr, _g_in) = self.src(s, &input)?;
            let whole = count * cx.planner.world * dtype.size();
            match cx
                .planner
                .plan_reduce_scatter(req, whole, &|| self.is_registered(in_ptr, whole))
            {
                Plan::Nccl => self.nccl_on(s, |n| n.reduce_scatter(in_ptr, out_ptr, count, dtype, op)),
                Plan::Kernel(k) => {
                    let d = DeviceOp {
                        input: in_ptr,
                        output: out_ptr,
                        count,
                        dtype,
                        op,
                    };
                    // SAFETY: the addresses come from checked buffers (module docs).
                    unsafe { self.coll()?.reduce_scatter(s, k, d) }
                }
            }
        })
    }

    fn all_gather(&self, cx: Cx<'_>, req: AllGatherAlgo, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        let OpArgs {
            input,
            mut output,
            count,
            dtype,
            ..
        } = a;
        self.locked(cx.stream, |s| {
            let (out_ptr, _g_out) = self.dst(s, &mut output)?;
            let (in_ptr, _g_in) = self.src(s, &input)?;
            let bytes = count * dtype.size();
            let whole = bytes * cx.planner.world;
            let in_place = out_ptr.checked_add((self.rank * bytes) as u64) == Some(in_ptr);
            let bufs = Bufs {
                in_place,
                apart: !in_place,
                registered: &|side| match side {
                    Side::Input => self.is_registered(in_ptr, bytes),
                    Side::Output => self.is_registered(out_ptr, whole),
                },
            };
            match cx.planner.plan_all_gather(req, whole, dtype, &bufs) {
                Plan::Nccl => self.nccl_on(s, |n| n.all_gather(in_ptr, out_ptr, count, dtype)),
                Plan::Kernel(k) => {
                    let d = DeviceOp::gather(in_ptr, out_ptr, count, dtype);
                    // SAFETY: the addresses come from checked buffers (module docs).
                    unsafe { self.coll()?.all_gather(s, k, d) }
                }
            }
        })
    }

    fn barrier(&self, stream: OpStream<'_>, ranks: &[Rank]) -> Result<()> {
        let (_l, s) = self.begin(stream)?;
        if let Some(c) = &self.coll {
            return c.barrier(s, ranks);
        }
        let world = ranks.first().map(|r| r.world_size()).unwrap_or(0);
        if ranks.len() != world {
            return Err(Error::Unavailable(
                "a barrier over a subset of ranks on an nccl-only communicator".into(),
            ));
        }
        let p = self
            .barrier_word
            .as_ref()
            .map(|(_, p)| *p)
            .ok_or_else(|| Error::Unavailable("no engine for a barrier".into()))?;
        self.nccl_on(s, |n| n.all_reduce(p, p, 1, DType::F32, ReduceOp::Sum))
    }

    fn epilogue(&self, cx: Cx<'_>, algo: EpilogueAlgo, a: EpiArgs<'_>, rows: Rows) -> Result<()> {
        self.locked(cx.stream, |s| self.epilogue_locked(s, cx.planner, algo, a, rows))
    }

    fn runs_empty_ops(&self) -> bool {
        true
    }

    /// An op with nothing to move: a checked barrier with the kernels, nothing without them.
    fn empty_op(&self, stream: OpStream<'_>, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        let (_l, s) = self.begin(stream)?;
        match &self.coll {
            Some(c) => c.agree_empty(s, kind, dtype, reduce),
            None => Ok(()),
        }
    }

    /// `Unavailable` is not a rejection here: every rank decides availability alike.
    fn reject(&self, stream: OpStream<'_>, e: &Error) -> bool {
        !matches!(e, Error::Unavailable(_))
            && self
                .send_rejection(stream)
                .map_or_else(|e2| crate::comm::is_fatal(&e2), |()| true)
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

    fn abort_waits_on_lost_peer(&self) -> Result<()> {
        match &self.coll {
            Some(c) => {
                c.abort_long_waits();
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

    fn stream(&self) -> Option<&Arc<CudaStream>> {
        Some(&self.stream)
    }

    fn error_probe(&self) -> Option<symm_cuda::collectives::ErrorProbe> {
        self.coll.as_ref().map(|c| c.error_probe())
    }
}
