//! Devices, device buffers, streams, modules and kernel launches.

use std::ffi::{c_int, c_void, CString};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use symm_core::coll::arg::{KernelArg, MAX_ARGS};
use symm_core::{check_range, Error};

use super::ffi;
use super::{check, to_error};

/// Number of HIP devices, or `Unavailable` with the reason.
pub fn device_count() -> Result<usize, Error> {
    static INIT: OnceLock<ffi::hipError> = OnceLock::new();
    // SAFETY: hipInit takes flags 0 and has no other preconditions.
    let init = *INIT.get_or_init(|| unsafe { ffi::hipInit(0) });
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer for the call's duration.
    let r = unsafe { ffi::hipGetDeviceCount(&mut n) };
    if r != ffi::HIP_SUCCESS {
        return Err(Error::Unavailable(format!(
            "no usable AMD GPU: hipInit gave {}, hipGetDeviceCount gave {}",
            super::error_name(init),
            super::error_name(r)
        )));
    }
    Ok(n.max(0) as usize)
}

/// HIP runtime version (`major * 10_000_000 + minor * 100_000 + patch`).
pub fn runtime_version() -> Result<i32, Error> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { ffi::hipRuntimeGetVersion(&mut v) }, "hipRuntimeGetVersion")?;
    Ok(v)
}

/// Makes `device` current on this thread.
pub fn set_device(device: u32) -> Result<(), Error> {
    let d = c_int::try_from(device).map_err(|_| Error::InvalidArgument(format!("device index {device}")))?;
    // SAFETY: plain call; an invalid ordinal is reported as an error.
    check(unsafe { ffi::hipSetDevice(d) }, "hipSetDevice")
}

/// PCI bus id of `device` ("0000:c1:00.0").
pub fn pci_bus_id(device: u32) -> Result<String, Error> {
    let mut buf = [0 as std::ffi::c_char; 64];
    check(
        // SAFETY: buf is 64 bytes and we pass that length.
        unsafe { ffi::hipDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, device as c_int) },
        "hipDeviceGetPCIBusId",
    )?;
    // SAFETY: the runtime wrote a NUL-terminated string into buf (zeroed, so a
    // terminator exists in any case).
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `hipDeviceProp_t` of ROCm 5.x (hip-sys' layout; ROCm 6 keeps this symbol with this layout
/// for old binaries), padded generously.
#[repr(C)]
struct Props {
    p: hip_sys::hiprt::hipDeviceProp_t,
    slack: [u8; 4096],
}

fn props(device: u32) -> Result<Box<Props>, Error> {
    // SAFETY: all-zero bytes are a valid value of this plain-data struct.
    let mut props: Box<Props> = Box::new(unsafe { std::mem::zeroed() });
    check(
        // SAFETY: the pointer is valid for the struct's size (plus slack).
        unsafe {
            ffi::hipGetDeviceProperties(
                (&mut props.p as *mut hip_sys::hiprt::hipDeviceProp_t).cast(),
                device as c_int,
            )
        },
        "hipGetDeviceProperties",
    )?;
    Ok(props)
}

/// The gfx architecture of `device` ("gfx90a", feature suffixes stripped).
pub fn arch_name(device: u32) -> Result<String, Error> {
    let props = props(device)?;
    let raw: Vec<u8> = props
        .p
        .gcnArchName
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let name = String::from_utf8_lossy(&raw).into_owned();
    Ok(crate::kernels::base_arch(&name).to_string())
}

/// Compute units of `device` (at least 1): the collectives' grid budget (NOTE [co-residency]).
pub fn compute_units(device: u32) -> Result<u32, Error> {
    Ok(u32::try_from(props(device)?.p.multiProcessorCount).unwrap_or(1).max(1))
}

/// Free and total bytes of the current device.
pub fn mem_info() -> Result<(usize, usize), Error> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    check(unsafe { ffi::hipMemGetInfo(&mut free, &mut total) }, "hipMemGetInfo")?;
    Ok((free, total))
}

