//! The CUDA extra of the kernel engine (`crate::kernel`): what only cudarc streams give. The
//! kernel engine runs symm-cuda's collectives through symm-core's `Collectives` trait like any
//! backend's; on a CUDA device it also holds a [`CudaSide`]: the communicator's stream and the
//! ordering of ops given other streams (events; captures), cudarc buffers resolved on the op's
//! stream (their own event tracking), and NCCL (cudarc), the fallback, which runs the plans that
//! name it on the NCCL communicator's stream (`nccl.rs`). Ops are enqueued on the op's stream: no
//! host synchronisation, no allocation, no store traffic, so they can be captured in a CUDA
//! graph.

pub(crate) mod nccl;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, SyncOnDrop};
use symm_core::coll::add_rms::Epilogue;
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::Queue;
use symm_core::{DType, Device, Error, Group, OpKind, Rank, ReduceOp, Result};

use crate::buf::{Buf, BufMut};
use crate::device::{DeviceInput, DeviceOutput};
use crate::engine::{Engine, OpStream};
use crate::kernel::Side;
use nccl::Nccl;
use symm_cuda::collectives::{CudaCollectives, Epilogues, ErrorProbe};

pub(crate) fn drv_err(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Backend {
        backend: "cuda",
        call: call.to_string(),
        detail: format!("{e:?}"),
    }
}

/// A new stream on `device`'s primary context (checks the driver and the
/// device first: cudarc panics without them).
pub(crate) fn new_stream(device: Device) -> Result<Arc<CudaStream>> {
    let n = symm_cuda::cuda_available()?;
    if device.index as usize >= n {
        return Err(Error::OutOfRange {
            what: "CUDA device index",
            value: device.index as u64,
            limit: n as u64,
        });
    }
    let ctx = CudaContext::new(device.index as usize).map_err(drv_err("cuDevicePrimaryCtxRetain"))?;
    ctx.new_stream().map_err(drv_err("cuStreamCreate"))
}

/// The device's UUID (unique across processes, whatever
/// CUDA_VISIBLE_DEVICES says), as hex.
pub(crate) fn device_uuid(stream: &CudaStream) -> Result<String> {
    let u = stream.context().uuid().map_err(drv_err("cuDeviceGetUuid"))?;
    Ok(u.bytes.iter().map(|&b| format!("{:02x}", b as u8)).collect())
}

/// A cudarc buffer's address aligned to its element. Not `coll::check::check_ptr`, which also
/// refuses a null address: cudarc's buffers are valid by construction, and an empty one may have
/// none (the op then moves nothing); raw addresses go through `check_ptr` in the kernels' checks.
fn check_align(what: &'static str, ptr: u64, dtype: DType) -> Result<()> {
    let a = dtype.size() as u64;
    if !ptr.is_multiple_of(a) {
        return Err(Error::Misaligned {
            what,
            value: ptr,
            align: a,
        });
    }
    Ok(())
}

/// The streams the communicator's last ops ran on (`None` before the first): the last op's, and,
/// as of the last switch of streams, the last eager op's and the last captured op's. Ops are
/// ordered after the previous op of their own kind only: a capture may not wait on work outside
/// it, and eager work does not wait on a capture.
#[derive(Default)]
pub(crate) struct Last {
    recent: Option<Arc<CudaStream>>,
    eager: Option<Arc<CudaStream>>,
    captured: Option<Arc<CudaStream>>,
}

fn same_stream(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream()
}

pub(crate) use symm_cuda::streams::capturing;

/// How the CUDA side is set up: every rank of the group passes the same.
pub(crate) struct CudaSetup<'a> {
    /// The op timeout.
    pub timeout: Duration,
    /// The symmetric-memory kernels are there (else NCCL only).
    pub symm: bool,
    /// Create NCCL (the config's `nccl`).
    pub nccl: bool,
    /// Why NCCL cannot serve this group although the config asks for it (ranks sharing a GPU),
    /// the same on every rank.
    pub no_nccl: Option<&'a str>,
    /// The config's PDL switch (the NCCL-only engine's own epilogue kernels).
    pub pdl: Option<bool>,
}

/// The CUDA extra of a kernel engine on a CUDA device (module docs).
pub(crate) struct CudaSide {
    device: Device,
    stream: Arc<CudaStream>,
    nccl: Option<Nccl>,
    /// One element NCCL all-reduces for a barrier when there are no kernels.
    barrier_word: Option<(CudaSlice<f32>, u64)>,
    /// Why NCCL was asked for but is not there.
    nccl_missing: Option<String>,
    /// The streams the last ops ran on; taken while the engine's op lock is held.
    last: Mutex<Last>,
    /// Orders an op after the previous op when their streams differ, and forks NCCL ops given
    /// another stream onto the NCCL communicator's stream and back (recorded, then waited on at
    /// once: one event serves every such edge).
    order: CudaEvent,
    /// The separate epilogue kernels of an NCCL-only engine (the kernels' own otherwise), or
    /// why they could not be loaded.
    own_epilogues: Option<std::result::Result<Epilogues, String>>,
}

