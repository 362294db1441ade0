//! The op methods of [`Communicator`] itself: each runs on the communicator's own stream
//! through [`OnStream`] (`comm.ops()`), or on another stream with `comm.on(&stream)`.

use super::*;

impl Communicator {
    /// The ops on `stream` instead of the communicator's (CUDA engine; a stream of the
    /// communicator's device): `comm.on(&stream).all_reduce(&mut x, ReduceOp::Sum)`. Stream
    /// ordered and graph-capturable like every op; consecutive ops of the communicator on
    /// different streams do not overlap (the communicator orders them; eager and captured ops
    /// apart, see [`OnStream`]), and
    /// ordering an op against your own work on its stream is yours, as with NCCL.
    #[cfg(feature = "cuda")]
    pub fn on<'c>(&'c self, stream: &'c Arc<cudarc::driver::CudaStream>) -> OnStream<'c> {
        OnStream::with(self, stream)
    }

    /// The ops on the communicator's own stream, as an [`OnStream`] (what the op methods below
    /// call).
    pub fn ops(&self) -> OnStream<'_> {
        OnStream::own(self)
    }

    /// All-reduce in place; the algorithm is picked by the selection table.
    pub fn all_reduce<'a>(&self, buf: impl Into<BufMut<'a>>, op: ReduceOp) -> Result<()> {
        self.ops().all_reduce(buf, op)
    }

    /// All-reduce `input` into `output` (same length and dtype); the algorithm is picked by
    /// the selection table.
    pub fn all_reduce_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        self.ops().all_reduce_out(input, output, op)
    }

    /// One-shot all-reduce, out of place: returns a new result (`Vec<T>` or `CudaSlice<T>`).
    /// Allocates the result; use [`Self::one_shot_all_reduce_out`] in hot loops and CUDA
    /// graphs.
    pub fn one_shot_all_reduce<'a, O: NewOutput>(&self, input: impl Into<Buf<'a>>, op: ReduceOp) -> Result<O> {
        self.ops().one_shot_all_reduce(input, op)
    }

    /// One-shot all-reduce into `output`.
    pub fn one_shot_all_reduce_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        self.ops().one_shot_all_reduce_out(input, output, op)
    }

    /// Two-shot all-reduce in place.
    pub fn two_shot_all_reduce<'a>(&self, buf: impl Into<BufMut<'a>>, op: ReduceOp) -> Result<()> {
        self.ops().two_shot_all_reduce(buf, op)
    }

    /// Two-shot all-reduce into `output`.
    pub fn two_shot_all_reduce_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        self.ops().two_shot_all_reduce_out(input, output, op)
    }

    /// All-reduce with an explicit algorithm; `input: None` means in place (`output` is also
    /// the input). [`AllReduceAlgo::Lamport`] runs as one-shot on the host engine; an
    /// algorithm the engine lacks is [`Error::Unavailable`].
    pub fn all_reduce_with(
        &self,
        algo: AllReduceAlgo,
        input: Option<Buf<'_>>,
        output: BufMut<'_>,
        op: ReduceOp,
    ) -> Result<()> {
        self.ops().all_reduce_with(algo, input, output, op)
    }

    /// Reduce-scatter, returning a new result of `input.len() / world` elements: rank r gets
    /// the reduction of every rank's r-th segment.
    pub fn reduce_scatter<'a, O: NewOutput>(&self, input: impl Into<Buf<'a>>, op: ReduceOp) -> Result<O> {
        self.ops().reduce_scatter(input, op)
    }

    /// Reduce-scatter `input` (`world * n` elements) into `output` (`n`).
    pub fn reduce_scatter_out<'a, 'b>(
        &self,
        input: impl Into<Buf<'a>>,
        output: impl Into<BufMut<'b>>,
        op: ReduceOp,
    ) -> Result<()> {
        self.ops().reduce_scatter_out(input, output, op)
    }

    /// All-gather, returning a new result of `input.len() * world` elements (rank r's input at
    /// `r * input.len()`).
    pub fn all_gather<'a, O: NewOutput>(&self, input: impl Into<Buf<'a>>) -> Result<O> {
        self.ops().all_gather(input)
    }

    /// All-gather `input` (`n` elements) into `output` (`world * n`).
    pub fn all_gather_out<'a, 'b>(&self, input: impl Into<Buf<'a>>, output: impl Into<BufMut<'b>>) -> Result<()> {
        self.ops().all_gather_out(input, output)
    }

    /// Barrier over `ranks` (this rank included; any order, no duplicates), or over the whole
    /// group with `None`. Every rank in the subset calls it.
    pub fn barrier(&self, ranks: Option<&[usize]>) -> Result<()> {
        self.ops().barrier(ranks)
    }

    /// All-reduce + residual + RMSNorm: [`OnStream::all_reduce_residual_rms_norm`].
    pub fn all_reduce_residual_rms_norm<'a>(
        &self,
        x: impl Into<Buf<'a>>,
        residual: impl Into<Buf<'a>>,
        norm: RmsNorm<'a>,
        norm_out: impl Into<BufMut<'a>>,
        residual_out: impl Into<BufMut<'a>>,
    ) -> Result<()> {
        self.ops()
            .all_reduce_residual_rms_norm(x, residual, norm, norm_out, residual_out)
    }

    /// In place: [`OnStream::all_reduce_residual_rms_norm_in_place`].
    pub fn all_reduce_residual_rms_norm_in_place<'a>(
        &self,
        x: impl Into<BufMut<'a>>,
        residual: impl Into<BufMut<'a>>,
        norm: RmsNorm<'a>,
    ) -> Result<()> {
        self.ops().all_reduce_residual_rms_norm_in_place(x, residual, norm)
    }

    /// All-reduce + residual: [`OnStream::all_reduce_residual`].
    pub fn all_reduce_residual<'a>(
        &self,
        x: impl Into<Buf<'a>>,
        residual: impl Into<Buf<'a>>,
        out: impl Into<BufMut<'a>>,
        hidden: usize,
    ) -> Result<()> {
        self.ops().all_reduce_residual(x, residual, out, hidden)
    }

    /// In place: [`OnStream::all_reduce_residual_in_place`].
    pub fn all_reduce_residual_in_place<'a>(
        &self,
        x: impl Into<BufMut<'a>>,
        residual: impl Into<BufMut<'a>>,
        hidden: usize,
    ) -> Result<()> {
        self.ops().all_reduce_residual_in_place(x, residual, hidden)
    }
}
