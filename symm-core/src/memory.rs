//! The [`SymmetricMemory`] trait: one rank's handle on a rendezvoused
//! symmetric allocation, and typed views of peers' buffers.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::group::Group;
use crate::types::{Channel, DType, Device, Rank};

/// One rank's handle on a symmetric allocation after rendezvous (PyTorch's
/// `SymmetricMemory`). Addresses are `u64`: device virtual addresses for GPU
/// backends, host addresses for the host backend; they are never dereferenced
/// outside a backend's unsafe module.
///
/// `barrier`, `put_signal` and `wait_signal` follow NOTE [signal-pad-layout]
/// (see [`crate::pad`]) and return when the operation has completed (a GPU
/// backend launches its kernel and waits for it); the GPU backends also offer
/// stream-ordered variants.
pub trait SymmetricMemory: Send + Sync + 'static {
    fn group(&self) -> &Arc<Group>;
    fn rank(&self) -> Rank {
        self.group().rank()
    }
    fn world_size(&self) -> usize {
        self.group().world_size()
    }
    fn device(&self) -> Device;
    /// Usable bytes of each rank's buffer (the size asked for at alloc).
    fn buffer_size(&self) -> usize;
    /// Bytes of each rank's signal pad ([`crate::pad::SIGNAL_PAD_SIZE`]).
    fn signal_pad_size(&self) -> usize;
    /// Address of every rank's buffer, as mapped in this process (host array).
    fn buffer_ptrs(&self) -> &[u64];
    /// Address of every rank's signal pad, as mapped in this process.
    fn signal_pad_ptrs(&self) -> &[u64];
    /// Address of a device-resident array of `buffer_ptrs` (GPU backends); for
    /// the host backend, a host array.
    fn buffer_ptrs_dev(&self) -> u64;
    /// Address of a device-resident array of `signal_pad_ptrs`.
    fn signal_pad_ptrs_dev(&self) -> u64;

    /// Barrier with every rank of the group on `channel`.
    fn barrier(&self, channel: Channel, timeout: Duration) -> Result<()>;
    /// Signals rank `dst` on `channel`.
    fn put_signal(&self, dst: Rank, channel: Channel, timeout: Duration) -> Result<()>;
    /// Waits for one signal from rank `src` on `channel`.
    fn wait_signal(&self, src: Rank, channel: Channel, timeout: Duration) -> Result<()>;

    /// Copies `out.len()` bytes from `rank`'s buffer at `offset` into host
    /// memory (bounds checked).
    fn read_bytes(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Copies `data` into `rank`'s buffer at `offset` (bounds checked).
    fn write_bytes(&self, rank: Rank, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies `out.len()` bytes of `rank`'s signal pad at `offset`.
    fn read_signal_pad(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()>;

    /// Sets (or clears) the abort word: every device or host wait of this
    /// memory ends with [`Error::Aborted`] while it is set.
    fn set_abort(&self, abort: bool) -> Result<()>;

    fn as_any(&self) -> &dyn Any;
}

/// Checks that `[offset, offset + len)` lies inside `size` bytes.
pub fn check_range(what: &'static str, offset: usize, len: usize, size: usize) -> Result<()> {
    let end = offset.checked_add(len).ok_or(Error::OutOfRange {
        what,
        value: u64::MAX,
        limit: size as u64,
    })?;
    if end > size {
        return Err(Error::OutOfRange {
            what,
            value: end as u64,
            limit: size as u64,
        });
    }
    Ok(())
}

/// A typed view of one rank's buffer (PyTorch's `get_buffer`).
#[derive(Clone)]
pub struct BufferView {
    mem: Arc<dyn SymmetricMemory>,
    rank: Rank,
    shape: Vec<usize>,
    dtype: DType,
    offset: usize,
}

impl std::fmt::Debug for BufferView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferView")
            .field("rank", &self.rank)
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("offset", &self.offset)
            .finish()
    }
}

impl BufferView {
    pub fn rank(&self) -> Rank {
        self.rank
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Byte offset inside the rank's buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// The view's address in this process's mapping.
    pub fn ptr(&self) -> u64 {
        self.mem.buffer_ptrs()[self.rank.get()] + self.offset as u64
    }
    pub fn memory(&self) -> &Arc<dyn SymmetricMemory> {
        &self.mem
    }
    /// Copies the view's bytes to host memory.
    pub fn read(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.nbytes()];
        self.mem.read_bytes(self.rank, self.offset, &mut v)?;
        Ok(v)
    }
    /// Writes `data` (exactly `nbytes()`) into the view.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        if data.len() != self.nbytes() {
            return Err(Error::Mismatch {
                what: "view size",
                detail: format!("{} bytes given for a view of {}", data.len(), self.nbytes()),
            });
        }
        self.mem.write_bytes(self.rank, self.offset, data)
    }
}

/// `get_buffer` and friends on any `Arc<dyn SymmetricMemory>`.
pub trait SymmetricMemoryExt {
    /// A typed view of `rank`'s buffer: `shape` elements of `dtype` starting
    /// `offset` bytes in. Checks rank, alignment and bounds.
    fn get_buffer(&self, rank: usize, shape: &[usize], dtype: DType, offset: usize) -> Result<BufferView>;
}

impl SymmetricMemoryExt for Arc<dyn SymmetricMemory> {
    fn get_buffer(&self, rank: usize, shape: &[usize], dtype: DType, offset: usize) -> Result<BufferView> {
        let rank = self.rank().peer(rank)?;
        if !offset.is_multiple_of(dtype.size()) {
            return Err(Error::Misaligned {
                what: "buffer offset",
                value: offset as u64,
                align: dtype.size() as u64,
            });
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))?;
        check_range("buffer view", offset, numel, self.buffer_size())?;
        Ok(BufferView {
            mem: self.clone(),
            rank,
            shape: shape.to_vec(),
            dtype,
            offset,
        })
    }
}
