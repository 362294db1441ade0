//! NVLink connectivity of the CUDA devices, registered as the
//! `ConnectivityDetector { Cuda, "nvlink" }`.
//!
//! The matrix is indexed by CUDA ordinal. NVML describes each device's
//! active NVLinks and, per link, the PCI bus id of the far end. Where that id
//! names another CUDA device, the link counts for that pair. Where it does
//! not (masked as `FFFFFFFF:FF:FF.0`, as in the 2 x H200 VM, or an NVSwitch),
//! the link is "unresolved", and a pair of devices that both have unresolved
//! links is counted as connected (with `min` of their unresolved link
//! counts) when NVML's P2P status for the NVLink capability is OK, or when
//! CUDA reports peer access and native atomics both ways between them (either
//! source suffices: a VM may mask one of them; without active NVLinks on both
//! sides nothing is counted, so PCIe peers never are). Everything here except
//! [`detect_nvlink`] is a pure function.

#![forbid(unsafe_code)]

use cudarc::driver::sys::CUdevice_P2PAttribute;
use symm_core::{ConnectivityDetector, DeviceType, Error, LinkMatrix, Result};

use crate::driver::{self, nvml};

/// Normalises a PCI bus id (`00000000:18:00.0` or `0000:18:00.0`, any case)
/// to `dddd:bb:dd.f` lowercase; `None` for unparsable or masked ids (domain
/// `ffffffff` or bus `ff` with device `ff`).
pub fn normalize_bus_id(id: &str) -> Option<String> {
    let id = id.trim();
    let mut parts = id.split(':');
    let (domain, bus, devfn) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (dev, func) = devfn.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let dev = u32::from_str_radix(dev, 16).ok()?;
    let func = u32::from_str_radix(func, 16).ok()?;
    if domain == 0xffff_ffff || (bus == 0xff && dev == 0xff) || bus > 0xff || dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// CUDA's view of a device pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CudaP2p {
    pub access: bool,
    pub native_atomics: bool,
}

/// Everything the matrix is built from (gathered by [`detect_nvlink`], or
/// made up by tests).
#[derive(Debug, Clone)]
pub struct LinkFacts {
    /// PCI bus id of each CUDA device, by ordinal.
    pub cuda_bus_ids: Vec<String>,
    /// CUDA P2P attributes, `[a][b]` by ordinal.
    pub cuda_p2p: Vec<Vec<CudaP2p>>,
    /// What NVML reported (its own device order).
    pub nvml: nvml::NvmlFacts,
}

/// Builds the NVLink matrix (link counts per pair of CUDA ordinals).
pub fn nvlink_matrix(f: &LinkFacts) -> Result<LinkMatrix> {
    let n = f.cuda_bus_ids.len();
    if f.cuda_p2p.len() != n || f.cuda_p2p.iter().any(|r| r.len() != n) {
        return Err(Error::InvalidArgument(
            "CUDA P2P table does not match the device count".into(),
        ));
    }
    let cuda_ids: Vec<Option<String>> = f.cuda_bus_ids.iter().map(|b| normalize_bus_id(b)).collect();
    // CUDA ordinal -> NVML index.
    let nvml_of: Vec<Option<usize>> = cuda_ids
        .iter()
        .map(|id| {
            id.as_ref().and_then(|id| {
                f.nvml
                    .devices
                    .iter()
                    .position(|d| normalize_bus_id(&d.bus_id).as_ref() == Some(id))
            })
        })
        .collect();
    let mut resolved = vec![vec![0u32; n]; n];
    let mut unresolved = vec![0u32; n];
    for a in 0..n {
        let Some(d) = nvml_of[a] else { continue };
        for remote in &f.nvml.devices[d].active_links {
            let far = remote
                .as_deref()
                .and_then(normalize_bus_id)
                .and_then(|id| cuda_ids.iter().position(|c| c.as_ref() == Some(&id)));
            match far {
                Some(b) if b != a => resolved[a][b] += 1,
                Some(_) => {}
                None => unresolved[a] += 1,
            }
        }
    }
    let nvml_p2p = |a: usize, b: usize| -> Option<bool> {
        let (da, db) = (nvml_of[a]?, nvml_of[b]?);
        let ab = f.nvml.p2p_nvlink.get(da)?.get(db).copied().flatten();
        let ba = f.nvml.p2p_nvlink.get(db)?.get(da).copied().flatten();
        match (ab, ba) {
            (Some(x), Some(y)) => Some(x && y),
            (Some(x), None) | (None, Some(x)) => Some(x),
            (None, None) => None,
        }
    };
    let mut rows = vec![vec![0u32; n]; n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let direct = resolved[a][b].max(resolved[b][a]);
            rows[a][b] = if direct > 0 {
                direct
            } else if unresolved[a] > 0 && unresolved[b] > 0 {
                let cuda_ok = f.cuda_p2p[a][b].access
                    && f.cuda_p2p[b][a].access
                    && f.cuda_p2p[a][b].native_atomics
                    && f.cuda_p2p[b][a].native_atomics;
                let linked = nvml_p2p(a, b) == Some(true) || cuda_ok;
                if linked {
                    unresolved[a].min(unresolved[b])
                } else {
                    0
                }
            } else {
                0
            };
        }
    }
    LinkMatrix::from_rows(rows)
}

