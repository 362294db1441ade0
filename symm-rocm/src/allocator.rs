//! [`RocmAllocator`]: symmetric allocations on AMD GPUs through HIP's virtual
//! memory API.
//!
//! One physical allocation per rank holds the buffer followed by the signal
//! pad (at [`RocmAllocation::pad_offset`]), rounded up to the recommended
//! granularity, created with a POSIX-fd handle type. The pad is zeroed (and
//! the zeroing completed) at alloc, before any handle is published.
//! Rendezvous exports the handle as an fd, passes fds between ranks with
//! [`symm_store::FdChannel`] (processes or threads alike), imports, reserves,
//! maps and grants this device access to every peer's allocation.

#![forbid(unsafe_code)]

use std::any::Any;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use symm_core::{
    check_device_sharing, check_same_host, pad, Allocation, Device, DeviceType, Error, Group, Result,
    SymmetricAllocator, SymmetricMemory,
};
use symm_store::FdChannel;

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
    sym: OnceLock<Arc<RocmSymmetricMemory>>,
    rendezvous_lock: Mutex<()>,
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

/// What each rank publishes at rendezvous (text, one field per line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    pub host: String,
    pub pid: u32,
    pub pci: String,
    pub size: usize,
    pub pad_offset: usize,
    pub total: usize,
    /// The group's [`symm_core::GroupOptions::shared_devices`].
    pub shared_ok: bool,
}

impl RankInfo {
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "symm-rocm/2\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
            self.host,
            self.pid,
            self.pci,
            self.size,
            self.pad_offset,
            self.total,
            u8::from(self.shared_ok)
        )
        .into_bytes()
    }
    pub fn decode(rank: usize, b: &[u8]) -> Result<RankInfo> {
        let bad = |why: &str| Error::Mismatch {
            what: "rendezvous record",
            detail: format!("rank {rank} sent {why}"),
        };
        let s = std::str::from_utf8(b).map_err(|_| bad("non-UTF-8 data"))?;
        let f: Vec<&str> = s.lines().collect();
        if f.len() != 8 || f[0] != "symm-rocm/2" {
            return Err(bad("a record of another backend or version"));
        }
        let n = |i: usize| f[i].parse::<usize>().map_err(|_| bad("a malformed number"));
        Ok(RankInfo {
            host: f[1].to_string(),
            pid: f[2].parse().map_err(|_| bad("a malformed pid"))?,
            pci: f[3].to_string(),
            size: n(4)?,
            pad_offset: n(5)?,
            total: n(6)?,
            shared_ok: match f[7] {
                "0" => false,
                "1" => true,
                _ => return Err(bad("a malformed shared-device flag")),
            },
        })
    }
}

