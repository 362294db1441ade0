//! [`RocmCollectives`] as symm-core's [`Collectives`], and its registration for
//! [`DeviceType::Rocm`]: every op runs on the object's own stream and returns when done, so it
//! takes [`Queue::own`] only (a given queue is refused). Each method forwards to the inherent
//! entry of the same name.

use std::any::Any;
use std::sync::Arc;

use symm_core::coll::add_rms::Epilogue;
use symm_core::coll::backend::{CollFacts, Collectives, CollectivesRegistration, CollectivesSetup, Queue};
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};
use symm_core::{DType, DeviceType, Error, OpKind, Rank, ReduceOp, Result, SymmetricMemory};

use super::{RocmCollectives, RocmCollectivesConfig};

/// The ROCm collectives run on their own stream only.
fn own(q: Queue<'_>) -> Result<()> {
    if q.is_own() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(
            "a queue given to an op of the ROCm collectives: they run on their own stream (Queue::own)".into(),
        ))
    }
}

impl Collectives for RocmCollectives {
    fn facts(&self) -> CollFacts {
        CollFacts {
            backend: "rocm",
            lamport_slot: self.lamport_max_bytes(),
            copy_engine: false,
            fused_epilogue: true,
            handoff_bytes: self.rig.handoff_bytes(),
            pdl: false,
            stream_ordered: false,
            host_abort: false,
        }
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the inherent entry
    unsafe fn all_reduce(&self, q: Queue<'_>, kernel: AllReduceKernel, d: DeviceOp) -> Result<()> {
        own(q)?;
        // SAFETY: the caller keeps this trait method's contract, which covers the inherent one's
        // (the op returns when done).
        unsafe { RocmCollectives::all_reduce(self, kernel, d) }
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the inherent entry
    unsafe fn reduce_scatter(&self, q: Queue<'_>, kernel: ReduceScatterKernel, d: DeviceOp) -> Result<()> {
        own(q)?;
        // SAFETY: the caller keeps this trait method's contract, which covers the inherent one's.
        unsafe { RocmCollectives::reduce_scatter(self, kernel, d) }
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the inherent entry
    unsafe fn all_gather(&self, q: Queue<'_>, kernel: AllGatherKernel, d: DeviceOp) -> Result<()> {
        own(q)?;
        // SAFETY: the caller keeps this trait method's contract, which covers the inherent one's.
        unsafe { RocmCollectives::all_gather(self, kernel, d) }
    }

    fn lamport_epilogue(&self, q: Queue<'_>, e: &Epilogue) -> Result<()> {
        own(q)?;
        RocmCollectives::lamport_epilogue(self, e)
    }

    #[allow(unsafe_code)] // forwards the contract it declares to the inherent entry
    unsafe fn epilogue(&self, q: Queue<'_>, sum: u64, e: &Epilogue) -> Result<()> {
        own(q)?;
        // SAFETY: the caller keeps this trait method's contract, which covers the inherent one's.
        unsafe { RocmCollectives::epilogue(self, sum, e) }
    }

    fn barrier(&self, q: Queue<'_>, ranks: &[Rank]) -> Result<()> {
        own(q)?;
        RocmCollectives::barrier(self, ranks)
    }

    fn agree_empty(&self, q: Queue<'_>, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        own(q)?;
        RocmCollectives::agree_empty(self, kind, dtype, reduce)
    }

    fn reject(&self, q: Queue<'_>) -> Result<()> {
        own(q)?;
        RocmCollectives::reject(self)
    }

    fn register_symmetric(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        RocmCollectives::register_symmetric(self, mem)
    }

    fn unregister_symmetric(&self, base: u64) -> bool {
        RocmCollectives::unregister_symmetric(self, base)
    }

    fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        RocmCollectives::is_registered(self, ptr, bytes)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        RocmCollectives::set_abort(self, abort)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// symm-core's factory for [`DeviceType::Rocm`].
pub(crate) fn make_collectives(s: &CollectivesSetup<'_>) -> Result<Arc<dyn Collectives>> {
    let mut c = RocmCollectivesConfig::new(s.staging_bytes, s.timeout);
    c.lamport_bytes = s.lamport_bytes;
    Ok(Arc::new(RocmCollectives::new(
        s.group,
        s.device.index,
        s.device_sharers,
        c,
    )?))
}

inventory::submit! {
    CollectivesRegistration {
        device_type: DeviceType::Rocm,
        name: "symm-rocm",
        make: make_collectives,
    }
}
