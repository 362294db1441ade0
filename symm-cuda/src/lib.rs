//! # symm-cuda (in progress)
//!
//! The CUDA backend of symm. See `docs/cuda.md`.

pub mod collectives;
