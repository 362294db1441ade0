//! CUDA virtual memory management: physical allocations (`cuMemCreate`)
//! exportable as POSIX fds, reserved address ranges and mappings.
//!
//! Lifetimes: a [`Mapping`] holds an `Arc` of the [`PhysicalAllocation`] it
//! maps and of the [`AddressRange`] it lives in, so drop order cannot unmap
//! after the range was freed or release a handle a mapping still uses (the
//! driver would keep the memory alive anyway, but this keeps the accounting
//! simple: memory returns when the last Rust owner drops).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUmemAllocationHandleType, CUmemGenericAllocationHandle};
use symm_core::{Error, Result};

use super::check;

fn prop(ordinal: usize) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal as i32,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The recommended allocation granularity of device `ordinal` for
/// fd-exportable pinned device memory.
pub fn granularity(ordinal: usize) -> Result<usize> {
    super::init()?;
    let p = prop(ordinal);
    let mut g = 0usize;
    check(
        // SAFETY: `p` is a fully initialised property struct; writes one size_t.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &p,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    if g == 0 || !g.is_power_of_two() {
        return Err(Error::Backend {
            backend: super::BACKEND,
            call: "cuMemGetAllocationGranularity".into(),
            detail: format!("unexpected granularity {g}"),
        });
    }
    Ok(g)
}

/// Checks that the device supports VMM with POSIX-fd handles.
pub fn check_vmm_support(dev: sys::CUdevice) -> Result<()> {
    use sys::CUdevice_attribute::*;
    if super::attribute(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? == 0 {
        return Err(Error::Unavailable(
            "device does not support CUDA virtual memory management".into(),
        ));
    }
    if super::attribute(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? == 0 {
        return Err(Error::Unavailable(
            "device does not support POSIX fd memory handles".into(),
        ));
    }
    Ok(())
}

/// Physical device memory from `cuMemCreate` (or imported from an fd);
/// `cuMemRelease` on drop.
#[derive(Debug)]
pub struct PhysicalAllocation {
    handle: CUmemGenericAllocationHandle,
    size: usize,
}

impl PhysicalAllocation {
    /// Allocates `size` bytes (a multiple of [`granularity`]) on device
    /// `ordinal`, exportable as a POSIX fd. A context must be current.
    pub fn create(ordinal: usize, size: usize) -> Result<Self> {
        super::init()?;
        let p = prop(ordinal);
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `p` is initialised; `handle` receives the new allocation.
        check(unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) }, "cuMemCreate").map_err(|e| match e {
            Error::OutOfMemory { detail, .. } => Error::OutOfMemory {
                device: format!("cuda:{ordinal}"),
                detail: format!("{detail} ({size} bytes)"),
            },
            e => e,
        })?;
        Ok(PhysicalAllocation { handle, size })
    }

    /// Imports an allocation another process (or thread) exported as a POSIX
    /// fd. `size` is what the exporter allocated. The fd stays owned by the
    /// caller (the driver does not take it).
    pub fn import(fd: BorrowedFd<'_>, size: usize) -> Result<Self> {
        super::init()?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // The POSIX-fd handle type passes the fd value itself as the pointer.
        let os_handle = fd.as_raw_fd() as isize as *mut c_void;
        check(
            // SAFETY: `fd` is a live fd borrowed for the call; the driver reads it
            // (dup'ing what it needs) and writes the new handle.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    os_handle,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            "cuMemImportFromShareableHandle",
        )?;
        Ok(PhysicalAllocation { handle, size })
    }

    /// Exports the allocation as a new POSIX fd (owned by the caller).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let mut fd: i32 = -1;
        check(
            // SAFETY: for POSIX fds the driver writes an int through the pointer.
            unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut fd as *mut i32).cast::<c_void>(),
                    self.handle,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            },
            "cuMemExportToShareableHandle",
        )?;
        if fd < 0 {
            return Err(Error::Backend {
                backend: super::BACKEND,
                call: "cuMemExportToShareableHandle".into(),
                detail: format!("driver returned fd {fd}"),
            });
        }
        // SAFETY: the driver created this fd for us; nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn raw(&self) -> CUmemGenericAllocationHandle {
        self.handle
    }
}

impl Drop for PhysicalAllocation {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate/import and is released once.
        let r = unsafe { sys::cuMemRelease(self.handle) };
        if let Err(e) = check(r, "cuMemRelease") {
            log::warn!("symm-cuda: {e}");
        }
    }
}

/// A reserved virtual address range (`cuMemAddressReserve`), freed on drop.
#[derive(Debug)]
pub struct AddressRange {
    ptr: u64,
    size: usize,
}

impl AddressRange {
    /// Reserves `size` bytes aligned to `align` (a multiple of the granularity).
    pub fn reserve(size: usize, align: usize) -> Result<Self> {
        super::init()?;
        let mut ptr: sys::CUdeviceptr = 0;
        check(
            // SAFETY: writes the reserved address; no fixed address requested.
            unsafe { sys::cuMemAddressReserve(&mut ptr, size, align, 0, 0) },
            "cuMemAddressReserve",
        )?;
        Ok(AddressRange { ptr, size })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        // SAFETY: the range was reserved by us; every Mapping inside it holds
        // an Arc of this range, so none is mapped any more.
        let r = unsafe { sys::cuMemAddressFree(self.ptr, self.size) };
        if let Err(e) = check(r, "cuMemAddressFree") {
            log::warn!("symm-cuda: {e}");
        }
    }
}

/// A physical allocation mapped at the start of an address range, accessible
/// read/write from the listed devices; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    range: Arc<AddressRange>,
    phys: Arc<PhysicalAllocation>,
}

impl Mapping {
    /// Maps the whole of `phys` at `range.ptr()` and grants read/write access
    /// to every device ordinal in `access`.
    pub fn map(range: Arc<AddressRange>, phys: Arc<PhysicalAllocation>, access: &[usize]) -> Result<Self> {
        if phys.size() > range.size() {
            return Err(Error::InvalidArgument(format!(
                "mapping {} bytes into a range of {}",
                phys.size(),
                range.size()
            )));
        }
        check(
            // SAFETY: the range is reserved and unmapped; the handle is live.
            unsafe { sys::cuMemMap(range.ptr(), phys.size(), 0, phys.raw(), 0) },
            "cuMemMap",
        )?;
        // From here on, drop unmaps.
        let m = Mapping { range, phys };
        let descs: Vec<sys::CUmemAccessDesc> = access
            .iter()
            .map(|&d| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: d as i32,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        check(
            // SAFETY: the range is mapped; `descs` holds `descs.len()` entries.
            unsafe { sys::cuMemSetAccess(m.ptr(), m.size(), descs.as_ptr(), descs.len()) },
            "cuMemSetAccess",
        )?;
        Ok(m)
    }

    pub fn ptr(&self) -> u64 {
        self.range.ptr()
    }
    pub fn size(&self) -> usize {
        self.phys.size()
    }
    pub fn physical(&self) -> &Arc<PhysicalAllocation> {
        &self.phys
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range; unmapping once.
        let r = unsafe { sys::cuMemUnmap(self.range.ptr(), self.phys.size()) };
        if let Err(e) = check(r, "cuMemUnmap") {
            log::warn!("symm-cuda: {e}");
        }
    }
}
