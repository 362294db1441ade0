//! [`CudaAllocator`] and [`CudaAllocation`]: one `cuMemCreate` per
//! allocation holding buffer, signal pad and a small metadata area, mapped
//! locally at once; [`Allocation::rendezvous`] maps every peer.
//!
//! Layout of one allocation (offsets from its base; `total` is a multiple of
//! the device's recommended VMM granularity, 2 MiB on H100/H200):
//!
//! ```text
//! 0            buffer (size bytes asked for)
//! pad_offset   signal pad (SIGNAL_PAD_SIZE), round_up(size, 4096)
//! meta_offset  buffer_ptrs[MAX_WORLD_SIZE] u64, then pad_ptrs[MAX_WORLD_SIZE] u64
//!              (this rank's device arrays of peer addresses; peers never read them)
//! total        round_up(meta_offset + 1 KiB, granularity)
//! ```
//!
//! The pad and metadata are zeroed and the zeroing synchronised at
//! allocation, before the handle can be exported, so no peer can signal into
//! a pad that is cleared later.
//!
//! Rendezvous is `symm_core::rendezvous` (records, checks, the handle
//! exchange, fault points, the closing status exchange), under
//! `group.next_prefix("cuda-rendezvous")`; this backend gives it:
//! - its record: buffer and total size, the device as `GPU-<uuid>`, and
//!   [`CudaExt`] (PCI bus id, ordinal, the process's hardware work queues,
//!   which ranks sharing a GPU need all of: NOTE [co-residency]); ranks
//!   sharing a GPU only with the group's
//!   [`GroupOptions::shared_devices`](symm_core::GroupOptions) and only as
//!   threads of one process (NOTE [shared-device]);
//! - its handle, the `Arc<PhysicalAllocation>`: handed over as it is among
//!   rank threads of one process (no fds at all), exported as a POSIX fd for
//!   other processes and imported (`cuMemImportFromShareableHandle`);
//! - the mapping of each peer's memory into a VA range of its own with
//!   read/write access for the local device, the context bound first.
//!
//! Fault points (symm_core::fault_point): `rendezvous.before_send`,
//! `rendezvous.after_send`, `rendezvous.after_map` in the rendezvous, and
//! `barrier.mid` in the blocking barrier.

#![forbid(unsafe_code)]

mod records;

use std::any::Any;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use symm_core::pad::{self, SIGNAL_PAD_SIZE};
use symm_core::rendezvous::{self, LocalRecord, Record, RendezvousBackend};
use symm_core::{
    connectivity::SHARED_DEVICE_QUEUES, Allocation, BackendRegistration, Device, DeviceType, Error, Group, Result,
    SymmetricAllocator, SymmetricMemory,
};

use crate::driver::mem::memset_d32_async;
use crate::driver::vmm::{self, AddressRange, Mapping, PhysicalAllocation};
use crate::driver::{self, bind};
use crate::symm_mem::CudaSymmetricMemory;
pub use records::CudaExt;

/// Name of the backend in the registry.
pub const BACKEND_NAME: &str = "symm-cuda";
/// Bytes of the metadata area (two arrays of MAX_WORLD_SIZE u64).
pub const META_SIZE: usize = 2 * pad::MAX_WORLD_SIZE * 8;
/// Alignment of the signal pad inside the allocation.
const PAD_ALIGN: usize = 4096;

/// The CUDA backend's allocator (registered for [`DeviceType::Cuda`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaAllocator;

pub(crate) fn make_allocator() -> Result<Arc<dyn SymmetricAllocator>> {
    Ok(Arc::new(CudaAllocator))
}

inventory::submit! {
    BackendRegistration {
        device_type: DeviceType::Cuda,
        name: BACKEND_NAME,
        make: make_allocator,
    }
}

impl SymmetricAllocator for CudaAllocator {
    fn device_type(&self) -> DeviceType {
        DeviceType::Cuda
    }
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }
    fn alloc(&self, size: usize, device: Device, group: &Arc<Group>) -> Result<Arc<dyn Allocation>> {
        Ok(Arc::new(CudaAllocation::new(size, device, group)?))
    }
    fn device_count(&self) -> Result<usize> {
        driver::device_count()
    }
    fn shared_device_support(&self) -> Result<()> {
        let q = crate::knobs::hw_queues();
        if q < SHARED_DEVICE_QUEUES {
            return Err(Error::Unavailable(format!(
                "ranks sharing a GPU need {}={SHARED_DEVICE_QUEUES} in the environment before the process \
                 starts CUDA; this process has {q} hardware work queues (NOTE [co-residency])",
                crate::knobs::HW_QUEUES
            )));
        }
        Ok(())
    }
}

fn round_up(v: usize, to: usize) -> Option<usize> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

