//! Adapter over symm-cuda's collective kernels ([`CudaCollectives`]):
//! maps symm-ops' algorithm names onto the kernels'; every op is enqueued on
//! the stream it is given (the op's: the communicator's or `Communicator::on`'s).
//!
//! The unsafe boundary of the CUDA engine (NOTE [raw-addresses]): symm-cuda's entry points
//! take raw device addresses, so they are `unsafe fn`s. Every address that reaches this module
//! comes from `CudaEngine::src` / `dst` (cuda/mod.rs): a symmetric tensor of the communicator, a
//! cudarc slice held (with its stream guard) for the op, the workspace's staging area, or a
//! `RawDevicePtr` whose `unsafe` constructor carries the caller's promise; each was checked
//! there against the op's element count and dtype and for alignment, and the op holds them
//! until its work is enqueued (the stream keeps the memory's users ordered after it).
#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use symm_core::{
    get_symmetric_memory, DType, Error, Group, OpKind, Rank, ReduceOp, Result, SymmTensor, SymmetricMemory,
};
use symm_cuda::collectives::{AllGatherPath, AllReduceAlgo as KernelAlgo, CollectivesConfig, CudaCollectives};

use crate::select::{AllGatherAlgo, AllReduceAlgo};
use crate::CommConfig;

pub(crate) struct Coll {
    inner: CudaCollectives,
}

impl Coll {
    /// Collective setup (allocates and rendezvouses the workspace).
    pub fn new(group: &Arc<Group>, ctx: &Arc<CudaContext>, config: &CommConfig, timeout: Duration) -> Result<Self> {
        let mut c = CollectivesConfig::new(config.staging_bytes, timeout);
        if let Some(pdl) = config.pdl {
            c.pdl = pdl;
        }
        c.lamport_bytes = config.lamport_bytes;
        Ok(Coll {
            inner: CudaCollectives::with_config(group, ctx, c)?,
        })
    }

    /// The separate epilogue kernels (NOTE [fused-epilogue]).
    pub fn epilogues(&self) -> &symm_cuda::collectives::Epilogues {
        self.inner.epilogues()
    }

    /// The Lamport one-shot with the epilogue fused in.
    pub fn lamport_epilogue(&self, stream: &CudaStream, e: &symm_cuda::collectives::Epilogue) -> Result<()> {
        self.inner.lamport_epilogue(stream, e)
    }

    /// Largest payload the Lamport algorithm takes.
    pub fn lamport_max_bytes(&self) -> usize {
        self.inner.lamport_max_bytes()
    }

    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        stream: &CudaStream,
        algo: AllReduceAlgo,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let k = match algo {
            AllReduceAlgo::OneShot => KernelAlgo::OneShot,
            AllReduceAlgo::TwoShot => KernelAlgo::TwoShot,
            AllReduceAlgo::Lamport => KernelAlgo::Lamport,
            AllReduceAlgo::Pull => KernelAlgo::Pull,
            AllReduceAlgo::CopyEngine => return self.all_reduce_ce_two_shot(stream, input, output, count, dtype, op),
            AllReduceAlgo::Nccl => {
                return Err(Error::InvalidArgument(
                    "internal: nccl is not a kernel algorithm".into(),
                ))
            }
        };
        // SAFETY: the addresses come from checked buffers (module docs).
        unsafe { self.inner.all_reduce(stream, k, input, output, count, dtype, op) }
    }

    /// `count` = output elements.
    pub fn reduce_scatter(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the addresses come from checked buffers (module docs).
        unsafe { self.inner.reduce_scatter(stream, input, output, count, dtype, op) }
    }

    /// Zero-copy reduce-scatter of a registered input; `count` = output elements.
    pub fn reduce_scatter_pull(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the addresses come from checked buffers (module docs).
        unsafe { self.inner.reduce_scatter_pull(stream, input, output, count, dtype, op) }
    }

    /// Copy-engine two-shot all-reduce (two ranks, input and output registered, apart).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_ce_two_shot(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        // SAFETY: the addresses come from checked buffers (module docs).
        unsafe {
            self.inner
                .all_reduce_ce_two_shot(stream, input, output, count, dtype, op)
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.group().rank().get()
    }

    /// Ranks of the group.
    pub fn world_size(&self) -> usize {
        self.inner.group().world_size()
    }

    /// `count` = input elements.
    pub fn all_gather(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        algo: AllGatherAlgo,
    ) -> Result<()> {
        // Sm: the kernels' own choice (Lamport for small tensors, else the SM ring).
        let path = match algo {
            AllGatherAlgo::CopyEngine => AllGatherPath::CopyEngine,
            AllGatherAlgo::Pull => AllGatherPath::Pull,
            AllGatherAlgo::Sm | AllGatherAlgo::Nccl => AllGatherPath::Auto,
        };
        // SAFETY: the addresses come from checked buffers (module docs).
        unsafe { self.inner.all_gather(stream, input, output, count, dtype, path) }
    }

    pub fn barrier(&self, stream: &CudaStream, ranks: &[Rank]) -> Result<()> {
        self.inner.barrier(stream, ranks)
    }

    /// Registers a rendezvoused symmetric tensor's allocation for the
    /// zero-copy (copy-engine) paths.
    pub fn register(&self, t: &SymmTensor) -> Result<()> {
        let mem = get_symmetric_memory(t).ok_or(Error::NotRendezvoused)?;
        self.inner.register_symmetric(mem)
    }

    /// Registers a rendezvoused symmetric allocation (see [`Self::register`]).
    pub fn register_memory(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        self.inner.register_symmetric(mem)
    }

    /// Forgets the registered allocation whose local buffer starts at `base`.
    pub fn unregister_memory(&self, base: u64) -> bool {
        self.inner.unregister_symmetric(base)
    }

    /// True if `bytes` at `ptr` lie in registered symmetric memory (zero-copy copy engine).
    pub fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        self.inner.is_registered(ptr, bytes)
    }

    pub fn check_error(&self) -> Result<()> {
        self.inner.check_error()
    }

    /// An error the kernels latched, read without a launch or a synchronisation (NOTE
    /// [error-mirror]): `Err` with it (taken from the device) when there is one.
    pub fn surface_error(&self) -> Result<()> {
        match self.inner.pending_error() {
            None => Ok(()),
            Some(_) => self.inner.check_error(),
        }
    }

    /// Tells every peer this rank rejected its arguments for its next op (NOTE [op-agreement]).
    pub fn reject(&self, stream: &CudaStream) -> Result<()> {
        self.inner.reject(stream)
    }

    /// An empty op's place in the group's op sequence (a checked barrier).
    pub fn agree_empty(&self, stream: &CudaStream, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        self.inner.agree_empty(stream, kind, dtype, reduce)
    }

    pub fn set_abort(&self, abort: bool) -> Result<()> {
        self.inner.set_abort(abort)
    }
}
