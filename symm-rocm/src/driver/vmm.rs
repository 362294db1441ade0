//! HIP virtual memory management: physical allocations with POSIX-fd
//! handles, export / import, address reservations, mappings and access.
//!
//! Ownership: [`PhysicalMemory`] releases its handle on drop; a [`Mapping`]
//! owns a reservation and the mapping of one physical allocation into it, and
//! unmaps + frees the range on drop (the physical memory is freed by HIP once
//! its handle is released and no mapping remains).

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use symm_core::Error;

use super::ffi;
use super::{check, to_error};

/// Which `hipMemAllocationProp` layout the runtime takes (NOTE [hip-ffi]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropLayout {
    V52,
    V53,
}

impl PropLayout {
    /// The layout a runtime version uses (5.3 moved to CUDA's field order).
    pub fn for_version(v: i32) -> PropLayout {
        if v >= 50_300_000 {
            PropLayout::V53
        } else {
            PropLayout::V52
        }
    }
    fn other(self) -> PropLayout {
        match self {
            PropLayout::V52 => PropLayout::V53,
            PropLayout::V53 => PropLayout::V52,
        }
    }
}

/// A pinned-device allocation property with a POSIX-fd handle type, in either layout.
pub enum Prop {
    V52(ffi::hipMemAllocationPropV52),
    V53(ffi::hipMemAllocationPropV53),
}

impl Prop {
    pub fn new(layout: PropLayout, device: u32) -> Prop {
        let location = ffi::hipMemLocation {
            type_: ffi::HIP_MEM_LOCATION_TYPE_DEVICE,
            id: device as c_int,
        };
        match layout {
            PropLayout::V52 => Prop::V52(ffi::hipMemAllocationPropV52 {
                compressionType: 0,
                location,
                requestedHandleType: ffi::HIP_MEM_HANDLE_TYPE_POSIX_FD,
                type_: ffi::HIP_MEM_ALLOCATION_TYPE_PINNED,
                usage: 0,
                win32HandleMetaData: std::ptr::null_mut(),
            }),
            PropLayout::V53 => Prop::V53(ffi::hipMemAllocationPropV53 {
                type_: ffi::HIP_MEM_ALLOCATION_TYPE_PINNED,
                requestedHandleType: ffi::HIP_MEM_HANDLE_TYPE_POSIX_FD,
                location,
                win32HandleMetaData: std::ptr::null_mut(),
                allocFlags: ffi::hipMemAllocFlags::default(),
            }),
        }
    }
    fn as_ptr(&self) -> *const c_void {
        match self {
            Prop::V52(p) => (p as *const ffi::hipMemAllocationPropV52).cast(),
            Prop::V53(p) => (p as *const ffi::hipMemAllocationPropV53).cast(),
        }
    }
}

fn granularity_with(layout: PropLayout, device: u32) -> Result<usize, Error> {
    let prop = Prop::new(layout, device);
    let mut g = 0usize;
    check(
        // SAFETY: prop is a valid property struct for `layout`; g is a valid out-pointer.
        unsafe { ffi::hipMemGetAllocationGranularity(&mut g, prop.as_ptr(), ffi::HIP_MEM_GRANULARITY_RECOMMENDED) },
        "hipMemGetAllocationGranularity",
    )?;
    Ok(g)
}

/// The layout this runtime accepts and the recommended granularity for
/// `device`: the version's layout first, the other one if that is rejected.
pub fn layout_and_granularity(device: u32) -> Result<(PropLayout, usize), Error> {
    static LAYOUT: OnceLock<PropLayout> = OnceLock::new();
    if let Some(l) = LAYOUT.get() {
        return Ok((*l, granularity_with(*l, device)?));
    }
    let first = PropLayout::for_version(super::runtime::runtime_version()?);
    let (layout, g) = match granularity_with(first, device) {
        Ok(g) if g > 0 => (first, g),
        first_err => match granularity_with(first.other(), device) {
            Ok(g) if g > 0 => (first.other(), g),
            _ => {
                return Err(first_err.err().unwrap_or_else(|| Error::Backend {
                    backend: "hip",
                    call: "hipMemGetAllocationGranularity".into(),
                    detail: "granularity 0".into(),
                }))
            }
        },
    };
    let _ = LAYOUT.set(layout);
    Ok((layout, g))
}

/// A physical allocation (`hipMemGenericAllocationHandle_t`), released on drop.
#[derive(Debug)]
pub struct PhysicalMemory {
    handle: ffi::hipMemGenericAllocationHandle_t,
    size: usize,
}

// SAFETY: the handle is an opaque identifier usable from any thread.
unsafe impl Send for PhysicalMemory {}
// SAFETY: as above; no interior mutation through &self.
unsafe impl Sync for PhysicalMemory {}

impl PhysicalMemory {
    /// `size` bytes (a multiple of the granularity) on `device`, exportable as a POSIX fd.
    pub fn create(device: u32, size: usize, layout: PropLayout) -> Result<Self, Error> {
        let prop = Prop::new(layout, device);
        let mut h: ffi::hipMemGenericAllocationHandle_t = std::ptr::null_mut();
        check(
            // SAFETY: valid property struct and out-pointer.
            unsafe { ffi::hipMemCreate(&mut h, size, prop.as_ptr(), 0) },
            "hipMemCreate",
        )?;
        Ok(PhysicalMemory { handle: h, size })
    }

