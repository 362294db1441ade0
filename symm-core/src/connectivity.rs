//! Connectivity: link matrices from registered detectors, and topology
//! detection as pure functions (PyTorch's `DMAConnectivity`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::types::DeviceType;

/// An N x N matrix of link counts between devices (0 = no direct link; the
/// diagonal is ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMatrix {
    n: usize,
    links: Vec<u32>,
}

impl LinkMatrix {
    /// Builds from rows; every row must have `rows.len()` entries.
    pub fn from_rows(rows: Vec<Vec<u32>>) -> Result<Self> {
        let n = rows.len();
        if rows.iter().any(|r| r.len() != n) {
            return Err(Error::InvalidArgument("link matrix is not square".into()));
        }
        Ok(LinkMatrix {
            n,
            links: rows.into_iter().flatten().collect(),
        })
    }
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    pub fn get(&self, a: usize, b: usize) -> u32 {
        self.links[a * self.n + b]
    }
    pub fn rows(&self) -> Vec<Vec<u32>> {
        self.links.chunks(self.n.max(1)).map(|c| c.to_vec()).collect()
    }
}

/// The link matrix of one (device type, link kind), with who detected it.
#[derive(Debug, Clone)]
pub struct Connectivity {
    pub device_type: DeviceType,
    pub link_kind: String,
    pub matrix: LinkMatrix,
    pub detector: &'static str,
}

/// A detector's registration: plain data, submitted with `inventory::submit!`.
pub struct ConnectivityDetector {
    pub device_type: DeviceType,
    /// "nvlink", "xgmi", "shm"...
    pub link_kind: &'static str,
    pub name: &'static str,
    pub detect: fn() -> Result<LinkMatrix>,
}

inventory::collect!(ConnectivityDetector);

/// The connectivity of `device_type` over `link_kind`, detected once per
/// process and cached.
pub fn get_connectivity(device_type: DeviceType, link_kind: &str) -> Result<Arc<Connectivity>> {
    // One detection at a time per process: ranks running as threads of one process ask at once,
    // and a detector (NVML, rocm-smi) need not be safe to run concurrently; the later callers
    // then find the cached result.
    static DETECTING: Mutex<()> = Mutex::new(());
    let _detecting = DETECTING.lock().unwrap_or_else(|e| e.into_inner());
    type Cache = Mutex<HashMap<(DeviceType, String), Arc<Connectivity>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (device_type, link_kind.to_string());
    if let Some(c) = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(c.clone());
    }
    let det = inventory::iter::<ConnectivityDetector>
        .into_iter()
        .find(|d| d.device_type == device_type && d.link_kind == link_kind)
        .ok_or_else(|| Error::NoDetector {
            device_type,
            link_kind: link_kind.to_string(),
        })?;
    let c = Arc::new(Connectivity {
        device_type,
        link_kind: link_kind.to_string(),
        matrix: (det.detect)()?,
        detector: det.name,
    });
    CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, c.clone());
    Ok(c)
}

/// Topologies the collectives distinguish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// Every pair of devices has a direct link.
    FullyConnected,
    /// The DGX-1 style 8-GPU hybrid cube mesh.
    HybridCubeMesh,
    Unknown,
}

/// The topology of the devices `devices` (indices into the matrix).
pub fn detect_topology(m: &LinkMatrix, devices: &[usize]) -> Topology {
    if devices.iter().any(|&d| d >= m.len()) {
        return Topology::Unknown;
    }
    if is_fully_connected(m, devices) {
        Topology::FullyConnected
    } else if is_hybrid_cube_mesh(m, devices) {
        Topology::HybridCubeMesh
    } else {
        Topology::Unknown
    }
}

/// True if every pair of `devices` has at least one direct link.
pub fn is_fully_connected(m: &LinkMatrix, devices: &[usize]) -> bool {
    devices
        .iter()
        .all(|&a| a < m.len() && devices.iter().all(|&b| a == b || (b < m.len() && m.get(a, b) > 0)))
}

