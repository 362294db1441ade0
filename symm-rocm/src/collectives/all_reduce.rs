//! The all-reduce entry of [`RocmCollectives`]: the explicit kernels of [`AllReduceKernel`] it
//! runs (Lamport one-shot and two-shot, the ring one-shot and two-shot, the zero-copy pulls), each as symm-core's
//! `Rig` plans it.

#![deny(unsafe_code)]

use symm_core::coll::check;
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::launch::{self, all_reduce_at};
use symm_core::coll::AllReduceKernel;
use symm_core::{OpKind, Result};

use super::RocmCollectives;

impl RocmCollectives {
    /// All-reduce of `d.count` elements from `d.input` into `d.output` (equal: in place) by
    /// `kernel`, exactly (NOTE [one-planner]): [`AllReduceKernel::Lamport`],
    /// [`AllReduceKernel::LamportTwoShot`], [`AllReduceKernel::OneShot`],
    /// [`AllReduceKernel::TwoShot`], [`AllReduceKernel::Pull`] (input registered, apart from the
    /// output) or [`AllReduceKernel::PullTwoShot`] (input and output registered); a copy-engine
    /// kernel is refused, as is a zero-copy kernel whose buffers are not registered. Returns
    /// when the op is done.
    ///
    /// # Safety
    /// NOTE [raw-addresses]: `d.input` and `d.output` each hold `d.count` elements of `d.dtype`
    /// in device memory this rank's GPU can read and write, and stay allocated and untouched by
    /// anything but this op until it returns; should it return an error after launching (a
    /// timeout the device did not end), until the device has gone idle, as its kernels may
    /// still read and write them.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_reduce(&self, kernel: AllReduceKernel, d: DeviceOp) -> Result<()> {
        if check::all_reduce(d.input, d.output, d.count, d.dtype)?.is_none() {
            return self.agree_empty(OpKind::AllReduce, d.dtype, Some(d.op));
        }
        let tuning = &self.config.tuning;
        let (rig, reg) = (&self.rig, &self.registry);
        match all_reduce_at(kernel, self.rig.world) {
            k @ (AllReduceKernel::Lamport
            | AllReduceKernel::LamportTwoShot
            | AllReduceKernel::OneShot
            | AllReduceKernel::TwoShot) => self.run("rocm all_reduce", |to| rig.all_reduce(to, k, tuning, d)),
            AllReduceKernel::Pull => self.run("rocm all_reduce (pull)", |to| rig.all_reduce_pull(to, reg, tuning, d)),
            AllReduceKernel::PullTwoShot => self.run("rocm all_reduce (two-shot pull)", |to| {
                rig.all_reduce_pull_two_shot(to, reg, tuning, d)
            }),
            k => Err(launch::not_here(k, crate::driver::BACKEND)),
        }
    }
}
