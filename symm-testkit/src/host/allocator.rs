//! [`HostAllocator`] and [`HostAllocation`]: one memfd per allocation
//! (buffer, page-rounded, then the signal pad), and the rendezvous that maps
//! every rank's memfd into every rank.
//!
//! Rendezvous, under `group.next_prefix("rendezvous")`:
//! 1. `info`: every rank publishes world size, buffer size, pad size, host id
//!    (hostname + boot id), device id, pid, a per-process nonce and its
//!    allocation key (StoreExchange all_gather).
//! 2. Every rank checks all of them ([`check_infos`]): all ranks hold the
//!    same records, so all fail the same way, before anything is mapped.
//! 3. Fault point `rendezvous.before_send`. Then, if every rank is in this
//!    process (threads), each rank publishes its region in a process-wide
//!    table, a store barrier `sent` follows, each rank takes the peers'
//!    regions from the table (the same mapping, so the same addresses in
//!    every rank), and a store barrier `taken` follows. Otherwise the memfds go through an [`FdChannel`]
//!    (`all_gather_fds`) and every rank maps every peer's memfd after
//!    checking its kind and size.
//! 4. Fault points `rendezvous.after_send` (fds exchanged, nothing mapped)
//!    and `rendezvous.after_map`, then a store barrier `done`: rendezvous
//!    returns only once every rank has mapped every peer.
//!
//! The pad is zeroed (and fenced) at allocation, before the handle is
//! published. Errors drop what was received or mapped: fds close, mappings
//! are unmapped, the FdChannel's socket closes.
#![forbid(unsafe_code)]

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use symm_core::agree::{check_equal, check_world_size, host_id, pid_namespace, time_left};

use symm_core::pad::SIGNAL_PAD_SIZE;
use symm_core::symm_store::{FdChannel, FdKind};
use symm_core::{
    check_device_sharing, check_same_host, Allocation, Device, DeviceType, Error, Group, Result, SymmetricAllocator,
    SymmetricMemory,
};

use super::mapping::{page_round, Region};
use super::symm_mem::HostSymmetricMemory;
use symm_core::fault_point;

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

/// Process-wide table of regions published for rendezvous among threads.
fn shared_regions() -> &'static Mutex<HashMap<u64, Weak<Region>>> {
    static TABLE: OnceLock<Mutex<HashMap<u64, Weak<Region>>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(rand::random)
}

fn next_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Removes a key from the shared table when dropped.
struct Published(u64);

impl Drop for Published {
    fn drop(&mut self) {
        shared_regions()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// What every rank publishes at rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    pub world: usize,
    pub buffer_size: usize,
    pub pad_size: usize,
    pub host: String,
    pub device: String,
    pub pid: u32,
    pub pid_ns: String,
    pub nonce: u64,
    pub key: u64,
    /// The group's [`symm_core::GroupOptions::shared_devices`].
    pub shared_ok: bool,
}

const INFO_MAGIC: &str = "symm-host-rdzv-2";

impl RankInfo {
    fn encode(&self) -> Vec<u8> {
        let clean = |s: &str| s.replace(['\n', '\t'], " ");
        format!(
            "{INFO_MAGIC}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.world,
            self.buffer_size,
            self.pad_size,
            clean(&self.host),
            clean(&self.device),
            self.pid,
            clean(&self.pid_ns),
            self.nonce,
            self.key,
            u8::from(self.shared_ok)
        )
        .into_bytes()
    }

