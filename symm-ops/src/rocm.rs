//! The ROCm engine: symm-rocm's collectives ([`RocmCollectives`]: the kernels of symm-core's
//! shared source, compiled by hiprtc, launched as symm-core's `coll` plans them, the plans
//! symm-cuda's GPU suites run) behind [`Engine`], with the one planner ([`Selector`]) choosing
//! among the kernels ROCm has: the Lamport one-shot, the ring (one-shot, two-shot,
//! reduce-scatter, all-gather) and the fused zero-copy pulls for registered symmetric memory
//! (`Communicator::alloc`, `persistent_buffer`, `register_buffer`), and the all-reduce
//! epilogues (NOTE [fused-epilogue]): the fused Lamport kernel, or an all-reduce into the sum's
//! place then the separate epilogue kernel, the buffers resolved as on the CUDA engine
//! (`crate::epilogue::EpiBufs`). No copy engine, no RCCL.
//!
//! Ops take device buffers of the communicator's device: symmetric tensors or
//! [`crate::RawDevicePtr`]s (host slices need the host engine). They run on the collectives'
//! own HIP stream and return when done (a device error is the op's error; every wait is
//! bounded): the caller orders its own streams around the call. No op is given a stream. An op
//! whose kernels do not end even after the abort (a wedged device) returns a timeout that
//! poisons the communicator; its buffers stay in use until the device is idle.
//!
//! Nothing here has run on AMD hardware (no AMD GPU exists on the project's machines).
//!
//! The unsafe boundary (NOTE [raw-addresses]): symm-rocm's op entries take raw device addresses,
//! so they are `unsafe fn`s. Every address that reaches them here comes from [`RocmEngine::src`]
//! / [`RocmEngine::dst`]: a symmetric tensor of the communicator (checked for its device and
//! contiguity), or a `RawDevicePtr`, whose `unsafe` constructor carries the caller's promise;
//! both checked for alignment, their lengths checked by the communicator against the op's
//! count; the op returns only when its work is done.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::coll::add_rms::Epilogue;
use symm_core::coll::check::check_ptr;
use symm_core::coll::epilogue_check::Rows;
use symm_core::{
    get_symmetric_memory, DType, Device, DeviceType, Error, Group, OpKind, Rank, ReduceOp, Result, SymmTensor,
    SymmetricMemory,
};
use symm_rocm::collectives::DeviceOp;
use symm_rocm::{RocmCollectives, RocmCollectivesConfig};

use crate::buf::{check_symm_tensor, Buf, BufMut};
use crate::comm::CommConfig;
use crate::engine::{is_refusal, op_lock, Caps, Cx, Engine, OpArgs};
use crate::epilogue::{EpiArgs, EpiBufs, EpilogueAlgo, Resolve};
use crate::ops::OpStream;
use crate::select::{AllGatherAlgo, AllReduceAlgo, Bufs, Plan, ReduceScatterAlgo, Selector, Side};

/// The rocm engine's buffer resolution (`RocmEngine::src` / `dst`): nothing to hold, ops are
/// synchronous.
impl<'s> Resolve<'s> for RocmEngine {
    type Guard = ();
    fn input(&'s self, b: &'s Buf<'_>) -> Result<(u64, ())> {
        Ok((self.src(b)?, ()))
    }
    fn output(&'s self, b: &'s mut BufMut<'_>) -> Result<(u64, ())> {
        Ok((self.dst(b)?, ()))
    }
}

pub(crate) struct RocmEngine {
    device: Device,
    rank: usize,
    coll: RocmCollectives,
    /// Held by the op running.
    lock: Mutex<()>,
    /// Set when this engine told its peers it rejected an op ([`Engine::take_told_peers`]).
    told_peers: AtomicBool,
}

/// What the ROCm engine cannot take, named.
fn not_device(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what}: the rocm engine takes device buffers of the communicator's device (symmetric tensors \
         or RawDevicePtr); host slices need the host engine (CommConfig::with_engine(EngineKind::Host))"
    ))
}

impl RocmEngine {
    /// Collective setup on `device` (every rank of `group`, the same `config`), which
    /// `device_sharers` ranks of the group use.
    pub fn new(
        group: &Arc<Group>,
        device: Device,
        config: &CommConfig,
        timeout: Duration,
        device_sharers: usize,
    ) -> Result<Self> {
        if device.ty != DeviceType::Rocm {
            return Err(Error::InvalidArgument(format!(
                "the rocm engine on {device}: it runs on ROCm devices only"
            )));
        }
        let mut c = RocmCollectivesConfig::new(config.staging_bytes, timeout);
        c.lamport_bytes = config.lamport_bytes;
        Ok(RocmEngine {
            device,
            rank: group.rank().get(),
            coll: RocmCollectives::new(group, device.index, device_sharers, c)?,
            lock: Mutex::new(()),
            told_peers: AtomicBool::new(false),
        })
    }

