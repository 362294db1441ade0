//! The ops, written once: [`OnStream`] runs them on a stream chosen per call
//! ([`Communicator::on`]) or on the communicator's own stream, and the
//! communicator's op methods are [`OnStream`]'s on its own stream.
//!
//! Ops on different streams are ordered by the communicator (they share its
//! workspace): an eager op on a stream other than the previous eager op's first
//! waits (an event, on the device) for the work queued on that stream so far,
//! and a captured op likewise for the previous captured op's stream while it is
//! still captured; eager and captured ops are not joined (a capture may not
//! wait on outside work). Ordering an op against the caller's own work on its
//! stream stays the caller's, as with NCCL.

#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use cudarc::driver::CudaStream;
use symm_core::{AllReduceKernel, DType, Error, OpKind, ReduceOp, Result};

use crate::buf::try_zeroed;
use crate::buf::{check_dtype, Buf, BufMut, Element};
use crate::comm::Communicator;
use crate::engine::{Cx, OpArgs, OpStream};
use crate::select::{AllGatherAlgo, AllReduceAlgo, Bufs, Placement, Plan, ReduceScatterAlgo, Side};

mod epilogue;

/// A result an out-of-place op allocates: `Vec<T>` (host engine) or
/// `cudarc::driver::CudaSlice<T>` (CUDA engine, allocated on the op's
/// stream).
pub trait NewOutput: Sized {
    /// A buffer of `len` elements of `dtype` for the op `on` runs (allocated on its stream).
    fn new_output(on: &OnStream<'_>, len: usize, dtype: DType) -> Result<Self>;
    /// The buffer as an op output.
    fn as_output(&mut self) -> BufMut<'_>;
}

impl<T: Element> NewOutput for Vec<T> {
    fn new_output(_on: &OnStream<'_>, len: usize, dtype: DType) -> Result<Self> {
        if dtype != T::DTYPE {
            return Err(Error::InvalidArgument(format!(
                "result type {} asked for a {dtype} input",
                T::DTYPE
            )));
        }
        try_zeroed(len, &format!("a {} result", T::DTYPE))
    }
    fn as_output(&mut self) -> BufMut<'_> {
        self.into()
    }
}

#[cfg(feature = "cuda")]
impl<T: Element + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> NewOutput
    for cudarc::driver::CudaSlice<T>
{
    fn new_output(on: &OnStream<'_>, len: usize, dtype: DType) -> Result<Self> {
        if dtype != T::DTYPE {
            return Err(Error::InvalidArgument(format!(
                "result type {} asked for a {dtype} input",
                T::DTYPE
            )));
        }
        let stream = on
            .stream()
            .ok_or_else(|| Error::InvalidArgument("a CudaSlice result from a host-engine communicator".into()))?;
        stream
            .alloc_zeros::<T>(len)
            .map_err(crate::cuda::drv_err("cuMemAllocAsync"))
    }
    fn as_output(&mut self) -> BufMut<'_> {
        self.into()
    }
}

/// Elements of an all-gather's output: `count` per rank, `w` ranks.
fn gathered_len(count: usize, w: usize) -> Result<usize> {
    count
        .checked_mul(w)
        .ok_or_else(|| Error::InvalidArgument(format!("all_gather: {count} elements x world {w} overflows")))
}

/// A communicator's ops on one stream: [`Communicator::on`] (a stream per
/// call) or the communicator's own (its op methods).
#[derive(Clone, Copy)]
pub struct OnStream<'c> {
    comm: &'c Communicator,
    stream: OpStream<'c>,
}

impl std::fmt::Debug for OnStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("OnStream");
        d.field("comm", self.comm);
        #[cfg(feature = "cuda")]
        d.field("stream", &self.stream.map(|s| s.cu_stream() as usize));
        d.finish_non_exhaustive()
    }
}

impl<'c> OnStream<'c> {
    /// The communicator's ops on its own stream.
    pub(crate) fn own(comm: &'c Communicator) -> Self {
        OnStream { comm, stream: None }
    }

