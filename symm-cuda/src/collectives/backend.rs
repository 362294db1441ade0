//! [`CudaCollectives`] as symm-core's [`Collectives`], and its registration for
//! [`DeviceType::Cuda`]: the ops run on the stream the caller gives ([`Queue::of`] a
//! [`CudaStream`]); [`Queue::own`] is refused (CUDA collectives have no stream of their own for
//! ops). Each method forwards to the inherent entry of the same name.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use symm_core::coll::backend::{CollFacts, Collectives, CollectivesRegistration, CollectivesSetup, Queue};
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};
use symm_core::{DType, DeviceType, Error, OpKind, Rank, ReduceOp, Result, SymmetricMemory};

use super::{CollectivesConfig, CudaCollectives, Epilogue};

/// The stream `q` names: CUDA ops run on the caller's stream only.
fn stream<'q>(q: Queue<'q>) -> Result<&'q CudaStream> {
    q.get::<CudaStream>().ok_or_else(|| {
        Error::InvalidArgument(
            "the CUDA collectives run on a stream the caller gives (Queue::of a cudarc CudaStream); \
             none was given"
                .into(),
        )
    })
}

impl Collectives for CudaCollectives {
    fn facts(&self) -> CollFacts {
        CollFacts {
            backend: "cuda",
            lamport_slot: self.lamport_max_bytes(),
            copy_engine: true,
            fused_epilogue: true,
            handoff_bytes: self.rig.handoff_bytes(),
            pdl: self.pdl(),
            stream_ordered: true,
            host_abort: true,
        }
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the inherent entry
    unsafe fn all_reduce(&self, q: Queue<'_>, kernel: AllReduceKernel, d: DeviceOp) -> Result<()> {
        let s = stream(q)?;
        // SAFETY: the caller keeps this trait method's contract, which includes the inherent one's
        // (Collectives' # Safety is the union of the backends' contracts).
        unsafe { CudaCollectives::all_reduce(self, s, kernel, d) }
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the inherent entry
    unsafe fn reduce_scatter(&self, q: Queue<'_>, kernel: ReduceScatterKernel, d: DeviceOp) -> Result<()> {
        let s = stream(q)?;
        // SAFETY: the caller keeps this trait method's contract, which includes the inherent one's
        // (Collectives' # Safety is the union of the backends' contracts).
        unsafe { CudaCollectives::reduce_scatter(self, s, kernel, d) }
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the inherent entry
    unsafe fn all_gather(&self, q: Queue<'_>, kernel: AllGatherKernel, d: DeviceOp) -> Result<()> {
        let s = stream(q)?;
        // SAFETY: the caller keeps this trait method's contract, which includes the inherent one's
        // (Collectives' # Safety is the union of the backends' contracts).
        unsafe { CudaCollectives::all_gather(self, s, kernel, d) }
    }

    fn lamport_epilogue(&self, q: Queue<'_>, e: &Epilogue) -> Result<()> {
        CudaCollectives::lamport_epilogue(self, stream(q)?, e)
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the separate kernel's launch
    unsafe fn epilogue(&self, q: Queue<'_>, sum: u64, e: &Epilogue) -> Result<()> {
        let s = stream(q)?;
        // SAFETY: the caller keeps this trait method's contract, which is `Epilogues::launch`'s.
        unsafe { self.epilogues().launch(s, sum, e) }
    }

    fn barrier(&self, q: Queue<'_>, ranks: &[Rank]) -> Result<()> {
        CudaCollectives::barrier(self, stream(q)?, ranks)
    }

    fn agree_empty(&self, q: Queue<'_>, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        CudaCollectives::agree_empty(self, stream(q)?, kind, dtype, reduce)
    }

    fn reject(&self, q: Queue<'_>) -> Result<()> {
        CudaCollectives::reject(self, stream(q)?)
    }

    fn register_symmetric(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        CudaCollectives::register_symmetric(self, mem)
    }

    fn unregister_symmetric(&self, base: u64) -> bool {
        CudaCollectives::unregister_symmetric(self, base)
    }

    fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        CudaCollectives::is_registered(self, ptr, bytes)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        CudaCollectives::set_abort(self, abort)
    }

    fn abort_long_waits(&self) {
        CudaCollectives::abort_long_waits(self)
    }

    fn has_pending_error(&self) -> bool {
        self.pending_error().is_some()
    }

    fn check_error(&self) -> Result<()> {
        CudaCollectives::check_error(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// symm-core's factory for [`DeviceType::Cuda`]: the collectives in the context of the setup's
/// queue (a [`CudaStream`]), else of the device's primary context.
pub(crate) fn make_collectives(s: &CollectivesSetup<'_>) -> Result<Arc<dyn Collectives>> {
    let ctx = match s.queue.get::<CudaStream>() {
        Some(stream) => stream.context().clone(),
        None => {
            let n = crate::cuda_available()?;
            if s.device.index as usize >= n {
                return Err(Error::OutOfRange {
                    what: "CUDA device index",
                    value: s.device.index as u64,
                    limit: n as u64,
                });
            }
            CudaContext::new(s.device.index as usize).map_err(|e| Error::Backend {
                backend: crate::driver::BACKEND,
                call: "cuDevicePrimaryCtxRetain".into(),
                detail: format!("{e:?}"),
            })?
        }
    };
    let mut c = CollectivesConfig::new(s.staging_bytes, s.timeout);
    if let Some(pdl) = s.pdl {
        c.pdl = pdl;
    }
    c.lamport_bytes = s.lamport_bytes;
    Ok(Arc::new(CudaCollectives::with_config(s.group, &ctx, c)?))
}

inventory::submit! {
    CollectivesRegistration {
        device_type: DeviceType::Cuda,
        name: "symm-cuda",
        make: make_collectives,
    }
}
