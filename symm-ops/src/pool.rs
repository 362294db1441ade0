//! Activations in symmetric memory: [`Communicator::alloc`] hands out
//! [`SymmBuffer`]s from a pool of rendezvoused, registered blocks, so an
//! engine's own activations take the zero-copy paths when passed to an op.
//!
//! A block is a power-of-two number of bytes (at least [`MIN_BLOCK_BYTES`]) of
//! one dtype. `alloc` takes the first free block of its class; when none is
//! free it allocates a new block, rendezvouses it with the group and registers
//! it with the engine: a collective setup step, so every rank allocates and
//! drops buffers in the same order (as ranks running the same model code do),
//! and then every rank takes the same block, at the same offsets, and the
//! zero-copy paths apply. Ranks whose pools diverge pair different blocks, which
//! the kernels' checks (offsets and sizes within an allocation) do not see: the
//! zero-copy paths then read the peer's paired block. Dropping a buffer returns
//! its block at once, without a rendezvous (a graph captured on it keeps its
//! address: keep the buffer while the graph is used); blocks live as long as
//! the communicator.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use symm_core::{empty_p2p, get_symmetric_memory, DType, Error, Result, SymmTensor};

use crate::buf::try_zeroed;
use crate::buf::{Buf, BufMut, Element};
use crate::comm::Communicator;

/// The smallest block the pool allocates (a CUDA backend rounds every
/// allocation up to its granularity, 2 MiB on an H100, anyway).
pub const MIN_BLOCK_BYTES: usize = 64 * 1024;

/// One pooled allocation: its class is the tensor's dtype and element count.
struct Block {
    tensor: SymmTensor,
    in_use: Arc<AtomicBool>,
}

/// A communicator's blocks.
#[derive(Default)]
pub(crate) struct Pool {
    blocks: Mutex<Vec<Block>>,
}

impl Pool {
    /// Blocks held, and how many of them are handed out.
    pub(crate) fn stats(&self) -> (usize, usize) {
        let b = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        (b.len(), b.iter().filter(|b| b.in_use.load(Ordering::Acquire)).count())
    }
}

/// Returns a block to its pool when the buffer holding it drops.
struct Lease(Arc<AtomicBool>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// `len` elements of `T` in the group's symmetric memory, from
/// [`Communicator::alloc`]: an op given it (`&buf` as input, `&mut buf` as
/// output) reads and writes it in place, zero-copy, and on CUDA its
/// [`view`](Self::view) / [`view_mut`](Self::view_mut) is a cudarc `DevicePtr` /
/// `DevicePtrMut` (kernels, cuBLAS, copies).
///
/// No cudarc event tracking: like every symmetric buffer it is ordered by the
/// streams its users enqueue on, so ops on it can be captured into a graph
/// with the context's event tracking on. Work on it on several streams is
/// ordered by the caller. Dropping it returns its block to the pool at once:
/// work still queued on it must be on the stream the next holder uses (the
/// communicator's, typically), or be synchronised first, as with any caching
/// allocator.
pub struct SymmBuffer<T> {
    tensor: SymmTensor,
    #[cfg(feature = "cuda")]
    view: Option<symm_cuda::SymmView<T>>,
    /// The communicator's stream, which the host copies wait for, and the error its kernels
    /// latched, which they report (CUDA).
    #[cfg(feature = "cuda")]
    stream: Option<Arc<cudarc::driver::CudaStream>>,
    #[cfg(feature = "cuda")]
    errors: Option<symm_cuda::collectives::ErrorProbe>,
    _lease: Lease,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for SymmBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmBuffer")
            .field("len", &self.tensor.numel())
            .field("dtype", &self.tensor.dtype())
            .field("ptr", &format_args!("{:#x}", self.tensor.ptr()))
            .finish()
    }
}

