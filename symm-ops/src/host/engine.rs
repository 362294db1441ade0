//! The host engine's [`Engine`] implementation: resolves the op's buffers and runs the plan the
//! op handed it (the planner names the generic path: one-shot or two-shot for an all-reduce).

use symm_core::coll::epilogue_check::Rows;
use symm_core::{AllGatherKernel, AllReduceKernel, Error, Rank, ReduceScatterKernel, Result};

use super::epilogue::HostEpi;
use super::{HostEngine, In, Out};
use crate::buf::{Buf, BufMut};
use crate::engine::OpStream;
use crate::engine::{Caps, Cx, Engine, OpArgs};
use crate::epilogue::{EpiArgs, EpiPlan};
use crate::select::Plan;

impl HostEngine {
    /// `r`, told to the peers when it is this rank's refusal of its own arguments (NOTE
    /// [op-agreement]): the rejection takes the op's place in the group's sequence, so every
    /// peer's matching op fails with [`Error::Mismatch`]; unless every rank rejected it the
    /// group is out of step ([`Engine::take_told_peers`]).
    fn refuse<T>(&self, stream: OpStream<'_>, r: Result<T>) -> Result<T> {
        r.inspect_err(|e| {
            if Engine::reject(self, stream, e) {
                self.told.store(true, std::sync::atomic::Ordering::Release);
            }
        })
    }

    /// An out-of-place op's buffers, resolved (refusals told to the peers).
    fn resolve_apart<'i, 'o>(&self, cx: Cx<'_>, input: Buf<'i>, output: BufMut<'o>) -> Result<(In<'i>, Out<'o>)> {
        self.no_stream(cx.stream)?;
        let input = self.refuse(cx.stream, self.resolve_in(input))?;
        let out = self.refuse(cx.stream, self.resolve_out(output, false))?;
        Ok((input, out))
    }

    /// The host engine has no streams: an op given one is refused.
    fn no_stream(&self, stream: OpStream<'_>) -> Result<()> {
        self.refuse(
            stream,
            match stream {
                None => Ok(()),
                Some(_) => Err(Error::InvalidArgument(
                    "a CUDA stream given to an op of a host-engine communicator".into(),
                )),
            },
        )
    }
}

impl Engine for HostEngine {
    fn caps(&self) -> Caps {
        Caps {
            symm: true,
            ..Caps::default()
        }
    }

    fn all_reduce(&self, cx: Cx<'_>, plan: Plan<AllReduceKernel>, a: OpArgs<'_, Option<Buf<'_>>>) -> Result<()> {
        let OpArgs {
            input,
            output,
            count,
            dtype,
            op,
        } = a;
        self.no_stream(cx.stream)?;
        let in_place = input.is_none();
        let mut out = self.refuse(cx.stream, self.resolve_out(output, in_place))?;
        let input = match input {
            Some(b) => self.refuse(cx.stream, self.resolve_in(b))?,
            None => In::Output,
        };
        match plan {
            Plan::Kernel(AllReduceKernel::TwoShot) => self.two_shot(&input, &mut out, count, dtype, op),
            _ => self.one_shot(&input, &mut out, count, dtype, op),
        }
    }

    fn reduce_scatter(&self, cx: Cx<'_>, plan: Plan<ReduceScatterKernel>, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        // One generic path whatever the plan (the planner's plan names the pull: every rank
        // reads its segment).
        let _ = plan;
        let (input, mut out) = self.resolve_apart(cx, a.input, a.output)?;
        self.reduce_scatter(&input, &mut out, a.count, a.dtype, a.op)
    }

    fn all_gather(&self, cx: Cx<'_>, plan: Plan<AllGatherKernel>, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        // One generic path whatever the plan (it names the pull).
        let _ = plan;
        let (input, mut out) = self.resolve_apart(cx, a.input, a.output)?;
        self.all_gather(&input, &mut out, a.count, a.dtype)
    }

    fn barrier(&self, stream: OpStream<'_>, ranks: &[Rank]) -> Result<()> {
        self.no_stream(stream)?;
        HostEngine::barrier(self, ranks)
    }

    fn epilogue(&self, cx: Cx<'_>, _plan: EpiPlan, a: EpiArgs<'_>, rows: Rows) -> Result<()> {
        self.no_stream(cx.stream)?;
        let mut p = self.refuse(cx.stream, HostEpi::resolve(self, a))?;
        self.refuse(cx.stream, p.check(&rows))?;
        p.run(self, &rows)
    }

    fn reject(&self, _stream: OpStream<'_>, _e: &Error) -> bool {
        self.send_rejection().is_err_and(|e2| crate::engine::is_fatal(&e2))
    }

    fn take_told_peers(&self) -> bool {
        self.told.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        HostEngine::set_abort(self, abort)
    }
}