impl CudaSide {
    /// The CUDA side on `stream` (of `device`), after the collectives (if any) were built: NCCL
    /// where `s` asks for it (collective: every rank agrees whether it is available).
    pub fn new(group: &Arc<Group>, device: Device, stream: Arc<CudaStream>, s: &CudaSetup<'_>) -> Result<Self> {
        let (symm, timeout) = (s.symm, s.timeout);
        let (nccl, nccl_missing) = if let (true, Some(why)) = (s.nccl, s.no_nccl) {
            if !symm {
                return Err(Error::Unavailable(format!(
                    "NCCL, the only engine for this group: {why}"
                )));
            }
            (None, Some(why.to_string()))
        } else if s.nccl {
            match nccl::agree_available(group, timeout)? {
                Ok(()) => (Some(Nccl::new(group, &stream, timeout)?), None),
                // The fallback is optional where the kernels can run.
                Err(why) if symm => (None, Some(why)),
                Err(why) => {
                    return Err(Error::Unavailable(format!(
                        "NCCL, the only engine for this group: {why}"
                    )))
                }
            }
        } else {
            (None, None)
        };
        // Its address taken once here: an op never goes through cudarc's event tracking for it
        // (a barrier may run inside a capture).
        let barrier_word = if symm {
            None
        } else {
            let w = stream.alloc_zeros::<f32>(1).map_err(drv_err("cuMemAlloc"))?;
            let p = w.device_ptr(&stream).0;
            Some((w, p))
        };
        let order = stream.context().new_event(None).map_err(drv_err("cuEventCreate"))?;
        // NCCL only: the epilogue kernels without the collectives' workspace (NVRTC may be
        // missing where NCCL is not; then only the epilogue ops are unavailable).
        let own_epilogues = (!symm).then(|| {
            Epilogues::load(stream.context(), s.pdl.unwrap_or_else(symm_cuda::knobs::pdl)).map_err(|e| e.to_string())
        });
        Ok(CudaSide {
            device,
            stream,
            nccl,
            barrier_word,
            nccl_missing,
            last: Mutex::new(Last::default()),
            order,
            own_epilogues,
        })
    }

    /// The communicator's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether NCCL is there.
    pub fn has_nccl(&self) -> bool {
        self.nccl.is_some()
    }

    /// Why NCCL is not there although the config asked for it.
    pub fn nccl_missing(&self) -> Option<String> {
        self.nccl_missing.clone()
    }

    /// The separate epilogue kernels of an NCCL-only engine (NOTE [fused-epilogue]).
    pub fn own_epilogues(&self) -> Result<&Epilogues> {
        match &self.own_epilogues {
            Some(Ok(e)) => Ok(e),
            Some(Err(why)) => Err(Error::Unavailable(format!("the all-reduce epilogue kernels: {why}"))),
            None => Err(Error::Unavailable("the all-reduce epilogue kernels".into())),
        }
    }

    fn nccl(&self) -> Result<&Nccl> {
        self.nccl
            .as_ref()
            .ok_or_else(|| Error::Unavailable("nccl on a communicator built with CommConfig::nccl = false".into()))
    }

    fn check_ctx(&self, ctx: &Arc<CudaContext>, what: &str) -> Result<()> {
        if ctx.ordinal() != self.device.index as usize {
            return Err(Error::InvalidArgument(format!(
                "{what} is on cuda:{}, the communicator on {}",
                ctx.ordinal(),
                self.device
            )));
        }
        Ok(())
    }

