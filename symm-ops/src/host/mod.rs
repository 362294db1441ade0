//! The generic engine: every op over any backend's [`SymmetricMemory`],
//! using only `read_bytes` / `write_bytes` and the pad's barrier and
//! signals. It runs the host backend (symm-testkit) in CI with the same
//! semantics as the GPU kernels: f32 accumulation, contributions in rank
//! order (bitwise-equal results on every rank), plain inputs staged through
//! the communicator's symmetric buffer in chunks, symmetric inputs read in
//! place.
//!
//! Staging layout (per rank): region A = `[0, half)` holds this rank's
//! staged input chunk, region B = `[half, 2 * half)` the slice this rank
//! reduced (two-shot). Protocol per chunk:
//!
//! - one-shot: stage -> barrier -> read every rank's chunk, reduce ->
//!   barrier -> write the output.
//! - two-shot: stage -> barrier -> reduce own slice from every rank, write
//!   it to B -> barrier -> read every rank's slice from its B into the output.
//!   (The next chunk's, or next op's, first barrier protects B; A was last
//!   read before the second barrier.)
//! - reduce-scatter: stage the world segments' chunks -> barrier -> reduce
//!   own segment's chunk from every rank -> barrier -> write.
//! - all-gather: stage -> barrier -> read every rank's chunk -> barrier.
//!
//! Every op ends with no peer still reading this rank's input, so a caller
//! may overwrite it as soon as the op returns.
//!
//! Agreement (NOTE [op-agreement]): at `2 * half` every rank publishes its
//! op's [`OpDescriptor`] before the op's first barrier and compares every
//! peer's right after it (chunk 0); the next op's descriptor is written only
//! after the op's second barrier, so each rank reads the one its peers
//! published for this op. Every rank reads the same records, so every rank
//! reaches the same verdict: all go on, or all return [`Error::Mismatch`]
//! (then the communicator is poisoned). Ops with nothing to move, full
//! barriers and rejected arguments run the same exchange alone (barrier,
//! compare, barrier).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use symm_core::{empty_p2p, get_symmetric_memory, Channel, DType, Device, Error, Group, Rank, ReduceOp, Result};
use symm_core::{OpDescriptor, OpKind};
use symm_core::{SymmTensor, SymmetricMemory};

use crate::buf::{check_symm_tensor, Buf, BufMut, HostIn, HostOut};
use crate::reduce;

mod engine;
pub(crate) mod epilogue;

/// Channel of the ops' own barriers on the staging memory's pad.
const OP_CHANNEL: usize = 0;
/// Channel of [`HostEngine::barrier`] over a subset of ranks.
const USER_CHANNEL: usize = 1;
/// Bytes after the two staging regions holding this rank's op descriptor.
const RECORD_BYTES: usize = 64;
const _: () = assert!(OpDescriptor::BYTES <= RECORD_BYTES);
/// The engine's all-reduce variants (`OpDescriptor::variant`): 0 one-shot, 1 two-shot.
fn variant_name(kind: OpKind, v: u8) -> Option<&'static str> {
    match (kind, v) {
        (OpKind::AllReduce, 0) => Some("one_shot"),
        (OpKind::AllReduce, 1) => Some("two_shot"),
        _ => None,
    }
}

/// Where this rank's input is.
pub(crate) enum In<'x> {
    Host(HostIn<'x>),
    /// Zero-copy: the same offset of a symmetric allocation on every rank.
    Symm {
        mem: Arc<dyn SymmetricMemory>,
        offset: usize,
    },
    /// In place: the output is the input.
    Output,
}

/// Where this rank's output goes.
pub(crate) enum Out<'x> {
    Host(HostOut<'x>),
    Symm {
        mem: Arc<dyn SymmetricMemory>,
        offset: usize,
    },
}

impl Out<'_> {
    /// Writes f32 accumulators narrowed to `dtype` at element `e0`.
    fn store_acc(&mut self, e0: usize, acc: &[f32], dtype: DType, scratch: &mut [u8]) -> Result<()> {
        match self {
            Out::Host(h) => {
                h.store(e0, acc);
                Ok(())
            }
            Out::Symm { mem, offset } => {
                let nb = acc.len() * dtype.size();
                reduce::narrow(dtype, acc, &mut scratch[..nb]);
                mem.write_bytes(mem.rank(), *offset + e0 * dtype.size(), &scratch[..nb])
            }
        }
    }
    /// Reads element bytes `[e0, e0 + n)` (this rank's part).
    pub(crate) fn load_bytes(&self, e0: usize, n: usize, dtype: DType, bytes: &mut [u8]) -> Result<()> {
        let nb = n * dtype.size();
        match self {
            Out::Host(h) => {
                h.encode(e0, n, &mut bytes[..nb]);
                Ok(())
            }
            Out::Symm { mem, offset } => mem.read_bytes(mem.rank(), *offset + e0 * dtype.size(), &mut bytes[..nb]),
        }
    }
    /// Writes element bytes at element `e0`.
    pub(crate) fn store_bytes(&mut self, e0: usize, bytes: &[u8], dtype: DType) -> Result<()> {
        match self {
            Out::Host(h) => {
                h.decode(e0, bytes);
                Ok(())
            }
            Out::Symm { mem, offset } => mem.write_bytes(mem.rank(), *offset + e0 * dtype.size(), bytes),
        }
    }
}

