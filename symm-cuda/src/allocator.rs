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
//! Rendezvous, under `group.next_prefix("cuda-rendezvous")`:
//! 1. `info`: every rank publishes world size, buffer size, pad size, total
//!    size, host id, device UUID / PCI id / ordinal, pid, pid namespace, a
//!    per-process nonce and its allocation key (StoreExchange all_gather);
//! 2. every rank checks every record the same way ([`check_infos`]), so all
//!    fail alike before anything is mapped (ranks sharing a GPU: only with
//!    the group's [`GroupOptions::shared_devices`](symm_core::GroupOptions)
//!    and only as threads of one process, NOTE [shared-device]);
//! 3. handles: if every rank is in this process (one thread per GPU), each
//!    publishes its `Arc<PhysicalAllocation>` in a process-wide table and
//!    takes the peers' after a store barrier (no fds at all); otherwise every
//!    rank exports its handle as a POSIX fd, the fds go through an
//!    [`FdChannel`] (`all_gather_fds`), and each peer fd is imported
//!    (`cuMemImportFromShareableHandle`) and closed;
//! 4. each peer's memory is mapped into a VA range of its own with read/write
//!    access for the local device;
//! 5. `status`: an all_gather of every rank's outcome; rendezvous succeeds
//!    only if every rank mapped every peer, and fails on every rank otherwise.
//!
//! Fault points (symm_core::fault_point): `rendezvous.before_send`,
//! `rendezvous.after_send`, `rendezvous.after_map`, and `barrier.mid` in
//! the blocking barrier.

#![forbid(unsafe_code)]

mod records;

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use symm_core::agree::{host_id, pid_namespace, time_left};

use cudarc::driver::{CudaContext, CudaStream};
use symm_core::pad::{self, SIGNAL_PAD_SIZE};
use symm_core::symm_store::FdChannel;
use symm_core::{
    connectivity::SHARED_DEVICE_QUEUES, fault_point, Allocation, BackendRegistration, Device, DeviceType, Error, Group,
    Result, SymmetricAllocator, SymmetricMemory,
};

