//! [`RocmAllocator`]: symmetric allocations on AMD GPUs through HIP's virtual
//! memory API.
//!
//! One physical allocation per rank holds the buffer followed by the signal
//! pad (at [`RocmAllocation::pad_offset`]), rounded up to the recommended
//! granularity, created with a POSIX-fd handle type. The pad is zeroed (and
//! the zeroing completed) at alloc, before any handle is published.
//! Rendezvous is `symm_core::rendezvous` (records, checks, the handle
//! exchange, fault points, the closing status exchange), under
//! `group.next_prefix("rocm-rendezvous")`; this backend gives it its record
//! (the device's PCI bus id, and [`RocmExt`]: where the pad lies), exports its
//! handle as an fd, which goes to every peer through `symm_store::FdChannel`
//! (processes or threads alike: [`RendezvousBackend::hands_over_in_process`]
//! is off), imports a peer's fd, and reserves, maps and grants this device
//! access to every peer's allocation.

#![forbid(unsafe_code)]

use std::any::Any;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::rendezvous::{self, LocalRecord, Record, RecordExt, RendezvousBackend};
use symm_core::{pad, Allocation, Device, DeviceType, Error, Group, Result, SymmetricAllocator, SymmetricMemory};

use crate::driver::runtime::{self, Stream};
use crate::driver::vmm::{self, Mapping, PhysicalMemory, PropLayout};
use crate::symm_mem::{PeerMaps, RocmSymmetricMemory};

/// Alignment of the signal pad inside an allocation.
pub const PAD_ALIGN: usize = 4096;

/// The ROCm allocator (registered for `DeviceType::Rocm` as "symm-rocm").
#[derive(Debug, Default)]
pub struct RocmAllocator;

/// Sizes of one rank's allocation (a pure function of the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub size: usize,
    pub pad_offset: usize,
    pub total: usize,
}

impl Layout {
    /// Buffer of `size` bytes, pad at the next [`PAD_ALIGN`] boundary, total
    /// rounded up to `granularity`.
    pub fn new(size: usize, granularity: usize) -> Result<Layout> {
        if size == 0 {
            return Err(Error::InvalidArgument("symmetric allocation of 0 bytes".into()));
        }
        if granularity == 0 || !granularity.is_power_of_two() {
            return Err(Error::InvalidArgument(format!("granularity {granularity}")));
        }
        let overflow = || Error::OutOfRange {
            what: "allocation size",
            value: size as u64,
            limit: isize::MAX as u64,
        };
        let pad_offset = vmm::round_up(size, PAD_ALIGN).ok_or_else(overflow)?;
        let end = pad_offset.checked_add(pad::SIGNAL_PAD_SIZE).ok_or_else(overflow)?;
        let total = vmm::round_up(end, granularity).ok_or_else(overflow)?;
        if total > isize::MAX as usize {
            return Err(overflow());
        }
        Ok(Layout {
            size,
            pad_offset,
            total,
        })
    }
}

/// This rank's physical allocation and its local mapping.
#[derive(Debug)]
pub(crate) struct Local {
    pub(crate) device: u32,
    pub(crate) layout: Layout,
    pub(crate) granularity: usize,
    pub(crate) mem: Arc<PhysicalMemory>,
    pub(crate) mapping: Mapping,
}

/// One rank's allocation, before or after rendezvous.
pub struct RocmAllocation {
    local: Arc<Local>,
    device: Device,
    group: Arc<Group>,
    sym: Mutex<Option<Arc<RocmSymmetricMemory>>>,
}

impl std::fmt::Debug for RocmAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocmAllocation")
            .field("device", &self.device)
            .field("layout", &self.local.layout)
            .field("ptr", &format_args!("{:#x}", self.local.mapping.ptr()))
            .finish()
    }
}

impl RocmAllocation {
    /// Byte offset of the signal pad from the buffer's start.
    pub fn pad_offset(&self) -> usize {
        self.local.layout.pad_offset
    }
    /// Bytes of the physical allocation (buffer + pad, rounded).
    pub fn total_size(&self) -> usize {
        self.local.layout.total
    }
}

/// What a ROCm rank adds to its rendezvous record (the record's `device` is the GPU's PCI
/// bus id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RocmExt {
    /// Byte offset of the signal pad in the allocation.
    pub pad_offset: usize,
}

impl RecordExt for RocmExt {
    fn fields(&self) -> Vec<String> {
        vec![self.pad_offset.to_string()]
    }