    /// Imports a peer's allocation from its exported fd (the fd stays owned by the caller).
    pub fn import(fd: BorrowedFd<'_>, size: usize) -> Result<Self, Error> {
        let mut h: ffi::hipMemGenericAllocationHandle_t = std::ptr::null_mut();
        check(
            // SAFETY: HIP takes a POSIX fd as the pointer-sized value of the
            // descriptor (as CUDA does); the fd is open for the call's duration.
            unsafe {
                ffi::hipMemImportFromShareableHandle(
                    &mut h,
                    fd.as_raw_fd() as isize as *mut c_void,
                    ffi::HIP_MEM_HANDLE_TYPE_POSIX_FD,
                )
            },
            "hipMemImportFromShareableHandle",
        )?;
        Ok(PhysicalMemory { handle: h, size })
    }

    /// Exports the allocation as a new POSIX fd.
    pub fn export_fd(&self) -> Result<OwnedFd, Error> {
        let mut fd: c_int = -1;
        check(
            // SAFETY: for POSIX fds the out-parameter is an int the runtime fills.
            unsafe {
                ffi::hipMemExportToShareableHandle(
                    (&mut fd as *mut c_int).cast(),
                    self.handle,
                    ffi::HIP_MEM_HANDLE_TYPE_POSIX_FD,
                    0,
                )
            },
            "hipMemExportToShareableHandle",
        )?;
        if fd < 0 {
            return Err(to_error(-1, "hipMemExportToShareableHandle returned no fd"));
        }
        // SAFETY: the runtime created this fd for us; nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        // SAFETY: the handle came from hipMemCreate / import and is released once.
        let _ = unsafe { ffi::hipMemRelease(self.handle) };
    }
}

/// A reserved address range with one physical allocation mapped at its start
/// and read-write access granted to `device`. Unmaps and frees on drop; keeps
/// the physical memory alive while mapped.
#[derive(Debug)]
pub struct Mapping {
    ptr: u64,
    size: usize,
    mapped: bool,
    _mem: std::sync::Arc<PhysicalMemory>,
}

impl Mapping {
    pub fn new(mem: std::sync::Arc<PhysicalMemory>, device: u32, granularity: usize) -> Result<Self, Error> {
        let size = mem.size();
        let mut p: *mut c_void = std::ptr::null_mut();
        check(
            // SAFETY: valid out-pointer; no fixed address requested.
            unsafe { ffi::hipMemAddressReserve(&mut p, size, granularity, std::ptr::null_mut(), 0) },
            "hipMemAddressReserve",
        )?;
        let mut m = Mapping {
            ptr: p as u64,
            size,
            mapped: false,
            _mem: mem,
        };
        check(
            // SAFETY: the range was just reserved with the allocation's size.
            unsafe { ffi::hipMemMap(m.ptr as *mut c_void, size, 0, m._mem.handle, 0) },
            "hipMemMap",
        )?;
        m.mapped = true;
        let desc = ffi::hipMemAccessDesc {
            location: ffi::hipMemLocation {
                type_: ffi::HIP_MEM_LOCATION_TYPE_DEVICE,
                id: device as c_int,
            },
            flags: ffi::HIP_MEM_ACCESS_READ_WRITE,
        };
        check(
            // SAFETY: the range is mapped; one descriptor is passed.
            unsafe { ffi::hipMemSetAccess(m.ptr as *mut c_void, size, &desc, 1) },
            "hipMemSetAccess",
        )?;
        Ok(m)
    }
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: the range is mapped by us, unmapped once.
            let _ = unsafe { ffi::hipMemUnmap(self.ptr as *mut c_void, self.size) };
        }
        // SAFETY: the range was reserved by us, freed once.
        let _ = unsafe { ffi::hipMemAddressFree(self.ptr as *mut c_void, self.size) };
    }
}

/// Rounds `n` up to a multiple of `g` (> 0); `None` on overflow.
pub fn round_up(n: usize, g: usize) -> Option<usize> {
    n.checked_add(g - 1).map(|x| x / g * g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_by_version() {
        assert_eq!(PropLayout::for_version(50_221_153), PropLayout::V52);
        assert_eq!(PropLayout::for_version(50_300_000), PropLayout::V53);
        assert_eq!(PropLayout::for_version(60_241_134), PropLayout::V53);
        assert_eq!(PropLayout::V52.other(), PropLayout::V53);
        match Prop::new(PropLayout::V53, 3) {
            Prop::V53(p) => {
                assert_eq!(p.location.id, 3);
                assert_eq!(p.requestedHandleType, ffi::HIP_MEM_HANDLE_TYPE_POSIX_FD);
            }
            Prop::V52(_) => panic!("wrong layout"),
        }
    }

    #[test]
    fn rounding() {
        assert_eq!(round_up(1, 2 << 20), Some(2 << 20));
        assert_eq!(round_up(2 << 20, 2 << 20), Some(2 << 20));
        assert_eq!(round_up(0, 4096), Some(0));
        assert_eq!(round_up(usize::MAX, 4096), None);
    }
}
