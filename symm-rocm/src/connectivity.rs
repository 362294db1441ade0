//! xGMI connectivity through rocm-smi, registered for `DeviceType::Rocm`
//! under link kind `"xgmi"`. The matrix is indexed by HIP device ordinal
//! (rocm-smi devices are matched to HIP devices by PCI id); building it from
//! rocm-smi's answers is a pure function ([`link_matrix`]).

#![forbid(unsafe_code)]

use symm_core::{ConnectivityDetector, DeviceType, Error, LinkMatrix, Result};

use crate::driver::rsmi::{self, LinkInfo, SmiTopology, LINK_TYPE_XGMI};

/// Parses a PCI bus id ("0000:c1:00.0") into rocm-smi's `bdfid`
/// (`domain << 32 | bus << 8 | device << 3 | function`).
pub fn parse_pci_bus_id(s: &str) -> Result<u64> {
    let bad = || Error::InvalidArgument(format!("not a PCI bus id: {s:?}"));
    let (domain, rest) = match s.trim().rsplitn(3, ':').collect::<Vec<_>>().as_slice() {
        [devfn, bus, domain] => (u64::from_str_radix(domain, 16).map_err(|_| bad())?, (*bus, *devfn)),
        [devfn, bus] => (0, (*bus, *devfn)),
        _ => return Err(bad()),
    };
    let (bus, devfn) = rest;
    let bus = u64::from_str_radix(bus, 16).map_err(|_| bad())?;
    let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
    let dev = u64::from_str_radix(dev, 16).map_err(|_| bad())?;
    let func = u64::from_str_radix(func, 16).map_err(|_| bad())?;
    if bus > 0xff || dev > 0x1f || func > 0x7 || domain > 0xffff_ffff {
        return Err(bad());
    }
    Ok(domain << 32 | bus << 8 | dev << 3 | func)
}

/// Whether one rocm-smi answer is a direct xGMI link.
pub fn is_direct_xgmi(l: &LinkInfo) -> bool {
    l.link_type == LINK_TYPE_XGMI && l.hops == 1
}

/// The link matrix of the HIP devices whose PCI ids are `hip_bdfids`, from
/// rocm-smi's view (`topo`): 1 for a direct xGMI link, 0 otherwise. With no
/// HIP ids (no runtime), rocm-smi's own order is used.
pub fn link_matrix(topo: &SmiTopology, hip_bdfids: &[u64]) -> Result<LinkMatrix> {
    let order: Vec<usize> = if hip_bdfids.is_empty() {
        (0..topo.bdfids.len()).collect()
    } else {
        hip_bdfids
            .iter()
            .map(|id| {
                topo.bdfids.iter().position(|b| b == id).ok_or_else(|| Error::Mismatch {
                    what: "device list",
                    detail: format!("HIP device with PCI id {id:#x} is unknown to rocm-smi"),
                })
            })
            .collect::<Result<_>>()?
    };
    let rows = order
        .iter()
        .map(|&a| {
            order
                .iter()
                .map(|&b| {
                    let l = topo.links.get(a).and_then(|r| r.get(b)).copied().flatten();
                    u32::from(a != b && l.is_some_and(|l| is_direct_xgmi(&l)))
                })
                .collect()
        })
        .collect();
    LinkMatrix::from_rows(rows)
}

fn detect() -> Result<LinkMatrix> {
    let topo = rsmi::query()?;
    let ids = match crate::driver::runtime::device_count() {
        Ok(n) => (0..n as u32)
            .map(|d| crate::driver::runtime::pci_bus_id(d).and_then(|s| parse_pci_bus_id(&s)))
            .collect::<Result<Vec<_>>>()?,
        Err(_) => Vec::new(),
    };
    link_matrix(&topo, &ids)
}

inventory::submit! {
    ConnectivityDetector {
        device_type: DeviceType::Rocm,
        link_kind: "xgmi",
        name: "symm-rocm/rocm-smi",
        detect,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::{detect_topology, Topology};

    fn topo(n: usize, f: impl Fn(usize, usize) -> Option<LinkInfo>) -> SmiTopology {
        SmiTopology {
            bdfids: (0..n as u64).map(|i| 0xc1_00 + (i << 8)).collect(),
            links: (0..n)
                .map(|a| (0..n).map(|b| if a == b { None } else { f(a, b) }).collect())
                .collect(),
        }
    }

    const XGMI: LinkInfo = LinkInfo {
        hops: 1,
        link_type: LINK_TYPE_XGMI,
        p2p_accessible: true,
    };

    #[test]
    fn pci_ids_parse() {
        assert_eq!(parse_pci_bus_id("0000:c1:00.0").unwrap(), 0xc1 << 8);
        assert_eq!(
            parse_pci_bus_id("0001:03:1f.7").unwrap(),
            1 << 32 | 3 << 8 | 0x1f << 3 | 7
        );
        assert_eq!(parse_pci_bus_id("c1:00.0").unwrap(), 0xc1 << 8);
        for bad in [
            "",
            "zz:00.0",
            "0000:c1:00",
            "0000:100:00.0",
            "0000:c1:20.0",
            "0000:c1:00.8",
        ] {
            assert!(parse_pci_bus_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mi300x_eight_way_xgmi_is_fully_connected() {
        let t = topo(8, |_, _| Some(XGMI));
        let m = link_matrix(&t, &[]).unwrap();
        assert_eq!(m.len(), 8);
        assert_eq!(m.get(0, 0), 0);
        assert_eq!(m.get(3, 5), 1);
        assert_eq!(
            detect_topology(&m, &(0..8).collect::<Vec<_>>()),
            Topology::FullyConnected
        );
    }

    #[test]
    fn pcie_and_multi_hop_are_not_links() {
        let t = topo(4, |a, b| {
            Some(match (a.min(b), a.max(b)) {
                (0, 1) | (2, 3) => XGMI,
                (0, 2) => LinkInfo { hops: 2, ..XGMI },
                _ => LinkInfo {
                    hops: 1,
                    link_type: rsmi::LINK_TYPE_PCIE,
                    p2p_accessible: true,
                },
            })
        });
        let m = link_matrix(&t, &[]).unwrap();
        assert_eq!(
            m.rows(),
            vec![vec![0, 1, 0, 0], vec![1, 0, 0, 0], vec![0, 0, 0, 1], vec![0, 0, 1, 0]]
        );
        assert_eq!(detect_topology(&m, &[0, 1]), Topology::FullyConnected);
        assert_eq!(detect_topology(&m, &[0, 1, 2, 3]), Topology::Unknown);
    }

    #[test]
    fn hip_order_is_mapped_by_pci_id() {
        // rocm-smi: 0-1 linked, 2 isolated. HIP sees [smi 2, smi 0, smi 1].
        let t = topo(3, |a, b| if a.max(b) == 1 { Some(XGMI) } else { None });
        let ids = [t.bdfids[2], t.bdfids[0], t.bdfids[1]];
        let m = link_matrix(&t, &ids).unwrap();
        assert_eq!(m.rows(), vec![vec![0, 0, 0], vec![0, 0, 1], vec![0, 1, 0]]);
        assert!(matches!(link_matrix(&t, &[0xdead]), Err(Error::Mismatch { .. })));
    }
}
