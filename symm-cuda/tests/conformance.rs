//! The conformance suite of symm-testkit on the CUDA backend:
//! - `cuda`: world sizes 1, 2, 4 and 8, one GPU per rank (a world needing more
//!   GPUs than the machine has skips), ranks as threads (one
//!   process, one thread per GPU) and as processes (one process per GPU, fds
//!   over the FdChannel);
//! - `cuda_shared`: world sizes 2, 3, 4 and 8, every rank a thread on GPU 0
//!   (NOTE [shared-device]), so the suite runs on a machine with one GPU.
//!
//! Every test passes the GPU gate first: it skips (printing why) without
//! enough GPUs, and fails instead when `SYMM_REQUIRE_GPUS` says the machine
//! has them. The alloc/free cycles check open fds and the device memory in
//! use against their baselines.

use std::time::Duration;

use symm_core::{Device, DeviceType};
use symm_testkit::conformance::{Backend, Resource};

fn cuda_device(_rank: usize, local_rank: usize) -> Device {
    Device::cuda(local_rank as u32)
}

fn one_gpu_per_rank(world: usize) -> usize {
    world
}

fn gpu_0(_rank: usize, _local_rank: usize) -> Device {
    Device::cuda(0)
}

fn one_gpu(_world: usize) -> usize {
    1
}

/// Open fds of this process, measured after the CUDA context of this
/// process's device exists (the driver opens its device files lazily, once).
fn cuda_resources() -> Vec<Resource> {
    let local = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    if let Err(e) = symm_cuda::driver::context(local) {
        eprintln!("cuda_resources: no context for device {local}: {e}");
    }
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let used_mib = symm_cuda::driver::context(local)
        .and_then(|c| symm_cuda::driver::mem_get_info(&c))
        .map(|(free, total)| ((total - free) >> 20) as u64)
        .unwrap_or(0);
    vec![("open fds", fds), ("device MiB in use", used_mib)]
}

fn cuda_slack(name: &str) -> u64 {
    // The driver may open an fd or two on first use of a feature (an extra
    // stream, the first kernel); a leak per cycle would show as hundreds.
    // Device memory: the driver's own pools may grow by a few MiB on first use; every cycle
    // maps at least 2 MiB per rank, so a leak per cycle would show as hundreds of MiB.
    match name {
        "open fds" => 8,
        "device MiB in use" => 64,
        _ => 0,
    }
}

fn cuda_backend() -> Backend {
    Backend {
        name: "cuda",
        device_type: DeviceType::Cuda,
        device_for_rank: cuda_device,
        min_devices: one_gpu_per_rank,
        threads: true,
        processes: true,
        shared_device: false,
        timeout: Duration::from_secs(60),
        fault_timeout: Duration::from_secs(3),
        launch_limit: Duration::from_secs(240),
        resources: Some(cuda_resources),
        resource_slack: cuda_slack,
        cycles: 300,
        link: symm_cuda::link,
    }
}

/// Every rank a thread on GPU 0 (processes cannot share a GPU: their contexts time-slice).
fn cuda_shared_backend() -> Backend {
    Backend {
        name: "cuda-shared",
        device_for_rank: gpu_0,
        min_devices: one_gpu,
        processes: false,
        shared_device: true,
        // Eight ranks' cycles on one GPU: fewer of them, a longer launch limit.
        cycles: 100,
        launch_limit: Duration::from_secs(300),
        ..cuda_backend()
    }
}

symm_testkit::conformance_tests!(cuda, cuda_backend(), [1, 2, 4, 8]);
symm_testkit::conformance_tests!(cuda_shared, cuda_shared_backend(), [2, 3, 4, 8]);