    fn parse(fields: &[&str]) -> Option<RocmExt> {
        match fields {
            [pad_offset] => Some(RocmExt {
                pad_offset: pad_offset.parse().ok()?,
            }),
            _ => None,
        }
    }

    /// Every rank's pad lies inside its allocation, whole.
    fn check(records: &[Record<RocmExt>], _sharers: &[usize]) -> Result<()> {
        for (r, i) in records.iter().enumerate() {
            let pad_offset = i.extra.pad_offset;
            if pad_offset >= i.total || i.total - pad_offset < pad::SIGNAL_PAD_SIZE {
                return Err(Error::Mismatch {
                    what: "pad layout",
                    detail: format!("rank {r}: pad at {pad_offset} of {} bytes", i.total),
                });
            }
        }
        Ok(())
    }
}

impl SymmetricAllocator for RocmAllocator {
    fn device_type(&self) -> DeviceType {
        DeviceType::Rocm
    }
    fn name(&self) -> &'static str {
        "symm-rocm"
    }
    fn device_count(&self) -> Result<usize> {
        runtime::device_count()
    }
    fn alloc(&self, size: usize, device: Device, group: &Arc<Group>) -> Result<Arc<dyn Allocation>> {
        if device.ty != DeviceType::Rocm {
            return Err(Error::InvalidArgument(format!("symm-rocm cannot allocate on {device}")));
        }
        let n = runtime::device_count()?;
        if device.index as usize >= n {
            return Err(Error::OutOfRange {
                what: "rocm device index",
                value: u64::from(device.index),
                limit: n as u64,
            });
        }
        runtime::set_device(device.index)?;
        let (prop_layout, granularity): (PropLayout, usize) = vmm::layout_and_granularity(device.index)?;
        let layout = Layout::new(size, granularity)?;
        let mem = Arc::new(PhysicalMemory::create(device.index, layout.total, prop_layout)?);
        let mapping = Mapping::new(mem.clone(), device.index, granularity)?;
        // Zero the pad and wait for it, before any handle can be published.
        let stream = Stream::new()?;
        stream.memset_sync(
            mapping.ptr() + layout.pad_offset as u64,
            0,
            pad::SIGNAL_PAD_SIZE,
            Duration::from_secs(30),
        )?;
        Ok(Arc::new(RocmAllocation {
            local: Arc::new(Local {
                device: device.index,
                layout,
                granularity,
                mem,
                mapping,
            }),
            device,
            group: group.clone(),
            sym: Mutex::new(None),
        }))
    }
}

impl Allocation for RocmAllocation {
    fn ptr(&self) -> u64 {
        self.local.mapping.ptr()
    }
    fn size(&self) -> usize {
        self.local.layout.size
    }
    fn device(&self) -> Device {
        self.device
    }
    fn group(&self) -> &Arc<Group> {
        &self.group
    }
    fn rendezvous(&self, timeout: Duration) -> Result<Arc<dyn SymmetricMemory>> {
        Ok(rendezvous::once(&self.sym, || {
            rendezvous(&self.local, &self.group, timeout)
        })?)
    }
    fn symmetric_memory(&self) -> Option<Arc<dyn SymmetricMemory>> {
        rendezvous::current(&self.sym).map(|s| s as Arc<dyn SymmetricMemory>)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn rendezvous(local: &Arc<Local>, group: &Arc<Group>, timeout: Duration) -> Result<RocmSymmetricMemory> {
    rendezvous::run(&Side(local), group, timeout, |done| {
        let maps = PeerMaps {
            local: local.clone(),
            peers: done.peers,
            pad_offsets: done.records.iter().map(|i| i.extra.pad_offset).collect(),
        };
        RocmSymmetricMemory::new(group.clone(), maps)
    })
}

/// This rank's side of `symm_core::rendezvous`.
struct Side<'a>(&'a Arc<Local>);

impl RendezvousBackend for Side<'_> {
    type Handle = PhysicalMemory;
    type Mapped = Mapping;
    type Extra = RocmExt;