    fn src(&self, b: &Buf<'_>) -> Result<u64> {
        match b {
            Buf::Symm(t) => {
                check_symm_tensor(t, self.device, "input tensor")?;
                Ok(t.ptr())
            }
            Buf::Raw(r) => {
                check_ptr("input pointer", r.ptr, r.dtype)?;
                Ok(r.ptr)
            }
            _ => Err(not_device("the input")),
        }
    }

    fn dst(&self, b: &BufMut<'_>) -> Result<u64> {
        match b {
            BufMut::Symm(t) => {
                check_symm_tensor(t, self.device, "output tensor")?;
                Ok(t.ptr())
            }
            BufMut::Raw(r) => {
                check_ptr("output pointer", r.ptr, r.dtype)?;
                Ok(r.ptr)
            }
            _ => Err(not_device("the output")),
        }
    }

    /// An all-reduce of resolved addresses (`d.input == d.output`: in place) as the planner
    /// plans `req` for them.
    fn all_reduce_at(&self, planner: &Selector, req: AllReduceAlgo, d: DeviceOp) -> Result<()> {
        let (inp, out) = (d.input, d.output);
        let bytes = d.count * d.dtype.size();
        let bufs = Bufs {
            in_place: inp == out,
            apart: inp.saturating_add(bytes as u64) <= out || out.saturating_add(bytes as u64) <= inp,
            registered: &|side| match side {
                Side::Input => self.coll.is_registered(inp, bytes),
                Side::Output => self.coll.is_registered(out, bytes),
            },
        };
        match planner.plan_all_reduce(req, bytes, &bufs) {
            // SAFETY: the addresses come from checked buffers (module docs).
            Plan::Kernel(k) => unsafe { self.coll.all_reduce(k, d) },
            Plan::Nccl => Err(Error::Unavailable("NCCL on a rocm-engine communicator".into())),
        }
    }

    /// One op: the lock (one op at a time), no stream given, then `f`; an argument this rank
    /// refused is told to the peers (NOTE [op-agreement]).
    fn locked(&self, stream: OpStream<'_>, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let _l = op_lock(&self.lock)?;
        let r = match stream {
            None => f(),
            Some(_) => Err(Error::InvalidArgument(
                "a CUDA stream given to an op of a rocm-engine communicator".into(),
            )),
        };
        if let Err(e) = &r {
            if is_refusal(e) {
                // The op's own error is what the caller needs; a failure to tell the peers
                // surfaces on their side as a timeout.
                let _ = self.tell_peers();
            }
        }
        r
    }

    fn tell_peers(&self) -> Result<()> {
        self.told_peers.store(true, Ordering::Release);
        self.coll.reject()
    }
}

impl Engine for RocmEngine {
    fn caps(&self) -> Caps {
        Caps {
            symm: true,
            nccl: false,
            lamport_slot: self.coll.lamport_max_bytes(),
            nccl_missing: None,
        }
    }

    fn all_reduce(&self, cx: Cx<'_>, req: AllReduceAlgo, a: OpArgs<'_, Option<Buf<'_>>>) -> Result<()> {
        self.locked(cx.stream, || {
            let out = self.dst(&a.output)?;
            let inp = match &a.input {
                Some(b) => self.src(b)?,
                None => out,
            };
            let d = DeviceOp {
                input: inp,
                output: out,
                count: a.count,
                dtype: a.dtype,
                op: a.op,
            };
            self.all_reduce_at(cx.planner, req, d)
        })
    }

