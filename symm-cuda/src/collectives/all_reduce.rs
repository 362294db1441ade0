//! The all-reduce entry of [`CudaCollectives`]: the explicit kernels of
//! [`AllReduceKernel`] (Lamport one-shot and two-shot, the ring one-shot and two-shot, the zero-copy pulls, the
//! copy-engine paths) and their launches.

use super::*;

impl CudaCollectives {
    // ------------------------------------------------------------------ all-reduce

    /// All-reduce of `d.count` elements from `d.input` into `d.output` (may be equal: in place)
    /// by `kernel`, exactly: a kernel whose preconditions do not hold (a zero-copy kernel's buffers
    /// not registered, the copy-engine two-shot on more than two ranks, ...) is an error naming
    /// them; nothing else runs instead (the choice is symm-ops' planner's, NOTE [one-planner]).
    /// With one rank every
    /// kernel is the ring kernel's local reduction: nothing is exchanged.
    ///
    /// # Safety
    /// NOTE [raw-addresses]: `d.input` and `d.output` each hold `d.count` elements of `d.dtype`
    /// in device memory of this object's context (or mapped for it, registered symmetric memory
    /// included), and stay allocated and untouched by anything but this op until its work on
    /// `stream` has completed (for a captured op: until the graph's last launch has). A
    /// registered output may be written on every rank ([`AllReduceKernel::PullTwoShot`],
    /// [`AllReduceKernel::CopyEngineTwoShot`]): every rank passes an output in the same
    /// registered allocation at the same offset (the op's check word compares offsets and
    /// sizes, not which allocation).
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_reduce(&self, stream: &CudaStream, kernel: AllReduceKernel, d: DeviceOp) -> Result<()> {
        self.all_reduce_tuned(stream, kernel, &self.config.tuning, d)
    }

    /// [`Self::all_reduce`] with explicit launch tuning (every rank must pass the same).
    ///
    /// # Safety
    /// As [`Self::all_reduce`].
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_reduce_tuned(
        &self,
        stream: &CudaStream,
        kernel: AllReduceKernel,
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
        let Some((dt, _)) = self.all_reduce_args(stream, input, output, count, dtype)? else {
            return Ok(());
        };
        tuning.validate()?;
        // One rank: nothing to exchange; the ring kernel reduces the rank's own data (avg
        // divides by 1). The copy-engine two-shot is a two-rank kernel: refused below.
        let kernel = all_reduce_at(kernel, self.rig.world);
        let mech = all_reduce_mechanism(kernel).ok_or_else(|| not_here(kernel))?;
        let hdr = &header(OpKind::AllReduce, dtype, count, Some(op), mech);
        match kernel {
            AllReduceKernel::Lamport
            | AllReduceKernel::LamportTwoShot
            | AllReduceKernel::OneShot
            | AllReduceKernel::TwoShot => self.rig.all_reduce(&self.on(stream), kernel, tuning, d),
            AllReduceKernel::PullTwoShot => {
                self.rig
                    .all_reduce_pull_two_shot(&self.on(stream), &self.registry, tuning, d)
            }
            AllReduceKernel::Pull => self.rig.all_reduce_pull(&self.on(stream), &self.registry, tuning, d),
            AllReduceKernel::CopyEnginePull => self.all_reduce_ce(stream, dt, d, tuning, hdr),
            AllReduceKernel::CopyEngineTwoShot => self.all_reduce_ce_two_shot(stream, dt, d, hdr),
            k => Err(not_here(k)),
        }
    }

    /// `r.out[0..r.n] = reduce over ranks s of r.srcs[s][0..r.n]` on `stream`.
    pub(super) fn launch_reduce_ptrs(
        &self,
        stream: &CudaStream,
        dt: KernelDtype,
        r: &ReducePtrs<'_>,
        tuning: &Tuning,
    ) -> Result<()> {
        match self.rig.reduce_ptrs(dt, r, tuning) {
            Some(l) => self.on(stream).launch(&l),
            None => Ok(()),
        }
    }

    pub(super) fn launch_barrier(&self, stream: &CudaStream, mask: u64, check: u32) -> Result<()> {
        self.on(stream).launch(&self.rig.barrier(mask, check))
    }

    /// One fused zero-copy pull (opening barrier, pull, closing barrier in one kernel; NOTE
    /// [collectives-protocols], "Fused pull").
    pub(super) fn launch_pull(
        &self,
        stream: &CudaStream,
        dt: KernelDtype,
        p: &args::Pull,
        tuning: &Tuning,
    ) -> Result<()> {
        self.on(stream).launch(&self.rig.pull(dt, p, tuning))
    }

