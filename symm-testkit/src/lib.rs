//! # symm-testkit
//!
//! Testing infrastructure for symm, and a backend that needs no GPU:
//!
//! - [`host`]: the host backend (memfd + mmap buffers mapped by every rank,
//!   signal pads of atomics with the GPU kernels' protocol), registered for
//!   `DeviceType::Host`.
//! - [`fault`]: fault injection (`SYMM_FAULT=kill:<rank>:<point>`).
#![deny(unsafe_code)]

pub mod fault;
pub mod host;

pub use fault::{fault_point, Fault};
pub use host::link;
