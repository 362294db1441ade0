//! The safe, typed entries of [`CudaCollectives`]: the same ops as the raw-address ones (NOTE
//! [raw-addresses]) on cudarc device buffers (`CudaSlice`, `CudaView`, `CudaViewMut`, and
//! [`crate::SymmView`] for symmetric memory), whose element type, length and context are checked
//! here, so an embedder using symm-core and symm-cuda alone needs no `unsafe`. Lifetimes:
//! - buffers cudarc tracks with events (or synchronises on the guard's drop) are ordered by
//!   cudarc: they cannot be freed before the op's work on the stream completes; the op returns
//!   once enqueued;
//! - buffers nothing tracks (a `SymmView`, a context with tracking off) could be freed while the
//!   kernel still runs, so with one of them the op waits (on the host, bounded by the op's
//!   timeout) for its work on the stream before it returns;
//! - the collectives' own workspace: the last typed op's completion is recorded (one event of
//!   theirs, re-recorded: nothing allocated per op), and dropping the collectives waits for it
//!   (bounded).
//!
//! The typed entries do not run while the stream is being captured into a graph: a tracked
//! buffer would make the capture wait on an event recorded outside it, and an untracked one
//! could not be kept alive for the graph's launches. Captures use the raw entries.
//!
//! Kernels that write into the peers' buffers (the two-shot pull, the copy-engine two-shot and
//! push) need every rank's output at the same place of one registered allocation, which no rank
//! can check alone: they are for the raw entries only.

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use symm_core::Scalar;

use super::*;

/// Whether cudarc orders the buffer's memory with the op (an event recorded, or the stream
/// synchronised, when the guard drops).
fn ordered(g: &SyncOnDrop<'_>) -> bool {
    matches!(g, SyncOnDrop::Record(Some(_)) | SyncOnDrop::Sync(Some(_)))
}

/// A kernel the typed entries refuse: it writes into the peers' outputs.
fn writes_peers(kernel: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!(
        "the {kernel} kernel writes into every peer's output, which must then lie at the same place of \
         one registered allocation on every rank: the typed entries cannot check that; use the raw \
         (unsafe) entry"
    ))
}

/// Refuses a stream being captured (the module's docs), before any buffer's address is taken
/// (taking a tracked one makes the stream wait on its events).
fn not_capturing(stream: &CudaStream) -> Result<()> {
    if crate::streams::capturing(stream)? {
        return Err(Error::InvalidArgument(
            "a typed collective entry while its stream is being captured into a CUDA graph: its buffers' \
             lifetimes cannot be kept for the graph's launches; use the raw (unsafe) entry"
                .into(),
        ));
    }
    Ok(())
}

/// A buffer's check: on this context's device.
fn check_buffer<T, B: DeviceSlice<T>>(c: &CudaCollectives, b: &B, what: &str) -> Result<()> {
    let ctx = DeviceSlice::stream(b).context();
    if ctx.cu_ctx() != c.ctx.cu_ctx() {
        return Err(Error::InvalidArgument(format!(
            "{what} is on cuda:{}, these collectives on cuda:{}",
            ctx.ordinal(),
            c.ctx.ordinal()
        )));
    }
    Ok(())
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::InvalidArgument(format!(
            "{what} holds {got} elements; the op needs {want}"
        )));
    }
    Ok(())
}

/// An op's input and output, checked (no capture, device, lengths `in_len` and `out_len` elements),
/// their addresses handed to `op` while cudarc's guards are held (they order the op with the
/// buffers' events when they drop, after `op` enqueued it).
fn pair<T, I, O, R>(
    c: &CudaCollectives,
    stream: &CudaStream,
    input: &I,
    output: &mut O,
    (in_len, out_len): (usize, usize),
    op: impl FnOnce(u64, u64) -> Result<R>,
) -> Result<R>
where
    I: DevicePtr<T>,
    O: DevicePtrMut<T>,
{
    not_capturing(stream)?;
    check_buffer(c, input, "input")?;
    check_buffer(c, output, "output")?;
    check_len("input", input.len(), in_len)?;
    check_len("output", output.len(), out_len)?;
    let (src, read) = input.device_ptr(stream);
    let (dst, write) = output.device_ptr_mut(stream);
    let untracked = !ordered(&read) || !ordered(&write);
    c.typed_op(stream, untracked, || op(src, dst))
}