/// A `hipMalloc` buffer, freed on drop. Its host copies are safe functions: the buffer owns
/// `ptr .. ptr + len`, and each copy checks its range against `len` first.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
}

impl DeviceBuffer {
    pub fn new(len: usize) -> Result<Self, Error> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; at least one byte is asked for, so the pointer is a fresh
        // allocation owned by the returned buffer.
        check(unsafe { ffi::hipMalloc(&mut p, len.max(1)) }, "hipMalloc")?;
        Ok(DeviceBuffer { ptr: p as u64, len })
    }
    /// A device buffer holding `words`.
    pub fn from_u64s(words: &[u64]) -> Result<Self, Error> {
        let mut b = DeviceBuffer::new(std::mem::size_of_val(words))?;
        b.write(bytes_of_u64(words))?;
        Ok(b)
    }
    /// Copies `src` to the start of the buffer (synchronous: `hipMemcpy`); `OutOfRange` when it
    /// does not fit.
    pub fn write(&mut self, src: &[u8]) -> Result<(), Error> {
        check_range("device buffer write", 0, src.len(), self.len)?;
        check(
            // SAFETY: `self.ptr .. self.ptr + src.len()` lies in this buffer's own hipMalloc
            // allocation (range checked above; `&mut self`: no other host copy of ours
            // meanwhile), which lives as long as `self`; `src` is a valid host slice for the
            // whole call, which returns once the copy is done.
            unsafe {
                ffi::hipMemcpy(
                    self.ptr as *mut c_void,
                    src.as_ptr().cast(),
                    src.len(),
                    ffi::HIP_MEMCPY_DEFAULT,
                )
            },
            "hipMemcpy (to device)",
        )
    }
    /// Copies the buffer's first `dst.len()` bytes into `dst` (synchronous: `hipMemcpy`);
    /// `OutOfRange` when the buffer is shorter.
    pub fn read(&self, dst: &mut [u8]) -> Result<(), Error> {
        check_range("device buffer read", 0, dst.len(), self.len)?;
        check(
            // SAFETY: `self.ptr .. self.ptr + dst.len()` lies in this buffer's own hipMalloc
            // allocation (range checked above), alive while `self` is borrowed; `dst` is a valid,
            // exclusively borrowed host slice for the whole call, which returns once the copy
            // is done.
            unsafe {
                ffi::hipMemcpy(
                    dst.as_mut_ptr().cast(),
                    self.ptr as *const c_void,
                    dst.len(),
                    ffi::HIP_MEMCPY_DEFAULT,
                )
            },
            "hipMemcpy (to host)",
        )
    }
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from hipMalloc and is freed once; errors are ignored
        // (Drop never panics).
        let _ = unsafe { ffi::hipFree(self.ptr as *mut c_void) };
    }
}

fn bytes_of_u64(w: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding; any byte view of initialised u64s is valid,
    // and the length is the slice's byte size.
    unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), std::mem::size_of_val(w)) }
}

/// A non-blocking stream, destroyed on drop.
#[derive(Debug)]
pub struct Stream(ffi::hipStream_t);

