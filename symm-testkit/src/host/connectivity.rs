//! Connectivity of host "devices": every rank reaches every other through
//! shared memory, so the `shm` link matrix is fully connected.
#![forbid(unsafe_code)]

use symm_core::pad::MAX_WORLD_SIZE;
use symm_core::{ConnectivityDetector, DeviceType, LinkMatrix, Result};

/// Link kind of the host detector.
pub const LINK_KIND: &str = "shm";

/// A fully connected matrix of [`MAX_WORLD_SIZE`] host devices, one link per pair.
pub fn detect() -> Result<LinkMatrix> {
    LinkMatrix::from_rows(
        (0..MAX_WORLD_SIZE)
            .map(|i| (0..MAX_WORLD_SIZE).map(|j| u32::from(i != j)).collect())
            .collect(),
    )
}

inventory::submit! {
    ConnectivityDetector {
        device_type: DeviceType::Host,
        link_kind: LINK_KIND,
        name: super::BACKEND_NAME,
        detect,
    }
}