    /// A cudarc buffer with event tracking cannot be used in a capture: cudarc makes the op's
    /// stream wait on an event recorded before the capture began, which CUDA refuses (the
    /// capture is invalidated). Asked where such a buffer is resolved, before its event wait and
    /// before the op enqueues anything (every op resolves its buffers first). Whether the buffer
    /// tracks events is read from its context's setting now (a slice allocated while tracking
    /// was off, then switched on, is refused too). A driver query only for such buffers.
    fn refuse_tracked_in_capture(&self, s: &CudaStream, tracks_events: bool) -> Result<()> {
        if tracks_events && capturing(s)? {
            return Err(Error::InvalidArgument(
                "a cudarc buffer with event tracking in a CUDA graph capture (cudarc would make the \
                 capture wait on an event recorded outside it); use a buffer from Communicator::alloc, \
                 or disable event tracking on the context"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A cudarc input buffer's address on the op's stream `s`, with its stream guard.
    pub fn input<'s>(&self, s: &'s CudaStream, d: &'s dyn DeviceInput) -> Result<(u64, SyncOnDrop<'s>)> {
        self.check_ctx(d.context(), "input")?;
        self.refuse_tracked_in_capture(s, d.tracks_events())?;
        let (p, g) = d.read_ptr(s);
        check_align("input pointer", p, d.dtype())?;
        Ok((p, g))
    }

    /// A cudarc output buffer's address on the op's stream `s`, with its stream guard.
    pub fn output<'s>(&self, s: &'s CudaStream, d: &'s mut dyn DeviceOutput) -> Result<(u64, SyncOnDrop<'s>)> {
        self.check_ctx(d.context(), "output")?;
        self.refuse_tracked_in_capture(s, d.tracks_events())?;
        let dtype = d.dtype();
        let (p, g) = d.write_ptr(s);
        check_align("output pointer", p, dtype)?;
        Ok((p, g))
    }

    /// Runs `f` (an NCCL call) on the NCCL communicator's stream, ordered within `s`: when `s`
    /// is another stream, the NCCL stream waits for `s` first and `s` waits for the call after
    /// (an event each way; in a capture that forks the NCCL stream into it and joins it back).
    pub fn nccl_on(&self, s: &CudaStream, f: impl FnOnce(&Nccl) -> Result<()>) -> Result<()> {
        let nccl = self.nccl()?;
        if same_stream(s, &self.stream) {
            return f(nccl);
        }
        if capturing(&self.stream)? {
            return Err(Error::InvalidArgument(
                "an NCCL op on another stream while the communicator's own stream is being captured \
                 (NCCL runs on that stream): run it on the communicator's stream, or outside the capture"
                    .into(),
            ));
        }
        // While the op's stream is being captured the edge forks NCCL's stream into the capture
        // and the edge back joins it again, before the lock is released.
        self.edge(s, &self.stream)?;
        let r = f(nccl);
        // Joined back even when the call failed: a capture must not end with a forked stream.
        let j = self.edge(&self.stream, s);
        r.and(j)
    }

    /// An NCCL op (`kind` over `d`) on the op's stream `s` ([`Self::nccl_on`]).
    pub fn nccl_op(&self, s: &CudaStream, kind: OpKind, d: DeviceOp) -> Result<()> {
        let DeviceOp {
            input,
            output,
            count,
            dtype,
            op,
        } = d;
        self.nccl_on(s, |n| match kind {
            OpKind::AllReduce => n.all_reduce(input, output, count, dtype, op),
            OpKind::ReduceScatter => n.reduce_scatter(input, output, count, dtype, op),
            OpKind::AllGather => n.all_gather(input, output, count, dtype),
            k => Err(Error::Unavailable(format!("{k:?} through NCCL"))),
        })
    }

    /// A barrier without kernels: NCCL all-reduces one word (the whole group only).
    pub fn nccl_barrier(&self, s: &CudaStream, ranks: &[Rank]) -> Result<()> {
        let world = ranks.first().map(|r| r.world_size()).unwrap_or(0);
        if ranks.len() != world {
            return Err(Error::Unavailable(
                "a barrier over a subset of ranks on an nccl-only communicator".into(),
            ));
        }
        let p = self
            .barrier_word
            .as_ref()
            .map(|(_, p)| *p)
            .ok_or_else(|| Error::Unavailable("no engine for a barrier".into()))?;
        self.nccl_on(s, |n| n.all_reduce(p, p, 1, DType::F32, ReduceOp::Sum))
    }

    /// Makes `to` wait for the work queued on `from` so far.
    fn edge(&self, from: &CudaStream, to: &CudaStream) -> Result<()> {
        self.order.record(from).map_err(drv_err("cuEventRecord"))?;
        to.wait(&self.order).map_err(drv_err("cuStreamWaitEvent"))
    }

    /// The op's stream (`stream`, else the communicator's), checked to be of this device (an
    /// `InvalidArgument` the engine tells the peers) and ordered after the previous op when that
    /// ran on another stream. Called with the engine's op lock held.
    pub fn begin<'s>(&'s self, stream: OpStream<'s>) -> Result<&'s Arc<CudaStream>> {
        let mut l = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let s = match stream {
            Some(s) => {
                self.check_ctx(s.context(), "the op's stream")?;
                s
            }
            None => &self.stream,
        };
        // Ops share the workspace: never let two overlap. An eager op waits for the previous
        // eager op's stream; an op being captured for the previous captured op's stream while
        // that one is still being captured (one capture at a time per communicator: CUDA refuses
        // a wait across two captures). A graph's first op is ordered by where it is launched.
        // The launch path: the same stream as the op before it is ordered by the stream itself,
        // with no driver call. Only a switch of streams asks which streams are being captured.
        if l.recent.as_ref().is_some_and(|r| same_stream(r, s)) {
            return Ok(s);
        }
        // Each stream's capture state is asked once (the previous op's stream is usually the
        // previous op's stream of its kind too).
        let cap = capturing(s)?;
        let recent_cap = match &l.recent {
            Some(r) => Some(capturing(r)?),
            None => None,
        };
        if let (Some(r), Some(rc)) = (l.recent.take(), recent_cap) {
            *(if rc { &mut l.captured } else { &mut l.eager }) = Some(r);
        }
        let prev = if cap { &l.captured } else { &l.eager };
        if let Some(prev) = prev {
            // When the previous op's stream went to this kind's slot it is `prev`, state known.
            let prev_cap = if same_stream(prev, s) {
                None
            } else if recent_cap == Some(cap) {
                Some(cap)
            } else {
                Some(capturing(prev)?)
            };
            if prev_cap == Some(cap) {
                self.edge(prev, s)?;
            }
        }
        l.recent = Some(s.clone());
        Ok(s)
    }

    /// Where a refusal is told: the op's stream, or the communicator's when the op's stream is
    /// of another context (the refusal may be that very stream; the kernels run in this one).
    pub fn telling_stream<'s>(&'s self, stream: OpStream<'s>) -> &'s CudaStream {
        match stream {
            Some(s) if s.context().cu_ctx() == self.stream.context().cu_ctx() => s,
            _ => &self.stream,
        }
    }
}

/// The op's stream in `q` (a `Queue` from [`CudaSide::begin`] always names one).
fn op_stream<'s>(q: Queue<'s>) -> Result<&'s CudaStream> {
    q.get::<CudaStream>()
        .ok_or_else(|| Error::InvalidArgument("internal: a CUDA op without its stream".into()))
}