impl In<'_> {
    /// The same input, borrowed again.
    pub(crate) fn reborrow(&self) -> In<'_> {
        match self {
            In::Host(h) => In::Host(*h),
            In::Symm { mem, offset } => In::Symm {
                mem: mem.clone(),
                offset: *offset,
            },
            In::Output => In::Output,
        }
    }

    /// Reads element bytes `[e0, e0 + n)` of this rank's input (not an in-place one: that is
    /// its output's [`Out::load_bytes`]).
    pub(crate) fn load_bytes(&self, e0: usize, n: usize, dtype: DType, bytes: &mut [u8]) -> Result<()> {
        let nb = n * dtype.size();
        match self {
            In::Host(h) => {
                h.encode(e0, n, &mut bytes[..nb]);
                Ok(())
            }
            In::Symm { mem, offset } => mem.read_bytes(mem.rank(), offset + e0 * dtype.size(), &mut bytes[..nb]),
            In::Output => Err(Error::InvalidArgument(
                "internal: an in-place input read as an input".into(),
            )),
        }
    }

    /// The zero-copy source, if the input lies in symmetric memory.
    fn zero_copy(&self, out: &Out<'_>) -> Option<(Arc<dyn SymmetricMemory>, usize)> {
        match (self, out) {
            (In::Symm { mem, offset }, _) | (In::Output, Out::Symm { mem, offset }) => Some((mem.clone(), *offset)),
            _ => None,
        }
    }
    /// Element bytes `[e0, e0 + n)` of a staged (host) input.
    fn encode(&self, out: &Out<'_>, e0: usize, n: usize, bytes: &mut [u8]) -> Result<()> {
        match (self, out) {
            (In::Host(h), _) => h.encode(e0, n, bytes),
            (In::Output, Out::Host(h)) => h.encode(e0, n, bytes),
            _ => {
                return Err(Error::InvalidArgument(
                    "internal: a symmetric input is not staged".into(),
                ))
            }
        }
        Ok(())
    }
}

struct Scratch {
    acc: Vec<f32>,
    bytes: Vec<u8>,
    /// Ops called so far (rejected ones included): the next op's sequence number.
    seq: u64,
}

/// The generic engine of one communicator.
pub(crate) struct HostEngine {
    group: Arc<Group>,
    device: Device,
    staging: Arc<dyn SymmetricMemory>,
    _staging_tensor: SymmTensor,
    /// Bytes of each staging region (A at 0, B at `half`).
    half: usize,
    ranks: Vec<Rank>,
    me: Rank,
    timeout: Duration,
    op_channel: Channel,
    user_channel: Channel,
    scratch: Mutex<Scratch>,
    /// Set when this engine told its peers it refused an op and the group is out of step.
    told: std::sync::atomic::AtomicBool,
}

