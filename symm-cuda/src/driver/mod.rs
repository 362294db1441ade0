//! The only module of symm-cuda with `unsafe` code: thin wrappers over
//! `cudarc::driver::sys` (the CUDA driver API), NVRTC presence/version, and
//! NVML through `libloading`.
//!
//! Rules kept here:
//! - every driver call goes through [`check`], which turns a `CUresult` into
//!   [`symm_core::Error::Backend`] (or [`Error::OutOfMemory`]);
//! - nothing calls into libcuda before [`init`] confirmed the library is
//!   present (cudarc panics otherwise);
//! - RAII types release in `Drop`, which never panics (it logs through
//!   the `log` crate at most);
//! - every `unsafe` block is preceded by a `// SAFETY:` line.
//!
//! Callers bind the right context to the calling thread (see [`bind`])
//! before calling anything here that needs one; several ranks of one process
//! (one thread per GPU) each use the primary context of their own device.

pub mod launch;
mod libs;
pub mod mem;
pub mod nccl;
pub mod nvml;
pub mod nvrtc;
pub mod vmm;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use symm_core::{Error, Result};

/// The backend name used in [`Error::Backend`].
pub const BACKEND: &str = "cuda";

fn error_text(r: CUresult) -> String {
    // Only called after `init` succeeded (a failing call implies the library
    // is loaded), so the symbol lookups of cuGetErrorName/String cannot panic.
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: both functions only write a pointer to a static string into the
    // out-parameters; they accept any CUresult value.
    let (rn, rs) = unsafe { (sys::cuGetErrorName(r, &mut name), sys::cuGetErrorString(r, &mut text)) };
    let name = if rn == CUresult::CUDA_SUCCESS && !name.is_null() {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("{r:?}")
    };
    let text = if rs == CUresult::CUDA_SUCCESS && !text.is_null() {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    } else {
        String::new()
    };
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}

/// Maps a driver status to `Ok` or a [`symm_core::Error`] naming `call`.
pub fn check(r: CUresult, call: &str) -> Result<()> {
    match r {
        CUresult::CUDA_SUCCESS => Ok(()),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory {
            device: current_device_name(),
            detail: format!("{call}: {}", error_text(r)),
        }),
        _ => Err(Error::Backend {
            backend: BACKEND,
            call: call.to_string(),
            detail: error_text(r),
        }),
    }
}

/// Converts a cudarc [`DriverError`] (from its safe API) the same way.
pub fn from_driver(e: DriverError, call: &str) -> Error {
    match check(e.0, call) {
        Err(e) => e,
        Ok(()) => Error::Backend {
            backend: BACKEND,
            call: call.to_string(),
            detail: "unexpected success code in error".into(),
        },
    }
}

fn current_device_name() -> String {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one int; fails harmlessly without a current context.
    let r = unsafe { sys::cuCtxGetDevice(&mut dev) };
    if r == CUresult::CUDA_SUCCESS {
        format!("cuda:{dev}")
    } else {
        "cuda".to_string()
    }
}

/// Loads libcuda (checking that it exists first) and calls `cuInit(0)` once
/// per process. Every entry point of the backend calls this first.
pub fn init() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !libs::present("cuda") {
            return Err("the CUDA driver library (libcuda.so) was not found".to_string());
        }
        // SAFETY: libcuda is present, so the symbol lookup succeeds; cuInit
        // takes flags 0.
        let r = unsafe { sys::cuInit(0) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(format!("cuInit failed: {}", error_text(r)));
        }
        Ok(())
    })
    .clone()
    .map_err(Error::Unavailable)
}

/// Number of CUDA devices, or [`Error::Unavailable`] with the reason.
pub fn device_count() -> Result<usize> {
    init()?;
    let mut n: c_int = 0;
    // SAFETY: driver initialised; writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// The `CUdevice` of an ordinal (checked against the device count).
pub fn device(ordinal: usize) -> Result<sys::CUdevice> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(Error::OutOfRange {
            what: "cuda device ordinal",
            value: ordinal as u64,
            limit: n as u64,
        });
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: driver initialised; ordinal < device count; writes one int.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as c_int) }, "cuDeviceGet")?;
    Ok(dev)
}

