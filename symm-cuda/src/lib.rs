//! # symm-cuda: the CUDA backend of symm
//!
//! Symmetric memory on NVIDIA GPUs through CUDA virtual memory management,
//! registered in symm-core's registry for [`symm_core::DeviceType::Cuda`]
//! (call [`link`] from a binary so the registration is linked in).
//!
//! Internals (details in `docs/cuda.md`):
//! - [`driver`]: the only module with `unsafe`: thin wrappers over
//!   `cudarc::driver::sys` with one status check ([`driver::check`]), RAII
//!   types for physical allocations, address ranges and mappings, fd
//!   export/import, copies, the pinned abort word, launches, NVRTC and NVML.
//! - [`allocator`]: [`CudaAllocator`] / [`CudaAllocation`]: one `cuMemCreate`
//!   per allocation holding buffer + signal pad + a small metadata area;
//!   its side of `symm_core::rendezvous` (which exchanges records through the
//!   store, then the handles: POSIX fds over `FdChannel` between processes,
//!   `Arc`s through a process table between threads): the record's CUDA
//!   fields, export, import, and the mapping of every peer with access for the
//!   local device.
//! - [`symm_mem`]: [`CudaSymmetricMemory`]: peer addresses (host and device
//!   arrays), blocking and stream-ordered barrier / put_signal / wait_signal,
//!   abort and error words, cudarc views ([`SymmView`]).
//! - [`kernels`]: the `.cu` files, compiled by NVRTC at first use for the
//!   device's architecture and cached on disk and per context.
//! - [`connectivity`]: the NVLink matrix from NVML, with fallbacks for masked
//!   remote PCI ids (NVML P2P status, CUDA P2P attributes).
//! - [`collectives`]: the collective kernels' host side (Lamport, ring,
//!   fused zero-copy pull, copy engine, subset barrier; NOTE
//!   [collectives-protocols] in symm-core's `kernels/collectives.cu`).
//! - [`streams`]: the few streams the library creates, shared per device and reused
//!   (NOTE [stream-budget]).
//! - [`probe`]: latency probes for the benchmark (`symm-bench --probe`).
//!
//! Threads: every rank thread uses the primary context of its device
//! ([`driver::context`]); every operation binds it to the calling thread
//! first. NVLink multicast (cuMulticast*, multimem, NVLS) is never used.

#![deny(unsafe_code)]

pub mod allocator;
pub mod collectives;
pub mod connectivity;
#[allow(unsafe_code)]
pub mod driver;
pub mod kernels;
pub mod knobs;
pub mod probe;
pub mod streams;
pub mod symm_mem;
pub mod trace;

pub use allocator::{CudaAllocation, CudaAllocator};
/// The cudarc this crate is built with (an embedder of symm-cuda alone uses the same).
pub use cudarc;
pub use symm_mem::{CudaSymmetricMemory, SymmView};

/// Forces this crate (and so its `inventory` registrations: the allocator,
/// the NVLink detector and the collectives) to be linked into a binary. Call it once, e.g.
/// at the start of `main` or of a test.
#[inline(never)]
pub fn link() {
    // Function pointers from the modules that hold the registrations, so the
    // linker keeps their object files (and the registrations with them).
    std::hint::black_box(allocator::make_allocator as fn() -> symm_core::Result<_>);
    std::hint::black_box(connectivity::detect_nvlink as fn() -> symm_core::Result<_>);
    std::hint::black_box(
        collectives::make_collectives
            as fn(
                &symm_core::coll::CollectivesSetup<'_>,
            ) -> symm_core::Result<std::sync::Arc<dyn symm_core::coll::Collectives>>,
    );
}

/// Number of CUDA devices, or [`symm_core::Error::Unavailable`] with the
/// reason (no driver library, no device).
pub fn cuda_available() -> symm_core::Result<usize> {
    match driver::device_count()? {
        0 => Err(symm_core::Error::Unavailable("no CUDA device found".into())),
        n => Ok(n),
    }
}

/// The CUDA symmetric memory behind a generic handle, if it is one.
pub fn as_cuda(mem: &dyn symm_core::SymmetricMemory) -> Option<&CudaSymmetricMemory> {
    mem.as_any().downcast_ref::<CudaSymmetricMemory>()
}
