//! The safe, typed entries of [`CudaCollectives`]: the same ops as the raw-address ones (NOTE
//! [raw-addresses]) on cudarc device buffers (`CudaSlice`, `CudaView`, `CudaViewMut`, and
//! [`crate::SymmView`] for symmetric memory), whose element type, length and context are checked
//! here, so an embedder using symm-core and symm-cuda alone needs no `unsafe`. Addresses come
//! through cudarc's `DevicePtr` / `DevicePtrMut`, so cudarc's event tracking orders the op after
//! other streams' work on the buffers (and later work after the op); a tracked buffer is
//! refused while the stream is being captured (a capture cannot wait on an event recorded
//! outside it).

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice};
use symm_core::Scalar;

use super::*;

/// A buffer's checks: on this context's device, not tracked by events during a capture.
fn check_buffer<T, B: DeviceSlice<T>>(c: &CudaCollectives, stream: &CudaStream, b: &B, what: &str) -> Result<()> {
    let ctx = DeviceSlice::stream(b).context();
    if ctx.cu_ctx() != c.ctx.cu_ctx() {
        return Err(Error::InvalidArgument(format!(
            "{what} is on cuda:{}, these collectives on cuda:{}",
            ctx.ordinal(),
            c.ctx.ordinal()
        )));
    }
    if ctx.is_event_tracking() && crate::streams::capturing(stream)? {
        return Err(Error::InvalidArgument(format!(
            "{what}: a cudarc buffer with event tracking in a CUDA graph capture (cudarc would make the \
             capture wait on an event recorded outside it); use symmetric memory (SymmView) or disable \
             event tracking on the context"
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

/// An op's input and output, checked (device, capture, lengths `in_len` and `out_len` elements),
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
    check_buffer(c, stream, input, "input")?;
    check_buffer(c, stream, output, "output")?;
    check_len("input", input.len(), in_len)?;
    check_len("output", output.len(), out_len)?;
    let (src, _read) = input.device_ptr(stream);
    let (dst, _write) = output.device_ptr_mut(stream);
    op(src, dst)
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
        let count = output.len();
        pair(self, stream, input, output, (count, count), |src, dst| {
            #[allow(unsafe_code)]
            // SAFETY: `src` and `dst` are the addresses of live cudarc buffers of `count`
            // elements of `T` in this object's context (checked by `pair`); cudarc's guards order
            // the op with the buffers' events (they cannot be freed before the op's work on
            // `stream` completes), and the borrows keep the caller from touching them meanwhile.
            unsafe {
                self.all_reduce(stream, kernel, src, dst, count, T::DTYPE, op)
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
        check_buffer(self, stream, buf, "buffer")?;
        let count = buf.len();
        let (p, _guard) = buf.device_ptr_mut(stream);
        #[allow(unsafe_code)]
        // SAFETY: as in `all_reduce_into`: a live, checked buffer of `count` elements, input and
        // output at once.
        unsafe {
            self.all_reduce(stream, kernel, p, p, count, T::DTYPE, op)
        }
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
            #[allow(unsafe_code)]
            // SAFETY: live, checked buffers of `count * world` (input) and `count` (output)
            // elements of `T`; cudarc's guards order the op with the buffers' events.
            unsafe {
                self.reduce_scatter(stream, kernel, src, dst, count, T::DTYPE, op)
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
        let count = input.len();
        let lens = (count, count.saturating_mul(self.rig.world));
        pair(self, stream, input, output, lens, |src, dst| {
            #[allow(unsafe_code)]
            // SAFETY: live, checked buffers of `count` (input) and `count * world` (output)
            // elements of `T`; cudarc's guards order the op with the buffers' events.
            unsafe {
                self.all_gather(stream, kernel, src, dst, count, T::DTYPE)
            }
        })
    }
}
