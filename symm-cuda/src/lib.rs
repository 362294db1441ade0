//! # symm-cuda (in progress)
//!
//! The CUDA backend of symm. See `docs/cuda.md`.

#![deny(unsafe_code)]

pub mod collectives;
#[allow(unsafe_code)]
pub mod driver;
pub mod kernels;
