//! The host backend: symmetric memory on ordinary CPU memory with the same
//! semantics as the GPU backends, so every layer runs in CI without a GPU.
//!
//! - [`allocator`]: [`HostAllocator`] / [`HostAllocation`]: one memfd per
//!   allocation (buffer, page-rounded, then the signal pad), and its side of
//!   `symm_core::rendezvous` (records checked on every rank before anything
//!   is mapped; memfds shared directly among threads of one process, passed
//!   through `FdChannel` among processes).
//! - [`symm_mem`]: [`HostSymmetricMemory`], the signal-pad protocol on
//!   atomics (NOTE [signal-pad-layout] in `symm_core::pad`).
//! - [`connectivity`]: the `shm` detector (fully connected).
//! - `mapping` (private): all unsafe code (memfd, mmap/munmap, atomic views).
//!
//! Registered for [`symm_core::DeviceType::Host`]; call
//! [`link`] from a binary that only names the backend through symm-core.

pub mod allocator;
pub mod connectivity;
#[allow(unsafe_code)]
mod mapping;
pub mod symm_mem;

use std::sync::Arc;

use symm_core::{BackendRegistration, DeviceType, Result, SymmetricAllocator};

pub use allocator::{HostAllocation, HostAllocator};
pub use symm_core::agree::host_id;
pub use symm_mem::HostSymmetricMemory;

/// Name under which the host backend registers.
pub const BACKEND_NAME: &str = "symm-testkit-host";

fn make() -> Result<Arc<dyn SymmetricAllocator>> {
    Ok(Arc::new(HostAllocator))
}

inventory::submit! {
    BackendRegistration {
        device_type: DeviceType::Host,
        name: BACKEND_NAME,
        make,
    }
}

/// Forces this crate to be linked, so the host backend's inventory
/// registrations are seen by `symm_core::get_allocator(DeviceType::Host)`.
#[inline(never)]
pub fn link() {
    std::hint::black_box(BACKEND_NAME);
}