/// Gathers the facts from CUDA and NVML and builds the matrix.
pub fn detect_nvlink() -> Result<LinkMatrix> {
    let n = driver::device_count()?;
    let devs = (0..n).map(driver::device).collect::<Result<Vec<_>>>()?;
    let cuda_bus_ids = devs
        .iter()
        .map(|&d| driver::pci_bus_id(d))
        .collect::<Result<Vec<_>>>()?;
    let mut cuda_p2p = vec![vec![CudaP2p::default(); n]; n];
    for a in 0..n {
        for b in 0..n {
            if a != b {
                cuda_p2p[a][b] = CudaP2p {
                    access: driver::p2p_attribute(
                        devs[a],
                        devs[b],
                        CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                    )? != 0,
                    native_atomics: driver::p2p_attribute(
                        devs[a],
                        devs[b],
                        CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                    )? != 0,
                };
            }
        }
    }
    let facts = LinkFacts {
        cuda_bus_ids,
        cuda_p2p,
        nvml: nvml::query()?,
    };
    nvlink_matrix(&facts)
}

inventory::submit! {
    ConnectivityDetector {
        device_type: DeviceType::Cuda,
        link_kind: "nvlink",
        name: "symm-cuda-nvml",
        detect: detect_nvlink,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::nvml::{NvmlDevice, NvmlFacts};
    use symm_core::{detect_topology, Topology};

    const MASKED: &str = "FFFFFFFF:FF:FF.0";

    fn p2p(n: usize, access: bool, atomics: bool) -> Vec<Vec<CudaP2p>> {
        (0..n)
            .map(|a| {
                (0..n)
                    .map(|b| {
                        if a == b {
                            CudaP2p::default()
                        } else {
                            CudaP2p {
                                access,
                                native_atomics: atomics,
                            }
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn dev(bus: &str, links: Vec<Option<&str>>) -> NvmlDevice {
        NvmlDevice {
            bus_id: bus.into(),
            active_links: links.into_iter().map(|l| l.map(str::to_string)).collect(),
        }
    }

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalize_bus_id("00000000:18:00.0").as_deref(), Some("0000:18:00.0"));
        assert_eq!(normalize_bus_id("0000:AB:1F.7").as_deref(), Some("0000:ab:1f.7"));
        assert_eq!(normalize_bus_id(MASKED), None);
        assert_eq!(normalize_bus_id("ffffffff:ff:ff.0"), None);
        assert_eq!(normalize_bus_id("garbage"), None);
        assert_eq!(normalize_bus_id("0000:18:00"), None);
        assert_eq!(normalize_bus_id(""), None);
    }

    /// The 2 x H200 VM: 18 active links each, remote ids masked, NVML P2P OK.
    #[test]
    fn masked_remote_ids_fall_back_to_p2p_status() {
        let facts = LinkFacts {
            cuda_bus_ids: vec!["0000:18:00.0".into(), "0000:2A:00.0".into()],
            cuda_p2p: p2p(2, true, true),
            nvml: NvmlFacts {
                devices: vec![
                    dev("00000000:18:00.0", vec![Some(MASKED); 18]),
                    dev("00000000:2A:00.0", vec![Some(MASKED); 18]),
                ],
                p2p_nvlink: vec![vec![None, Some(true)], vec![Some(true), None]],
            },
        };
        let m = nvlink_matrix(&facts).unwrap();
        assert_eq!(m.rows(), vec![vec![0, 18], vec![18, 0]]);
        assert_eq!(detect_topology(&m, &[0, 1]), Topology::FullyConnected);

        // NVML OK alone suffices (CUDA without native atomics).
        let mut nvml_only = facts.clone();
        nvml_only.cuda_p2p = p2p(2, true, false);
        assert_eq!(nvlink_matrix(&nvml_only).unwrap().get(0, 1), 18);

        // NVML says no or cannot say: CUDA access + native atomics decide.
        for status in [Some(false), None] {
            let mut other = facts.clone();
            other.nvml.p2p_nvlink = vec![vec![None, status], vec![status, None]];
            assert_eq!(nvlink_matrix(&other).unwrap().get(0, 1), 18, "{status:?}");
            other.cuda_p2p = p2p(2, true, false);
            assert_eq!(nvlink_matrix(&other).unwrap().get(0, 1), 0, "{status:?}");
            other.cuda_p2p = p2p(2, false, true);
            assert_eq!(nvlink_matrix(&other).unwrap().get(0, 1), 0, "{status:?}");
        }

        // No active NVLink on one side: never connected.
        let mut one_sided = facts.clone();
        one_sided.nvml.devices[1].active_links.clear();
        assert_eq!(nvlink_matrix(&one_sided).unwrap().get(0, 1), 0);
    }

    /// Remote ids visible: links count per pair; CUDA/NVML orders differ.
    #[test]
    fn resolved_links_count_per_pair() {
        let facts = LinkFacts {
            // CUDA order differs from NVML order.
            cuda_bus_ids: vec!["0000:2a:00.0".into(), "0000:18:00.0".into(), "0000:3b:00.0".into()],
            cuda_p2p: p2p(3, true, true),
            nvml: NvmlFacts {
                devices: vec![
                    dev(
                        "00000000:18:00.0",
                        vec![
                            Some("00000000:2A:00.0"),
                            Some("00000000:2A:00.0"),
                            Some("00000000:3B:00.0"),
                        ],
                    ),
                    dev(
                        "00000000:2A:00.0",
                        vec![Some("00000000:18:00.0"), Some("00000000:18:00.0")],
                    ),
                    dev("00000000:3B:00.0", vec![Some("00000000:18:00.0")]),
                ],
                p2p_nvlink: vec![vec![None; 3]; 3],
            },
        };
        let m = nvlink_matrix(&facts).unwrap();
        // cuda 0 = 2a, cuda 1 = 18, cuda 2 = 3b.
        assert_eq!(m.rows(), vec![vec![0, 2, 0], vec![2, 0, 1], vec![0, 1, 0]]);
        assert_eq!(detect_topology(&m, &[0, 1, 2]), Topology::Unknown);
        assert_eq!(detect_topology(&m, &[0, 1]), Topology::FullyConnected);
    }

    /// NVSwitch systems: every GPU's links end at switches (ids not GPUs).
    #[test]
    fn switch_links_connect_every_pair() {
        let n = 4;
        let facts = LinkFacts {
            cuda_bus_ids: (0..n).map(|i| format!("0000:{:02x}:00.0", 0x10 + i)).collect(),
            cuda_p2p: p2p(n, true, true),
            nvml: NvmlFacts {
                devices: (0..n)
                    .map(|i| {
                        dev(
                            &format!("00000000:{:02x}:00.0", 0x10 + i),
                            vec![Some("00000000:c0:00.0"); 18],
                        )
                    })
                    .collect(),
                p2p_nvlink: (0..n)
                    .map(|a| (0..n).map(|b| (a != b).then_some(true)).collect())
                    .collect(),
            },
        };
        let m = nvlink_matrix(&facts).unwrap();
        assert!((0..n).all(|a| (0..n).all(|b| m.get(a, b) == if a == b { 0 } else { 18 })));
    }

    /// No NVLink at all (PCIe box), and a CUDA device NVML does not know.
    #[test]
    fn no_links_and_unknown_devices() {
        let facts = LinkFacts {
            cuda_bus_ids: vec!["0000:18:00.0".into(), "0000:99:00.0".into()],
            cuda_p2p: p2p(2, true, false),
            nvml: NvmlFacts {
                devices: vec![dev("00000000:18:00.0", vec![])],
                p2p_nvlink: vec![vec![None]],
            },
        };
        assert_eq!(nvlink_matrix(&facts).unwrap().rows(), vec![vec![0, 0], vec![0, 0]]);
        let mut bad = facts;
        bad.cuda_p2p.pop();
        assert!(nvlink_matrix(&bad).is_err());
    }

    #[test]
    fn detector_without_driver_is_an_error_not_a_panic() {
        match detect_nvlink() {
            Ok(m) => println!("nvlink matrix: {:?}", m.rows()),
            Err(e) => println!("nvlink detection unavailable: {e}"),
        }
    }
}
