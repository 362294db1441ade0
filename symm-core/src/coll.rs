//! The collectives, everything of them that is not a vendor's, written once for every GPU
//! backend: the explicit kernels symm-ops' planner names, what the ranks of an op agree on, and
//! the host side of the collective kernels in [`crate::kernel_source`] (what a backend needs
//! besides its driver to launch them). Pure functions of values every rank agrees on (NOTE
//! [collectives-protocols], NOTE [op-agreement]).
//!
//! The face: [`AllReduceKernel`], [`ReduceScatterKernel`], [`AllGatherKernel`] (the planner's
//! vocabulary, NOTE [one-planner]) and [`OpDescriptor`] / [`OpKind`] (re-exported at the crate
//! root too), then one module per concern, each used by the backends (symm-cuda, symm-rocm) as a
//! namespace; what no backend uses is `pub(crate)`:
//!
//! - [`launch`]: the launches of the in-kernel mechanisms (Lamport, ring, the fused zero-copy
//!   pulls, barrier, the empty op's agreement) planned once, which a backend's `Launcher` runs;
//! - [`add_rms`]: the all-reduce epilogue kernels' launches (the fused Lamport one and the
//!   separate one), their row layouts and the checked buffers of an epilogue op;
//! - [`epilogue_check`]: the row geometry and aliasing rules every engine of the epilogues
//!   checks alike, GPU or host;
//! - [`arg`]: one kernel argument and the packed parameter buffer;
//! - [`args`]: the argument list of every entry, each mirroring its `extern "C"` signature;
//! - [`layout`]: the collectives workspace (state words, flags, Lamport and ring slots),
//!   mirrored by the kernels' `COLL_ST_*` defines;
//! - [`geometry`]: grid shapes, chunking and sharding of a launch (which kernel runs is symm-ops'
//!   planner's choice, NOTE [one-planner]);
//! - [`op_agree`]: the op header and check words every launch carries, and the error a recorded
//!   disagreement becomes;
//! - [`check`]: the checks on an op's device addresses (null, alignment, overflow, overlap);
//! - [`registry`]: the symmetric allocations registered for the zero-copy kernels;
//! - [`backend`]: the [`Collectives`] trait every GPU backend's collectives implement, their
//!   [`CollFacts`], and the registry that finds them by device type.
//!
//! symm-cuda and symm-rocm launch the same entries with these same lists; CUDA's unit tests
//! check each list against the parameters NVRTC compiled.

pub mod add_rms;
pub mod arg;
pub mod args;
pub mod backend;
pub mod check;
pub mod epilogue_check;
pub mod geometry;
mod kernels;
pub mod launch;
pub mod layout;
pub mod op_agree;
mod op_desc;
pub mod registry;

pub use backend::{
    collectives_for, has_collectives, make_collectives, CollFacts, Collectives, CollectivesRegistration,
    CollectivesSetup, Queue,
};
pub use kernels::{AllGatherKernel, AllReduceKernel, ReduceScatterKernel};
pub use op_desc::{OpDescriptor, OpKind, VariantNames};