    fn decode(rank: usize, bytes: &[u8]) -> Result<RankInfo> {
        let bad = || Error::Mismatch {
            what: "rendezvous record",
            detail: format!("rank {rank} published a record this backend cannot read"),
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let f: Vec<&str> = text.split('\n').collect();
        if f.len() != 11 || f[0] != INFO_MAGIC {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        Ok(RankInfo {
            world: num(f[1])? as usize,
            buffer_size: num(f[2])? as usize,
            pad_size: num(f[3])? as usize,
            host: f[4].to_string(),
            device: f[5].to_string(),
            pid: u32::try_from(num(f[6])?).map_err(|_| bad())?,
            pid_ns: f[7].to_string(),
            nonce: num(f[8])?,
            key: num(f[9])?,
            shared_ok: match f[10] {
                "0" => false,
                "1" => true,
                _ => return Err(bad()),
            },
        })
    }
}

/// Checks the records of all ranks (the same on every rank, so every rank
/// fails the same way): world size (also against `world`), signal-pad size,
/// buffer size, host, device sharing ([`check_device_sharing`]).
pub fn check_infos(world: usize, infos: &[RankInfo]) -> Result<()> {
    check_world_size(world, infos, |i| i.world)?;
    check_equal("signal pad size", infos, |i| i.pad_size)?;
    check_equal("buffer size", infos, |i| i.buffer_size)?;
    check_same_host(&infos.iter().map(|i| i.host.clone()).collect::<Vec<_>>())?;
    check_device_sharing(
        &infos.iter().map(|i| i.device.clone()).collect::<Vec<_>>(),
        &infos.iter().map(|i| i.shared_ok).collect::<Vec<_>>(),
        None,
    )?;
    Ok(())
}

/// One rank's host allocation: a memfd holding the buffer (page-rounded)
/// and then the signal pad, mapped in this process.
pub struct HostAllocation {
    group: Arc<Group>,
    device: Device,
    size: usize,
    pad_offset: usize,
    region: Arc<Region>,
    key: u64,
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
            key: next_key(),
            mem: Mutex::new(None),
        })
    }

    fn info(&self) -> RankInfo {
        RankInfo {
            world: self.group.world_size(),
            buffer_size: self.size,
            pad_size: SIGNAL_PAD_SIZE,
            host: host_id(),
            // Host "devices" are distinct by rank.
            device: format!("host-rank-{}", self.group.rank().get()),
            pid: std::process::id(),
            pid_ns: pid_namespace(),
            nonce: process_nonce(),
            key: self.key,
            shared_ok: self.group.options().shared_devices,
        }
    }