// SAFETY: a HIP stream handle may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: HIP stream calls are thread-safe.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new() -> Result<Self, Error> {
        let mut s: ffi::hipStream_t = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer.
            unsafe { ffi::hipStreamCreateWithFlags(&mut s, ffi::HIP_STREAM_NON_BLOCKING) },
            "hipStreamCreateWithFlags",
        )?;
        Ok(Stream(s))
    }
    pub fn raw(&self) -> ffi::hipStream_t {
        self.0
    }
    /// Async host -> device copy of `src` into `dst`, then waits for it.
    ///
    /// Crate-private: it takes a raw device address (NOTE [raw-addresses]), and every caller
    /// in this crate passes a range it checked against a mapping it holds (`symm_mem.rs`:
    /// `check_range` against the buffer or the pad of a mapping the object keeps alive).
    /// The copy reads an owned staging copy of `src`, leaked if the wait fails
    /// ([`Stream::wait_or_leak`]), so a copy still queued after a timeout never reads freed
    /// host memory.
    pub(crate) fn copy_to_device_sync(&self, dst: u64, src: &[u8], limit: Duration) -> Result<(), Error> {
        let staged = src.to_vec();
        check(
            // SAFETY: `dst .. dst + src.len()` lies in a mapping the crate-private caller holds
            // and checked the range against (see the doc), and the mappings outlive the
            // streams that copy into them (`RocmSymmetricMemory` drops its mappings last);
            // `staged` holds `src.len()` bytes until the copy is done, or forever if the wait
            // below gives up.
            unsafe {
                ffi::hipMemcpyAsync(
                    dst as *mut c_void,
                    staged.as_ptr().cast(),
                    staged.len(),
                    ffi::HIP_MEMCPY_DEFAULT,
                    self.0,
                )
            },
            "hipMemcpyAsync",
        )?;
        self.wait_or_leak(staged, limit, "copy").map(drop)
    }
    /// Async device -> host copy of `dst.len()` bytes from `src`, then waits for it
    /// (crate-private, as [`Stream::copy_to_device_sync`]; the copy lands in a staging buffer
    /// that is leaked if the wait fails, and is copied into `dst` once it is done).
    pub(crate) fn copy_from_device_sync(&self, dst: &mut [u8], src: u64, limit: Duration) -> Result<(), Error> {
        let mut staged = vec![0u8; dst.len()];
        check(
            // SAFETY: `src .. src + dst.len()` lies in a mapping the crate-private caller holds
            // and checked the range against; `staged` is an owned host buffer of that length,
            // alive until the copy is done, or forever if the wait below gives up.
            unsafe {
                ffi::hipMemcpyAsync(
                    staged.as_mut_ptr().cast(),
                    src as *const c_void,
                    staged.len(),
                    ffi::HIP_MEMCPY_DEFAULT,
                    self.0,
                )
            },
            "hipMemcpyAsync",
        )?;
        let staged = self.wait_or_leak(staged, limit, "copy")?;
        dst.copy_from_slice(&staged);
        Ok(())
    }
    /// Waits for the stream ([`Stream::wait`]) and gives `buf` back; if the wait fails, the
    /// copy that uses `buf` may still be queued, so `buf` is leaked instead of freed.
    fn wait_or_leak(&self, buf: Vec<u8>, limit: Duration, what: &str) -> Result<Vec<u8>, Error> {
        match self.wait(limit, what) {
            Ok(()) => Ok(buf),
            Err(e) => {
                std::mem::forget(buf);
                Err(e)
            }
        }
    }
    /// Async memset of `len` bytes at `dst`, then waits (crate-private, as
    /// [`Stream::copy_to_device_sync`]; the caller is the allocator zeroing the pad of the
    /// mapping it just made).
    pub(crate) fn memset_sync(&self, dst: u64, value: u8, len: usize, limit: Duration) -> Result<(), Error> {
        check(
            // SAFETY: `dst .. dst + len` lies in a mapping the crate-private caller holds (the
            // allocator's own, with the pad inside the layout it sized the allocation for).
            unsafe { ffi::hipMemsetAsync(dst as *mut c_void, c_int::from(value), len, self.0) },
            "hipMemsetAsync",
        )?;
        self.wait(limit, "memset")
    }
    /// Polls the stream until its work is done or `limit` passes (never an
    /// unbounded hipStreamSynchronize).
    pub fn wait(&self, limit: Duration, what: &str) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            // SAFETY: the stream handle is live.
            let r = unsafe { ffi::hipStreamQuery(self.0) };
            match r {
                ffi::HIP_SUCCESS => return Ok(()),
                ffi::HIP_ERROR_NOT_READY => {}
                e => return Err(to_error(e, &format!("hipStreamQuery ({what})"))),
            }
            if start.elapsed() > limit {
                return Err(Error::Timeout {
                    what: format!("rocm stream ({what})"),
                    timeout: limit,
                });
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by hipStreamCreateWithFlags, destroyed once.
        let _ = unsafe { ffi::hipStreamDestroy(self.0) };
    }
}