impl CudaCollectives {
    /// [`Self::all_reduce`] on typed device buffers: `output.len()` elements of `input` (of the
    /// same length) reduced over the ranks into `output`, by `kernel`, on `stream`. Every rank
    /// passes the same kernel, length, type and op.
    pub fn all_reduce_into<T, I, O>(
        &self,
        stream: &CudaStream,
        kernel: AllReduceKernel,
        input: &I,
        output: &mut O,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: Scalar,
        I: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        refuse_writers(kernel)?;
        let count = output.len();
        pair(self, stream, input, output, (count, count), |src, dst| {
            let d = DeviceOp {
                input: src,
                output: dst,
                count,
                dtype: T::DTYPE,
                op,
            };
            #[allow(unsafe_code)]
            // SAFETY: `src` and `dst` are the addresses of live buffers of `count` elements of `T`
            // in this object's context (checked by `pair`); cudarc orders their memory with the
            // op, or `typed_op` waits for the op before they can be dropped; the borrows keep the
            // caller from touching them meanwhile; no kernel allowed here writes a peer's output.
            unsafe {
                self.all_reduce(stream, kernel, d)
            }
        })
    }

    /// [`Self::all_reduce_into`] in place in `buf`.
    pub fn all_reduce_in_place<T, B>(
        &self,
        stream: &CudaStream,
        kernel: AllReduceKernel,
        buf: &mut B,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: Scalar,
        B: DevicePtrMut<T>,
    {
        not_capturing(stream)?;
        check_buffer(self, buf, "buffer")?;
        refuse_writers(kernel)?;
        let count = buf.len();
        let (p, guard) = buf.device_ptr_mut(stream);
        self.typed_op(stream, !ordered(&guard), || {
            let d = DeviceOp {
                input: p,
                output: p,
                count,
                dtype: T::DTYPE,
                op,
            };
            #[allow(unsafe_code)]
            // SAFETY: as in `all_reduce_into`: a live, checked buffer of `count` elements, input
            // and output at once, ordered with the op by cudarc or waited for by `typed_op`.
            unsafe {
                self.all_reduce(stream, kernel, d)
            }
        })
    }

    /// [`Self::reduce_scatter`] on typed device buffers: `input` holds `output.len() * world`
    /// elements; this rank's reduced part lands in `output`.
    pub fn reduce_scatter_into<T, I, O>(
        &self,
        stream: &CudaStream,
        kernel: ReduceScatterKernel,
        input: &I,
        output: &mut O,
        op: ReduceOp,
    ) -> Result<()>
    where
        T: Scalar,
        I: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        let count = output.len();
        let lens = (count.saturating_mul(self.rig.world), count);
        pair(self, stream, input, output, lens, |src, dst| {
            let d = DeviceOp {
                input: src,
                output: dst,
                count,
                dtype: T::DTYPE,
                op,
            };
            #[allow(unsafe_code)]
            // SAFETY: live, checked buffers of `count * world` (input) and `count` (output)
            // elements of `T`, ordered with the op by cudarc or waited for by `typed_op`.
            unsafe {
                self.reduce_scatter(stream, kernel, d)
            }
        })
    }

    /// [`Self::all_gather`] on typed device buffers: `input` (`count` elements) from every rank
    /// into `output` (`count * world`, in rank order).
    pub fn all_gather_into<T, I, O>(
        &self,
        stream: &CudaStream,
        kernel: AllGatherKernel,
        input: &I,
        output: &mut O,
    ) -> Result<()>
    where
        T: Scalar,
        I: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        if kernel == AllGatherKernel::CopyEnginePush {
            return Err(writes_peers(kernel));
        }
        let count = input.len();
        let lens = (count, count.saturating_mul(self.rig.world));
        pair(self, stream, input, output, lens, |src, dst| {
            let d = DeviceOp::gather(src, dst, count, T::DTYPE);
            #[allow(unsafe_code)]
            // SAFETY: live, checked buffers of `count` (input) and `count * world` (output)
            // elements of `T`, ordered with the op by cudarc or waited for by `typed_op`; the
            // copy-engine push (which writes the peers' outputs) is refused above.
            unsafe {
                self.all_gather(stream, kernel, d)
            }
        })
    }
}

/// The all-reduce kernels the typed entries refuse ([`writes_peers`]).
fn refuse_writers(kernel: AllReduceKernel) -> Result<()> {
    match kernel {
        AllReduceKernel::PullTwoShot | AllReduceKernel::CopyEngineTwoShot => Err(writes_peers(kernel)),
        _ => Ok(()),
    }
}

impl CudaCollectives {
    /// Runs `enqueue` (one typed op on `stream`) with the lifetimes of the module's docs: waited
    /// for when a buffer is `untracked`; its completion recorded for [`Drop`].
    fn typed_op<R>(&self, stream: &CudaStream, untracked: bool, enqueue: impl FnOnce() -> Result<R>) -> Result<R> {
        let r = enqueue()?;
        self.typed_done
            .record(stream)
            .map_err(|e| from_driver(e, "cuEventRecord"))?;
        if untracked {
            crate::streams::wait_idle(
                stream,
                self.config.timeout.saturating_add(crate::streams::HOST_COPY_TIMEOUT),
                "a typed op on a buffer no event tracks",
            )?;
        }
        Ok(r)
    }
}