    fn do_rendezvous(&self, timeout: Duration) -> Result<HostSymmetricMemory> {
        let deadline = Instant::now() + timeout;
        let g = &self.group;
        let (rank, world) = (g.rank().get(), g.world_size());
        let prefix = g.next_prefix("rendezvous");
        let store = g.store().clone();
        // Every rank meets at `{prefix}/{step}` within the rendezvous's deadline.
        let barrier = |step: &str| -> Result<()> {
            g.exchange(format!("{prefix}/{step}"))
                .barrier(rank, world, time_left(deadline, timeout, "rendezvous")?)?;
            Ok(())
        };

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
        check_infos(world, &infos)?;

        let me = &infos[rank];
        let same_process = infos.iter().all(|i| i.pid == me.pid && i.nonce == me.nonce);
        let total = self.region.len();

        fault_point("rendezvous.before_send")?;
        let regions: Vec<Arc<Region>> = if same_process {
            let _published = Published(self.key);
            shared_regions()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.key, Arc::downgrade(&self.region));
            fault_point("rendezvous.after_send")?;
            barrier("sent")?;
            let table = shared_regions().lock().unwrap_or_else(|e| e.into_inner());
            let regions = infos
                .iter()
                .enumerate()
                .map(|(r, i)| {
                    table
                        .get(&i.key)
                        .and_then(Weak::upgrade)
                        .filter(|reg| reg.len() == total)
                        .ok_or_else(|| Error::PeerLost {
                            rank: r,
                            reason: "its allocation was freed during rendezvous".into(),
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            drop(table);
            // Nobody leaves (and drops its region) before every rank has taken
            // every region, so a rank that fails later cannot make a peer's
            // lookup fail and be misreported.
            barrier("taken")?;
            fault_point("rendezvous.after_map")?;
            barrier("done")?;
            regions
        } else {
            let own_fd = self
                .region
                .fd()
                .ok_or_else(|| Error::InvalidArgument("host allocation lost its memfd".into()))?;
            let channel = FdChannel::with_liveness(
                store.clone(),
                &format!("{prefix}/fds"),
                rank,
                world,
                time_left(deadline, timeout, "rendezvous")?,
                g.liveness(),
            )?
            .with_expected_kind(FdKind::Memfd);
            let fds = channel.all_gather_fds(own_fd, time_left(deadline, timeout, "rendezvous")?)?;
            drop(channel);
            fault_point("rendezvous.after_send")?;
            let mut regions = Vec::with_capacity(world);
            for (r, fd) in fds.into_iter().enumerate() {
                if r == rank {
                    regions.push(self.region.clone());
                } else {
                    regions.push(Arc::new(Region::from_fd(fd, total)?));
                }
            }
            fault_point("rendezvous.after_map")?;
            barrier("done")?;
            regions
        };

        let peer_pids = infos
            .iter()
            .map(|i| (i.pid != me.pid && i.pid_ns == me.pid_ns).then_some(i.pid as i32))
            .collect();
        Ok(HostSymmetricMemory::new(
            g.clone(),
            self.device,
            self.size,
            self.pad_offset,
            regions,
            peer_pids,
        ))
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
        let mut mem = self.mem.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = mem.as_ref() {
            return Ok(m.clone());
        }
        let m = Arc::new(self.do_rendezvous(timeout)?);
        *mem = Some(m.clone());
        Ok(m)
    }
    fn symmetric_memory(&self) -> Option<Arc<dyn SymmetricMemory>> {
        self.mem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|m| m.clone() as Arc<dyn SymmetricMemory>)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(r: usize) -> RankInfo {
        RankInfo {
            world: 3,
            buffer_size: 4096,
            pad_size: SIGNAL_PAD_SIZE,
            host: "h/b".into(),
            device: format!("host-rank-{r}"),
            pid: 7,
            pid_ns: "pid:[1]".into(),
            nonce: 9,
            key: r as u64,
            shared_ok: false,
        }
    }

    #[test]
    fn encode_decode() {
        let i = info(2);
        assert_eq!(RankInfo::decode(2, &i.encode()).unwrap(), i);
        assert!(RankInfo::decode(0, b"junk").is_err());
    }

    #[test]
    fn checks_fail_the_same_way() {
        let ok: Vec<_> = (0..3).map(info).collect();
        check_infos(3, &ok).unwrap();
        let mut v = ok.clone();
        v[1].buffer_size = 8192;
        let e = check_infos(3, &v).unwrap_err().to_string();
        assert!(e.contains("buffer size") && e.contains("rank 1: 8192"), "{e}");
        let mut v = ok.clone();
        v[2].pad_size = 1;
        assert!(matches!(
            check_infos(3, &v),
            Err(Error::Mismatch {
                what: "signal pad size",
                ..
            })
        ));
        let mut v = ok.clone();
        v[0].world = 4;
        assert!(matches!(
            check_infos(3, &v),
            Err(Error::Mismatch { what: "world size", .. })
        ));
        assert!(matches!(
            check_infos(4, &ok),
            Err(Error::Mismatch { what: "world size", .. })
        ));
        let mut v = ok.clone();
        v[2].host = "other/b".into();
        assert!(matches!(check_infos(3, &v), Err(Error::NotSameHost(_))));
        let mut v = ok.clone();
        v[2].device = "host-rank-0".into();
        assert!(matches!(
            check_infos(3, &v),
            Err(Error::OverlappingDevices { a: 0, b: 2, .. })
        ));
        v.iter_mut().for_each(|i| i.shared_ok = true);
        assert!(check_infos(3, &v).is_ok());
        let mut v = ok;
        v[1].shared_ok = true;
        assert!(matches!(check_infos(3, &v), Err(Error::Mismatch { .. })));
    }
}