use crate::driver::mem::memset_d32_async;
use crate::driver::vmm::{self, AddressRange, Mapping, PhysicalAllocation};
use crate::driver::{self, bind};
use crate::symm_mem::CudaSymmetricMemory;
pub use records::{check_infos, same_process, RankInfo};
use records::{missing_rank, next_key, process_nonce, shared_handles, Published};

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
    /// Unique in this process: names the allocation in the thread table.
    pub(crate) key: u64,
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
            eprintln!("symm-cuda: freeing allocation: {e}");
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
            key: next_key(),
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
        self.mem.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn info(&self) -> RankInfo {
        RankInfo {
            world: self.group.world_size(),
            buffer_size: self.local.size,
            pad_size: SIGNAL_PAD_SIZE,
            total: self.local.total,
            host: host_id(),
            uuid: self.uuid.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            ordinal: self.local.ordinal,
            pid: std::process::id(),
            pid_ns: pid_namespace(),
            nonce: process_nonce(),
            key: self.local.key,
            shared_ok: self.group.options().shared_devices,
            hw_queues: crate::knobs::hw_queues(),
        }
    }

    /// Steps 3 and 4: the peers' physical allocations, mapped here.
    fn exchange_and_map(
        &self,
        prefix: &str,
        infos: &[RankInfo],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(Vec<Option<Mapping>>, Option<Published>)> {
        let g = &self.group;
        let (rank, world) = (g.rank().get(), g.world_size());
        let store = g.store().clone();
        let local_proc = same_process(infos, rank);
        fault_point("rendezvous.before_send")?;
        let mut published = None;
        let handles: Vec<Option<Arc<PhysicalAllocation>>> = if local_proc.iter().all(|&b| b) {
            // Threads: hand the Arc over through the process-wide table.
            published = Some(Published(self.local.key));
            shared_handles()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.local.key, Arc::downgrade(&self.phys));
            fault_point("rendezvous.after_send")?;
            g.exchange(format!("{prefix}/sent"))
                .barrier(rank, world, time_left(deadline, timeout, "rendezvous")?)?;
            let table = shared_handles().lock().unwrap_or_else(|e| e.into_inner());
            infos
                .iter()
                .enumerate()
                .map(|(r, i)| {
                    if r == rank {
                        return Ok(None);
                    }
                    table
                        .get(&i.key)
                        .and_then(Weak::upgrade)
                        .filter(|p| p.size() == self.local.total)
                        .map(Some)
                        .ok_or_else(|| Error::PeerLost {
                            rank: r,
                            reason: "its allocation was freed during rendezvous".into(),
                        })
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            // Processes: POSIX fds over the FdChannel.
            let own = self.phys.export_fd()?;
            let channel = FdChannel::with_liveness(
                store,
                &format!("{prefix}/fds"),
                rank,
                world,
                time_left(deadline, timeout, "rendezvous")?,
                g.liveness(),
            )?;
            let fds = channel.all_gather_fds(
                std::os::fd::AsFd::as_fd(&own),
                time_left(deadline, timeout, "rendezvous")?,
            )?;
            drop(channel);
            drop(own);
            fault_point("rendezvous.after_send")?;
            bind(&self.local.ctx)?;
            fds.into_iter()
                .enumerate()
                .map(|(r, fd)| {
                    if r == rank {
                        return Ok(None);
                    }
                    // The fd closes when `fd` drops, after the import.
                    let imported = PhysicalAllocation::import(std::os::fd::AsFd::as_fd(&fd), self.local.total)
                        .map_err(|e| match e {
                            Error::Backend { call, detail, .. } => Error::Backend {
                                backend: driver::BACKEND,
                                call: format!("{call} (handle of rank {r})"),
                                detail,
                            },
                            e => e,
                        })?;
                    Ok(Some(Arc::new(imported)))
                })
                .collect::<Result<Vec<_>>>()?
        };
        bind(&self.local.ctx)?;
        let mut mappings = Vec::with_capacity(world);
        for (r, h) in handles.into_iter().enumerate() {
            match h {
                None => mappings.push(None),
                Some(phys) => {
                    let range = Arc::new(AddressRange::reserve(self.local.total, self.local.granularity)?);
                    let m = Mapping::map(range, phys, &[self.local.ordinal]).map_err(|e| match e {
                        Error::Backend { call, detail, .. } => Error::Backend {
                            backend: driver::BACKEND,
                            call: format!("{call} (memory of rank {r} on device {})", infos[r].pci_bus_id),
                            detail,
                        },
                        e => e,
                    })?;
                    mappings.push(Some(m));
                }
            }
        }
        fault_point("rendezvous.after_map")?;
        Ok((mappings, published))
    }

    fn do_rendezvous(&self, timeout: Duration) -> Result<CudaSymmetricMemory> {
        // A timeout too large for an Instant means "a year": effectively none.
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
        let g = &self.group;
        let (rank, world) = (g.rank().get(), g.world_size());
        let prefix = g.next_prefix("cuda-rendezvous");
        let raw = g.exchange(format!("{prefix}/info")).all_gather(
            rank,
            world,
            &self.info().encode(),
            time_left(deadline, timeout, "rendezvous")?,
        )?;
        let infos = raw
            .iter()
            .enumerate()
            .map(|(r, b)| RankInfo::decode(r, b))
            .collect::<Result<Vec<_>>>()?;
        let sharers = check_infos(world, &infos)?[rank];

        let outcome = self
            .exchange_and_map(&prefix, &infos, deadline, timeout)
            .and_then(|(peers, published)| {
                let mem = CudaSymmetricMemory::new(g.clone(), self.device, self.local.clone(), peers, sharers)?;
                Ok((mem, published))
            });
        // An injected fault stands for a dead rank: leave without a word.
        if let Err(e) = &outcome {
            if symm_core::fault::is_injected(e) {
                return outcome.map(|(m, _)| m);
            }
        }
        // Every rank learns every outcome: all succeed or all fail. (This is
        // also the barrier after which the thread table entry may go.)
        let status = match &outcome {
            Ok(_) => b"ok".to_vec(),
            Err(e) => format!("failed: {e}").into_bytes(),
        };
        let all = g.exchange(format!("{prefix}/status")).all_gather(
            rank,
            world,
            &status,
            time_left(deadline, timeout, "rendezvous status exchange").unwrap_or(Duration::from_millis(1)),
        );
        let (mem, _published) = match (outcome, &all) {
            (Ok(m), _) => m,
            // A local failure (an import or a mapping) while a peer vanished:
            // the vanished peer is the likely cause; name it.
            (Err(e), Err(se)) if !matches!(e, Error::Store(_) | Error::Timeout { .. } | Error::PeerLost { .. }) => {
                return Err(match missing_rank(se) {
                    Some(rank) => Error::PeerLost {
                        rank,
                        reason: format!("it did not finish rendezvous; here: {e}"),
                    },
                    None => e,
                });
            }
            (Err(e), _) => return Err(e),
        };
        let all = all?;
        if let Some((r, s)) = all.iter().enumerate().find(|(_, s)| s.as_slice() != b"ok") {
            return Err(Error::Backend {
                backend: driver::BACKEND,
                call: format!("rendezvous (rank {r})"),
                detail: String::from_utf8_lossy(s).into_owned(),
            });
        }
        Ok(mem)
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
        let mut mem = self.mem.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = mem.as_ref() {
            return Ok(m.clone());
        }
        let m = Arc::new(self.do_rendezvous(timeout)?);
        *mem = Some(m.clone());
        Ok(m)
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
