//! Setup-time exchange: every rank publishes who it is (host, device,
//! configuration fingerprint) through the group's store, once, when the
//! communicator is built. Nothing here runs after setup.

use std::sync::Arc;
use std::time::Duration;

use symm_core::{DeviceType, Error, Group, Result};

/// What one rank told the others at setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    pub host: String,
    pub device_type: String,
    pub device_index: u32,
    /// A device identity unique on the host (CUDA: the UUID).
    pub device_id: String,
    pub fingerprint: String,
}

impl PeerInfo {
    fn encode(&self) -> String {
        format!(
            "{}\n{}\n{}\n{}\n{}",
            self.host, self.device_type, self.device_index, self.device_id, self.fingerprint
        )
    }
    fn decode(rank: usize, b: &[u8]) -> Result<Self> {
        let text = String::from_utf8_lossy(b);
        let mut it = text.splitn(5, '\n');
        let bad = || Error::InvalidArgument(format!("rank {rank} published a malformed communicator record"));
        let host = it.next().ok_or_else(bad)?.to_string();
        let device_type = it.next().ok_or_else(bad)?.to_string();
        let device_index = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let device_id = it.next().ok_or_else(bad)?.to_string();
        let fingerprint = it.next().ok_or_else(bad)?.to_string();
        Ok(PeerInfo {
            host,
            device_type,
            device_index,
            device_id,
            fingerprint,
        })
    }
}

pub(crate) use symm_core::agree::host_id;

/// Publishes `me` and gathers every rank's record (collective; every rank
/// of the group calls it in the same order of setup steps).
pub(crate) fn exchange(group: &Arc<Group>, me: &PeerInfo, timeout: Duration) -> Result<Vec<PeerInfo>> {
    let values = group.exchange(group.next_prefix("comm"), timeout)?.all_gather(
        group.rank().get(),
        group.world_size(),
        me.encode().as_bytes(),
        timeout,
    )?;
    values.iter().enumerate().map(|(r, v)| PeerInfo::decode(r, v)).collect()
}

/// Checks that every rank agreed on what must be equal.
pub(crate) fn check_agreement(peers: &[PeerInfo], me: &PeerInfo) -> Result<()> {
    for (r, p) in peers.iter().enumerate() {
        if p.device_type != me.device_type {
            return Err(Error::Mismatch {
                what: "communicator device type",
                detail: format!("this rank uses {}, rank {r} uses {}", me.device_type, p.device_type),
            });
        }
        if p.fingerprint != me.fingerprint {
            return Err(Error::Mismatch {
                what: "communicator configuration",
                detail: format!(
                    "this rank has {:?}, rank {r} has {:?}; every rank must pass the same staging size, \
                     thresholds and engine choice, or the ranks would pick different algorithms",
                    me.fingerprint, p.fingerprint
                ),
            });
        }
    }
    Ok(())
}

/// Whether every rank runs on one host.
pub(crate) fn same_host(peers: &[PeerInfo]) -> bool {
    peers.windows(2).all(|w| w[0].host == w[1].host)
}

pub(crate) fn device_type_name(t: DeviceType) -> String {
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: &str, fp: &str) -> PeerInfo {
        PeerInfo {
            host: host.into(),
            device_type: "host".into(),
            device_index: 0,
            device_id: "d".into(),
            fingerprint: fp.into(),
        }
    }

    #[test]
    fn records_round_trip_and_disagreements_are_named() {
        let a = info("h/1", "staging=10\nx");
        assert_eq!(PeerInfo::decode(0, a.encode().as_bytes()).unwrap(), a);
        assert!(PeerInfo::decode(3, b"only-host").is_err());
        let b = info("h/1", "staging=20");
        let err = check_agreement(&[a.clone(), b.clone()], &a).unwrap_err().to_string();
        assert!(err.contains("rank 1"), "{err}");
        assert!(same_host(&[a.clone(), b]));
        assert!(!same_host(&[a, info("h/2", "")]));
        assert!(host_id().contains('/'));
    }
}