/// Hybrid cube mesh (as PyTorch's IntraNodeComm checks it): 8 devices, each
/// linked to exactly 4 others, and every neighbour of a device shares at least
/// two neighbours with it... the defining property used here is PyTorch's:
/// exactly four neighbours per device, with the neighbour sets forming two
/// fully connected quads joined by a perfect matching.
pub fn is_hybrid_cube_mesh(m: &LinkMatrix, devices: &[usize]) -> bool {
    if devices.len() != 8 || devices.iter().any(|&d| d >= m.len()) {
        return false;
    }
    let nbrs: Vec<Vec<usize>> = (0..8)
        .map(|i| {
            (0..8)
                .filter(|&j| j != i && m.get(devices[i], devices[j]) > 0)
                .collect()
        })
        .collect();
    if nbrs.iter().any(|n| n.len() != 4) {
        return false;
    }
    // Each device: 3 neighbours form a quad with it (pairwise linked), the 4th is its match.
    (0..8).all(|i| {
        let quad: Vec<usize> = nbrs[i]
            .iter()
            .copied()
            .filter(|&j| nbrs[i].iter().filter(|&&k| k != j && nbrs[j].contains(&k)).count() == 2)
            .collect();
        quad.len() == 3
    })
}

/// Checks that every rank reported the same host identity.
pub fn check_same_host(host_ids: &[String]) -> Result<()> {
    if let Some(first) = host_ids.first() {
        if let Some((r, other)) = host_ids.iter().enumerate().find(|(_, h)| *h != first) {
            return Err(Error::NotSameHost(format!(
                "rank 0 is on {first:?}, rank {r} on {other:?}"
            )));
        }
    }
    Ok(())
}

/// Checks how the ranks of a rendezvous use their devices (NOTE [shared-device] in
/// docs/architecture.md) from what every rank published, the same way on every rank:
/// `devices[r]` names rank r's device, `shared_ok[r]` is its group's
/// [`GroupOptions::shared_devices`](crate::GroupOptions), and `processes[r]`, for GPU backends,
/// names its process (ranks sharing a GPU must be threads of one process: contexts of different
/// processes time-slice, so a rank's kernel could wait on a peer's that cannot run).
///
/// Fails with [`Error::Mismatch`] when ranks disagree on the permission, with
/// [`Error::OverlappingDevices`] when ranks share a device without it, and with
/// [`Error::Unavailable`] when ranks of different processes share a GPU. Returns, for every rank,
/// how many ranks use its device (itself included).
pub fn check_device_sharing(
    devices: &[String],
    shared_ok: &[bool],
    processes: Option<&[String]>,
) -> Result<Vec<usize>> {
    crate::agree::check_equal(
        "shared-device permission (GroupOptions::shared_devices)",
        shared_ok,
        |b| *b,
    )?;
    let allowed = shared_ok.first().copied().unwrap_or(false);
    for (a, da) in devices.iter().enumerate() {
        if let Some(b) = devices[a + 1..].iter().position(|db| db == da).map(|b| a + 1 + b) {
            if !allowed {
                return Err(Error::OverlappingDevices {
                    a,
                    b,
                    device: da.clone(),
                });
            }
            if let Some(p) = processes {
                if p.get(a) != p.get(b) {
                    return Err(Error::Unavailable(format!(
                        "ranks {a} and {b} share device {da} from different processes; ranks that share \
                         a GPU must be threads of one process (one context, so every rank's kernels run \
                         together): run them as threads"
                    )));
                }
            }
        }
    }
    Ok(devices
        .iter()
        .map(|d| devices.iter().filter(|e| *e == d).count())
        .collect())
}

/// The hardware work queues a shared-device group needs: the most a CUDA context can have
/// (`CUDA_DEVICE_MAX_CONNECTIONS`, 1-32, default 8).
pub const SHARED_DEVICE_QUEUES: u32 = 32;

