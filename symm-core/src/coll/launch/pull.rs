//! The fused zero-copy pulls (NOTE [collectives-protocols], "Fused pull", "Two-shot pull"):
//! every rank reads its peers' registered buffers in place in one kernel between a checking
//! opening barrier and a closing one. Each op here looks its buffers up in the backend's
//! [`Registry`], checks what the kernel needs, builds the check word every rank must pass alike
//! (the offsets and sizes of the registered buffers, so ranks that passed different ones get a
//! mismatch instead of reading the wrong bytes) and launches one [`Entry::Pull`] (or its
//! two-rank specialisation).

use super::*;
use crate::coll::check::{ranges_overlap, ShardGeometry};
use crate::coll::layout::MAX_WORLD;
use crate::coll::registry::Registry;

impl Rig {
    /// [`AllReduceKernel::Pull`]: every rank reads every peer's whole input (registered) and
    /// reduces it into its own output, which must not overlap the input (peers read it while
    /// the output is written).
    pub fn all_reduce_pull(&self, to: &dyn Launcher, reg: &Registry, tuning: &Tuning, d: DeviceOp) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        let dt = kernel_dtype(dtype, "all_reduce")?;
        let bytes = count * dtype.size();
        let sym = reg.registered(input, bytes, "the zero-copy all-reduce pull needs its input")?;
        if ranges_overlap(input, bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "the zero-copy all-reduce pull cannot run in place (peers read the input while the output is written)"
                    .into(),
            ));
        }
        let hdr = &header(OpKind::AllReduce, dtype, count, Some(op), Mechanism::Pull);
        let p = self.all_reduce_pull_args(
            d,
            sym.ptrs,
            checked(hdr, &[3, sym.offset as u64, sym.alloc_size as u64]),
        );
        to.launch(&self.pull(dt, &p, tuning))
    }

    /// The one-shot pull's arguments: every rank's input (`peers`, this rank's own `d.input`),
    /// reduced into `d.output`; `check` the check word.
    pub fn all_reduce_pull_args(&self, d: DeviceOp, peers: [u64; MAX_WORLD], check: u32) -> args::Pull {
        let DeviceOp {
            input,
            output,
            count,
            op,
            ..
        } = d;
        args::Pull {
            mode: RingMode::AllReduce,
            op: kernel_op(op),
            out: output,
            n: count,
            srcs: args::per_rank(self.rank, self.world, input, &peers, 0),
            dsts: None,
            check,
        }
    }

    /// [`AllReduceKernel::PullTwoShot`] (3+ ranks; input and output both registered, equal or
    /// apart): each rank reduces its shard of the message ([`two_shot_shard`]) from every rank's
    /// input, read in place, and writes the result into every rank's output.
    pub fn all_reduce_pull_two_shot(
        &self,
        to: &dyn Launcher,
        reg: &Registry,
        tuning: &Tuning,
        d: DeviceOp,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        let dt = kernel_dtype(dtype, "all_reduce")?;
        let es = dtype.size();
        let bytes = count * es;
        let sym_out = reg.registered(output, bytes, "the two-shot pull needs its output")?;
        let sym_in = reg.registered(input, bytes, "the two-shot pull needs its input")?;
        let hdr = &header(OpKind::AllReduce, dtype, count, Some(op), Mechanism::Pull);
        let q = two_shot_shard(count, self.world, dtype);
        let start = (self.rank * q).min(count);
        let n = q.min(count - start);
        let off = (start * es) as u64;
        let check = checked(
            hdr,
            &[
                10,
                sym_in.offset as u64,
                sym_in.alloc_size as u64,
                sym_out.offset as u64,
                sym_out.alloc_size as u64,
            ],
        );
        let p = args::Pull {
            mode: RingMode::AllReduce,
            op: kernel_op(op),
            out: output + off,
            n,
            srcs: args::per_rank(self.rank, self.world, input + off, &sym_in.ptrs, off),
            dsts: Some(args::per_rank(self.rank, self.world, output + off, &sym_out.ptrs, off)),
            check,
        };
        to.launch(&self.pull(dt, &p, tuning))
    }

    /// [`ReduceScatterKernel::Pull`]: every rank reads its shard straight from every peer's
    /// (registered) input and reduces it; the output may be this rank's shard of the input.
    /// `g`: the geometry [`crate::coll::check::reduce_scatter`] accepted.
    pub fn reduce_scatter_pull(
        &self,
        to: &dyn Launcher,
        reg: &Registry,
        tuning: &Tuning,
        g: &ShardGeometry,
        d: DeviceOp,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        let dt = kernel_dtype(dtype, "reduce_scatter")?;
        let shard = g.own - input;
        let sym = reg.registered(input, g.whole_bytes, "the zero-copy reduce-scatter needs its input")?;
        let hdr = &header(OpKind::ReduceScatter, dtype, count, Some(op), Mechanism::Pull);
        let p = args::Pull {
            mode: RingMode::ReduceScatter,
            op: kernel_op(op),
            out: output,
            n: count,
            srcs: args::per_rank(self.rank, self.world, g.own, &sym.ptrs, shard),
            dsts: None,
            check: checked(hdr, &[4, sym.offset as u64, sym.alloc_size as u64]),
        };
        to.launch(&self.pull(dt, &p, tuning))
    }

    /// [`AllGatherKernel::Pull`]: every rank copies every peer's input straight into its output;
    /// the inputs registered, or in place in a registered output (rank s's input is slice s of
    /// its output). `dt`: the lanes [`crate::coll::check::all_gather`] returned; `d.op` is not
    /// used.
    pub fn all_gather_pull(
        &self,
        to: &dyn Launcher,
        reg: &Registry,
        tuning: &Tuning,
        dt: KernelDtype,
        d: DeviceOp,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            ..
        } = d;
        let hdr = &header(OpKind::AllGather, dtype, count, None, Mechanism::Pull);
        let bytes = count * dtype.size();
        let mut srcs = [0u64; MAX_WORLD];
        let in_place = input == output + (self.rank * bytes) as u64;
        let check = if let Some(sym) = in_place.then(|| reg.lookup(output, bytes * self.world)).flatten() {
            for (s, src) in srcs.iter_mut().enumerate().take(self.world) {
                *src = sym.ptrs[s] + (s * bytes) as u64;
            }
            checked(hdr, &[6, sym.offset as u64, sym.alloc_size as u64])
        } else {
            let sym = reg.registered(
                input,
                bytes,
                "the zero-copy all-gather pull needs its input (or, in place, its output)",
            )?;
            srcs = args::per_rank(self.rank, self.world, input, &sym.ptrs, 0);
            checked(hdr, &[5, sym.offset as u64, sym.alloc_size as u64])
        };
        let p = args::Pull {
            mode: RingMode::AllGather,
            op: 0,
            out: output,
            n: count,
            srcs,
            dsts: None,
            check,
        };
        to.launch(&self.pull(dt, &p, tuning))
    }
}
