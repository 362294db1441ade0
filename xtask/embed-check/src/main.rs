//! An engine's view of symm-ops: its own cudarc (CUDA 12.8 bindings) beside symm-ops built
//! with `default-features = false, features = ["cuda"]`. Building proves the two agree on one
//! cudarc; running prints what the planner would do on two GPUs and whether a GPU is here, and
//! passes a fault point: CI runs it with `SYMM_FAULT=kill:0:rendezvous.before_send RANK=0`, and a
//! symm-ops built without its defaults must ignore that (symm-core's `fault-injection` compiled
//! in would end the process with status 137 there).

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
    // The fault point symm's rendezvous passes first; without symm-core's `fault-injection`
    // feature it reads no SYMM_FAULT and returns Ok(()).
    if let Err(e) = symm_ops::symm_core::fault_point("rendezvous.before_send") {
        eprintln!("symm-embed-check: fault point rendezvous.before_send: {e}");
        std::process::exit(1);
    }
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| "unset".into());
    println!(
        "symm-embed-check: fault point rendezvous.before_send passed (SYMM_FAULT={}, RANK={})",
        env("SYMM_FAULT"),
        env("RANK")
    );
    println!(
        "symm-embed-check: cudarc with CUDA 12.8 bindings and symm-ops (cuda) build together; {driver}; \
         two-rank Lamport bound {} bytes, staging {} bytes",
        t.lamport_max_bytes, config.staging_bytes
    );
}