    /// The communicator's ops on `stream`.
    #[cfg(feature = "cuda")]
    pub(crate) fn with(comm: &'c Communicator, stream: &'c Arc<CudaStream>) -> Self {
        OnStream {
            comm,
            stream: Some(stream),
        }
    }

    /// The stream the op was given (`None`: the communicator's own).
    pub(crate) fn stream_arg(&self) -> OpStream<'c> {
        self.stream
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The stream the ops run on (CUDA engine): the one given to
    /// [`Communicator::on`], else the communicator's.
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&'c Arc<CudaStream>> {
        self.stream.or_else(|| self.comm.stream())
    }

    /// [`Communicator::arg`] for an op on this stream: a refusal is told to the peers on the
    /// op's stream (NOTE [op-agreement]).
    pub(crate) fn arg<T>(&self, r: Result<T>) -> Result<T> {
        self.comm.arg(self.stream, r)
    }

    /// The op's context for the engine: its stream.
    pub(crate) fn cx(&self) -> Cx<'c> {
        Cx { stream: self.stream }
    }

    /// Whether `bytes` at the known address `p` lie in symmetric memory registered with the
    /// engine (an unknown address never does: `Buf::known_address`).
    fn registered(&self, p: Option<u64>, bytes: usize) -> bool {
        p.is_some_and(|p| self.comm.engine.is_registered(p, bytes))
    }

    /// `f` on what the planner asks of buffers placed as `at`: their placement, and whether the
    /// input's `in_bytes` / the output's `out_bytes` are registered (asked only when a plan
    /// needs it).
    fn with_bufs<R>(&self, at: Placement, in_bytes: usize, out_bytes: usize, f: impl FnOnce(&Bufs<'_>) -> R) -> R {
        f(&Bufs {
            in_place: at.in_place,
            apart: at.apart,
            registered: &|side| match side {
                Side::Input => self.registered(at.input, in_bytes),
                Side::Output => self.registered(at.output, out_bytes),
            },
        })
    }

    /// The plan of an all-reduce of `count` elements of `dtype` requested as `req`, on buffers
    /// placed as `at`: the buffers' facts once, then the planner (NOTE [one-planner]).
    pub(crate) fn plan_all_reduce(
        &self,
        req: AllReduceAlgo,
        at: Placement,
        count: usize,
        dtype: DType,
    ) -> Plan<AllReduceKernel> {
        let bytes = count * dtype.size();
        self.with_bufs(at, bytes, bytes, |b| self.comm.selector.plan_all_reduce(req, bytes, b))
    }

    // ---- all-reduce -------------------------------------------------------

    /// All-reduce in place; the algorithm is picked by the selection table.
    pub fn all_reduce<'a>(&self, buf: impl Into<BufMut<'a>>, op: ReduceOp) -> Result<()> {
        let buf = buf.into();
        let algo = self.comm.selector.all_reduce(buf.len() * buf.dtype().size());
        self.all_reduce_with(algo, None, buf, op)
    }

    /// All-reduce `input` into `output` (same length and dtype); the
    /// algorithm is picked by the selection table.
    pub fn all_reduce_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        let input = input.into();
        let algo = self.comm.selector.all_reduce(input.len() * input.dtype().size());
        self.all_reduce_with(algo, Some(input), output.into(), op)
    }

    /// One-shot all-reduce, out of place: returns a new result
    /// (`Vec<T>` or `CudaSlice<T>`). Allocates the result; use
    /// [`Self::one_shot_all_reduce_out`] in hot loops and CUDA graphs.
    pub fn one_shot_all_reduce<'a, O: NewOutput>(&self, input: impl Into<Buf<'a>>, op: ReduceOp) -> Result<O> {
        let input = input.into();
        let mut out = self.arg(O::new_output(self, input.len(), input.dtype()))?;
        self.all_reduce_with(AllReduceAlgo::OneShot, Some(input), out.as_output(), op)?;
        Ok(out)
    }

    /// One-shot all-reduce into `output`.
    pub fn one_shot_all_reduce_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_with(AllReduceAlgo::OneShot, Some(input.into()), output.into(), op)
    }

    /// Two-shot all-reduce in place.
    pub fn two_shot_all_reduce<'a>(&self, buf: impl Into<BufMut<'a>>, op: ReduceOp) -> Result<()> {
        self.all_reduce_with(AllReduceAlgo::TwoShot, None, buf.into(), op)
    }

    /// Two-shot all-reduce into `output`.
    pub fn two_shot_all_reduce_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        self.all_reduce_with(AllReduceAlgo::TwoShot, Some(input.into()), output.into(), op)
    }

    /// All-reduce with an explicit algorithm; `input: None` means in place
    /// (`output` is also the input). What runs is the planner's plan for the
    /// request and the buffers (a zero-copy request on buffers that do not
    /// qualify runs the table's pick without its zero-copy rows);
    /// [`AllReduceAlgo::Lamport`] runs as one-shot on the host engine; an
    /// algorithm the engine lacks is [`Error::Unavailable`].
    pub fn all_reduce_with(
        &self,
        algo: AllReduceAlgo,
        input: Option<Buf<'_>>,
        output: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        let count = output.len();
        let dtype = output.dtype();
        self.arg(check_dtype(dtype, "all_reduce"))?;
        if let Some(i) = &input {
            self.arg(check_same("all_reduce", i, &output, i.len()))?;
        }
        self.arg(self.comm.check_algo(algo))?;
        if count == 0 {
            if let Some(r) = self.comm.empty_op(self.stream, OpKind::AllReduce, dtype, Some(op)) {
                return r;
            }
        }
        let at = Placement::all_reduce(
            input.as_ref().map(Buf::known_address),
            output.known_address(),
            count * dtype.size(),
        );
        let a = OpArgs {
            input,
            output,
            count,
            dtype,
            op,
        };
        self.comm.run(|| {
            let plan = self.plan_all_reduce(algo, at, count, dtype);
            self.comm.engine.all_reduce(self.cx(), plan, a)
        })
    }

    // ---- reduce-scatter -----------------------------------------------------

    /// Reduce-scatter, returning a new result of `input.len() / world`
    /// elements: rank r gets the reduction of every rank's r-th segment.
    pub fn reduce_scatter<'a, O: NewOutput>(&self, input: impl Into<Buf<'a>>, op: ReduceOp) -> Result<O> {
        let input = input.into();
        let mut out = self.arg(O::new_output(self, input.len() / self.comm.world_size(), input.dtype()))?;
        self.reduce_scatter_out(input, out.as_output(), op)?;
        Ok(out)
    }

    /// Reduce-scatter `input` (`world * n` elements) into `output` (`n`).
    pub fn reduce_scatter_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        let (input, output) = (input.into(), output.into());
        let w = self.comm.world_size();
        let dtype = input.dtype();
        self.arg(check_dtype(dtype, "reduce_scatter"))?;
        if input.len() % w != 0 {
            return self.arg(Err(Error::InvalidArgument(format!(
                "reduce_scatter: input of {} elements is not a multiple of the world size {w}",
                input.len()
            ))));
        }
        let count = input.len() / w;
        self.arg(check_same("reduce_scatter", &input, &output, count))?;
        if count == 0 {
            if let Some(r) = self.comm.empty_op(self.stream, OpKind::ReduceScatter, dtype, Some(op)) {
                return r;
            }
        }
        let whole = input.len() * dtype.size();
        let algo: ReduceScatterAlgo = self.comm.selector.reduce_scatter(whole);
        let input_at = input.known_address();
        let a = OpArgs {
            input,
            output,
            count,
            dtype,
            op,
        };
        self.comm.run(|| {
            let plan = self
                .comm
                .selector
                .plan_reduce_scatter(algo, whole, &|| self.registered(input_at, whole));
            self.comm.engine.reduce_scatter(self.cx(), plan, a)
        })
    }

    // ---- all-gather ---------------------------------------------------------

    /// All-gather, returning a new result of `input.len() * world` elements
    /// (rank r's input at `r * input.len()`).
    pub fn all_gather<'a, O: NewOutput>(&self, input: impl Into<Buf<'a>>) -> Result<O> {
        let input = input.into();
        let len = self.arg(gathered_len(input.len(), self.comm.world_size()))?;
        let mut out = self.arg(O::new_output(self, len, input.dtype()))?;
        self.all_gather_out(input, out.as_output())?;
        Ok(out)
    }

    /// All-gather `input` (`n` elements) into `output` (`world * n`).
    pub fn all_gather_out<'a, 'b>(&self, input: impl Into<Buf<'a>>, output: impl Into<BufMut<'b>>) -> Result<()> {
        let (input, output) = (input.into(), output.into());
        let w = self.comm.world_size();
        let dtype = input.dtype();
        self.arg(check_dtype(dtype, "all_gather"))?;
        let count = input.len();
        let want = self.arg(gathered_len(count, w))?;
        self.arg(check_same("all_gather", &input, &output, want))?;
        if count == 0 {
            if let Some(r) = self.comm.empty_op(self.stream, OpKind::AllGather, dtype, None) {
                return r;
            }
        }
        let whole = want * dtype.size();
        let algo: AllGatherAlgo = self.comm.selector.all_gather(whole);
        let bytes = count * dtype.size();
        let at = Placement::all_gather(
            input.known_address(),
            output.known_address(),
            self.comm.rank().get(),
            bytes,
        );
        let a = OpArgs::gather(input, output, count, dtype);
        self.comm.run(|| {
            let plan = self.with_bufs(at, bytes, whole, |b| {
                self.comm.selector.plan_all_gather(algo, whole, dtype, b)
            });
            self.comm.engine.all_gather(self.cx(), plan, a)
        })
    }

    // ---- barrier ------------------------------------------------------------

    /// Barrier over `ranks` (this rank included; any order, no duplicates),
    /// or over the whole group with `None`. Every rank in the subset calls it.
    pub fn barrier(&self, ranks: Option<&[usize]>) -> Result<()> {
        let me = self.comm.rank();
        // A stack array (world <= MAX_WORLD_SIZE): a barrier allocates nothing.
        let mut buf = [me; symm_core::pad::MAX_WORLD_SIZE];
        let n = match ranks {
            None => {
                for (r, slot) in buf.iter_mut().enumerate().take(self.comm.world_size()) {
                    *slot = me.peer(r)?;
                }
                self.comm.world_size()
            }
            Some(list) => {
                if list.len() > self.comm.world_size() {
                    return Err(Error::InvalidArgument(format!(
                        "barrier: {} ranks listed in a group of {}",
                        list.len(),
                        self.comm.world_size()
                    )));
                }
                for (slot, &r) in buf.iter_mut().zip(list) {
                    *slot = me.peer(r)?;
                }
                let v = &mut buf[..list.len()];
                v.sort();
                if let Some(w) = v.windows(2).find(|w| w[0] == w[1]) {
                    return Err(Error::InvalidArgument(format!(
                        "barrier: rank {} listed twice",
                        w[0].get()
                    )));
                }
                if !v.contains(&me) {
                    return Err(Error::InvalidArgument(format!(
                        "barrier: ranks {list:?} do not include this rank {}",
                        me.get()
                    )));
                }
                list.len()
            }
        };
        let ranks = &buf[..n];
        self.comm.run(|| self.comm.engine.barrier(self.stream, ranks))
    }
}

/// Checks dtype equality and the output length.
fn check_same(op: &str, input: &Buf<'_>, output: &BufMut<'_>, want_out: usize) -> Result<()> {
    if input.dtype() != output.dtype() {
        return Err(Error::InvalidArgument(format!(
            "{op}: input is {}, output is {}",
            input.dtype(),
            output.dtype()
        )));
    }
    if output.len() != want_out {
        return Err(Error::InvalidArgument(format!(
            "{op}: output has {} elements, expected {want_out} (input has {})",
            output.len(),
            input.len()
        )));
    }
    Ok(())
}
