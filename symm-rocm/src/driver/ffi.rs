//! Raw HIP runtime declarations.
//!
//! NOTE [hip-ffi]
//! ==============
//! hip-sys 0.1.2 links `libamdhip64` and provides the opaque handle types, but
//! (a) its bindings predate the virtual memory API (hipMemCreate & co.), and
//! (b) it returns `hipError_t` as a Rust enum, so a code the bindings do not
//! know (newer ROCm) would be undefined behaviour. The functions symm uses are
//! therefore declared here with `c_int` results, against the same library.
//!
//! `hipMemAllocationProp` changed layout after ROCm 5.2 (to CUDA's order);
//! both are declared and [`crate::driver::vmm`] picks one by runtime version,
//! falling back to the other when the runtime rejects it.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

pub use hip_sys::hiprt::{hipFunction_t, hipModule_t, hipStream_t};

pub type hipError = c_int;
pub const HIP_SUCCESS: hipError = 0;
pub const HIP_ERROR_NOT_READY: hipError = 600;

/// `hipMemGenericAllocationHandle_t` (an opaque pointer).
pub type hipMemGenericAllocationHandle_t = *mut c_void;

pub const HIP_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const HIP_MEM_HANDLE_TYPE_POSIX_FD: c_int = 1;
pub const HIP_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
pub const HIP_MEM_ACCESS_READ_WRITE: c_int = 3;
pub const HIP_MEM_GRANULARITY_RECOMMENDED: c_int = 1;
pub const HIP_MEMCPY_DEFAULT: c_int = 4;
pub const HIP_STREAM_NON_BLOCKING: c_uint = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipMemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// ROCm <= 5.2 layout.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipMemAllocationPropV52 {
    pub compressionType: u8,
    pub location: hipMemLocation,
    pub requestedHandleType: c_int,
    pub type_: c_int,
    pub usage: u16,
    pub win32HandleMetaData: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipMemAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
}

/// ROCm >= 5.3 layout (CUDA's order).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipMemAllocationPropV53 {
    pub type_: c_int,
    pub requestedHandleType: c_int,
    pub location: hipMemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: hipMemAllocFlags,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipMemAccessDesc {
    pub location: hipMemLocation,
    pub flags: c_int,
}

#[link(name = "amdhip64")]
extern "C" {
    pub fn hipInit(flags: c_uint) -> hipError;
    pub fn hipGetDeviceCount(count: *mut c_int) -> hipError;
    pub fn hipSetDevice(device: c_int) -> hipError;
    pub fn hipGetDevice(device: *mut c_int) -> hipError;
    pub fn hipRuntimeGetVersion(v: *mut c_int) -> hipError;
    pub fn hipGetErrorName(e: hipError) -> *const c_char;
    pub fn hipGetErrorString(e: hipError) -> *const c_char;
    pub fn hipDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: c_int) -> hipError;
    pub fn hipGetDeviceProperties(prop: *mut c_void, device: c_int) -> hipError;
    pub fn hipDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) -> hipError;
    pub fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> hipError;

    pub fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> hipError;
    pub fn hipFree(ptr: *mut c_void) -> hipError;
    pub fn hipMemcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int) -> hipError;
    pub fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int, s: hipStream_t) -> hipError;
    pub fn hipMemsetAsync(dst: *mut c_void, value: c_int, n: usize, s: hipStream_t) -> hipError;

    pub fn hipStreamCreateWithFlags(s: *mut hipStream_t, flags: c_uint) -> hipError;
    pub fn hipStreamDestroy(s: hipStream_t) -> hipError;
    pub fn hipStreamQuery(s: hipStream_t) -> hipError;
    pub fn hipStreamSynchronize(s: hipStream_t) -> hipError;

    pub fn hipModuleLoadData(m: *mut hipModule_t, image: *const c_void) -> hipError;
    pub fn hipModuleUnload(m: hipModule_t) -> hipError;
    pub fn hipModuleGetFunction(f: *mut hipFunction_t, m: hipModule_t, name: *const c_char) -> hipError;
    pub fn hipModuleLaunchKernel(
        f: hipFunction_t,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        s: hipStream_t,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> hipError;

    pub fn hipMemCreate(
        h: *mut hipMemGenericAllocationHandle_t,
        size: usize,
        prop: *const c_void,
        flags: c_ulonglong,
    ) -> hipError;
    pub fn hipMemRelease(h: hipMemGenericAllocationHandle_t) -> hipError;
    pub fn hipMemExportToShareableHandle(
        out: *mut c_void,
        h: hipMemGenericAllocationHandle_t,
        ty: c_int,
        flags: c_ulonglong,
    ) -> hipError;
    pub fn hipMemImportFromShareableHandle(
        h: *mut hipMemGenericAllocationHandle_t,
        os_handle: *mut c_void,
        ty: c_int,
    ) -> hipError;
    pub fn hipMemGetAllocationGranularity(g: *mut usize, prop: *const c_void, option: c_int) -> hipError;
    pub fn hipMemAddressReserve(
        ptr: *mut *mut c_void,
        size: usize,
        align: usize,
        addr: *mut c_void,
        flags: c_ulonglong,
    ) -> hipError;
    pub fn hipMemAddressFree(ptr: *mut c_void, size: usize) -> hipError;
    pub fn hipMemMap(
        ptr: *mut c_void,
        size: usize,
        offset: usize,
        h: hipMemGenericAllocationHandle_t,
        flags: c_ulonglong,
    ) -> hipError;
    pub fn hipMemUnmap(ptr: *mut c_void, size: usize) -> hipError;
    pub fn hipMemSetAccess(ptr: *mut c_void, size: usize, desc: *const hipMemAccessDesc, count: usize) -> hipError;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_the_headers() {
        // ROCm 5.2: u8, pad, location@4, handle@12, type@16, usage@20, ptr@24 -> 32 bytes.
        assert_eq!(std::mem::size_of::<hipMemAllocationPropV52>(), 32);
        assert_eq!(std::mem::offset_of!(hipMemAllocationPropV52, location), 4);
        assert_eq!(std::mem::offset_of!(hipMemAllocationPropV52, requestedHandleType), 12);
        assert_eq!(std::mem::offset_of!(hipMemAllocationPropV52, win32HandleMetaData), 24);
        // ROCm >= 5.3: type@0, handle@4, location@8, ptr@16, flags@24 -> 32 bytes.
        assert_eq!(std::mem::size_of::<hipMemAllocationPropV53>(), 32);
        assert_eq!(std::mem::offset_of!(hipMemAllocationPropV53, location), 8);
        assert_eq!(std::mem::offset_of!(hipMemAllocationPropV53, allocFlags), 24);
        assert_eq!(std::mem::size_of::<hipMemAccessDesc>(), 12);
    }
}
