//! # symm-core
//!
//! The backend-agnostic heart of symm, modelled on PyTorch's c10d symmetric
//! memory:
//!
//! - [`SymmetricMemory`]: one rank's handle on a rendezvoused allocation —
//!   peer buffer and signal-pad addresses, typed views of peers' buffers
//!   ([`SymmetricMemoryExt::get_buffer`]), `barrier`, `put_signal`,
//!   `wait_signal`, all bounded by a timeout.
//! - [`SymmetricAllocator`]: alloc / free / rendezvous per device type,
//!   registered by backends through `inventory` ([`BackendRegistration`]) and
//!   found with [`get_allocator`].
//! - [`Group`]: name, rank, world size and store; [`set_group_info`] /
//!   [`group_info`] for one rank per process.
//! - [`SymmTensor`]: [`empty_strided_p2p`] with persistent `alloc_id`s,
//!   `rendezvous`, [`get_symmetric_memory`].
//! - Connectivity: link matrices from registered detectors and
//!   [`detect_topology`].
//! - [`fault`]: named fault points for fault-injection tests
//!   (`SYMM_FAULT=kill:<rank>:<point>`).
//! - [`pad`]: the signal-pad layout every backend and kernel shares
//!   (NOTE [signal-pad-layout]).
//! - [`rendezvous`]: the rendezvous protocol of every backend (records, checks, the handle
//!   exchange between threads or processes, fault points, the closing status exchange),
//!   driven through the small [`rendezvous::RendezvousBackend`] trait.
//! - [`kernel_source`]: the GPU kernels' source (the collectives and the pad's
//!   sync kernels), one text for every GPU vendor (each backend adds its vendor
//!   header and compiles it); [`kernel_cache`]: the compiled kernels' disk cache.
//! - [`coll`]: everything of the collectives that is not a vendor's, in one
//!   bounded tree: the explicit kernels symm-ops' planner names
//!   ([`AllReduceKernel`] and the others), what ranks agree on per op
//!   ([`OpDescriptor`]), and the host side every GPU backend launches the
//!   kernels with (argument lists, workspace layout, launch geometry, op
//!   agreement, the epilogue checks).
//!
//! symm-core depends on no backend. A program links one (symm-cuda,
//! symm-rocm, or the host backend in symm-testkit) and finds it by
//! [`DeviceType`].

// No unsafe block anywhere; declared contracts only (`coll::add_rms::Epilogue::new` and the op
// entries of `coll::Collectives`, `unsafe fn`s taking raw device addresses, NOTE
// [raw-addresses]), allowed where each is declared.
#![deny(unsafe_code)]

pub mod agree;
pub mod allocator;
pub mod coll;
pub mod connectivity;
pub mod error;
pub mod fault;
pub mod group;
pub mod kernel_cache;
pub mod kernel_source;
pub mod knobs;
mod liveness;
mod membership;
pub mod memory;
pub mod pad;
pub mod rendezvous;
pub mod tensor;
pub mod types;
pub mod watch;

pub use allocator::{
    get_allocator, has_allocator, registered_device_types, Allocation, BackendRegistration, SymmetricAllocator,
};
pub use coll::{AllGatherKernel, AllReduceKernel, OpDescriptor, OpKind, ReduceScatterKernel, VariantNames};
pub use connectivity::{
    check_device_sharing, check_same_host, check_shared_queues, detect_topology, get_connectivity, is_fully_connected,
    Connectivity, ConnectivityDetector, LinkMatrix, Topology,
};
pub use error::{Error, Result};
pub use fault::fault_point;
pub use group::{
    group_info, remove_group_info, set_group_info, Group, GroupOptions, JobId, ALLOW_OVERLAPPING_DEVICES_ENV,
    JOB_ID_ENVS, LAUNCH_ID_ENV,
};
pub use memory::{check_range, BufferView, SymmetricMemory, SymmetricMemoryExt};
pub use tensor::{
    contiguous_strides, empty_p2p, empty_strided_p2p, get_symmetric_memory, release_persistent, SymmTensor,
};
pub use types::{Channel, DType, Device, DeviceType, Rank, ReduceOp, Scalar};

pub use inventory;
pub use symm_store;
