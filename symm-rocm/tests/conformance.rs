//! symm-testkit's conformance suite on the ROCm backend: one rank per AMD GPU,
//! threads and processes. Without AMD GPUs every case skips and says why
//! (SYMM_REQUIRE_GPUS=1 turns that into a failure).

use std::time::Duration;

use symm_core::{Device, DeviceType};
use symm_testkit::conformance::{Backend, Resource};

fn device(_rank: usize, local_rank: usize) -> Device {
    Device::rocm(local_rank as u32)
}

fn one_per_rank(world: usize) -> usize {
    world
}

fn resources() -> Vec<Resource> {
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    vec![
        ("open fds", fds),
        ("device memory", symm_rocm::device_memory_used().unwrap_or(0)),
    ]
}

fn slack(name: &str) -> u64 {
    match name {
        // the runtime opens a few descriptors lazily (kfd, render nodes)
        "open fds" => 8,
        // module loads and runtime pools; a leaked allocation is >= 2 MiB each
        "device memory" => 64 << 20,
        _ => 0,
    }
}

fn rocm() -> Backend {
    Backend {
        name: "rocm",
        device_type: DeviceType::Rocm,
        device_for_rank: device,
        min_devices: one_per_rank,
        threads: true,
        processes: true,
        shared_device: false,
        timeout: Duration::from_secs(60),
        fault_timeout: Duration::from_secs(3),
        launch_limit: Duration::from_secs(300),
        resources: Some(resources),
        resource_slack: slack,
        cycles: 200,
        link: symm_rocm::link,
    }
}

symm_testkit::conformance_tests!(rocm_conformance, rocm(), [1, 2, 4, 8]);