    fn backend_name(&self) -> &'static str {
        "hip"
    }
    fn prefix(&self) -> &'static str {
        "rocm-rendezvous"
    }
    fn local_record(&self) -> Result<LocalRecord<RocmExt>> {
        let l = self.0;
        Ok(LocalRecord {
            buffer_size: l.layout.size,
            total: l.layout.total,
            device: runtime::pci_bus_id(l.device)?,
            extra: RocmExt {
                pad_offset: l.layout.pad_offset,
            },
        })
    }
    fn handle(&self) -> Arc<PhysicalMemory> {
        self.0.mem.clone()
    }
    fn handle_size(&self, mem: &PhysicalMemory) -> usize {
        mem.size()
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        self.0.mem.export_fd()
    }
    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<Arc<PhysicalMemory>> {
        Ok(Arc::new(PhysicalMemory::import(fd.as_fd(), size)?))
    }
    fn map_peer(&self, mem: Arc<PhysicalMemory>, _record: &Record<RocmExt>) -> Result<Mapping> {
        Mapping::new(mem, self.0.device, self.0.granularity)
    }
    fn bind(&self) -> Result<()> {
        runtime::set_device(self.0.device)
    }
    /// Rank threads pass fds too, as ROCm always has (handing a handle to another thread's
    /// device in one process is not measured on AMD GPUs).
    fn hands_over_in_process(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_rounds_and_places_the_pad() {
        let g = 2 << 20;
        let l = Layout::new(1, g).unwrap();
        assert_eq!(l.pad_offset, PAD_ALIGN);
        assert_eq!(l.total, g);
        let l = Layout::new(g, g).unwrap();
        assert_eq!(l.pad_offset, g);
        assert_eq!(l.total, 2 * g);
        assert!(l.total - l.pad_offset >= pad::SIGNAL_PAD_SIZE);
        let l = Layout::new(2 << 30, g).unwrap();
        assert_eq!(l.total % g, 0);
        assert!(Layout::new(0, g).is_err());
        assert!(Layout::new(usize::MAX - 10, g).is_err());
        assert!(Layout::new(10, 3).is_err());
    }

    fn record(r: usize) -> Record<RocmExt> {
        let local = LocalRecord {
            buffer_size: 100,
            total: 2 << 20,
            device: format!("0000:c{}:00.0", r + 1),
            extra: RocmExt { pad_offset: 4096 },
        };
        Record::of_this_process(2, local, r as u64 + 1, false)
    }

    /// The common checks are symm_core::rendezvous's (tested there, world size included);
    /// a size mismatch is `buffer size` there, as the conformance suite asks of every backend.
    #[test]
    fn rank_records_round_trip_and_are_checked() {
        let a = record(0);
        assert_eq!(Record::<RocmExt>::decode("hip", 0, &a.encode("hip")).unwrap(), a);
        assert!(Record::<RocmExt>::decode("hip", 1, b"symm-cuda/1\n").is_err());
        assert!(Record::<RocmExt>::decode("hip", 1, &a.encode("cuda")).is_err());
        assert_eq!(RocmExt::parse(&["x"]), None);
        assert_eq!(RocmExt::parse(&["1", "2"]), None);
        let b = record(1);
        let check = |v: &[Record<RocmExt>]| rendezvous::check_records(2, v, true);
        assert!(check(&[a.clone(), b.clone()]).is_ok());
        let other_size = Record {
            buffer_size: 200,
            ..b.clone()
        };
        assert!(matches!(
            check(&[a.clone(), other_size]),
            Err(Error::Mismatch {
                what: "buffer size",
                ..
            })
        ));
        let other_host = Record {
            host: "g".into(),
            ..b.clone()
        };
        assert!(matches!(check(&[a.clone(), other_host]), Err(Error::NotSameHost(_))));
        assert!(matches!(
            check(&[a.clone(), a.clone()]),
            Err(Error::OverlappingDevices { .. })
        ));
        let shared = Record {
            shared_ok: true,
            ..a.clone()
        };
        assert!(check(&[shared.clone(), shared.clone()]).is_ok());
        assert!(matches!(check(&[shared, a.clone()]), Err(Error::Mismatch { .. })));
        let no_room = Record {
            extra: RocmExt {
                pad_offset: (2 << 20) - 8,
            },
            ..b.clone()
        };
        assert!(matches!(
            check(&[a.clone(), no_room]),
            Err(Error::Mismatch { what: "pad layout", .. })
        ));
        let past_the_end = Record {
            extra: RocmExt { pad_offset: 2 << 20 },
            ..b
        };
        assert!(matches!(
            check(&[a, past_the_end]),
            Err(Error::Mismatch { what: "pad layout", .. })
        ));
    }
}