impl Side for CudaSide {
    fn begin<'s>(&'s self, stream: OpStream<'s>) -> Result<Queue<'s>> {
        CudaSide::begin(self, stream).map(|s| Queue::of(&**s))
    }

    fn telling<'s>(&'s self, stream: OpStream<'s>) -> Queue<'s> {
        Queue::of(self.telling_stream(stream))
    }

    fn input<'s>(&'s self, q: Queue<'s>, b: &'s Buf<'_>) -> Option<Result<(u64, crate::kernel::Guard<'s>)>> {
        match (b, q.get::<CudaStream>()) {
            (Buf::Device(d), Some(s)) => {
                Some(CudaSide::input(self, s, *d).map(|(p, g)| (p, crate::kernel::Guard::Cuda(g))))
            }
            _ => None,
        }
    }

    fn output<'s>(&'s self, q: Queue<'s>, b: &'s mut BufMut<'_>) -> Option<Result<(u64, crate::kernel::Guard<'s>)>> {
        match (b, q.get::<CudaStream>()) {
            (BufMut::Device(d), Some(s)) => {
                Some(CudaSide::output(self, s, &mut **d).map(|(p, g)| (p, crate::kernel::Guard::Cuda(g))))
            }
            _ => None,
        }
    }

    fn nccl_op(&self, q: Queue<'_>, kind: OpKind, d: DeviceOp) -> Result<()> {
        CudaSide::nccl_op(self, op_stream(q)?, kind, d)
    }

    fn nccl_barrier(&self, q: Queue<'_>, ranks: &[Rank]) -> Result<()> {
        CudaSide::nccl_barrier(self, op_stream(q)?, ranks)
    }

    // The one unsafe entry of the side (NOTE [raw-addresses]).
    #[allow(unsafe_code)]
    unsafe fn epilogue(&self, q: Queue<'_>, sum: u64, e: &Epilogue) -> Result<()> {
        let s = op_stream(q)?;
        // SAFETY: the caller's promise (`Side::epilogue`): `sum` and `e`'s addresses are this
        // device's memory, `e`'s rows long, held until the work is enqueued.
        unsafe { self.own_epilogues()?.launch(s, sum, e) }
    }

    fn has_nccl(&self) -> bool {
        CudaSide::has_nccl(self)
    }

    fn nccl_missing(&self) -> Option<String> {
        CudaSide::nccl_missing(self)
    }

    fn buffers(&self) -> &'static str {
        ", cudarc buffers"
    }
}

/// The CUDA stream `e`'s ops run on by default (a kernel engine with the CUDA side).
pub(crate) fn stream_of(e: &dyn Engine) -> Option<&Arc<CudaStream>> {
    let side: &dyn std::any::Any = e.side()?;
    side.downcast_ref::<CudaSide>().map(CudaSide::stream)
}

/// What reads the error `e`'s kernels latched (symm-cuda's collectives), for the host copies of
/// its buffers.
pub(crate) fn error_probe_of(e: &dyn Engine) -> Option<ErrorProbe> {
    e.collectives()?
        .as_any()
        .downcast_ref::<CudaCollectives>()
        .map(|c| c.error_probe())
}