/// Sizes of one allocation: `(pad_offset, meta_offset, total)`.
pub fn layout(size: usize, granularity: usize) -> Result<(usize, usize, usize)> {
    let too_big = || Error::OutOfRange {
        what: "allocation size",
        value: size as u64,
        limit: (isize::MAX as usize - SIGNAL_PAD_SIZE - META_SIZE - granularity) as u64,
    };
    if granularity == 0 || !granularity.is_power_of_two() {
        return Err(Error::InvalidArgument(format!("bad granularity {granularity}")));
    }
    let pad_offset = round_up(size, PAD_ALIGN).ok_or_else(too_big)?;
    let meta_offset = pad_offset.checked_add(SIGNAL_PAD_SIZE).ok_or_else(too_big)?;
    let end = meta_offset.checked_add(META_SIZE).ok_or_else(too_big)?;
    let total = round_up(end, granularity).ok_or_else(too_big)?;
    if total > isize::MAX as usize {
        return Err(too_big());
    }
    Ok((pad_offset, meta_offset, total))
}

/// The local part of an allocation: physical memory, its local mapping and
/// the internal stream; shared by the allocation and its symmetric memory.
pub(crate) struct LocalMemory {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) ordinal: usize,
    pub(crate) size: usize,
    pub(crate) pad_offset: usize,
    pub(crate) meta_offset: usize,
    pub(crate) total: usize,
    pub(crate) granularity: usize,
    pub(crate) mapping: Mapping,
    /// The device's control stream (NOTE [stream-budget]): setup copies and control words.
    pub(crate) stream: Arc<CudaStream>,
}

impl LocalMemory {
    pub(crate) fn ptr(&self) -> u64 {
        self.mapping.ptr()
    }
    pub(crate) fn pad_ptr(&self) -> u64 {
        self.ptr() + self.pad_offset as u64
    }
    pub(crate) fn meta_ptr(&self) -> u64 {
        self.ptr() + self.meta_offset as u64
    }
}

impl Drop for LocalMemory {
    fn drop(&mut self) {
        // Our own queued copies/kernels finish first (they are bounded); then
        // the mapping unmaps, the range is freed and the handle released.
        if let Err(e) = bind(&self.ctx).and_then(|()| driver::stream_synchronize(&self.stream)) {
            log::warn!("symm-cuda: freeing allocation: {e}");
        }
    }
}

/// One rank's CUDA symmetric allocation, mapped locally; peers are mapped by
/// [`Allocation::rendezvous`].
pub struct CudaAllocation {
    group: Arc<Group>,
    device: Device,
    local: Arc<LocalMemory>,
    phys: Arc<PhysicalAllocation>,
    uuid: String,
    pci_bus_id: String,
    mem: Mutex<Option<Arc<CudaSymmetricMemory>>>,
}

impl std::fmt::Debug for CudaAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaAllocation")
            .field("group", &self.group.name())
            .field("rank", &self.group.rank().get())
            .field("device", &self.device)
            .field("size", &self.local.size)
            .field("total", &self.local.total)
            .field("ptr", &format_args!("{:#x}", self.local.ptr()))
            .finish()
    }
}

impl CudaAllocation {
    fn new(size: usize, device: Device, group: &Arc<Group>) -> Result<CudaAllocation> {
        if device.ty != DeviceType::Cuda {
            return Err(Error::InvalidArgument(format!(
                "the CUDA backend allocates on cuda devices, not {device}"
            )));
        }
        let ordinal = device.index as usize;
        let ctx = driver::context(ordinal)?;
        bind(&ctx)?;
        let cu_dev = ctx.cu_device();
        vmm::check_vmm_support(cu_dev)?;
        let granularity = vmm::granularity(ordinal)?;
        let (pad_offset, meta_offset, total) = layout(size, granularity)?;
        let phys = Arc::new(PhysicalAllocation::create(ordinal, total)?);
        let range = Arc::new(AddressRange::reserve(total, granularity)?);
        let mapping = Mapping::map(range, phys.clone(), &[ordinal])?;
        let stream = crate::streams::control(&ctx)?;
        let local = LocalMemory {
            ctx: ctx.clone(),
            ordinal,
            size,
            pad_offset,
            meta_offset,
            total,
            granularity,
            mapping,
            stream,
        };
        // Zero pad + metadata and wait: visible before any export.
        memset_d32_async(&local.stream, local.pad_ptr(), 0, (total - pad_offset) / 4)?;
        driver::stream_synchronize(&local.stream)?;
        Ok(CudaAllocation {
            group: group.clone(),
            device,
            uuid: driver::uuid(cu_dev)?,
            pci_bus_id: driver::pci_bus_id(cu_dev)?,
            local: Arc::new(local),
            phys,
            mem: Mutex::new(None),
        })
    }

    /// The CUDA context of the allocation's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.local.ctx
    }

    /// Bytes mapped (buffer + pad + metadata, rounded to the granularity).
    pub fn mapped_size(&self) -> usize {
        self.local.total
    }

    /// The device's VMM granularity used for this allocation.
    pub fn granularity(&self) -> usize {
        self.local.granularity
    }

    /// The local signal pad's device address.
    pub fn signal_pad_ptr(&self) -> u64 {
        self.local.pad_ptr()
    }

    /// The rendezvoused memory as its concrete type, if rendezvous completed.
    pub fn cuda_memory(&self) -> Option<Arc<CudaSymmetricMemory>> {
        rendezvous::current(&self.mem)
    }

    fn do_rendezvous(&self, timeout: Duration) -> Result<CudaSymmetricMemory> {
        let g = &self.group;
        let rank = g.rank().get();
        rendezvous::run(&Side(self), g, timeout, |done| {
            CudaSymmetricMemory::new(
                g.clone(),
                self.device,
                self.local.clone(),
                done.peers,
                done.sharers[rank],
            )
        })
    }
}

