//! NVML (libnvidia-ml.so.1) through `libloading`: just what NVLink detection
//! needs. Loaded and initialised once per process; never shut down (other
//! users in the process may hold it too, and NVML reference-counts inits).
//!
//! The raw facts gathered here ([`NvmlDevice`]) are turned into a link matrix
//! by pure functions in `crate::connectivity`, which are unit-tested on fake
//! inputs.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use symm_core::{Error, Result};

type NvmlReturn = c_int;
type NvmlDeviceHandle = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_FEATURE_ENABLED` of `nvmlEnableState_t`.
const NVML_FEATURE_ENABLED: c_uint = 1;
/// `NVML_P2P_CAPS_INDEX_NVLINK` of `nvmlGpuP2PCapsIndex_t` (READ = 0,
/// WRITE = 1, NVLINK = 2, ATOMICS = 3, PROP = 4, UNKNOWN = 5).
pub const NVML_P2P_CAPS_INDEX_NVLINK: c_int = 2;
/// `NVML_P2P_STATUS_OK` of `nvmlGpuP2PStatus_t`.
pub const NVML_P2P_STATUS_OK: c_int = 0;
/// NVLink links probed per device (`NVML_NVLINK_MAX_LINKS` is 18 on Hopper).
pub const MAX_LINKS: u32 = 18;

/// `nvmlPciInfo_t` (the v3 layout used by `nvmlDeviceGetPciInfo_v3` and
/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

impl PciInfo {
    fn zeroed() -> Self {
        PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        }
    }
    fn bus_id(&self) -> String {
        let bytes: Vec<u8> = self.bus_id.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

type FnInit = unsafe extern "C" fn() -> NvmlReturn;
type FnCount = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type FnHandle = unsafe extern "C" fn(c_uint, *mut NvmlDeviceHandle) -> NvmlReturn;
type FnPci = unsafe extern "C" fn(NvmlDeviceHandle, *mut PciInfo) -> NvmlReturn;
type FnLinkState = unsafe extern "C" fn(NvmlDeviceHandle, c_uint, *mut c_uint) -> NvmlReturn;
type FnRemotePci = unsafe extern "C" fn(NvmlDeviceHandle, c_uint, *mut PciInfo) -> NvmlReturn;
type FnP2p = unsafe extern "C" fn(NvmlDeviceHandle, NvmlDeviceHandle, c_int, *mut c_int) -> NvmlReturn;
type FnErrStr = unsafe extern "C" fn(NvmlReturn) -> *const c_char;

struct Nvml {
    _lib: libloading::Library,
    count: FnCount,
    handle: FnHandle,
    pci: FnPci,
    link_state: FnLinkState,
    remote_pci: Option<FnRemotePci>,
    p2p: Option<FnP2p>,
    err_str: Option<FnErrStr>,
}

// SAFETY: NVML is thread-safe (documented); the struct holds the library and
// plain function pointers into it.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    fn load() -> std::result::Result<Nvml, String> {
        // SAFETY: loading the NVIDIA management library runs its initialisers,
        // which is what every NVML user does.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
            .or_else(|_| {
                // SAFETY: as above.
                unsafe { libloading::Library::new("libnvidia-ml.so") }
            })
            .map_err(|e| format!("NVML (libnvidia-ml.so.1) not found: {e}"))?;
        // SAFETY: each symbol is looked up with the signature nvml.h declares.
        unsafe {
            let init: FnInit = *lib
                .get::<FnInit>(b"nvmlInit_v2\0")
                .map_err(|e| format!("nvmlInit_v2: {e}"))?;
            let count: FnCount = *lib
                .get::<FnCount>(b"nvmlDeviceGetCount_v2\0")
                .map_err(|e| format!("nvmlDeviceGetCount_v2: {e}"))?;
            let handle: FnHandle = *lib
                .get::<FnHandle>(b"nvmlDeviceGetHandleByIndex_v2\0")
                .map_err(|e| format!("nvmlDeviceGetHandleByIndex_v2: {e}"))?;
            let pci: FnPci = *lib
                .get::<FnPci>(b"nvmlDeviceGetPciInfo_v3\0")
                .map_err(|e| format!("nvmlDeviceGetPciInfo_v3: {e}"))?;
            let link_state: FnLinkState = *lib
                .get::<FnLinkState>(b"nvmlDeviceGetNvLinkState\0")
                .map_err(|e| format!("nvmlDeviceGetNvLinkState: {e}"))?;
            let remote_pci = lib
                .get::<FnRemotePci>(b"nvmlDeviceGetNvLinkRemotePciInfo_v2\0")
                .ok()
                .map(|s| *s);
            let p2p = lib.get::<FnP2p>(b"nvmlDeviceGetP2PStatus\0").ok().map(|s| *s);
            let err_str = lib.get::<FnErrStr>(b"nvmlErrorString\0").ok().map(|s| *s);
            let r = init();
            let nvml = Nvml {
                _lib: lib,
                count,
                handle,
                pci,
                link_state,
                remote_pci,
                p2p,
                err_str,
            };
            if r != NVML_SUCCESS {
                return Err(format!("nvmlInit_v2 failed: {}", nvml.describe(r)));
            }
            Ok(nvml)
        }
    }

    fn describe(&self, r: NvmlReturn) -> String {
        if let Some(f) = self.err_str {
            // SAFETY: nvmlErrorString accepts any code and returns a static string.
            let p = unsafe { f(r) };
            if !p.is_null() {
                // SAFETY: NUL-terminated static string from NVML.
                return format!("{} ({r})", unsafe { CStr::from_ptr(p) }.to_string_lossy());
            }
        }
        format!("NVML error {r}")
    }

    fn check(&self, r: NvmlReturn, call: &str) -> Result<()> {
        if r == NVML_SUCCESS {
            Ok(())
        } else {
            Err(Error::Backend {
                backend: "nvml",
                call: call.to_string(),
                detail: self.describe(r),
            })
        }
    }
}

fn nvml() -> Result<&'static Nvml> {
    static NVML: OnceLock<std::result::Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(Nvml::load)
        .as_ref()
        .map_err(|e| Error::Unavailable(e.clone()))
}

/// Whether NVML loads and initialises on this machine.
pub fn available() -> Result<()> {
    nvml().map(|_| ())
}

/// What NVML says about one device.
#[derive(Debug, Clone)]
pub struct NvmlDevice {
    /// PCI bus id as NVML prints it (`00000000:18:00.0`).
    pub bus_id: String,
    /// For each active NVLink: the remote end's PCI bus id as reported
    /// (possibly masked as `FFFFFFFF:FF:FF.0` in a VM), or `None` when the
    /// query failed.
    pub active_links: Vec<Option<String>>,
}

/// Every device NVML sees, plus the NVLink P2P status of every pair
/// (`p2p_nvlink[a][b]`: `Some(true)` when NVML reports
/// `NVML_P2P_STATUS_OK` for `NVML_P2P_CAPS_INDEX_NVLINK`, `None` when it could
/// not say).
#[derive(Debug, Clone)]
pub struct NvmlFacts {
    pub devices: Vec<NvmlDevice>,
    pub p2p_nvlink: Vec<Vec<Option<bool>>>,
}

/// Queries NVML.
pub fn query() -> Result<NvmlFacts> {
    let n = nvml()?;
    let mut count: c_uint = 0;
    // SAFETY: writes one unsigned int.
    n.check(unsafe { (n.count)(&mut count) }, "nvmlDeviceGetCount_v2")?;
    let mut handles = Vec::with_capacity(count as usize);
    let mut devices = Vec::with_capacity(count as usize);
    for i in 0..count {
        let mut h: NvmlDeviceHandle = std::ptr::null_mut();
        // SAFETY: index < count; writes one handle.
        n.check(unsafe { (n.handle)(i, &mut h) }, "nvmlDeviceGetHandleByIndex_v2")?;
        let mut pci = PciInfo::zeroed();
        // SAFETY: `h` is a valid handle; `pci` is a writable nvmlPciInfo_t.
        n.check(unsafe { (n.pci)(h, &mut pci) }, "nvmlDeviceGetPciInfo_v3")?;
        let mut active_links = Vec::new();
        for link in 0..MAX_LINKS {
            let mut state: c_uint = 0;
            // SAFETY: valid handle; writes one enum value. Links beyond the
            // device's count return an error, which means "not active".
            let r = unsafe { (n.link_state)(h, link, &mut state) };
            if r != NVML_SUCCESS || state != NVML_FEATURE_ENABLED {
                continue;
            }
            let remote = n.remote_pci.and_then(|f| {
                let mut rp = PciInfo::zeroed();
                // SAFETY: valid handle and link; writes one nvmlPciInfo_t.
                (unsafe { f(h, link, &mut rp) } == NVML_SUCCESS).then(|| rp.bus_id())
            });
            active_links.push(remote);
        }
        handles.push(h);
        devices.push(NvmlDevice {
            bus_id: pci.bus_id(),
            active_links,
        });
    }
    let p2p_nvlink = handles
        .iter()
        .enumerate()
        .map(|(a, &ha)| {
            handles
                .iter()
                .enumerate()
                .map(|(b, &hb)| {
                    if a == b {
                        return None;
                    }
                    let f = n.p2p?;
                    let mut status: c_int = -1;
                    // SAFETY: valid handles; writes one enum value.
                    let r = unsafe { f(ha, hb, NVML_P2P_CAPS_INDEX_NVLINK, &mut status) };
                    (r == NVML_SUCCESS).then_some(status == NVML_P2P_STATUS_OK)
                })
                .collect()
        })
        .collect();
    Ok(NvmlFacts { devices, p2p_nvlink })
}