    pub(super) fn all_reduce_ce(
        &self,
        stream: &CudaStream,
        dt: KernelDtype,
        d: DeviceOp,
        tuning: &Tuning,
        hdr: &OpHeader,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        let es = dtype.size();
        let bytes = count * es;
        let sym = self
            .registry
            .registered(input, bytes, "the copy-engine all-reduce needs its input")?;
        if ranges_overlap(input, bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "the copy-engine all-reduce cannot run in place (peers read the input while the output is written)"
                    .into(),
            ));
        }
        let (ce_elems, chunk, nchunks, slots) = ce_split(count, dtype, &self.rig.layout, tuning)?;
        let check = checked(hdr, &[3, sym.offset as u64, sym.alloc_size as u64]);
        if ce_elems == 0 {
            // Pure SM pull: one fused kernel.
            let p = self.rig.all_reduce_pull_args(d, sym.ptrs, check);
            return self.launch_pull(stream, dt, &p, tuning);
        }
        let mask = self.rig.full_mask();
        self.launch_barrier(stream, mask, check)?;
        let ce = self.ce.lock().unwrap_or_else(|e| e.into_inner());
        if ce_elems > 0 {
            ce.fork.record(stream).map_err(|e| from_driver(e, "cuEventRecord"))?;
            ce.copy_stream(stream)
                .wait(&ce.fork)
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
        }
        // The part the SMs pull directly runs while the copy engine copies the rest.
        if ce_elems < count {
            let off = (ce_elems * es) as u64;
            let srcs = args::per_rank(self.rig.rank, self.rig.world, input + off, &sym.ptrs, off);
            let r = ReducePtrs {
                op,
                out: output + off,
                n: count - ce_elems,
                srcs: &srcs[..self.rig.world],
            };
            self.launch_reduce_ptrs(stream, dt, &r, tuning)?;
        }
        let w1 = self.rig.world - 1;
        let chunk_bytes = chunk * es;
        for c in 0..nchunks {
            let k = c % slots.min(CE_EVENTS);
            let start = c * chunk;
            let n = chunk.min(ce_elems - start);
            if c >= slots.min(CE_EVENTS) {
                ce.copy_stream(stream)
                    .wait(&ce.reduced[k])
                    .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
            }
            let mut srcs = [0u64; MAX_WORLD];
            for (s, src) in srcs.iter_mut().enumerate().take(self.rig.world) {
                if s == self.rig.rank {
                    *src = input + (start * es) as u64;
                    continue;
                }
                let l = peer_index(self.rig.rank, s, self.rig.world);
                let scratch = self.rig.ws() + (self.rig.layout.ring_off + (k * w1 + l) * chunk_bytes) as u64;
                dtod_async(
                    ce.copy_stream(stream),
                    scratch,
                    sym.ptrs[s] + (start * es) as u64,
                    n * es,
                )?;
                *src = scratch;
            }
            ce.copied[k]
                .record(ce.copy_stream(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream
                .wait(&ce.copied[k])
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
            let r = ReducePtrs {
                op,
                out: output + (start * es) as u64,
                n,
                srcs: &srcs[..self.rig.world],
            };
            self.launch_reduce_ptrs(stream, dt, &r, tuning)?;
            ce.reduced[k]
                .record(stream)
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
        }
        drop(ce);
        // Peers read this rank's input until here.
        self.launch_barrier(stream, mask, 0)
    }

    /// The checks every all-reduce entry makes (the stream, then symm-core's `coll::check`);
    /// `None` when there is nothing to move.
    pub(super) fn all_reduce_args(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
    ) -> Result<Option<(KernelDtype, usize)>> {
        self.check_stream(stream)?;
        check::all_reduce(input, output, count, dtype)
    }

    /// Copy-engine two-shot all-reduce (two ranks; input and output both in registered
    /// symmetric memory, at the same offsets on every rank, out of place): after a barrier that
    /// checks the geometry, each rank owns half of the message. A copy stream pulls the peer's
    /// input for this rank's half straight into the output in chunks that shrink towards the end
    /// ([`ce_rs_chunks`]); the SMs reduce each chunk in place as it lands (`output = input +
    /// output`, fp32, rank order); a second copy stream pushes each reduced chunk into the
    /// peer's output at once. So pulls, reductions and pushes overlap, and both NVLink
    /// directions carry the whole message once (the minimum for two ranks) through the copy
    /// engines, which moved ~370 GB/s (reads) and ~389 GB/s (writes) per direction with both
    /// GPUs copying, against ~333 for the SM pull (docs/benchmarks.md). A closing barrier: the
    /// peer's pushes into this output have landed and the peer no longer reads this input.
    /// Other world sizes, or inputs / outputs outside registered memory, get an error naming
    /// the requirement. Stream-ordered, allocates nothing, graph-capturable.
    pub(super) fn all_reduce_ce_two_shot(
        &self,
        stream: &CudaStream,
        dt: KernelDtype,
        d: DeviceOp,
        hdr: &OpHeader,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        let bytes = count * dtype.size();
        let es = dtype.size();
        if self.rig.world != 2 {
            return Err(Error::InvalidArgument(format!(
                "the copy-engine two-shot all-reduce runs on two ranks, this group has {}",
                self.rig.world
            )));
        }
        if ranges_overlap(input, bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "the copy-engine two-shot all-reduce runs out of place (the peer's half lands in the output)".into(),
            ));
        }
        let sin = self
            .registry
            .registered(input, bytes, "the copy-engine two-shot all-reduce needs its input")?;
        let sout = self
            .registry
            .registered(output, bytes, "the copy-engine two-shot all-reduce needs its output")?;
        let peer = 1 - self.rig.rank;
        let q = two_shot_shard(count, 2, dtype).min(count);
        let (start, n) = if self.rig.rank == 0 { (0, q) } else { (q, count - q) };
        let check = checked(
            hdr,
            &[
                9,
                sin.offset as u64,
                sin.alloc_size as u64,
                sout.offset as u64,
                sout.alloc_size as u64,
                count as u64,
                dt.index() as u64,
            ],
        );
        let mask = self.rig.full_mask();
        self.launch_barrier(stream, mask, check)?;
        if n > 0 {
            let off = (start * es) as u64;
            self.ce_pull_reduce(
                stream,
                dt,
                dtype,
                op,
                CePull {
                    own: input + off,
                    out: output + off,
                    remote: sin.ptrs[peer] + off,
                    count: n,
                    push_to: Some(sout.ptrs[peer] + off),
                },
            )?;
        }
        // The peer's pushes into this output have landed; it no longer reads this input.
        self.launch_barrier(stream, mask, 0)
    }

    /// The copy-engine pipeline of [`Self::reduce_scatter_ce`] and
    /// [`Self::all_reduce_ce_two_shot`] (two ranks): the copy stream pulls `p.remote` into
    /// `p.out` in chunks ([`ce_rs_chunks`]); as each lands, the SMs reduce it in place with
    /// `p.own` (rank order); with `push_to`, a second copy stream then pushes each reduced chunk
    /// there. Returns with every copy joined into `stream`.
    pub(super) fn ce_pull_reduce(
        &self,
        stream: &CudaStream,
        dt: KernelDtype,
        dtype: DType,
        op: ReduceOp,
        p: CePull,
    ) -> Result<()> {
        let es = dtype.size();
        let peer = 1 - self.rig.rank;
        let tuning = self.config.tuning;
        let ce = self.ce.lock().unwrap_or_else(|e| e.into_inner());
        ce.fork.record(stream).map_err(|e| from_driver(e, "cuEventRecord"))?;
        ce.copy_stream(stream)
            .wait(&ce.fork)
            .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
        let mut at = 0usize;
        let (chunks, nchunks) = ce_rs_chunks(p.count, dtype, CE_EVENTS);
        for (k, &m) in chunks[..nchunks].iter().enumerate() {
            let off = (at * es) as u64;
            dtod_async(ce.copy_stream(stream), p.out + off, p.remote + off, m * es)?;
            ce.copied[k]
                .record(ce.copy_stream(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream
                .wait(&ce.copied[k])
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
            let mut srcs = [0u64; 2];
            srcs[self.rig.rank] = p.own + off;
            srcs[peer] = p.out + off;
            let r = ReducePtrs {
                op,
                out: p.out + off,
                n: m,
                srcs: &srcs,
            };
            self.launch_reduce_ptrs(stream, dt, &r, &tuning)?;
            if let Some(dst) = p.push_to {
                ce.reduced[k]
                    .record(stream)
                    .map_err(|e| from_driver(e, "cuEventRecord"))?;
                ce.reduced_push_stream(stream)
                    .wait(&ce.reduced[k])
                    .map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
                dtod_async(ce.reduced_push_stream(stream), dst + off, p.out + off, m * es)?;
            }
            at += m;
        }
        if p.push_to.is_some() {
            ce.join
                .record(ce.reduced_push_stream(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream.wait(&ce.join).map_err(|e| from_driver(e, "cuStreamWaitEvent"))?;
        }
        Ok(())
    }
}
