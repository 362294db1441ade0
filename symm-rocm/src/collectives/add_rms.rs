//! The all-reduce epilogues on ROCm (NOTE [fused-epilogue]): the fused Lamport one-shot and the
//! separate kernel, each launched as symm-core's `coll::add_rms` plans it for CUDA too (whole
//! rows: the rocm engine leaves the layout switches off, and never cluster rows, since AMD GPUs
//! have no thread-block clusters and the vendor header's cluster primitives are the one-block
//! forms). Synchronous, like every op of
//! [`RocmCollectives`].

#![deny(unsafe_code)]

use symm_core::coll::add_rms::{self, Epilogue};
use symm_core::Result;

use super::RocmCollectives;

impl RocmCollectives {
    /// The Lamport one-shot all-reduce (sum) of `e`'s input with the epilogue applied to each
    /// row as it completes (`Rig::fused_add_rms`: one kernel, or the handoff pair where the
    /// switch is on; the rocm engine leaves it off); returns when done. Every rank
    /// passes the same geometry and mechanism in the same op order (NOTE [op-agreement]). `e`'s
    /// buffers are device memory of this object's device, under [`Epilogue::new`]'s contract
    /// until this returns (or, after a timeout the device did not end, until the device is
    /// idle).
    pub fn lamport_epilogue(&self, e: &Epilogue) -> Result<()> {
        match self.rig.fused_add_rms(e, &self.config.tuning)? {
            Some(f) => self.run("rocm all-reduce epilogue (fused)", |to| f.run(to)),
            None => Ok(()),
        }
    }

    /// The separate epilogue kernel over `sum` (the all-reduced rows: `e`'s input, norm output
    /// or residual output, read before they are written), at most the grid budget's blocks
    /// ([`add_rms::separate`]); returns when done.
    ///
    /// # Safety
    /// `sum` holds `e.rows().count()` elements under [`Epilogue::new`]'s contract, which lasts
    /// until this returns (or, after a timeout the device did not end, until the device is
    /// idle).
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn epilogue(&self, sum: u64, e: &Epilogue) -> Result<()> {
        match add_rms::separate(sum, e, self.rig.grid.blocks)? {
            Some(l) => self.run("rocm all-reduce epilogue", |to| to.launch(&l)),
            None => Ok(()),
        }
    }
}