    fn reduce_scatter(&self, cx: Cx<'_>, req: ReduceScatterAlgo, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        self.locked(cx.stream, || {
            let (inp, out) = (self.src(&a.input)?, self.dst(&a.output)?);
            let d = DeviceOp {
                input: inp,
                output: out,
                count: a.count,
                dtype: a.dtype,
                op: a.op,
            };
            let whole = d.count * cx.planner.world * d.dtype.size();
            match cx
                .planner
                .plan_reduce_scatter(req, whole, &|| self.coll.is_registered(inp, whole))
            {
                // SAFETY: the addresses come from checked buffers (module docs).
                Plan::Kernel(k) => unsafe { self.coll.reduce_scatter(k, d) },
                Plan::Nccl => Err(Error::Unavailable("NCCL on a rocm-engine communicator".into())),
            }
        })
    }

    fn all_gather(&self, cx: Cx<'_>, req: AllGatherAlgo, a: OpArgs<'_, Buf<'_>>) -> Result<()> {
        let (count, dtype) = (a.count, a.dtype);
        self.locked(cx.stream, || {
            let (inp, out) = (self.src(&a.input)?, self.dst(&a.output)?);
            let bytes = count * dtype.size();
            let whole = bytes * cx.planner.world;
            let bufs = Bufs {
                in_place: inp == out.saturating_add((self.rank * bytes) as u64),
                apart: inp.saturating_add(bytes as u64) <= out || out.saturating_add(whole as u64) <= inp,
                registered: &|side| match side {
                    Side::Input => self.coll.is_registered(inp, bytes),
                    Side::Output => self.coll.is_registered(out, whole),
                },
            };
            match cx.planner.plan_all_gather(req, whole, dtype, &bufs) {
                Plan::Kernel(k) => {
                    let d = DeviceOp::gather(inp, out, count, dtype);
                    // SAFETY: the addresses come from checked buffers (module docs).
                    unsafe { self.coll.all_gather(k, d) }
                }
                Plan::Nccl => Err(Error::Unavailable("NCCL on a rocm-engine communicator".into())),
            }
        })
    }

    fn barrier(&self, stream: OpStream<'_>, ranks: &[Rank]) -> Result<()> {
        self.locked(stream, || self.coll.barrier(ranks))
    }

    /// The fused Lamport kernel, or the all-reduce `algo` names (as the planner plans it) into
    /// the sum's place followed by the epilogue kernel, as on the CUDA engine.
    fn epilogue(&self, cx: Cx<'_>, algo: EpilogueAlgo, a: EpiArgs<'_>, rows: Rows) -> Result<()> {
        self.locked(cx.stream, || {
            let mut bufs = EpiBufs::from(a);
            let (p, _) = bufs.resolve(self)?;
            // SAFETY: every address was resolved by `src` / `dst` from this op's buffers, their
            // lengths checked against `rows` by the communicator; the ops return when done
            // (module docs, NOTE [raw-addresses]).
            let e = unsafe { Epilogue::new(p.op, p.x, rows, p.residual, p.residual_out, p.norm) }?;
            let sum = p.sum_place()?;
            match algo {
                EpilogueAlgo::Separate(ar) => {
                    let a = DeviceOp {
                        input: p.x,
                        output: sum,
                        count: rows.count(),
                        dtype: rows.dtype(),
                        op: ReduceOp::Sum,
                    };
                    self.all_reduce_at(cx.planner, ar, a)?;
                    // SAFETY: `sum` is one of the op's checked outputs (or `x`), `rows` long.
                    unsafe { self.coll.epilogue(sum, &e) }
                }
                _ => self.coll.lamport_epilogue(&e),
            }
        })
    }

    fn runs_empty_ops(&self) -> bool {
        true
    }

    fn empty_op(&self, stream: OpStream<'_>, kind: OpKind, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
        self.locked(stream, || self.coll.agree_empty(kind, dtype, reduce))
    }

    /// `Unavailable` is not a rejection here: every rank decides availability alike.
    fn reject(&self, stream: OpStream<'_>, e: &Error) -> bool {
        let _ = stream;
        !matches!(e, Error::Unavailable(_))
            && op_lock(&self.lock)
                .and_then(|_l| self.tell_peers())
                .map_or_else(|e2| crate::comm::is_fatal(&e2), |()| true)
    }

    fn take_told_peers(&self) -> bool {
        self.told_peers.swap(false, Ordering::AcqRel)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        self.coll.set_abort(abort)
    }

    /// Nothing: symm-rocm's kernels have no host-only abort word, and the pad's ABORT word stops
    /// every kernel as it starts, which would fail a lagging rank's ops whose data the departed
    /// peer had already sent (NOTE [peer-watch]). On ROCm a wait on a lost peer ends at the op
    /// timeout; the communicator then names the peer (`PeerLost`).
    fn abort_waits_on_lost_peer(&self) -> Result<()> {
        Ok(())
    }

    fn register(&self, t: &SymmTensor) -> Result<()> {
        self.coll
            .register_symmetric(get_symmetric_memory(t).ok_or(Error::NotRendezvoused)?)
    }

    fn register_memory(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        self.coll.register_symmetric(mem)
    }

    fn unregister_memory(&self, base: u64) -> bool {
        self.coll.unregister_symmetric(base)
    }
}
