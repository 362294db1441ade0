//! # symm-testkit
//!
//! Testing infrastructure for symm, and a backend that needs no GPU:
//!
//! - [`host`]: the host backend (one memfd per allocation, mapped by every
//!   rank: shared directly among threads, passed through `FdChannel` among
//!   processes; signal pads of atomics with the GPU kernels' protocol),
//!   registered for `DeviceType::Host`; call [`link`] to link it.
//! - [`launch`]: ranks as threads ([`run_threads`]) or as processes
//!   re-executing the test binary with torchrun's variables
//!   ([`run_processes`]; children branch on [`child_ctx`]); the `symmrun`
//!   binary runs any program that way around a TcpStore it hosts.
//! - [`fault`]: fault injection (`SYMM_FAULT=kill:<rank>:<point>`, or a
//!   thread-armed fault), at points backends mark with [`fault_point`].
//! - [`gate`]: [`gpu_gate`], skipping GPU tests without GPUs (failing them
//!   with `SYMM_REQUIRE_GPUS=1`).
//! - [`gpu_world`]: the worlds every multi-rank GPU suite runs at (distinct
//!   GPUs, and threads sharing one GPU at worlds 2, 3, 4 and 8) and
//!   [`gpu_world_tests!`], one test per world.
//! - [`conformance`]: the conformance suite, written once, instantiated per
//!   backend with [`conformance_tests!`]:
//!   `symm_testkit::conformance_tests!(host, symm_testkit::conformance::Backend::host(), [1, 2, 3, 5, 8]);`
//!
//! See `docs/testkit.md` for the internals.
#![deny(unsafe_code)]

pub mod conformance;
pub mod fault;
pub mod gate;
pub mod gpu_world;
pub mod host;
pub mod knobs;
pub mod launch;
mod store_host;

pub use fault::{fault_point, Fault};
pub use gate::{gpu_gate, shared_gpu_gate, SkipReason};
pub use gpu_world::{GpuWorld, Placement, GPU_WORLDS};
pub use host::link;
pub use launch::{
    child_ctx, child_rank, is_child, run_processes, run_threads, run_threads_with, Mode, RankCtx, TestResult,
};
