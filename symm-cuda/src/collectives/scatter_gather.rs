//! The reduce-scatter and all-gather entries of [`CudaCollectives`]: SM push, zero-copy pull and
//! copy-engine paths, and their launches.

use super::*;

impl CudaCollectives {
    // ------------------------------------------------------------------ reduce-scatter

    /// Reduce-scatter by `kernel`, exactly (as [`Self::all_reduce`]: unmet preconditions are an
    /// error, nothing else runs instead): `d.input` holds `d.count * world` elements, `d.output`
    /// receives this rank's `d.count` (in place when `d.output == d.input + rank * d.count`
    /// elements). With one rank the Lamport kernel is the ring kernel's local copy.
    ///
    /// # Safety
    /// NOTE [raw-addresses], as [`Self::all_reduce`] with `d.input` holding `d.count * world`
    /// elements and `d.output` `d.count`.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn reduce_scatter(&self, stream: &CudaStream, kernel: ReduceScatterKernel, d: DeviceOp) -> Result<()> {
        let tuning = self.config.tuning;
        self.reduce_scatter_tuned(stream, kernel, &tuning, d)
    }

    /// [`Self::reduce_scatter`] with explicit launch tuning (every rank must pass the same).
    ///
    /// # Safety
    /// As [`Self::reduce_scatter`].
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn reduce_scatter_tuned(
        &self,
        stream: &CudaStream,
        kernel: ReduceScatterKernel,
        tuning: &Tuning,
        d: DeviceOp,
    ) -> Result<()> {
        let Some((dt, g)) = self.reduce_scatter_geometry(stream, d.input, d.output, d.count, d.dtype)? else {
            return Ok(());
        };
        tuning.validate()?;
        // One rank: the Lamport kernel is the ring kernel's local copy (the zero-copy kernels keep
        // their preconditions).
        match reduce_scatter_at(kernel, self.rig.world) {
            k @ (ReduceScatterKernel::Lamport | ReduceScatterKernel::Ring) => {
                self.rig.reduce_scatter(&self.on(stream), k, tuning, d)
            }
            ReduceScatterKernel::Pull => self
                .rig
                .reduce_scatter_pull(&self.on(stream), &self.registry, tuning, &g, d),
            ReduceScatterKernel::CopyEngine => self.reduce_scatter_ce(stream, dt, &g, d),
            k => Err(not_here(k)),
        }
    }

    /// Checks a reduce-scatter's arguments (`count` output elements; the input holds `count *
    /// world`); `None` when there is nothing to do.
    /// The checks every reduce-scatter entry makes (the stream, the dtype, the shard geometry);
    /// `None` for an empty shard.
    pub(super) fn reduce_scatter_geometry(
        &self,
        stream: &CudaStream,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
    ) -> Result<Option<(KernelDtype, ShardGeometry)>> {
        self.check_stream(stream)?;
        check::reduce_scatter(input, output, count, dtype, (self.rig.rank, self.rig.world))
    }

    /// Copy-engine reduce-scatter for an input in registered symmetric memory and an output
    /// outside it (two ranks; more are an error): after a barrier
    /// that checks the geometry, the copy engine pulls this rank's shard of the peer's input
    /// straight into `output`, in chunks that shrink towards the end ([`ce_rs_chunks`]), on a side
    /// stream; as each chunk lands the SMs reduce it in place with this rank's own shard
    /// (`output = own + output`, fp32, rank order), overlapping the next copy; a closing barrier
    /// (the peer reads this rank's input until then). No staging, no scratch. Bare copy-engine
    /// reads run at ~370 GB/s per direction with both GPUs copying, against ~333 for SM reads,
    /// but with the gaps between its chunked copies this path measured 417 us against the SM
    /// pull's 409 at 256 MiB on 2 x H200 (docs/benchmarks.md), so the planner does not pick it.
    /// `output` must not overlap `input` (in place: use the pull). Stream-ordered, allocates
    /// nothing, graph-capturable.
    fn reduce_scatter_ce(&self, stream: &CudaStream, dt: KernelDtype, g: &ShardGeometry, d: DeviceOp) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        if self.rig.world != 2 {
            return Err(Error::InvalidArgument(format!(
                "the copy-engine reduce-scatter runs on two ranks, this group has {} (use the pull)",
                self.rig.world
            )));
        }
        let es = dtype.size();
        let bytes = count * es;
        if ranges_overlap(input, g.whole_bytes, output, bytes) {
            return Err(Error::InvalidArgument(
                "the copy-engine reduce-scatter lands the peer's shard in its output: the output must not \
                 overlap the input (in place, use the pull)"
                    .into(),
            ));
        }
        let own = g.own;
        let shard = own - input;
        let sym = self
            .registry
            .registered(input, g.whole_bytes, "the copy-engine reduce-scatter needs its input")?;
        let peer = 1 - self.rig.rank;
        let hdr = &header(OpKind::ReduceScatter, dtype, count, Some(op), Mechanism::CopyEngine);
        let check = checked(hdr, &[8, sym.offset as u64, sym.alloc_size as u64]);
        let mask = self.rig.full_mask();
        self.launch_barrier(stream, mask, check)?;
        self.ce_pull_reduce(
            stream,
            dt,
            dtype,
            op,
            CePull {
                own,
                out: output,
                remote: sym.ptrs[peer] + shard,
                count,
                push_to: None,
            },
        )?;
        // The peer reads this rank's input until here.
        self.launch_barrier(stream, mask, 0)
    }

    // ------------------------------------------------------------------ all-gather

    /// All-gather by `kernel`, exactly (as [`Self::all_reduce`]: unmet preconditions are an
    /// error, nothing else runs instead): `d.input` holds `d.count` elements, `d.output`
    /// receives `d.count * world` (in place when `d.input == d.output + rank * d.count`
    /// elements); `d.op` is not used ([`DeviceOp::gather`]). With one rank every kernel is the
    /// ring kernel's local copy.
    ///
    /// # Safety
    /// NOTE [raw-addresses], as [`Self::all_reduce`] with `d.input` holding `d.count` elements
    /// and `d.output` `d.count * world`.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_gather(&self, stream: &CudaStream, kernel: AllGatherKernel, d: DeviceOp) -> Result<()> {
        let tuning = self.config.tuning;
        self.all_gather_tuned(stream, kernel, &tuning, d)
    }

    /// [`Self::all_gather`] with explicit launch tuning.
    ///
    /// # Safety
    /// As [`Self::all_gather`].
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn all_gather_tuned(
        &self,
        stream: &CudaStream,
        kernel: AllGatherKernel,
        tuning: &Tuning,
        d: DeviceOp,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            ..
        } = d;
        self.check_stream(stream)?;
        let Some(dt) = check::all_gather(input, output, count, dtype, (self.rig.rank, self.rig.world))? else {
            return Ok(());
        };
        tuning.validate()?;
        let kernel = all_gather_at(kernel, self.rig.world);
        match kernel {
            AllGatherKernel::Lamport | AllGatherKernel::Ring => {
                self.rig.all_gather(&self.on(stream), kernel, tuning, dt, d)
            }
            AllGatherKernel::CopyEnginePush | AllGatherKernel::CopyEnginePull | AllGatherKernel::CopyEngineStaged => {
                let hdr = &header(OpKind::AllGather, dtype, count, None, Mechanism::CopyEngine);
                self.all_gather_ce(stream, kernel, d, hdr)
            }
            AllGatherKernel::Pull => self
                .rig
                .all_gather_pull(&self.on(stream), &self.registry, tuning, dt, d),
            k => Err(not_here(k)),
        }
    }

    /// The copy-engine all-gathers: `kernel` is one of [`AllGatherKernel::CopyEnginePush`]
    /// (the output registered), [`AllGatherKernel::CopyEnginePull`] (the input registered) and
    /// [`AllGatherKernel::CopyEngineStaged`] (any buffers).
    pub(super) fn all_gather_ce(
        &self,
        stream: &CudaStream,
        kernel: AllGatherKernel,
        d: DeviceOp,
        hdr: &OpHeader,
    ) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            ..
        } = d;
        let bytes = count * dtype.size();
        let mask = self.rig.full_mask();
        let own = output + (self.rig.rank * bytes) as u64;
        let ce = self.ce.lock().unwrap_or_else(|e| e.into_inner());
        let fork = |ce: &CeState| -> Result<()> {
            ce.fork.record(stream).map_err(|e| from_driver(e, "cuEventRecord"))?;
            ce.copy_stream(stream)
                .wait(&ce.fork)
                .map_err(|e| from_driver(e, "cuStreamWaitEvent"))
        };
        let join = |ce: &CeState| -> Result<()> {
            ce.join
                .record(ce.copy_stream(stream))
                .map_err(|e| from_driver(e, "cuEventRecord"))?;
            stream.wait(&ce.join).map_err(|e| from_driver(e, "cuStreamWaitEvent"))
        };
        // Zero-copy, as (check word, per rank s: (destination, source) of its copy).
        let zero_copy = match kernel {
            AllGatherKernel::CopyEnginePush => {
                // Push: the output is registered (in place or not), so this rank's copy engine
                // writes its input into every peer's output slice between two barriers (the
                // opening one: every peer's output is free; the closing one: every write into
                // this rank's output has landed). Writes ran at ~389 GB/s per direction with
                // both GPUs copying, reads at ~370 (docs/benchmarks.md, bandwidth probes).
                let o = self.registry.registered(
                    output,
                    bytes * self.rig.world,
                    "the copy-engine all-gather push needs its output",
                )?;
                let slice = (self.rig.rank * bytes) as u64;
                let check = checked(hdr, &[7, o.offset as u64, o.alloc_size as u64]);
                Some((
                    check,
                    std::array::from_fn::<_, MAX_WORLD, _>(|s| (o.ptrs[s] + slice, input)),
                ))
            }
            AllGatherKernel::CopyEnginePull => {
                // Pull: peers' inputs are read in place between two barriers.
                let i = self
                    .registry
                    .registered(input, bytes, "the copy-engine all-gather pull needs its input")?;
                let check = checked(hdr, &[1, i.offset as u64, i.alloc_size as u64]);
                Some((check, std::array::from_fn(|s| (output + (s * bytes) as u64, i.ptrs[s]))))
            }
            _ => None,
        };
        if let Some((check, copies)) = zero_copy {
            self.launch_barrier(stream, mask, check)?;
            fork(&ce)?;
            for s in (0..self.rig.world).filter(|&s| s != self.rig.rank) {
                dtod_async(ce.copy_stream(stream), copies[s].0, copies[s].1, bytes)?;
            }
            if own != input {
                dtod_async(stream, own, input, bytes)?;
            }
            join(&ce)?;
        } else {
            // Staged: rounds through the two halves of every rank's ring area. A round's barrier
            // also means every peer finished pulling the round before (its join precedes its
            // barrier), so the half written next is free.
            let half = self.rig.layout.ring_bytes() / 2 / 16 * 16;
            if half == 0 {
                return Err(Error::InvalidArgument(
                    "staging area too small for the copy-engine path".into(),
                ));
            }
            let check = checked(hdr, &[2]);
            let ring_base = |rank: usize| self.mem.buffer_ptrs()[rank] + self.rig.layout.ring_off as u64;
            let rounds = bytes.div_ceil(half);
            for r in 0..rounds {
                let off = r * half;
                let n = half.min(bytes - off);
                let h = ((r % 2) * half) as u64;
                dtod_async(stream, ring_base(self.rig.rank) + h, input + off as u64, n)?;
                self.launch_barrier(stream, mask, check)?;
                fork(&ce)?;
                for s in (0..self.rig.world).filter(|&s| s != self.rig.rank) {
                    dtod_async(
                        ce.copy_stream(stream),
                        output + (s * bytes + off) as u64,
                        ring_base(s) + h,
                        n,
                    )?;
                }
                if own != input {
                    dtod_async(stream, own + off as u64, input + off as u64, n)?;
                }
                join(&ce)?;
            }
        }
        drop(ce);
        self.launch_barrier(stream, mask, 0)
    }
}
