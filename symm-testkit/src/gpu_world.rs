//! The worlds every multi-rank GPU suite runs at (NOTE [shared-device] in
//! docs/architecture.md): ranks on distinct GPUs (worlds 2, 4 and 8, the GPUs'
//! own links; a world needing more GPUs than the machine has skips) and rank
//! threads sharing device 0 at worlds 2, 3, 4 and 8, so the whole multi-rank
//! matrix runs on a machine with one GPU.
//!
//! [`gpu_world_tests!`](crate::gpu_world_tests) turns a `fn(GpuWorld)` into
//! one `#[test]` per world (`<name>::distinct_w2`, `<name>::shared_w8`...);
//! [`GpuWorld::run_threads`] gates it (a shared-device world needs one GPU, a
//! distinct one `world` GPUs) and launches the ranks.
#![forbid(unsafe_code)]

use std::io::Write;
use std::time::Duration;

use symm_core::DeviceType;

use crate::gate::{gpu_gate, shared_gpu_gate, SkipReason};
use crate::launch::{run_threads_with, RankCtx, TestResult, ThreadOptions};

/// Where the ranks of a GPU test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// One GPU per rank (device = local rank).
    Distinct,
    /// Every rank a thread on device 0, in a group that allows sharing.
    Shared,
}

/// A world size and placement of a GPU suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuWorld {
    pub world: usize,
    pub placement: Placement,
}

impl GpuWorld {
    pub const fn distinct(world: usize) -> GpuWorld {
        GpuWorld {
            world,
            placement: Placement::Distinct,
        }
    }
    pub const fn shared(world: usize) -> GpuWorld {
        GpuWorld {
            world,
            placement: Placement::Shared,
        }
    }

    /// Whether the ranks share one device.
    pub fn is_shared(&self) -> bool {
        self.placement == Placement::Shared
    }

    /// Devices the world needs.
    pub fn min_devices(&self) -> usize {
        match self.placement {
            Placement::Distinct => self.world,
            Placement::Shared => 1,
        }
    }

    /// `threads 2 on 2 GPUs`, `threads 8 on one GPU` (for SUMMARY lines).
    pub fn label(&self) -> String {
        match self.placement {
            Placement::Distinct => format!("threads {} on {} GPUs", self.world, self.world),
            Placement::Shared => format!("threads {} on one GPU", self.world),
        }
    }

    /// The gate of a test at this world on `device_type`: [`shared_gpu_gate`] for ranks sharing
    /// a device, else [`gpu_gate`] for `world` devices. `None` when the test can run.
    pub fn gate(&self, device_type: DeviceType) -> Option<SkipReason> {
        match self.placement {
            Placement::Distinct => gpu_gate(device_type, self.world),
            Placement::Shared => shared_gpu_gate(device_type),
        }
    }

    /// Thread-launch options for this world.
    pub fn thread_options(&self, limit: Duration) -> ThreadOptions {
        let mut o = ThreadOptions::new(self.world, limit);
        o.shared_device = self.is_shared();
        o
    }

    /// Gates on `device_type` ([`gpu_gate`]), then runs `f` on every rank as
    /// threads; `None` when skipped. Panics naming the world when a rank
    /// fails (this is for tests).
    pub fn run_threads<T, F>(&self, device_type: DeviceType, limit: Duration, f: F) -> Option<Vec<T>>
    where
        T: Send + 'static,
        F: Fn(RankCtx) -> TestResult<T> + Send + Sync + 'static,
    {
        self.gate(device_type).is_none().then_some(())?;
        match run_threads_with(&self.thread_options(limit), f) {
            Ok(v) => Some(v),
            Err(e) => panic!("{}: {e}", self.label()),
        }
    }
}

/// Every world of the GPU suites, in the order the generated tests run.
pub const GPU_WORLDS: [GpuWorld; 7] = [
    GpuWorld::distinct(2),
    GpuWorld::distinct(4),
    GpuWorld::distinct(8),
    GpuWorld::shared(2),
    GpuWorld::shared(3),
    GpuWorld::shared(4),
    GpuWorld::shared(8),
];

/// Prints `SUMMARY <line>` to stderr, past the harness's capture (the run's
/// notes collect these).
pub fn summary(line: &str) {
    let _ = writeln!(std::io::stderr(), "SUMMARY {line}");
}

/// One `#[test]` per world of [`GPU_WORLDS`], in `mod $name`, each calling
/// `$run(world)`:
///
/// ```text
/// fn all_reduce(w: GpuWorld) { /* w.run_threads(...) */ }
/// symm_testkit::gpu_world_tests!(coll_all_reduce, all_reduce);
/// ```
#[macro_export]
macro_rules! gpu_world_tests {
    ($name:ident, $run:ident) => {
        mod $name {
            #[test]
            fn distinct_w2() {
                super::$run($crate::gpu_world::GpuWorld::distinct(2))
            }
            #[test]
            fn distinct_w4() {
                super::$run($crate::gpu_world::GpuWorld::distinct(4))
            }
            #[test]
            fn distinct_w8() {
                super::$run($crate::gpu_world::GpuWorld::distinct(8))
            }
            #[test]
            fn shared_w2() {
                super::$run($crate::gpu_world::GpuWorld::shared(2))
            }
            #[test]
            fn shared_w3() {
                super::$run($crate::gpu_world::GpuWorld::shared(3))
            }
            #[test]
            fn shared_w4() {
                super::$run($crate::gpu_world::GpuWorld::shared(4))
            }
            #[test]
            fn shared_w8() {
                super::$run($crate::gpu_world::GpuWorld::shared(8))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worlds_and_their_devices() {
        assert_eq!(GPU_WORLDS.iter().filter(|w| w.is_shared()).count(), 4);
        assert_eq!(GPU_WORLDS.iter().filter(|w| !w.is_shared()).count(), 3);
        assert_eq!(GpuWorld::distinct(8).min_devices(), 8);
        assert_eq!(GpuWorld::shared(8).min_devices(), 1);
        assert_eq!(GpuWorld::distinct(2).min_devices(), 2);
        assert!(GpuWorld::shared(3).thread_options(Duration::from_secs(1)).shared_device);
        assert!(
            !GpuWorld::distinct(2)
                .thread_options(Duration::from_secs(1))
                .shared_device
        );
        assert_eq!(GpuWorld::shared(4).label(), "threads 4 on one GPU");
    }

    #[test]
    fn a_shared_launch_places_every_rank_on_device_0_and_allows_sharing() {
        crate::link();
        let w = GpuWorld::shared(3);
        let out = w
            .run_threads(DeviceType::Host, Duration::from_secs(30), |ctx| {
                let g = ctx.group(&ctx.unique("gpu-world"))?;
                Ok((ctx.gpu(), g.options().shared_devices, ctx.local_rank))
            })
            .expect("host is never gated");
        assert_eq!(out, vec![(0, true, 0), (0, true, 1), (0, true, 2)]);
        let out = GpuWorld::distinct(2)
            .run_threads(DeviceType::Host, Duration::from_secs(30), |ctx| Ok(ctx.gpu()))
            .expect("host is never gated");
        assert_eq!(out, vec![0, 1]);
    }
}
