//! [`HostAllocator`] and [`HostAllocation`]: one memfd per allocation
//! (buffer, page-rounded, then the signal pad), and its side of the
//! rendezvous that maps every rank's memfd into every rank.
//!
//! The protocol is `symm_core::rendezvous` (records, checks, the handle
//! exchange, fault points, the closing status exchange), under
//! `group.next_prefix("rendezvous")`; this backend gives it:
//! - its record: buffer size, the memfd's size, and the device id (host
//!   devices are distinct by rank; ranks of different processes may share
//!   one, no GPU context being involved), no fields of its own;
//! - the handle, the mapped memfd (`Region`): among threads of one process
//!   the peers' regions themselves (the same mapping, so a peer's buffer has
//!   the same address in every rank); among processes the memfd (a dup of
//!   it) through the `FdChannel`, accepting only memfds, which every rank maps
//!   after checking its kind and size, then closes.
//!
//! The pad is zeroed (and fenced) at allocation, before the handle is
//! published. Errors drop what was received or mapped: fds close, mappings
//! are unmapped, the FdChannel's socket closes.
#![forbid(unsafe_code)]

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::pad::SIGNAL_PAD_SIZE;
use symm_core::rendezvous::{self, LocalRecord, Record, RendezvousBackend};
use symm_core::symm_store::FdKind;
use symm_core::{Allocation, Device, DeviceType, Error, Group, Result, SymmetricAllocator, SymmetricMemory};

use super::mapping::{page_round, Region};
use super::symm_mem::HostSymmetricMemory;

/// The host backend's allocator (registered for [`DeviceType::Host`]).
#[derive(Debug, Default)]
pub struct HostAllocator;

impl SymmetricAllocator for HostAllocator {
    fn device_type(&self) -> DeviceType {
        DeviceType::Host
    }
    fn name(&self) -> &'static str {
        super::BACKEND_NAME
    }
    fn alloc(&self, size: usize, device: Device, group: &Arc<Group>) -> Result<Arc<dyn Allocation>> {
        Ok(Arc::new(HostAllocation::new(size, device, group)?))
    }
    fn device_count(&self) -> Result<usize> {
        Ok(symm_core::pad::MAX_WORLD_SIZE)
    }
}

/// One rank's host allocation: a memfd holding the buffer (page-rounded)
/// and then the signal pad, mapped in this process.
pub struct HostAllocation {
    group: Arc<Group>,
    device: Device,
    size: usize,
    pad_offset: usize,
    region: Arc<Region>,
    mem: Mutex<Option<Arc<HostSymmetricMemory>>>,
}

impl std::fmt::Debug for HostAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAllocation")
            .field("group", &self.group.name())
            .field("rank", &self.group.rank().get())
            .field("size", &self.size)
            .field("region", &self.region)
            .finish()
    }
}

impl HostAllocation {
    fn new(size: usize, device: Device, group: &Arc<Group>) -> Result<HostAllocation> {
        if device.ty != DeviceType::Host {
            return Err(Error::InvalidArgument(format!(
                "the host backend allocates on host devices, not {device}"
            )));
        }
        let pad_offset = page_round(size)?;
        let total = pad_offset.checked_add(SIGNAL_PAD_SIZE).ok_or(Error::OutOfRange {
            what: "allocation size",
            value: size as u64,
            limit: (usize::MAX - SIGNAL_PAD_SIZE) as u64,
        })?;
        let name: String = format!("symm-host-{}", group.name()).chars().take(64).collect();
        let region = Region::create(&name, total)?;
        // A fresh memfd reads as zeros; clear the pad explicitly anyway (and
        // fence), so no protocol relies on that.
        region.fill(pad_offset, SIGNAL_PAD_SIZE, 0)?;
        Ok(HostAllocation {
            group: group.clone(),
            device,
            size,
            pad_offset,
            region: Arc::new(region),
            mem: Mutex::new(None),
        })
    }