impl HostEngine {
    /// Allocates and rendezvouses the staging buffer (collective).
    pub fn new(group: &Arc<Group>, device: Device, staging_bytes: usize, timeout: Duration) -> Result<Self> {
        let half = (staging_bytes / 2) & !63;
        if half < 64 {
            return Err(Error::OutOfRange {
                what: "staging bytes (at least 128)",
                value: staging_bytes as u64,
                limit: 128,
            });
        }
        // Sized by the user's config: allocated fallibly (an error naming the size, not an abort),
        // and before the staging buffer's collective rendezvous, so every rank fails here alike.
        // Largest chunk: `half` bytes of 2-byte elements.
        let what = |buf: &str| format!("the host engine's {buf} for staging_bytes = {staging_bytes}");
        let acc = crate::buf::try_zeroed(half / 2, &what("f32 scratch"))?;
        let bytes = crate::buf::try_zeroed(half, &what("byte scratch"))?;
        let tensor = empty_p2p(&[2 * half + RECORD_BYTES], DType::U8, device, group, None)?;
        let staging = tensor.rendezvous(timeout)?;
        let me = group.rank();
        let ranks = (0..group.world_size())
            .map(|r| me.peer(r))
            .collect::<Result<Vec<_>>>()?;
        Ok(HostEngine {
            group: group.clone(),
            device,
            staging,
            _staging_tensor: tensor,
            half,
            ranks,
            me,
            timeout,
            op_channel: Channel::new(OP_CHANNEL)?,
            user_channel: Channel::new(USER_CHANNEL)?,
            scratch: Mutex::new(Scratch { acc, bytes, seq: 0 }),
            told: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Scratch>> {
        crate::engine::op_lock(&self.scratch)
    }

    fn op_barrier(&self) -> Result<()> {
        self.staging.barrier(self.op_channel, self.timeout)
    }

    /// The next op's descriptor (advances the sequence number), published at
    /// `2 * half` of this rank's staging buffer for its peers.
    fn publish(
        &self,
        scratch: &mut Scratch,
        kind: OpKind,
        dtype: Option<DType>,
        count: usize,
        reduce: Option<ReduceOp>,
        variant: u8,
    ) -> Result<OpDescriptor> {
        scratch.seq += 1;
        let d = OpDescriptor {
            seq: scratch.seq,
            kind,
            dtype,
            count: count as u64,
            reduce,
            variant,
        };
        self.staging.write_bytes(self.me, 2 * self.half, &d.encode())?;
        Ok(d)
    }

    /// After the op's first barrier: every peer's descriptor equals `d`, or
    /// [`Error::Mismatch`] naming the first that differs.
    fn check_peers(&self, d: &OpDescriptor) -> Result<()> {
        let mut theirs = [0u8; OpDescriptor::BYTES];
        for &p in self.ranks.iter().filter(|&&p| p != self.me) {
            self.staging.read_bytes(p, 2 * self.half, &mut theirs)?;
            d.agree(self.me.get(), p.get(), &theirs, variant_name)?;
        }
        Ok(())
    }

    /// The agreement alone (an op with nothing to move, a full barrier, a
    /// rejected op): barrier, compare, barrier.
    fn handshake(&self, d: &OpDescriptor) -> Result<()> {
        self.op_barrier()?;
        self.check_peers(d)?;
        self.op_barrier()
    }

    /// This rank rejected its own arguments for its next op: its peers learn
    /// it in that op's exchange and fail with [`Error::Mismatch`]. Ok when
    /// every rank rejected that op (the group stays in step); else the
    /// mismatch, and the caller poisons the communicator.
    pub fn send_rejection(&self) -> Result<()> {
        let mut guard = self.lock()?;
        let d = self.publish(&mut guard, OpKind::Rejected, None, 0, None, 0)?;
        self.handshake(&d)
    }

    /// One chunk's start, for ops whose peers read elements `e0..e0 + n` of this rank's input:
    /// unless the input is read in place (`zero_copy`), encode the chunk into `bytes` and stage it
    /// at the start of this rank's staging buffer; then the op barrier (every rank staged it).
    fn stage_chunk(
        &self,
        input: &In<'_>,
        out: &Out<'_>,
        zero_copy: bool,
        e0: usize,
        n: usize,
        bytes: &mut [u8],
    ) -> Result<()> {
        if !zero_copy {
            input.encode(out, e0, n, bytes)?;
            self.staging.write_bytes(self.me, 0, bytes)?;
        }
        self.op_barrier()
    }

    /// Checks a symmetric tensor the engine reads or writes.
    fn symm(&self, t: &SymmTensor, what: &str, same_group: bool) -> Result<(Arc<dyn SymmetricMemory>, usize)> {
        check_symm_tensor(t, self.device, what)?;
        let g = t.allocation().group();
        if same_group
            && (g.name() != self.group.name()
                || g.generation() != self.group.generation()
                || g.world_size() != self.group.world_size())
        {
            return Err(Error::InvalidArgument(format!(
                "{what} lives in symmetric memory of group {:?} (generation {}), the communicator's group is {:?} (generation {})",
                g.name(),
                g.generation(),
                self.group.name(),
                self.group.generation()
            )));
        }
        let mem = get_symmetric_memory(t).ok_or(Error::NotRendezvoused)?;
        Ok((mem, t.storage_offset()))
    }

    pub fn resolve_in<'x>(&self, b: Buf<'x>) -> Result<In<'x>> {
        match b {
            Buf::Host(h) => Ok(In::Host(h)),
            Buf::Symm(t) => {
                let (mem, offset) = self.symm(t, "input tensor", true)?;
                Ok(In::Symm { mem, offset })
            }
            other => Err(Error::InvalidArgument(format!(
                "{} input buffers need the CUDA engine; this communicator runs the host engine",
                other.kind()
            ))),
        }
    }

    /// `in_place`: the output is also the input, so a symmetric one must be
    /// in the communicator's group.
    pub fn resolve_out<'x>(&self, b: BufMut<'x>, in_place: bool) -> Result<Out<'x>> {
        match b {
            BufMut::Host(h) => Ok(Out::Host(h)),
            BufMut::Symm(t) => {
                let (mem, offset) = self.symm(t, "output tensor", in_place)?;
                Ok(Out::Symm { mem, offset })
            }
            other => Err(Error::InvalidArgument(format!(
                "{} output buffers need the CUDA engine; this communicator runs the host engine",
                other.kind()
            ))),
        }
    }

    /// Reads `out.len()` bytes of rank `p`'s input: at `in_off` bytes into
    /// the symmetric input, or at `staged_off` of the staging buffer.
    fn read_src(
        &self,
        zc: &Option<(Arc<dyn SymmetricMemory>, usize)>,
        p: Rank,
        in_off: usize,
        staged_off: usize,
        out: &mut [u8],
    ) -> Result<()> {
        match zc {
            Some((mem, base)) => mem.read_bytes(p, base + in_off, out),
            None => self.staging.read_bytes(p, staged_off, out),
        }
    }

    /// Reduces every rank's bytes (read by `read`) into `acc`, rank 0 first.
    fn reduce_from(
        &self,
        dtype: DType,
        op: ReduceOp,
        acc: &mut [f32],
        bytes: &mut [u8],
        mut read: impl FnMut(Rank, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        for (i, &p) in self.ranks.iter().enumerate() {
            read(p, bytes)?;
            if i == 0 {
                reduce::load(dtype, bytes, acc);
            } else {
                reduce::combine(dtype, op, bytes, acc);
            }
        }
        reduce::finish(op, self.ranks.len(), acc);
        Ok(())
    }

    pub fn one_shot(&self, input: &In<'_>, out: &mut Out<'_>, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let es = dtype.size();
        let chunk = self.half / es;
        let mut guard = self.lock()?;
        let d = self.publish(&mut guard, OpKind::AllReduce, Some(dtype), count, Some(op), 0)?;
        if count == 0 {
            return self.handshake(&d);
        }
        let Scratch { acc, bytes, .. } = &mut *guard;
        let zc = input.zero_copy(out);
        let mut e0 = 0;
        while e0 < count {
            let n = chunk.min(count - e0);
            let nb = n * es;
            self.stage_chunk(input, out, zc.is_some(), e0, n, &mut bytes[..nb])?;
            if e0 == 0 {
                self.check_peers(&d)?;
            }
            self.reduce_from(dtype, op, &mut acc[..n], &mut bytes[..nb], |p, b| {
                self.read_src(&zc, p, e0 * es, 0, b)
            })?;
            self.op_barrier()?;
            out.store_acc(e0, &acc[..n], dtype, &mut bytes[..nb])?;
            e0 += n;
        }
        Ok(())
    }

    /// Elements `[lo, hi)` of a chunk of `n` that rank `r` reduces.
    fn slice(&self, r: usize, n: usize) -> (usize, usize) {
        let w = self.ranks.len();
        (r * n / w, (r + 1) * n / w)
    }

    pub fn two_shot(&self, input: &In<'_>, out: &mut Out<'_>, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let es = dtype.size();
        let chunk = self.half / es;
        let mut guard = self.lock()?;
        let d = self.publish(&mut guard, OpKind::AllReduce, Some(dtype), count, Some(op), 1)?;
        if count == 0 {
            return self.handshake(&d);
        }
        let Scratch { acc, bytes, .. } = &mut *guard;
        let zc = input.zero_copy(out);
        let me = self.me.get();
        let mut e0 = 0;
        while e0 < count {
            let n = chunk.min(count - e0);
            self.stage_chunk(input, out, zc.is_some(), e0, n, &mut bytes[..n * es])?;
            if e0 == 0 {
                self.check_peers(&d)?;
            }
            let (lo, hi) = self.slice(me, n);
            let sb = (hi - lo) * es;
            self.reduce_from(dtype, op, &mut acc[..hi - lo], &mut bytes[..sb], |p, b| {
                self.read_src(&zc, p, (e0 + lo) * es, lo * es, b)
            })?;
            reduce::narrow(dtype, &acc[..hi - lo], &mut bytes[..sb]);
            self.staging.write_bytes(self.me, self.half + lo * es, &bytes[..sb])?;
            self.op_barrier()?;
            for &p in &self.ranks {
                let (lo, hi) = self.slice(p.get(), n);
                let sb = (hi - lo) * es;
                self.staging.read_bytes(p, self.half + lo * es, &mut bytes[..sb])?;
                out.store_bytes(e0 + lo, &bytes[..sb], dtype)?;
            }
            e0 += n;
        }
        Ok(())
    }

    /// `count` = output elements; the input holds `count * world`.
    pub fn reduce_scatter(
        &self,
        input: &In<'_>,
        out: &mut Out<'_>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let es = dtype.size();
        let w = self.ranks.len();
        let chunk = self.half / (es * w);
        let mut guard = self.lock()?;
        let d = self.publish(&mut guard, OpKind::ReduceScatter, Some(dtype), count, Some(op), 0)?;
        if chunk == 0 {
            // After the records are compared: a rank whose dtype differs gets Mismatch, not a
            // peer left waiting (NOTE [op-agreement]); ranks that agree all get this error.
            self.handshake(&d)?;
            return Err(Error::OutOfRange {
                what: "world size for the staging buffer",
                value: w as u64,
                limit: (self.half / es) as u64,
            });
        }
        if count == 0 {
            return self.handshake(&d);
        }
        let Scratch { acc, bytes, .. } = &mut *guard;
        let zc = input.zero_copy(out);
        let me = self.me.get();
        let mut e0 = 0;
        while e0 < count {
            let n = chunk.min(count - e0);
            let nb = n * es;
            if zc.is_none() {
                for r in 0..w {
                    input.encode(out, r * count + e0, n, &mut bytes[r * nb..(r + 1) * nb])?;
                }
                self.staging.write_bytes(self.me, 0, &bytes[..w * nb])?;
            }
            self.op_barrier()?;
            if e0 == 0 {
                self.check_peers(&d)?;
            }
            self.reduce_from(dtype, op, &mut acc[..n], &mut bytes[..nb], |p, b| {
                self.read_src(&zc, p, (me * count + e0) * es, me * nb, b)
            })?;
            self.op_barrier()?;
            out.store_acc(e0, &acc[..n], dtype, &mut bytes[..nb])?;
            e0 += n;
        }
        Ok(())
    }

    /// `count` = input elements; the output holds `count * world`.
    pub fn all_gather(&self, input: &In<'_>, out: &mut Out<'_>, count: usize, dtype: DType) -> Result<()> {
        let es = dtype.size();
        let chunk = self.half / es;
        let mut guard = self.lock()?;
        let d = self.publish(&mut guard, OpKind::AllGather, Some(dtype), count, None, 0)?;
        if count == 0 {
            return self.handshake(&d);
        }
        let Scratch { bytes, .. } = &mut *guard;
        let zc = input.zero_copy(out);
        let mut e0 = 0;
        while e0 < count {
            let n = chunk.min(count - e0);
            let nb = n * es;
            self.stage_chunk(input, out, zc.is_some(), e0, n, &mut bytes[..nb])?;
            if e0 == 0 {
                self.check_peers(&d)?;
            }
            for &p in &self.ranks {
                self.read_src(&zc, p, e0 * es, 0, &mut bytes[..nb])?;
                out.store_bytes(p.get() * count + e0, &bytes[..nb], dtype)?;
            }
            self.op_barrier()?;
            e0 += n;
        }
        Ok(())
    }

    /// Barrier over `ranks` (sorted, distinct, including this rank): for the
    /// whole group an op of its own (the agreement exchange), else pairwise
    /// signals (a subset barrier is no op of the group: no sequence number).
    pub fn barrier(&self, ranks: &[Rank]) -> Result<()> {
        let mut guard = self.lock()?;
        if ranks.len() == self.ranks.len() {
            let d = self.publish(&mut guard, OpKind::Barrier, None, 0, None, 0)?;
            return self.handshake(&d);
        }
        for &p in ranks.iter().filter(|&&p| p != self.me) {
            self.staging.put_signal(p, self.user_channel, self.timeout)?;
        }
        for &p in ranks.iter().filter(|&&p| p != self.me) {
            self.staging.wait_signal(p, self.user_channel, self.timeout)?;
        }
        Ok(())
    }

    /// Sets or clears the abort word of the staging memory: every wait of
    /// this engine ends with [`Error::Aborted`] while set.
    pub fn set_abort(&self, abort: bool) -> Result<()> {
        self.staging.set_abort(abort)
    }
}