impl<T: Element> SymmBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.tensor.numel()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The buffer as a symmetric tensor (1-D, `len` elements).
    pub fn tensor(&self) -> &SymmTensor {
        &self.tensor
    }
    /// The local address of element 0 (device memory on GPU backends).
    pub fn address(&self) -> u64 {
        self.tensor.ptr()
    }

    /// Copies `src` (exactly `len` elements) into the buffer, in the order of the communicator's
    /// stream, as PyTorch's `.copy_()` from the host: it first waits until the work queued on
    /// that stream (the ops `comm.all_reduce(&mut buf, ..)` and the like enqueue there) has
    /// finished, at most [`symm_cuda::streams::HOST_COPY_TIMEOUT`], then writes and returns once
    /// the data is in place, so ops queued afterwards read it. Work the caller queued on other
    /// streams (`comm.on(&stream)`) it orders itself. Blocks the calling thread; engines that
    /// must not block use the stream copies (`stream.memcpy_htod(src, buf.view_mut()?)`), which
    /// also do not hold up other rank threads (NOTE [pageable-copies]).
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        self.check_len(src.len())?;
        let mut bytes = try_zeroed::<u8>(src.len() * T::DTYPE.size(), "a buffer write")?;
        T::host_in(src).encode(0, src.len(), &mut bytes);
        self.after_queued_work("a SymmBuffer write from the host")?;
        let mem = self.memory()?;
        mem.write_bytes(mem.rank(), self.tensor.storage_offset(), &bytes)
    }

    /// The buffer's elements, read after the work queued on the communicator's stream finished
    /// (as PyTorch's `.cpu()`; see [`Self::copy_from_host`] for what it waits for and how long).
    pub fn to_host(&self) -> Result<Vec<T>> {
        let mut bytes = try_zeroed::<u8>(self.len() * T::DTYPE.size(), "a buffer read")?;
        self.after_queued_work("a SymmBuffer read to the host")?;
        let mem = self.memory()?;
        mem.read_bytes(mem.rank(), self.tensor.storage_offset(), &mut bytes)?;
        let mut out = try_zeroed::<T>(self.len(), "a buffer read")?;
        T::host_out(&mut out).decode(0, &bytes);
        Ok(out)
    }

    /// Waits until the communicator's stream has no queued work, then reports an error its
    /// kernels latched (a timed-out or aborted op left the buffer as it was: its data must not
    /// come back as `Ok`); the error stays latched for the next op. CUDA; the host backend's
    /// ops complete, or fail, before they return.
    fn after_queued_work(&self, what: &str) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(s) = &self.stream {
            // Querying a capturing stream would end the caller's capture: refuse instead.
            if crate::cuda::capturing(s)? {
                return Err(Error::InvalidArgument(format!(
                    "{what} while the communicator's stream is being captured into a graph: copy \
                     after the capture ends (a host copy cannot be part of a graph)"
                )));
            }
            symm_cuda::streams::wait_idle(s, symm_cuda::streams::HOST_COPY_TIMEOUT, what)?;
            if let Some(e) = self.errors.as_ref().and_then(|p| p.pending(what)) {
                return Err(e);
            }
        }
        let _ = what;
        Ok(())
    }

    fn check_len(&self, n: usize) -> Result<()> {
        if n != self.len() {
            return Err(Error::InvalidArgument(format!(
                "a host slice of {n} elements for a buffer of {}",
                self.len()
            )));
        }
        Ok(())
    }

    fn memory(&self) -> Result<Arc<dyn symm_core::SymmetricMemory>> {
        get_symmetric_memory(&self.tensor).ok_or(Error::NotRendezvoused)
    }
}

impl<'a, T: Element> From<&'a SymmBuffer<T>> for Buf<'a> {
    fn from(b: &'a SymmBuffer<T>) -> Self {
        Buf::Symm(&b.tensor)
    }
}

impl<'a, T: Element> From<&'a mut SymmBuffer<T>> for BufMut<'a> {
    fn from(b: &'a mut SymmBuffer<T>) -> Self {
        BufMut::Symm(&b.tensor)
    }
}

