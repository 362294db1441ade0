//! What ranks exchange at rendezvous and how they find each other's handles: the record each
//! rank publishes ([`RankInfo`], its text encoding), the checks every rank runs on all records
//! alike ([`check_infos`], [`same_process`]), the process-wide table through which rank threads
//! of one process hand their physical allocations over, and the process nonce.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, Weak};

use symm_core::agree::{check_equal, check_world_size};
use symm_core::symm_store::StoreError;
use symm_core::{check_device_sharing, check_same_host, check_shared_queues, Error, Result};

use crate::driver::vmm::PhysicalAllocation;

/// Process-wide table of physical allocations published for rendezvous
/// among threads of this process.
pub(super) fn shared_handles() -> &'static Mutex<HashMap<u64, Weak<PhysicalAllocation>>> {
    static TABLE: OnceLock<Mutex<HashMap<u64, Weak<PhysicalAllocation>>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// Removes a key from the shared table when dropped.
pub(super) struct Published(pub(super) u64);

impl Drop for Published {
    fn drop(&mut self) {
        shared_handles()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

pub(super) fn next_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A random number drawn once per process (to tell processes apart even when
/// pids are reused or live in other namespaces).
pub(super) fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut b = [0u8; 8];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
            .is_err()
        {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            b = (t ^ (u64::from(std::process::id()) << 32)).to_le_bytes();
        }
        u64::from_le_bytes(b)
    })
}

/// What every rank publishes at rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    pub world: usize,
    pub buffer_size: usize,
    pub pad_size: usize,
    pub total: usize,
    pub host: String,
    /// Device UUID (32 hex digits).
    pub uuid: String,
    pub pci_bus_id: String,
    pub ordinal: usize,
    pub pid: u32,
    pub pid_ns: String,
    pub nonce: u64,
    pub key: u64,
    /// The group's [`GroupOptions::shared_devices`](symm_core::GroupOptions).
    pub shared_ok: bool,
    /// The hardware work queues of the rank's process ([`crate::knobs::hw_queues`]).
    pub hw_queues: u32,
}

const INFO_MAGIC: &str = "symm-cuda-rdzv-3";
const INFO_FIELDS: usize = 15;

impl RankInfo {
    /// Newline-separated text (fields cleaned of newlines).
    pub fn encode(&self) -> Vec<u8> {
        let clean = |s: &str| s.replace(['\n', '\r'], " ");
        format!(
            "{INFO_MAGIC}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.world,
            self.buffer_size,
            self.pad_size,
            self.total,
            clean(&self.host),
            clean(&self.uuid),
            clean(&self.pci_bus_id),
            self.ordinal,
            self.pid,
            clean(&self.pid_ns),
            self.nonce,
            self.key,
            u8::from(self.shared_ok),
            self.hw_queues
        )
        .into_bytes()
    }