/// Ranks sharing a GPU need their streams on distinct hardware work queues (NOTE
/// [co-residency]): a driver feeds one queue in order, so a rank's kernel queued behind a peer's
/// kernel that waits for it (or behind the peer's next kernel, which waits for the peer's
/// previous one) cannot start, and both wait until the timeout. Measured on an H100 with the
/// default 8 queues: two-shot all-reduces of 64 MiB at 2, 3 and 4 ranks, and of 7 elements at
/// 8 ranks, hung; with 32 every suite passed.
///
/// `sharers[r]` is how many ranks use rank r's device ([`check_device_sharing`]); `queues[r]` is
/// the queue count rank r's process runs with, as read from `variable`. Fails with
/// [`Error::Unavailable`] naming the first rank that shares a device with fewer than
/// [`SHARED_DEVICE_QUEUES`]; every rank reaches the same verdict from the same records.
pub fn check_shared_queues(sharers: &[usize], queues: &[u32], variable: &str) -> Result<()> {
    for (r, (&n, &q)) in sharers.iter().zip(queues).enumerate() {
        if n > 1 && q < SHARED_DEVICE_QUEUES {
            return Err(Error::Unavailable(format!(
                "rank {r} shares its GPU with {} other rank(s) but its process has {q} hardware work \
                 queues: set {variable}={SHARED_DEVICE_QUEUES} in the environment before the process \
                 starts CUDA (with fewer, one rank's kernel can queue behind a peer's that waits for \
                 it, and both hang until the timeout)",
                n - 1
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_devices_need_every_queue() {
        // Distinct devices: any queue count.
        assert!(check_shared_queues(&[1, 1], &[8, 1], "Q").is_ok());
        assert!(check_shared_queues(&[2, 2], &[32, 32], "Q").is_ok());
        match check_shared_queues(&[1, 2, 2], &[8, 32, 8], "Q") {
            Err(Error::Unavailable(m)) => {
                assert!(m.starts_with("rank 2 shares its GPU with 1 other"), "{m}");
                assert!(m.contains("Q=32"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }

    fn full(n: usize) -> LinkMatrix {
        LinkMatrix::from_rows(
            (0..n)
                .map(|i| (0..n).map(|j| u32::from(i != j) * 18).collect())
                .collect(),
        )
        .unwrap()
    }

    fn cube_mesh() -> LinkMatrix {
        // DGX-1: quads {0,1,2,3} and {4,5,6,7}, matched i <-> i+4.
        let mut rows = vec![vec![0u32; 8]; 8];
        for (i, row) in rows.iter_mut().enumerate() {
            for (j, link) in row.iter_mut().enumerate() {
                if i != j && i / 4 == j / 4 {
                    *link = 1;
                }
            }
        }
        for i in 0..4 {
            rows[i][i + 4] = 1;
            rows[i + 4][i] = 1;
        }
        LinkMatrix::from_rows(rows).unwrap()
    }

    #[test]
    fn topologies() {
        assert_eq!(detect_topology(&full(2), &[0, 1]), Topology::FullyConnected);
        assert_eq!(
            detect_topology(&full(8), &(0..8).collect::<Vec<_>>()),
            Topology::FullyConnected
        );
        assert_eq!(
            detect_topology(&cube_mesh(), &(0..8).collect::<Vec<_>>()),
            Topology::HybridCubeMesh
        );
        assert_eq!(detect_topology(&cube_mesh(), &[0, 1, 2, 3]), Topology::FullyConnected);
        assert_eq!(detect_topology(&cube_mesh(), &[0, 5]), Topology::Unknown);
        let none = LinkMatrix::from_rows(vec![vec![0, 0], vec![0, 0]]).unwrap();
        assert_eq!(detect_topology(&none, &[0, 1]), Topology::Unknown);
        assert_eq!(detect_topology(&full(2), &[0, 2]), Topology::Unknown);
        assert!(LinkMatrix::from_rows(vec![vec![0, 1]]).is_err());
    }

    #[test]
    fn host_and_device_checks() {
        assert!(check_same_host(&["a".into(), "a".into()]).is_ok());
        assert!(matches!(
            check_same_host(&["a".into(), "b".into()]),
            Err(Error::NotSameHost(_))
        ));
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            check_device_sharing(&ids(&["0", "1"]), &[false; 2], None).unwrap(),
            vec![1, 1]
        );
        assert!(matches!(
            check_device_sharing(&ids(&["0", "1", "0"]), &[false; 3], None),
            Err(Error::OverlappingDevices { a: 0, b: 2, .. })
        ));
        assert_eq!(
            check_device_sharing(&ids(&["0", "1", "0"]), &[true; 3], None).unwrap(),
            vec![2, 1, 2]
        );
        // Ranks that disagree on the permission all fail alike.
        assert!(matches!(
            check_device_sharing(&ids(&["0", "1"]), &[true, false], None),
            Err(Error::Mismatch { .. })
        ));
        // GPU backends: sharing only among threads of one process.
        let procs = ids(&["p", "p", "q"]);
        assert_eq!(
            check_device_sharing(&ids(&["0", "0", "1"]), &[true; 3], Some(&procs)).unwrap(),
            vec![2, 2, 1]
        );
        let e = check_device_sharing(&ids(&["0", "1", "0"]), &[true; 3], Some(&procs)).unwrap_err();
        assert!(matches!(e, Error::Unavailable(ref m) if m.contains("threads")), "{e}");
    }
}
