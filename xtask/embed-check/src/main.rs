//! An engine's view of symm-ops: its own cudarc (CUDA 12.8 bindings) beside symm-ops built
//! with `default-features = false, features = ["cuda"]`. Building proves the two agree on one
//! cudarc; running prints what the planner would do on two GPUs and whether a GPU is here.

use symm_ops::prelude::*;

fn main() {
    // symm's driver check looks for libcuda before calling into cudarc (which panics without it).
    let driver = match symm_ops::symm_cuda::driver::init() {
        Ok(()) => "a CUDA driver is present".to_string(),
        Err(e) => format!("no CUDA driver here: {e}"),
    };
    // The engine's own cudarc: the same crate and version symm-ops links.
    let _: Option<cudarc::driver::CudaStream> = None;
    let t = SelectionThresholds::defaults(EngineKind::Cuda, 2);
    let config = CommConfig::default().with_selection(t.clone());
    println!(
        "symm-embed-check: cudarc with CUDA 12.8 bindings and symm-ops (cuda) build together; {driver}; \
         two-rank Lamport bound {} bytes, staging {} bytes",
        t.lamport_max_bytes, config.staging_bytes
    );
}
