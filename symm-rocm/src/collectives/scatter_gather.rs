//! The reduce-scatter and all-gather entries of [`RocmCollectives`]: Lamport, ring and the
//! zero-copy pull, each as symm-core's `Rig` plans it.

#![deny(unsafe_code)]

use symm_core::coll::check;
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::launch::{self, all_gather_at, reduce_scatter_at};
use symm_core::coll::{AllGatherKernel, ReduceScatterKernel};
use symm_core::{OpKind, Result};

use super::RocmCollectives;

impl RocmCollectives {
    /// Reduce-scatter by `kernel` ([`ReduceScatterKernel::Lamport`], [`ReduceScatterKernel::Ring`]
    /// or [`ReduceScatterKernel::Pull`], the input registered): `d.input` holds `d.count * world`
    /// elements, `d.output` receives this rank's `d.count` (in place when `d.output == d.input +
    /// rank * d.count` elements).
    ///
    /// # Safety
    /// As [`Self::all_reduce`], with `d.input` holding `d.count * world` elements and `d.output`
    /// `d.count`.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn reduce_scatter(&self, kernel: ReduceScatterKernel, d: DeviceOp) -> Result<()> {
        let geometry = check::reduce_scatter(d.input, d.output, d.count, d.dtype, (self.rig.rank, self.rig.world))?;
        let Some((_, g)) = geometry else {
            return self.agree_empty(OpKind::ReduceScatter, d.dtype, Some(d.op));
        };
        let tuning = &self.config.tuning;
        let (rig, reg) = (&self.rig, &self.registry);
        match reduce_scatter_at(kernel, self.rig.world) {
            k @ (ReduceScatterKernel::Lamport | ReduceScatterKernel::Ring) => {
                self.run("rocm reduce_scatter", |to| rig.reduce_scatter(to, k, tuning, d))
            }
            ReduceScatterKernel::Pull => self.run("rocm reduce_scatter (pull)", |to| {
                rig.reduce_scatter_pull(to, reg, tuning, &g, d)
            }),
            k => Err(launch::not_here(k, crate::driver::BACKEND)),
        }
    }

    /// All-gather by `kernel` ([`AllGatherKernel::Lamport`], [`AllGatherKernel::Ring`] or
    /// [`AllGatherKernel::Pull`], the input registered or in place in a registered output):
    /// `d.input` holds `d.count` elements, `d.output` `d.count * world` (in place when `d.input`
    /// is this rank's part of `d.output`); `d.op` is not used ([`DeviceOp::gather`]).
    ///
    /// # Safety
    /// As [`Self::all_reduce`], with `d.input` holding `d.count` elements and `d.output`
    /// `d.count * world`.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_gather(&self, kernel: AllGatherKernel, d: DeviceOp) -> Result<()> {
        let Some(dt) = check::all_gather(d.input, d.output, d.count, d.dtype, (self.rig.rank, self.rig.world))? else {
            return self.agree_empty(OpKind::AllGather, d.dtype, None);
        };
        let tuning = &self.config.tuning;
        let (rig, reg) = (&self.rig, &self.registry);
        match all_gather_at(kernel, self.rig.world) {
            k @ (AllGatherKernel::Lamport | AllGatherKernel::Ring) => {
                self.run("rocm all_gather", |to| rig.all_gather(to, k, tuning, dt, d))
            }
            AllGatherKernel::Pull => self.run("rocm all_gather (pull)", |to| {
                rig.all_gather_pull(to, reg, tuning, dt, d)
            }),
            k => Err(launch::not_here(k, crate::driver::BACKEND)),
        }
    }
}
