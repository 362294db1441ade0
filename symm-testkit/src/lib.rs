//! # symm-testkit
//!
//! Testing infrastructure for symm, and a backend that needs no GPU:
//!
//! - [`host`]: the host backend (memfd + mmap buffers mapped by every rank,
//!   signal pads of atomics with the GPU kernels' protocol), registered for
//!   `DeviceType::Host`.
//! - [`launch`]: ranks as threads ([`run_threads`]) or as processes
//!   re-executing the test binary ([`run_processes`], torchrun's variables).
//! - [`fault`]: fault injection (`SYMM_FAULT=kill:<rank>:<point>`).
//! - [`gate`]: [`gpu_gate`], skipping GPU tests without GPUs (failing them
//!   with `SYMM_REQUIRE_GPUS=1`).
//! - [`conformance`]: the conformance suite, written once, instantiated per
//!   backend with [`conformance_tests!`].
#![deny(unsafe_code)]

pub mod conformance;
pub mod fault;
pub mod gate;
pub mod host;
pub mod launch;
mod store_host;

pub use fault::{fault_point, Fault};
pub use gate::{gpu_gate, SkipReason};
pub use host::link;
pub use launch::{child_ctx, child_rank, is_child, run_processes, run_threads, Mode, RankCtx, TestResult};