#[cfg(feature = "cuda")]
impl<T> SymmBuffer<T> {
    /// The buffer as a cudarc `DevicePtr` (kernels, cuBLAS, copies: `blas.gemm(cfg, &a, &b,
    /// buf.view_mut()?)`); [`Error::InvalidArgument`] on a host device.
    pub fn view(&self) -> Result<&symm_cuda::SymmView<T>> {
        self.view.as_ref().ok_or_else(not_cuda)
    }
    /// The buffer as a cudarc `DevicePtrMut`; see [`Self::view`].
    pub fn view_mut(&mut self) -> Result<&mut symm_cuda::SymmView<T>> {
        self.view.as_mut().ok_or_else(not_cuda)
    }
}

#[cfg(feature = "cuda")]
fn not_cuda() -> Error {
    Error::InvalidArgument("a cudarc view of a buffer on a host device".into())
}

impl Communicator {
    /// `len` elements of `T` in the group's symmetric memory, for an engine's activations:
    /// pass the buffer to ops (zero-copy: the pull and copy-engine paths apply) and, on CUDA,
    /// its view to kernels, cuBLAS and copies as a cudarc `DevicePtr`. Contents are uninitialised
    /// (whatever the block held last).
    ///
    /// From a pool of blocks (see the module docs): when no block of the size class is free
    /// this is a collective setup step (every rank calls `alloc` with the same sizes in the
    /// same order and drops buffers in the same order); otherwise it is local and allocates
    /// nothing on the device.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<SymmBuffer<T>> {
        let dtype = T::DTYPE;
        let bytes = len
            .checked_mul(dtype.size())
            .and_then(|b| b.max(MIN_BLOCK_BYTES).checked_next_power_of_two())
            .ok_or(Error::OutOfRange {
                what: "buffer elements",
                value: len as u64,
                limit: (usize::MAX / 2 / dtype.size()) as u64,
            })?;
        // The lease is taken the moment a block is claimed: an error after it gives the block back.
        let (block, lease) = {
            let mut blocks = self.pool.blocks.lock().unwrap_or_else(|e| e.into_inner());
            let free = blocks.iter().find(|b| {
                b.tensor.dtype() == dtype
                    && b.tensor.numel() * dtype.size() == bytes
                    && b.in_use
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
            });
            match free {
                Some(b) => {
                    let lease = Lease(b.in_use.clone());
                    (b.tensor.narrow(0, len)?, lease)
                }
                None => {
                    let tensor = self.new_block(bytes / dtype.size(), dtype)?;
                    let in_use = Arc::new(AtomicBool::new(true));
                    let lease = Lease(in_use.clone());
                    let view = tensor.narrow(0, len)?;
                    blocks.push(Block { tensor, in_use });
                    (view, lease)
                }
            }
        };
        Ok(SymmBuffer {
            #[cfg(feature = "cuda")]
            view: self.cuda_view::<T>(&block, len)?,
            #[cfg(feature = "cuda")]
            stream: self.stream().cloned(),
            #[cfg(feature = "cuda")]
            errors: crate::cuda::error_probe_of(&*self.engine),
            tensor: block,
            _lease: lease,
            _t: PhantomData,
        })
    }

    /// Blocks the allocation pool holds, and how many are handed out.
    pub fn pool_blocks(&self) -> (usize, usize) {
        self.pool.stats()
    }

    /// A new block: allocated, rendezvoused with the group and registered with the engine.
    fn new_block(&self, elems: usize, dtype: DType) -> Result<SymmTensor> {
        let t = empty_p2p(&[elems], dtype, self.device(), self.group(), None)?;
        t.rendezvous(self.timeout())?;
        self.engine.register(&t)?;
        Ok(t)
    }

    #[cfg(feature = "cuda")]
    fn cuda_view<T>(&self, t: &SymmTensor, len: usize) -> Result<Option<symm_cuda::SymmView<T>>> {
        let Some(stream) = self.stream() else {
            return Ok(None);
        };
        let mem = get_symmetric_memory(t).ok_or(Error::NotRendezvoused)?;
        let cuda = symm_cuda::as_cuda(mem.as_ref())
            .ok_or_else(|| Error::InvalidArgument("a CUDA communicator's block is not CUDA memory".into()))?;
        cuda.view::<T>(self.rank().get(), t.storage_offset(), len, stream)
            .map(Some)
    }
}