/// Checks the records of every rank agree (same host, device sharing as
/// [`check_device_sharing`] allows it, same size).
pub fn check_records(infos: &[RankInfo]) -> Result<()> {
    check_same_host(&infos.iter().map(|i| i.host.clone()).collect::<Vec<_>>())?;
    check_device_sharing(
        &infos.iter().map(|i| i.pci.clone()).collect::<Vec<_>>(),
        &infos.iter().map(|i| i.shared_ok).collect::<Vec<_>>(),
        Some(&infos.iter().map(|i| i.pid.to_string()).collect::<Vec<_>>()),
    )?;
    if let Some(first) = infos.first() {
        for (r, i) in infos.iter().enumerate() {
            if i.size != first.size {
                return Err(Error::Mismatch {
                    what: "allocation size",
                    detail: format!("rank 0 allocated {} bytes, rank {r} {}", first.size, i.size),
                });
            }
            if i.pad_offset >= i.total || i.total - i.pad_offset < pad::SIGNAL_PAD_SIZE {
                return Err(Error::Mismatch {
                    what: "pad layout",
                    detail: format!("rank {r}: pad at {} of {} bytes", i.pad_offset, i.total),
                });
            }
        }
    }
    Ok(())
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
            sym: OnceLock::new(),
            rendezvous_lock: Mutex::new(()),
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
        let _g = self.rendezvous_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.sym.get() {
            return Ok(s.clone());
        }
        let s = Arc::new(rendezvous(&self.local, &self.group, timeout)?);
        let _ = self.sym.set(s.clone());
        Ok(s)
    }
    fn symmetric_memory(&self) -> Option<Arc<dyn SymmetricMemory>> {
        self.sym.get().map(|s| s.clone() as Arc<dyn SymmetricMemory>)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn rendezvous(local: &Arc<Local>, group: &Arc<Group>, timeout: Duration) -> Result<RocmSymmetricMemory> {
    runtime::set_device(local.device)?;
    let rank = group.rank().get();
    let world = group.world_size();
    let prefix = group.next_prefix("rocm-rendezvous");
    let exchange = group.exchange(prefix.clone());
    let me = RankInfo {
        host: symm_core::agree::host_id(),
        pid: std::process::id(),
        pci: runtime::pci_bus_id(local.device)?,
        size: local.layout.size,
        pad_offset: local.layout.pad_offset,
        total: local.layout.total,
        shared_ok: group.options().shared_devices,
    };
    let infos = exchange
        .all_gather(rank, world, &me.encode(), timeout)?
        .iter()
        .enumerate()
        .map(|(r, b)| RankInfo::decode(r, b))
        .collect::<Result<Vec<_>>>()?;
    check_records(&infos)?;

    let fd = local.mem.export_fd()?;
    let chan = FdChannel::with_liveness(
        group.store().clone(),
        &format!("{prefix}/fd"),
        rank,
        world,
        timeout,
        group.liveness(),
    )?;
    let fds = chan.all_gather_fds(fd.as_fd(), timeout)?;
    drop(fd);
    let mut peers: Vec<Option<Mapping>> = Vec::with_capacity(world);
    for (p, pfd) in fds.iter().enumerate() {
        if p == rank {
            peers.push(None);
            continue;
        }
        let mem = Arc::new(PhysicalMemory::import(pfd.as_fd(), infos[p].total)?);
        peers.push(Some(Mapping::new(mem, local.device, local.granularity)?));
    }
    drop(fds);
    let maps = PeerMaps {
        local: local.clone(),
        peers,
        pad_offsets: infos.iter().map(|i| i.pad_offset).collect(),
    };
    let mem = RocmSymmetricMemory::new(group.clone(), maps)?;
    // Every rank has mapped every peer before anyone returns.
    exchange.barrier(rank, world, timeout)?;
    Ok(mem)
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

    #[test]
    fn rank_records_round_trip_and_are_checked() {
        let a = RankInfo {
            host: "h".into(),
            pid: 7,
            pci: "0000:c1:00.0".into(),
            size: 100,
            pad_offset: 4096,
            total: 2 << 20,
            shared_ok: false,
        };
        assert_eq!(RankInfo::decode(0, &a.encode()).unwrap(), a);
        assert!(RankInfo::decode(1, b"symm-cuda/1\n").is_err());
        assert!(RankInfo::decode(1, b"symm-rocm/2\nh\nx\np\n1\n2\n3\n0\n").is_err());
        let b = RankInfo {
            pci: "0000:c2:00.0".into(),
            ..a.clone()
        };
        assert!(check_records(&[a.clone(), b.clone()]).is_ok());
        let other_size = RankInfo { size: 200, ..b.clone() };
        assert!(matches!(
            check_records(&[a.clone(), other_size]),
            Err(Error::Mismatch {
                what: "allocation size",
                ..
            })
        ));
        let other_host = RankInfo {
            host: "g".into(),
            ..b.clone()
        };
        assert!(matches!(
            check_records(&[a.clone(), other_host]),
            Err(Error::NotSameHost(_))
        ));
        assert!(matches!(
            check_records(&[a.clone(), a.clone()]),
            Err(Error::OverlappingDevices { .. })
        ));
        let shared = RankInfo {
            shared_ok: true,
            ..a.clone()
        };
        assert!(check_records(&[shared.clone(), shared.clone()]).is_ok());
        assert!(matches!(
            check_records(&[shared, a.clone()]),
            Err(Error::Mismatch { .. })
        ));
    }
}
