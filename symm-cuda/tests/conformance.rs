//! The conformance suite of symm-testkit on the CUDA backend: world sizes 1
//! and 2, ranks as threads (one process, one thread per GPU) and as
//! processes (one process per GPU, fds over the FdChannel). Every test passes
//! the GPU gate first: it skips (printing why) without enough GPUs, and fails
//! instead with `SYMM_REQUIRE_GPUS=1`.

use std::time::Duration;

use symm_core::{Device, DeviceType};
use symm_testkit::conformance::{Backend, Resource};

fn cuda_device(_rank: usize, local_rank: usize) -> Device {
    Device::cuda(local_rank as u32)
}

fn one_gpu_per_rank(world: usize) -> usize {
    world
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
    vec![("open fds", fds)]
}

fn cuda_slack(name: &str) -> u64 {
    // The driver may open an fd or two on first use of a feature (an extra
    // stream, the first kernel); a leak per cycle would show as hundreds.
    if name == "open fds" {
        8
    } else {
        0
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
        timeout: Duration::from_secs(60),
        fault_timeout: Duration::from_secs(3),
        launch_limit: Duration::from_secs(240),
        resources: Some(cuda_resources),
        resource_slack: cuda_slack,
        cycles: 300,
        link: symm_cuda::link,
    }
}

symm_testkit::conformance_tests!(cuda, cuda_backend(), [1, 2]);