/// A device attribute.
pub fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    init()?;
    let mut v: c_int = 0;
    check(
        // SAFETY: `dev` came from `device`; writes one int.
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

/// `(major, minor)` compute capability.
pub fn compute_capability(dev: sys::CUdevice) -> Result<(i32, i32)> {
    use sys::CUdevice_attribute::*;
    Ok((
        attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// Whether kernels on `dev` can be launched with programmatic dependent launch
/// ([`launch::Launch::pdl`]; compute capability 9.0 or newer).
pub fn supports_pdl(dev: sys::CUdevice) -> Result<bool> {
    Ok(compute_capability(dev)?.0 >= 9)
}

/// Whether kernels on `dev` can be launched with thread-block clusters
/// ([`launch::Launch::cluster`]; compute capability 9.0 or newer).
pub fn supports_clusters(dev: sys::CUdevice) -> Result<bool> {
    Ok(compute_capability(dev)?.0 >= 9)
}

/// The device UUID as 32 lowercase hex digits.
pub fn uuid(dev: sys::CUdevice) -> Result<String> {
    init()?;
    let mut u = MaybeUninit::<sys::CUuuid>::uninit();
    check(
        // SAFETY: `dev` is valid; the driver fills the 16-byte struct.
        unsafe { sys::cuDeviceGetUuid_v2(u.as_mut_ptr(), dev) },
        "cuDeviceGetUuid",
    )?;
    // SAFETY: initialised by the successful call above.
    let u = unsafe { u.assume_init() };
    Ok(u.bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect())
}

/// The PCI bus id as the driver prints it (`0000:18:00.0`).
pub fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
    init()?;
    let mut buf = [0 as c_char; 64];
    check(
        // SAFETY: the buffer holds 64 bytes; the driver writes a NUL-terminated string.
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) },
        "cuDeviceGetPCIBusId",
    )?;
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A peer-to-peer attribute between two devices (0 when `a == b`).
pub fn p2p_attribute(a: sys::CUdevice, b: sys::CUdevice, attr: sys::CUdevice_P2PAttribute) -> Result<i32> {
    if a == b {
        return Ok(0);
    }
    init()?;
    let mut v: c_int = 0;
    check(
        // SAFETY: valid devices; writes one int.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, a, b) },
        "cuDeviceGetP2PAttribute",
    )?;
    Ok(v)
}

/// The driver's CUDA version (e.g. 13000).
pub fn driver_version() -> Result<i32> {
    init()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDriverGetVersion(&mut v) }, "cuDriverGetVersion")?;
    Ok(v)
}

/// The primary context of device `ordinal`, one `Arc` per device per process
/// (so the per-context caches are shared by every user of the device).
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    type Contexts = Mutex<HashMap<usize, (Arc<CudaContext>, Arc<CudaStream>)>>;
    static CTXS: OnceLock<Contexts> = OnceLock::new();
    device(ordinal)?;
    let mut map = CTXS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((c, _)) = map.get(&ordinal) {
        c.bind_to_thread().map_err(|e| from_driver(e, "cuCtxSetCurrent"))?;
        return Ok(c.clone());
    }
    let c = CudaContext::new(ordinal).map_err(|e| from_driver(e, "cuDevicePrimaryCtxRetain"))?;
    // cudarc synchronises the whole context when its stream count goes from
    // 0 to 1; a stream kept for the life of the process makes that happen
    // once, here, and never later behind a user's (or a peer-waiting) kernel.
    let keeper = c.new_stream().map_err(|e| from_driver(e, "cuStreamCreate"))?;
    map.insert(ordinal, (c.clone(), keeper));
    Ok(c)
}

/// Function `name` of `module`, loaded onto the device now (`cuFuncLoad`)
/// rather than at its first launch. Under CUDA's lazy loading (the default) a
/// first launch loads the function, and loading may synchronise the whole
/// context: with ranks sharing a GPU it would wait for a peer's kernel that
/// spins until this rank's kernel runs (NOTE [co-residency]).
pub fn load_function(module: &Arc<cudarc::driver::CudaModule>, name: &str) -> Result<cudarc::driver::CudaFunction> {
    let f = module
        .load_function(name)
        .map_err(|e| from_driver(e, &format!("cuModuleGetFunction({name})")))?;
    // SAFETY: `f` is a live function handle of a module loaded in its context (kept alive by
    // `f`'s own reference to the module); cuFuncLoad only loads it.
    let r = unsafe { sys::cuFuncLoad(f.cu_function()) };
    check(r, &format!("cuFuncLoad({name})"))?;
    Ok(f)
}

/// Binds `ctx` to the calling thread (every operation calls this first).
pub fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().map_err(|e| from_driver(e, "cuCtxSetCurrent"))
}

/// `(free, total)` device memory of `ctx`'s device.
pub fn mem_get_info(ctx: &CudaContext) -> Result<(usize, usize)> {
    bind(ctx)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: a context is current; writes two size_t.
    check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }, "cuMemGetInfo")?;
    Ok((free, total))
}

/// Blocks until every operation on `stream` finished.
pub fn stream_synchronize(stream: &CudaStream) -> Result<()> {
    bind(stream.context())?;
    // SAFETY: the stream is alive (borrowed) and belongs to the bound context.
    check(
        unsafe { sys::cuStreamSynchronize(stream.cu_stream()) },
        "cuStreamSynchronize",
    )
}

/// `Ok(true)` if every operation on `stream` finished, `Ok(false)` if some
/// are still running, an error if one failed.
pub fn stream_query(stream: &CudaStream) -> Result<bool> {
    bind(stream.context())?;
    // SAFETY: the stream is alive and belongs to the bound context.
    let r = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    match r {
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => check(r, "cuStreamQuery").map(|()| true),
    }
}

/// Blocks until every operation of the context finished.
pub fn ctx_synchronize(ctx: &CudaContext) -> Result<()> {
    bind(ctx)?;
    // SAFETY: a context is current.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_unavailable_not_a_panic() {
        // On a machine without libcuda this must be Unavailable; with one,
        // any outcome is fine as long as nothing panics.
        match device_count() {
            Ok(n) => println!("cuda devices: {n}"),
            Err(Error::Unavailable(why)) => println!("cuda unavailable: {why}"),
            Err(e) => println!("cuda error: {e}"),
        }
    }
}
