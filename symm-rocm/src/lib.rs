//! # symm-rocm
//!
//! The ROCm backend of symm, the same shape as symm-cuda on AMD GPUs:
//!
//! - [`RocmAllocator`] (registered for [`symm_core::DeviceType::Rocm`] as
//!   "symm-rocm"): HIP VMM allocations (`hipMemCreate` with POSIX-fd
//!   handles) holding buffer + signal pad, exported, passed between ranks
//!   with `FdChannel`, imported, mapped and made accessible.
//! - [`RocmSymmetricMemory`]: barrier / put_signal / wait_signal kernels
//!   following NOTE [signal-pad-layout] (symm-core's shared `sync.cu`),
//!   bounded on the device by a wall-clock deadline and the ABORT word.
//! - [`RocmCollectives`]: the collective kernels of symm-core's shared source (Lamport
//!   one-shot, ring one-shot / two-shot / reduce-scatter / all-gather, subset barrier) on a
//!   symmetric workspace, launched as symm-core's `coll` plans them (the same plans symm-cuda
//!   runs); synchronous, bounded waits, errors decoded once in symm-core. Not run on AMD
//!   hardware.
//! - [`kernels`]: symm-core's shared kernel source (sync and collectives) after
//!   `symm-rocm/kernels/vendor.hip.h`, compiled with hiprtc (loaded with
//!   libloading) per gfx architecture and cached on disk.
//! - [`connectivity`]: the xGMI link matrix from rocm-smi (libloading),
//!   registered for link kind `"xgmi"`.
//!
//! Building needs HIP headers (hip-sys; `HIP_PATH=/usr` with Debian's
//! `libamdhip64-dev`), so the crate is outside the workspace's default
//! members. Call [`link()`] from a binary so the registrations are linked.
//! No multicast anywhere.

#![deny(unsafe_code)]

pub mod allocator;
pub mod collectives;
pub mod connectivity;
#[allow(unsafe_code)]
pub mod driver;
pub mod kernels;
pub mod knobs;
pub mod symm_mem;

use std::sync::Arc;

pub use allocator::{RocmAllocation, RocmAllocator};
pub use collectives::{RocmCollectives, RocmCollectivesConfig};
pub use symm_mem::RocmSymmetricMemory;

use symm_core::{BackendRegistration, DeviceType, Result, SymmetricAllocator};

fn make_allocator() -> Result<Arc<dyn SymmetricAllocator>> {
    Ok(Arc::new(RocmAllocator))
}

inventory::submit! {
    BackendRegistration {
        device_type: DeviceType::Rocm,
        name: "symm-rocm",
        make: make_allocator,
    }
}

/// Forces this crate (and its inventory registrations: the allocator and the collectives) into
/// the final binary.
#[inline(never)]
pub fn link() {
    std::hint::black_box(make_allocator as fn() -> Result<Arc<dyn SymmetricAllocator>>);
    std::hint::black_box(
        collectives::make_collectives
            as fn(&symm_core::coll::CollectivesSetup<'_>) -> Result<Arc<dyn symm_core::coll::Collectives>>,
    );
}

/// Number of AMD GPUs HIP sees, or `Error::Unavailable` with the reason.
pub fn rocm_available() -> Result<usize> {
    match driver::runtime::device_count()? {
        0 => Err(symm_core::Error::Unavailable("HIP reports 0 devices".into())),
        n => Ok(n),
    }
}

/// Bytes in use (total - free) summed over every AMD GPU, for leak checks.
pub fn device_memory_used() -> Result<u64> {
    let mut used = 0u64;
    for d in 0..driver::runtime::device_count()? {
        driver::runtime::set_device(d as u32)?;
        let (free, total) = driver::runtime::mem_info()?;
        used += total.saturating_sub(free) as u64;
    }
    Ok(used)
}
