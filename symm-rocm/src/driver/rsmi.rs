//! rocm-smi (`librocm_smi64.so`), loaded at run time with libloading: the
//! xGMI link matrix between AMD GPUs.

use std::ffi::c_int;

use libloading::Library;
use symm_core::Error;

/// `RSMI_IO_LINK_TYPE` values.
pub const LINK_TYPE_PCIE: u32 = 1;
pub const LINK_TYPE_XGMI: u32 = 2;

/// What rocm-smi says about one ordered device pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    pub hops: u64,
    pub link_type: u32,
    pub p2p_accessible: bool,
}

/// One rocm-smi session: devices by rocm-smi index, with PCI ids.
#[derive(Debug, Clone)]
pub struct SmiTopology {
    /// `bdfid` per rocm-smi device (domain << 32 | bus << 8 | device << 3 | function).
    pub bdfids: Vec<u64>,
    /// `links[a][b]` for a != b (the diagonal is unused).
    pub links: Vec<Vec<Option<LinkInfo>>>,
}

type InitFn = unsafe extern "C" fn(u64) -> c_int;
type ShutFn = unsafe extern "C" fn() -> c_int;
type NumFn = unsafe extern "C" fn(*mut u32) -> c_int;
type PciFn = unsafe extern "C" fn(u32, *mut u64) -> c_int;
type LinkTypeFn = unsafe extern "C" fn(u32, u32, *mut u64, *mut u32) -> c_int;
type P2pFn = unsafe extern "C" fn(u32, u32, *mut bool) -> c_int;

/// Queries rocm-smi. `Unavailable` when the library or devices are missing.
pub fn query() -> Result<SmiTopology, Error> {
    let mut names: Vec<String> = Vec::new();
    if let Some(root) = crate::knobs::get(crate::knobs::ROCM_PATH) {
        names.push(format!("{root}/lib/librocm_smi64.so"));
    }
    names.extend(
        [
            "librocm_smi64.so",
            "librocm_smi64.so.1",
            "librocm_smi64.so.7",
            "librocm_smi64.so.6",
            "librocm_smi64.so.5",
        ]
        .map(String::from),
    );
    let mut tried = Vec::new();
    let lib = names
        .iter()
        // SAFETY: rocm-smi is designed to be dlopen'ed; loading runs its initialisers only.
        .find_map(|n| match unsafe { Library::new(n) } {
            Ok(l) => Some(l),
            Err(e) => {
                tried.push(format!("{n}: {e}"));
                None
            }
        })
        .ok_or_else(|| Error::Unavailable(format!("rocm-smi not found: {}", tried.join("; "))))?;
    let sym_err = |e: libloading::Error| Error::Unavailable(format!("rocm-smi symbol missing: {e}"));
    // SAFETY: symbols looked up with the signatures of rocm_smi.h; the library
    // stays loaded (`lib`) while they are used in this function.
    unsafe {
        let init: libloading::Symbol<InitFn> = lib.get(b"rsmi_init\0").map_err(sym_err)?;
        let shut: libloading::Symbol<ShutFn> = lib.get(b"rsmi_shut_down\0").map_err(sym_err)?;
        let num: libloading::Symbol<NumFn> = lib.get(b"rsmi_num_monitor_devices\0").map_err(sym_err)?;
        let pci: libloading::Symbol<PciFn> = lib.get(b"rsmi_dev_pci_id_get\0").map_err(sym_err)?;
        let link_type: libloading::Symbol<LinkTypeFn> = lib.get(b"rsmi_topo_get_link_type\0").map_err(sym_err)?;
        let p2p: libloading::Symbol<P2pFn> = lib.get(b"rsmi_is_P2P_accessible\0").map_err(sym_err)?;
        let r = init(0);
        if r != 0 {
            return Err(Error::Unavailable(format!("rsmi_init failed with status {r}")));
        }
        let mut n = 0u32;
        let r = num(&mut n);
        let result = if r != 0 {
            Err(Error::Unavailable(format!(
                "rsmi_num_monitor_devices failed with status {r}"
            )))
        } else {
            let mut bdfids = Vec::new();
            for d in 0..n {
                let mut id = 0u64;
                if pci(d, &mut id) != 0 {
                    id = u64::MAX;
                }
                bdfids.push(id);
            }
            let links = (0..n)
                .map(|a| {
                    (0..n)
                        .map(|b| {
                            if a == b {
                                return None;
                            }
                            let (mut hops, mut ty) = (0u64, 0u32);
                            if link_type(a, b, &mut hops, &mut ty) != 0 {
                                return None;
                            }
                            let mut acc = false;
                            let acc_ok = p2p(a, b, &mut acc) == 0;
                            Some(LinkInfo {
                                hops,
                                link_type: ty,
                                p2p_accessible: acc_ok && acc,
                            })
                        })
                        .collect()
                })
                .collect();
            Ok(SmiTopology { bdfids, links })
        };
        let _ = shut();
        result
    }
}