    fn do_rendezvous(&self, timeout: Duration) -> Result<HostSymmetricMemory> {
        let g = &self.group;
        let rank = g.rank().get();
        rendezvous::run(&Side(self), g, timeout, |done| {
            let me = &done.records[rank];
            let peer_pids = done
                .records
                .iter()
                .map(|i| (i.pid != me.pid && i.pid_ns == me.pid_ns).then_some(i.pid as i32))
                .collect();
            let regions = done
                .peers
                .into_iter()
                .map(|p| p.unwrap_or_else(|| self.region.clone()))
                .collect();
            Ok(HostSymmetricMemory::new(
                g.clone(),
                self.device,
                self.size,
                self.pad_offset,
                regions,
                peer_pids,
            ))
        })
    }
}

/// This rank's side of `symm_core::rendezvous`.
struct Side<'a>(&'a HostAllocation);

impl RendezvousBackend for Side<'_> {
    type Handle = Region;
    type Mapped = Arc<Region>;
    type Extra = ();

    fn backend_name(&self) -> &'static str {
        super::BACKEND_NAME
    }
    fn prefix(&self) -> &'static str {
        "rendezvous"
    }
    fn local_record(&self) -> Result<LocalRecord<()>> {
        Ok(LocalRecord {
            buffer_size: self.0.size,
            total: self.0.region.len(),
            // Host "devices" are distinct by rank.
            device: format!("host-rank-{}", self.0.group.rank().get()),
            extra: (),
        })
    }
    fn handle(&self) -> Arc<Region> {
        self.0.region.clone()
    }
    fn handle_size(&self, region: &Region) -> usize {
        region.len()
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        let fd = self
            .0
            .region
            .fd()
            .ok_or_else(|| Error::InvalidArgument("host allocation lost its memfd".into()))?;
        Ok(fd.try_clone_to_owned()?)
    }
    fn fd_kind(&self) -> FdKind {
        FdKind::Memfd
    }
    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<Arc<Region>> {
        Ok(Arc::new(Region::from_fd(fd, size)?))
    }
    fn map_peer(&self, region: Arc<Region>, _record: &Record<()>) -> Result<Arc<Region>> {
        // Imported regions are mapped already; the table hands over the mapping itself.
        Ok(region)
    }
    fn sharing_needs_one_process(&self) -> bool {
        false
    }
}

impl Allocation for HostAllocation {
    fn ptr(&self) -> u64 {
        self.region.addr()
    }
    fn size(&self) -> usize {
        self.size
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
        rendezvous::current(&self.mem).map(|m| m as Arc<dyn SymmetricMemory>)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::symm_store::HashStore;
    use symm_core::GroupOptions;

    /// The record this backend publishes, as the protocol checks it (the checks themselves
    /// are symm_core::rendezvous's, tested there).
    #[test]
    fn local_record() {
        let store = HashStore::new(Duration::from_secs(1));
        let g = Group::with_options("host-record", 1, 3, store, GroupOptions::default()).unwrap();
        let alloc = HostAllocation::new(100, Device::host(1), &g).unwrap();
        let a = Side(&alloc);
        let r = a.local_record().unwrap();
        assert_eq!((r.buffer_size, r.device.as_str()), (100, "host-rank-1"));
        assert_eq!(r.total, alloc.pad_offset + SIGNAL_PAD_SIZE);
        assert_eq!(a.handle_size(&a.handle()), r.total);
        assert!(HostAllocation::new(100, Device::cuda(1), &g).is_err());
        // The exported fd is a memfd of the whole region, and imports as one.
        let fd = a.export_fd().unwrap();
        let back = a.import_fd(fd, r.total).unwrap();
        assert_eq!(back.len(), r.total);
        let fd = a.export_fd().unwrap();
        assert!(matches!(a.import_fd(fd, r.total + 4096), Err(Error::Mismatch { .. })));
    }
}