    /// Parses what rank `rank` published.
    pub fn decode(rank: usize, bytes: &[u8]) -> Result<RankInfo> {
        let bad = || Error::Mismatch {
            what: "rendezvous record",
            detail: format!(
                "rank {rank} published a record the CUDA backend cannot read (another backend or version?)"
            ),
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let f: Vec<&str> = text.split('\n').collect();
        if f.len() != INFO_FIELDS || f[0] != INFO_MAGIC {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        let size = |s: &str| num(s).and_then(|v| usize::try_from(v).map_err(|_| bad()));
        Ok(RankInfo {
            world: size(f[1])?,
            buffer_size: size(f[2])?,
            pad_size: size(f[3])?,
            total: size(f[4])?,
            host: f[5].to_string(),
            uuid: f[6].to_string(),
            pci_bus_id: f[7].to_string(),
            ordinal: size(f[8])?,
            pid: u32::try_from(num(f[9])?).map_err(|_| bad())?,
            pid_ns: f[10].to_string(),
            nonce: num(f[11])?,
            key: num(f[12])?,
            shared_ok: match f[13] {
                "0" => false,
                "1" => true,
                _ => return Err(bad()),
            },
            hw_queues: u32::try_from(num(f[14])?).map_err(|_| bad())?,
        })
    }
}

/// Checks the records of all ranks (identical on every rank, so every rank
/// fails the same way): world size (also against `world`), signal-pad size,
/// buffer size, allocation size, host, device sharing
/// ([`check_device_sharing`]). Returns how many ranks use each rank's device.
pub fn check_infos(world: usize, infos: &[RankInfo]) -> Result<Vec<usize>> {
    check_world_size(world, infos, |i| i.world)?;
    check_equal("signal pad size", infos, |i| i.pad_size)?;
    check_equal("buffer size", infos, |i| i.buffer_size)?;
    check_equal("allocation size (granularity)", infos, |i| i.total)?;
    check_same_host(&infos.iter().map(|i| i.host.clone()).collect::<Vec<_>>())?;
    let sharers = check_device_sharing(
        &infos.iter().map(|i| format!("GPU-{}", i.uuid)).collect::<Vec<_>>(),
        &infos.iter().map(|i| i.shared_ok).collect::<Vec<_>>(),
        Some(
            &infos
                .iter()
                .map(|i| format!("{}/{}/{}", i.pid, i.pid_ns, i.nonce))
                .collect::<Vec<_>>(),
        ),
    )?;
    check_shared_queues(
        &sharers,
        &infos.iter().map(|i| i.hw_queues).collect::<Vec<_>>(),
        crate::knobs::HW_QUEUES,
    )?;
    Ok(sharers)
}

/// Which ranks share this rank's process (same pid, pid namespace and nonce).
pub fn same_process(infos: &[RankInfo], rank: usize) -> Vec<bool> {
    let me = &infos[rank];
    infos
        .iter()
        .map(|i| i.pid == me.pid && i.nonce == me.nonce && i.pid_ns == me.pid_ns)
        .collect()
}

/// The rank a store error says is missing or lost, if any.
pub(super) fn missing_rank(e: &StoreError) -> Option<usize> {
    match e {
        StoreError::MissingRanks { missing, .. } => missing.first().copied(),
        StoreError::PeerLost { rank, .. } => Some(*rank),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use symm_core::pad::SIGNAL_PAD_SIZE;

    fn info(r: usize) -> RankInfo {
        RankInfo {
            world: 2,
            buffer_size: 1 << 20,
            pad_size: SIGNAL_PAD_SIZE,
            total: 4 << 20,
            host: "h/b".into(),
            uuid: format!("{r:032x}"),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + r),
            ordinal: r,
            pid: 7,
            pid_ns: "pid:[1]".into(),
            nonce: 9,
            key: r as u64 + 1,
            shared_ok: false,
            hw_queues: 8,
        }
    }

    #[test]
    fn records_round_trip() {
        let i = info(1);
        assert_eq!(RankInfo::decode(1, &i.encode()).unwrap(), i);
        assert!(RankInfo::decode(0, b"symm-host-rdzv-1\n2").is_err());
        let mut weird = info(0);
        weird.host = "a\nb".into();
        assert_eq!(RankInfo::decode(0, &weird.encode()).unwrap().host, "a b");
    }

    #[test]
    fn every_rank_fails_the_same_way() {
        let ok: Vec<_> = (0..2).map(info).collect();
        check_infos(2, &ok).unwrap();
        let mut v = ok.clone();
        v[1].buffer_size = 5;
        let e = check_infos(2, &v).unwrap_err().to_string();
        assert!(e.contains("buffer size") && e.contains("rank 1: 5"), "{e}");
        let mut v = ok.clone();
        v[0].pad_size = 1;
        assert!(matches!(
            check_infos(2, &v),
            Err(Error::Mismatch {
                what: "signal pad size",
                ..
            })
        ));
        let mut v = ok.clone();
        v[1].world = 3;
        assert!(matches!(
            check_infos(2, &v),
            Err(Error::Mismatch { what: "world size", .. })
        ));
        assert!(matches!(
            check_infos(3, &ok),
            Err(Error::Mismatch { what: "world size", .. })
        ));
        let mut v = ok.clone();
        v[1].total = 6 << 20;
        assert!(matches!(check_infos(2, &v), Err(Error::Mismatch { .. })));
        let mut v = ok.clone();
        v[1].host = "other/b".into();
        assert!(matches!(check_infos(2, &v), Err(Error::NotSameHost(_))));
        let mut v = ok.clone();
        v[1].uuid = v[0].uuid.clone();
        assert!(matches!(
            check_infos(2, &v),
            Err(Error::OverlappingDevices { a: 0, b: 1, .. })
        ));
        // Shared devices: with the permission, among threads of one process; every rank counts
        // the ranks on its device.
        // (and with every hardware queue: NOTE [co-residency]).
        v.iter_mut().for_each(|i| i.shared_ok = true);
        match check_infos(2, &v) {
            Err(Error::Unavailable(m)) => assert!(m.contains("CUDA_DEVICE_MAX_CONNECTIONS=32"), "{m}"),
            other => panic!("8 hardware queues on a shared GPU: {other:?}"),
        }
        v.iter_mut().for_each(|i| i.hw_queues = 32);
        assert_eq!(check_infos(2, &v).unwrap(), vec![2, 2]);
        v[1].pid = 8;
        assert!(matches!(check_infos(2, &v), Err(Error::Unavailable(_))));
        let mut v = ok.clone();
        v[0].shared_ok = true;
        assert!(matches!(check_infos(2, &v), Err(Error::Mismatch { .. })));
    }

    #[test]
    fn missing_ranks_are_named() {
        let t = Duration::from_secs(1);
        let e = StoreError::MissingRanks {
            what: "x".into(),
            missing: vec![3, 4],
            timeout: t,
        };
        assert_eq!(missing_rank(&e), Some(3));
        let e = StoreError::PeerLost {
            rank: 2,
            reason: "gone".into(),
        };
        assert_eq!(missing_rank(&e), Some(2));
        assert_eq!(missing_rank(&StoreError::Protocol("p".into())), None);
    }

    #[test]
    fn process_membership() {
        let mut v: Vec<_> = (0..3).map(info).collect();
        assert_eq!(same_process(&v, 0), vec![true, true, true]);
        v[2].pid = 8;
        assert_eq!(same_process(&v, 0), vec![true, true, false]);
        assert_eq!(same_process(&v, 2), vec![false, false, true]);
        v[1].nonce = 10;
        assert_eq!(same_process(&v, 0), vec![true, false, false]);
    }
}