/// A loaded code object; functions are looked up by name.
#[derive(Debug)]
pub struct Module(ffi::hipModule_t);

// SAFETY: module handles are usable from any thread.
unsafe impl Send for Module {}
// SAFETY: module lookups are thread-safe in HIP.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a code object (hiprtc output) on the current device.
    pub fn load(code: &[u8]) -> Result<Self, Error> {
        let mut m: ffi::hipModule_t = std::ptr::null_mut();
        check(
            // SAFETY: `code` is a complete code object, alive for the call (HIP copies it).
            unsafe { ffi::hipModuleLoadData(&mut m, code.as_ptr().cast()) },
            "hipModuleLoadData",
        )?;
        Ok(Module(m))
    }
    pub fn function(&self, name: &str) -> Result<Function, Error> {
        let c = CString::new(name).map_err(|_| Error::InvalidArgument(format!("kernel name {name:?}")))?;
        let mut f: ffi::hipFunction_t = std::ptr::null_mut();
        check(
            // SAFETY: module is live; c is NUL-terminated.
            unsafe { ffi::hipModuleGetFunction(&mut f, self.0, c.as_ptr()) },
            "hipModuleGetFunction",
        )?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded once, unloaded once.
        let _ = unsafe { ffi::hipModuleUnload(self.0) };
    }
}

/// A kernel of a [`Module`] (valid while the module lives).
#[derive(Debug, Clone, Copy)]
pub struct Function(ffi::hipFunction_t);

// SAFETY: function handles are plain identifiers.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// Launches `grid` x `block` threads (1-D) on `stream` with `args`.
    ///
    /// Crate-private: the kernel dereferences the device addresses among `args` (NOTE
    /// [raw-addresses]), and `args` must match the kernel's parameter list. Every caller in
    /// this crate passes its own device arrays and pad addresses (alive as long as the object
    /// that launches, which waits for the stream before it returns) or an address its own
    /// caller vouched for (`RocmCollectives`' `unsafe fn` entries).
    pub(crate) fn launch(&self, stream: &Stream, grid: u32, block: u32, args: &[KernelArg]) -> Result<(), Error> {
        if args.len() > MAX_ARGS {
            return Err(Error::InvalidArgument(format!(
                "kernel launch with {} arguments (at most {MAX_ARGS})",
                args.len()
            )));
        }
        // One 8-byte cell per parameter, on the stack (an op's launch allocates nothing).
        let mut vals = [[0u8; 8]; MAX_ARGS];
        for (v, a) in vals.iter_mut().zip(args) {
            match *a {
                KernelArg::U64(x) => v.copy_from_slice(&x.to_ne_bytes()),
                KernelArg::I64(x) => v.copy_from_slice(&x.to_ne_bytes()),
                KernelArg::U32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                KernelArg::I32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                KernelArg::F32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
            }
        }
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, v) in ptrs.iter_mut().zip(vals.iter_mut()) {
            *p = v.as_mut_ptr().cast();
        }
        // SAFETY: `ptrs` holds one pointer per kernel parameter (the first
        // `args.len()`), each to 8 bytes whose prefix is the parameter's value (the
        // kernels' signatures match `args`, the crate-private callers' duty);
        // HIP copies the values at launch, while `vals` is alive. The device
        // addresses among them are valid for the kernel by the callers' duty
        // (see the doc).
        check(
            unsafe {
                ffi::hipModuleLaunchKernel(
                    self.0,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.raw(),
                    ptrs.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "hipModuleLaunchKernel",
        )
    }
}
