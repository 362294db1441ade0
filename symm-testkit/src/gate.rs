//! The GPU gate: a GPU test without GPUs skips at run time and says why, or
//! fails when `SYMM_REQUIRE_GPUS=1`.
#![forbid(unsafe_code)]

use std::io::Write;

use symm_core::{get_allocator, DeviceType};

/// Environment variable that turns a skip into a failure.
pub const REQUIRE_GPUS_ENV: &str = "SYMM_REQUIRE_GPUS";

/// Why a test was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipReason(pub String);

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// True when `SYMM_REQUIRE_GPUS=1`.
pub fn gpus_required() -> bool {
    std::env::var(REQUIRE_GPUS_ENV).is_ok_and(|v| v == "1")
}

/// Why `min_devices` devices of `device_type` cannot be used here, if they
/// cannot (no backend linked, backend unavailable, too few devices). Pure:
/// prints nothing, never panics. The host device type is always available.
pub fn gpu_unavailable(device_type: DeviceType, min_devices: usize) -> Option<SkipReason> {
    if device_type == DeviceType::Host {
        return None;
    }
    let alloc = match get_allocator(device_type) {
        Ok(a) => a,
        Err(e) => return Some(SkipReason(format!("{device_type}: {e}"))),
    };
    match alloc.device_count() {
        Ok(n) if n >= min_devices => None,
        Ok(n) => Some(SkipReason(format!(
            "{device_type}: {n} device(s) present, {min_devices} needed"
        ))),
        Err(e) => Some(SkipReason(format!("{device_type}: {e}"))),
    }
}

/// The gate for a test needing `min_devices` devices of `device_type`.
/// Returns `None` when the test can run. Otherwise prints `skipped: <reason>`
/// to stderr (bypassing the harness's capture) and returns the reason, or,
/// with `SYMM_REQUIRE_GPUS=1`, panics (this is for tests: it fails them).
pub fn gpu_gate(device_type: DeviceType, min_devices: usize) -> Option<SkipReason> {
    let reason = gpu_unavailable(device_type, min_devices)?;
    if gpus_required() {
        panic!("{REQUIRE_GPUS_ENV}=1 but the test cannot run: {reason}");
    }
    let _ = writeln!(std::io::stderr(), "skipped: {reason}");
    Some(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_never_gated() {
        crate::link();
        assert_eq!(gpu_unavailable(DeviceType::Host, 64), None);
    }

    #[test]
    fn missing_backend_is_a_reason() {
        // symm-testkit links no GPU backend.
        let r = gpu_unavailable(DeviceType::Rocm, 1).unwrap();
        assert!(r.0.contains("rocm"), "{r}");
    }
}
