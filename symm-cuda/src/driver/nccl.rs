//! A cudarc NCCL communicator that may move between threads (symm-ops' NCCL fallback keeps one
//! per `Communicator`, which engines build on one thread and use on another), and the check that
//! libnccl can be loaded before anything calls cudarc's NCCL (its loader panics otherwise, and a
//! panic cannot be caught in a build with `panic = "abort"`).

use cudarc::nccl::Comm;
use symm_core::Result;

/// `Ok(())` if libnccl can be loaded (the candidate names cudarc tries), else
/// [`Error::Unavailable`]. Checked once per process.
pub fn available() -> Result<()> {
    super::libs::require(
        "nccl",
        "NCCL (libnccl.so) was not found; put its folder on LD_LIBRARY_PATH (e.g. site-packages/nvidia/nccl/lib \
         from the nvidia-nccl wheel; cudarc looks for libnccl.so)",
    )
}

/// Owns a [`Comm`] and may be sent to another thread; it is not `Sync`, so one thread at a time
/// uses it.
pub struct MovableComm(Comm);

// SAFETY: cudarc's `Comm` is `!Send` only because it holds the raw `ncclComm_t` (its other fields,
// an `Arc<CudaStream>` and two integers, are `Send`). NCCL allows a communicator to be used from
// any thread as long as no two threads use it at once; `MovableComm` is not `Sync`, so a `&Comm`
// obtained through it never reaches a second thread while the first may still use it, and moving
// it hands the only access to the new thread.
unsafe impl Send for MovableComm {}

impl MovableComm {
    pub fn new(comm: Comm) -> Self {
        MovableComm(comm)
    }

    pub fn get(&self) -> &Comm {
        &self.0
    }
}
