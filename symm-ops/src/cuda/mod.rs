//! The CUDA engine: symm-cuda's collective kernels on symmetric memory,
//! with NCCL (cudarc) as the fallback. Every op resolves its buffers to
//! device addresses (cudarc slices through their own event tracking), asks
//! the planner what runs, and enqueues it on the op's stream: no host
//! synchronisation, no allocation, no store traffic, so ops can be captured
//! in a CUDA graph. This file holds the engine's setup, its stream ordering,
//! buffer resolution and refusals; `engine.rs` the ops ([`crate::engine::Engine`]),
//! `epilogue.rs` the epilogues, `nccl.rs` NCCL.

mod engine;
mod epilogue;
pub(crate) mod nccl;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DeviceRepr, SyncOnDrop, ValidAsZeroBits,
};
use symm_core::{DType, Device, Error, Group, Result, SymmTensor};

use crate::buf::{check_symm_tensor, Buf, BufMut, Element};
use crate::comm::CommConfig;
use crate::engine::is_refusal;
use crate::ops::{NewOutput, OnStream, OpStream};
use nccl::Nccl;
use symm_cuda::collectives::{CollectivesConfig, CudaCollectives, Epilogues};

fn drv_err(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
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

pub(crate) struct CudaEngine {
    device: Device,
    /// This rank.
    rank: usize,
    stream: Arc<CudaStream>,
    coll: Option<CudaCollectives>,
    nccl: Option<Nccl>,
    /// One element NCCL all-reduces for a barrier when there are no kernels.
    barrier_word: Option<(CudaSlice<f32>, u64)>,
    /// Why NCCL was asked for but is not there.
    nccl_missing: Option<String>,
    /// Held by the op running; the stream the last op ran on.
    lock: Mutex<Last>,
    /// Orders an op after the previous op when their streams differ, and forks NCCL ops given
    /// another stream onto the NCCL communicator's stream and back (recorded, then waited on at
    /// once: one event serves every such edge).
    order: CudaEvent,
    /// Set when this engine told its peers it rejected an op ([`Self::take_told_peers`]).
    told_peers: AtomicBool,
    /// The separate epilogue kernels of an NCCL-only engine (the kernels' own otherwise), or
    /// why they could not be loaded.
    own_epilogues: Option<std::result::Result<Epilogues, String>>,
}

impl CudaEngine {
    /// Collective setup on `stream` (of `device`). `symm`: build the
    /// symmetric-memory kernels (one host, fully connected); else NCCL only.
    /// `no_nccl`: why NCCL cannot serve this group although the config asks
    /// for it (ranks sharing a GPU), the same on every rank.
    pub fn new(
        group: &Arc<Group>,
        device: Device,
        stream: Arc<CudaStream>,
        config: &CommConfig,
        timeout: Duration,
        symm: bool,
        no_nccl: Option<&str>,
    ) -> Result<Self> {
        if !symm && !config.nccl {
            return Err(Error::Unavailable(
                "the nccl engine with CommConfig::nccl = false: nothing could run the ops".into(),
            ));
        }
        let coll = if symm {
            let mut c = CollectivesConfig::new(config.staging_bytes, timeout);
            if let Some(pdl) = config.pdl {
                c.pdl = pdl;
            }
            c.lamport_bytes = config.lamport_bytes;
            Some(CudaCollectives::with_config(group, stream.context(), c)?)
        } else {
            None
        };
        let (nccl, nccl_missing) = if let (true, Some(why)) = (config.nccl, no_nccl) {
            if !symm {
                return Err(Error::Unavailable(format!(
                    "NCCL, the only engine for this group: {why}"
                )));
            }
            (None, Some(why.to_string()))
        } else if config.nccl {
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
        let barrier_word = if coll.is_none() {
            let w = stream.alloc_zeros::<f32>(1).map_err(drv_err("cuMemAlloc"))?;
            let p = w.device_ptr(&stream).0;
            Some((w, p))
        } else {
            None
        };
        let order = stream.context().new_event(None).map_err(drv_err("cuEventCreate"))?;
        // NCCL only: the epilogue kernels without the collectives' workspace (NVRTC may be
        // missing where NCCL is not; then only the epilogue ops are unavailable).
        let own_epilogues = coll.is_none().then(|| {
            Epilogues::load(stream.context(), config.pdl.unwrap_or_else(symm_cuda::knobs::pdl))
                .map_err(|e| e.to_string())
        });
        Ok(CudaEngine {
            device,
            rank: group.rank().get(),
            stream,
            coll,
            nccl,
            barrier_word,
            nccl_missing,
            lock: Mutex::new(Last::default()),
            order,
            told_peers: AtomicBool::new(false),
            own_epilogues,
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Last>> {
        crate::engine::op_lock(&self.lock)
    }

    fn coll(&self) -> Result<&CudaCollectives> {
        self.coll
            .as_ref()
            .ok_or_else(|| Error::Unavailable("symmetric-memory kernels on an nccl-only communicator".into()))
    }
    /// The separate epilogue kernels (NOTE [fused-epilogue]).
    fn epilogue_kernels(&self) -> Result<&Epilogues> {
        match (&self.coll, &self.own_epilogues) {
            (Some(c), _) => Ok(c.epilogues()),
            (None, Some(Ok(e))) => Ok(e),
            (None, Some(Err(why))) => Err(Error::Unavailable(format!("the all-reduce epilogue kernels: {why}"))),
            (None, None) => Err(Error::Unavailable("the all-reduce epilogue kernels".into())),
        }
    }
    fn nccl(&self) -> Result<&Nccl> {
        self.nccl
            .as_ref()
            .ok_or_else(|| Error::Unavailable("nccl on a communicator built with CommConfig::nccl = false".into()))
    }

    fn check_symm(&self, t: &SymmTensor, what: &str) -> Result<()> {
        check_symm_tensor(t, self.device, what)
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

    fn src<'s>(&'s self, s: &'s CudaStream, b: &'s Buf<'_>) -> Result<(u64, Option<SyncOnDrop<'s>>)> {
        match b {
            Buf::Symm(t) => {
                self.check_symm(t, "input tensor")?;
                Ok((t.ptr(), None))
            }
            Buf::Device(d) => {
                self.check_ctx(d.context(), "input")?;
                self.refuse_tracked_in_capture(s, d.tracks_events())?;
                let (p, g) = d.read_ptr(s);
                check_align("input pointer", p, d.dtype())?;
                Ok((p, Some(g)))
            }
            Buf::Raw(r) => {
                check_align("input pointer", r.ptr, r.dtype)?;
                Ok((r.ptr, None))
            }
            Buf::Host(_) => Err(Error::InvalidArgument(
                "host slices need the host engine; copy them to the device first".into(),
            )),
        }
    }

    fn dst<'s>(&'s self, s: &'s CudaStream, b: &'s mut BufMut<'_>) -> Result<(u64, Option<SyncOnDrop<'s>>)> {
        match b {
            BufMut::Symm(t) => {
                self.check_symm(t, "output tensor")?;
                Ok((t.ptr(), None))
            }
            BufMut::Device(d) => {
                self.check_ctx(d.context(), "output")?;
                self.refuse_tracked_in_capture(s, d.tracks_events())?;
                let dtype = d.dtype();
                let (p, g) = d.write_ptr(s);
                check_align("output pointer", p, dtype)?;
                Ok((p, Some(g)))
            }
            BufMut::Raw(r) => {
                check_align("output pointer", r.ptr, r.dtype)?;
                Ok((r.ptr, None))
            }
            BufMut::Host(_) => Err(Error::InvalidArgument(
                "host slices need the host engine; copy them to the device first".into(),
            )),
        }
    }

    /// Runs `f` (an NCCL call) on the NCCL communicator's stream, ordered within `s`: when `s`
    /// is another stream, the NCCL stream waits for `s` first and `s` waits for the call after
    /// (an event each way; in a capture that forks the NCCL stream into it and joins it back).
    fn nccl_on(&self, s: &CudaStream, f: impl FnOnce(&Nccl) -> Result<()>) -> Result<()> {
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

    /// Makes `to` wait for the work queued on `from` so far.
    fn edge(&self, from: &CudaStream, to: &CudaStream) -> Result<()> {
        self.order.record(from).map_err(drv_err("cuEventRecord"))?;
        to.wait(&self.order).map_err(drv_err("cuStreamWaitEvent"))
    }

    /// The start of every op: the communicator's lock, then any error the kernels latched since
    /// the last op (NOTE [error-mirror]), read without a launch or a synchronisation, so a
    /// timeout, an abort or a disagreement reaches the caller without a `check_error` call.
    /// Returns the op's stream (`stream`, else the communicator's), checked to be of this
    /// device and ordered after the previous op when that ran on another stream.
    fn begin<'s>(&'s self, stream: OpStream<'s>) -> Result<(MutexGuard<'s, Last>, &'s Arc<CudaStream>)> {
        let mut l = self.lock()?;
        // An error the kernels latched, read without a launch or a synchronisation (NOTE
        // [error-mirror]): taken from the device when there is one.
        if let Some(c) = self.coll.as_ref().filter(|c| c.pending_error().is_some()) {
            c.check_error()?;
        }
        let s = match stream {
            Some(s) => {
                if let Err(e) = self.check_ctx(s.context(), "the op's stream") {
                    // A refusal of this rank's own argument: the peers' matching op must fail.
                    let _ = self.tell_peers(self.telling_stream(stream));
                    return Err(e);
                }
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
            return Ok((l, s));
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
        Ok((l, s))
    }

    /// Where a refusal is told: the op's stream, or the communicator's when the op's stream is
    /// of another context (the refusal may be that very stream; the kernels run in this one).
    fn telling_stream<'s>(&'s self, stream: OpStream<'s>) -> &'s CudaStream {
        match stream {
            Some(s) if s.context().cu_ctx() == self.stream.context().cu_ctx() => s,
            _ => &self.stream,
        }
    }

    /// [`Self::reject`] with the lock held, on `s` (the op's stream).
    fn tell_peers(&self, s: &CudaStream) -> Result<()> {
        self.told_peers.store(true, Ordering::Release);
        match &self.coll {
            Some(c) => c.reject(s),
            None => Ok(()),
        }
    }

    /// `r` of an op that took this communicator's lock: an argument the engine refused (after
    /// the communicator's own checks) is told to the peers like [`Self::reject`]. Errors every
    /// rank gets alike (`Unavailable`: the same selector everywhere) and failures are not
    /// refusals.
    fn refused(&self, s: &CudaStream, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            if is_refusal(e) {
                // The op's own error is what the caller needs; a failure to tell the peers
                // surfaces on their side as a timeout.
                let _ = self.tell_peers(s);
            }
        }
        r
    }
}

impl<T: Element + DeviceRepr + ValidAsZeroBits> NewOutput for CudaSlice<T> {
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
        stream.alloc_zeros::<T>(len).map_err(drv_err("cuMemAllocAsync"))
    }
    fn as_output(&mut self) -> BufMut<'_> {
        self.into()
    }
}