/// This rank's side of `symm_core::rendezvous`.
struct Side<'a>(&'a CudaAllocation);

impl RendezvousBackend for Side<'_> {
    type Handle = PhysicalAllocation;
    type Mapped = Mapping;
    type Extra = CudaExt;

    fn backend_name(&self) -> &'static str {
        driver::BACKEND
    }
    fn prefix(&self) -> &'static str {
        "cuda-rendezvous"
    }
    fn local_record(&self) -> Result<LocalRecord<CudaExt>> {
        let a = self.0;
        Ok(LocalRecord {
            buffer_size: a.local.size,
            total: a.local.total,
            device: format!("GPU-{}", a.uuid),
            extra: CudaExt {
                pci_bus_id: a.pci_bus_id.clone(),
                ordinal: a.local.ordinal,
                hw_queues: crate::knobs::hw_queues(),
            },
        })
    }
    fn handle(&self) -> Arc<PhysicalAllocation> {
        self.0.phys.clone()
    }
    fn handle_size(&self, phys: &PhysicalAllocation) -> usize {
        phys.size()
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        self.0.phys.export_fd()
    }
    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<Arc<PhysicalAllocation>> {
        // The fd closes when `fd` drops, after the import.
        Ok(Arc::new(PhysicalAllocation::import(fd.as_fd(), size)?))
    }
    fn map_peer(&self, phys: Arc<PhysicalAllocation>, _record: &Record<CudaExt>) -> Result<Mapping> {
        let local = &self.0.local;
        let range = Arc::new(AddressRange::reserve(local.total, local.granularity)?);
        Mapping::map(range, phys, &[local.ordinal])
    }
    fn bind(&self) -> Result<()> {
        bind(&self.0.local.ctx)
    }
}

impl Allocation for CudaAllocation {
    fn ptr(&self) -> u64 {
        self.local.ptr()
    }
    fn size(&self) -> usize {
        self.local.size
    }
    fn device(&self) -> Device {
        self.device
    }
    fn group(&self) -> &Arc<Group> {
        &self.group
    }
    fn rendezvous(&self, timeout: Duration) -> Result<Arc<dyn SymmetricMemory>> {
        Ok(rendezvous::once(&self.mem, || self.do_rendezvous(timeout))?)
    }
    fn symmetric_memory(&self) -> Option<Arc<dyn SymmetricMemory>> {
        self.cuda_memory().map(|m| m as Arc<dyn SymmetricMemory>)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaAllocation {
    fn drop(&mut self) {
        // Drop the memory (peer mappings) before the local part goes.
        let m = self.mem.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        drop(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_rounds_and_checks() {
        let g = 2 << 20;
        let (pad, meta, total) = layout(1, g).unwrap();
        assert_eq!((pad, meta, total), (4096, 4096 + SIGNAL_PAD_SIZE, g));
        let (pad, meta, total) = layout(0, g).unwrap();
        assert_eq!((pad, meta), (0, SIGNAL_PAD_SIZE));
        assert_eq!(total, g);
        let two_gib = 2usize << 30;
        let (pad, _, total) = layout(two_gib, g).unwrap();
        assert_eq!(pad, two_gib);
        assert_eq!(total, two_gib + g);
        // The pad and metadata always fit, and total is a granularity multiple.
        for size in [
            1usize,
            4095,
            4096,
            4097,
            g - SIGNAL_PAD_SIZE - META_SIZE,
            g - 1,
            g,
            3 * g + 5,
        ] {
            let (pad, meta, total) = layout(size, g).unwrap();
            assert!(pad >= size && pad % 4096 == 0, "{size}");
            assert!(meta + META_SIZE <= total && total % g == 0, "{size}");
        }
        assert!(layout(usize::MAX - 10, g).is_err());
        assert!(layout(isize::MAX as usize, g).is_err());
        assert!(layout(10, 3).is_err());
    }

    #[test]
    fn alloc_without_driver_is_unavailable() {
        if driver::device_count().is_ok() {
            println!("note: a CUDA driver is present; the no-driver path is not exercised here");
            return;
        }
        let store = symm_core::symm_store::HashStore::new(Duration::from_secs(1));
        let g = Group::new("cuda-alloc-nodriver", 0, 1, store).unwrap();
        let e = CudaAllocator.alloc(1024, Device::cuda(0), &g).err().unwrap();
        assert!(matches!(e, Error::Unavailable(_)), "{e}");
        let e = CudaAllocator.alloc(1024, Device::host(0), &g).err().unwrap();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(matches!(CudaAllocator.device_count(), Err(Error::Unavailable(_))));
    }
}
