//! GPU gating for symm-rocm's tests: without an AMD GPU a test skips and says
//! why; with SYMM_REQUIRE_GPUS=1 it fails instead.

#![allow(dead_code)]

/// The number of AMD GPUs, or `None` (after printing why) when the test must skip.
pub fn gpus_or_skip(test: &str, need: usize) -> Option<usize> {
    let why = match symm_rocm::rocm_available() {
        Ok(n) if n >= need => return Some(n),
        Ok(n) => format!("needs {need} AMD GPUs, found {n}"),
        Err(e) => e.to_string(),
    };
    if std::env::var("SYMM_REQUIRE_GPUS").is_ok_and(|v| v == "1") {
        panic!("{test}: SYMM_REQUIRE_GPUS=1 but {why}");
    }
    // Straight to stderr, past the test harness's capture, so the skip is seen.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    None
}
