//! The GPU gate: a GPU test without GPUs skips at run time and says why, or
//! fails when `SYMM_REQUIRE_GPUS=<n>` says this machine has the `n` GPUs it
//! needs.
//!
//! `SYMM_REQUIRE_GPUS=<n>` (what `cargo xtask test-multigpu` and the GPU
//! bundle's `run.sh tests` set to the machine's GPU count): a test that needs
//! at most `n` devices must run, so its skip is a failure; a test that needs
//! more skips and says so (on one GPU the shared-device suites run and the
//! distinct-GPU suites skip).
#![forbid(unsafe_code)]

use std::io::Write;

use symm_core::{get_allocator, DeviceType};

/// Environment variable that turns a skip into a failure (its value: how many
/// GPUs the run requires tests to use).
pub const REQUIRE_GPUS_ENV: &str = crate::knobs::REQUIRE_GPUS;

/// Why a test was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipReason(pub String);

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How many GPUs `SYMM_REQUIRE_GPUS` requires tests to use (0 when unset or
/// not a number: every gated test may skip).
pub fn gpus_required() -> usize {
    crate::knobs::get(REQUIRE_GPUS_ENV)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether a gate for `min_devices` devices fails instead of skipping when
/// `required` GPUs are required.
pub fn skip_is_failure(min_devices: usize, required: usize) -> bool {
    required > 0 && min_devices <= required
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

/// Why ranks cannot share a device of `device_type` here, if they cannot (no device, or what
/// [`SymmetricAllocator::shared_device_support`](symm_core::SymmetricAllocator) says is
/// missing). Pure, like [`gpu_unavailable`].
pub fn shared_device_unavailable(device_type: DeviceType) -> Option<SkipReason> {
    if let Some(r) = gpu_unavailable(device_type, 1) {
        return Some(r);
    }
    let alloc = get_allocator(device_type).ok()?;
    alloc
        .shared_device_support()
        .err()
        .map(|e| SkipReason(format!("{device_type}: ranks cannot share a device: {e}")))
}

/// The gate for a test whose ranks share one device of `device_type` (NOTE [shared-device]):
/// like [`gpu_gate`] for one device, plus [`shared_device_unavailable`].
pub fn shared_gpu_gate(device_type: DeviceType) -> Option<SkipReason> {
    gate_with(1, shared_device_unavailable(device_type))
}

/// The gate for a test needing `min_devices` devices of `device_type`.
/// Returns `None` when the test can run. Otherwise prints `skipped: <reason>`
/// to stderr (bypassing the harness's capture) and returns the reason, or,
/// when `SYMM_REQUIRE_GPUS` is at least `min_devices`, panics (this is for
/// tests: it fails them).
pub fn gpu_gate(device_type: DeviceType, min_devices: usize) -> Option<SkipReason> {
    gate_with(min_devices, gpu_unavailable(device_type, min_devices))
}

fn gate_with(min_devices: usize, reason: Option<SkipReason>) -> Option<SkipReason> {
    let reason = reason?;
    let required = gpus_required();
    if skip_is_failure(min_devices, required) {
        panic!("{REQUIRE_GPUS_ENV}={required} but the test (needing {min_devices} device(s)) cannot run: {reason}");
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
    fn required_count_decides_which_skips_fail() {
        // Unset: nothing fails. One GPU: shared-device tests (1 device) must run, distinct-GPU
        // ones (2) skip. Two GPUs: both must run; an 8-GPU test skips.
        assert!(!skip_is_failure(1, 0));
        assert!(skip_is_failure(1, 1));
        assert!(!skip_is_failure(2, 1));
        assert!(skip_is_failure(2, 2));
        assert!(!skip_is_failure(8, 2));
    }

    #[test]
    fn missing_backend_is_a_reason() {
        // symm-testkit links no GPU backend.
        let r = gpu_unavailable(DeviceType::Rocm, 1).unwrap();
        assert!(r.0.contains("rocm"), "{r}");
    }
}
