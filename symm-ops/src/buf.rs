//! What the ops take: symmetric tensors (zero-copy), host slices (the host
//! engine) and device buffers (the CUDA engine: cudarc slices and views, or a
//! raw device pointer). Everything converts into [`Buf`] (read) or
//! [`BufMut`] (written) with `From`, so an op accepts `&input[..]`,
//! `&mut out[..]`, `&tensor`, `&cuda_slice`, `&mut cuda_slice`, ...

use half::{bf16, f16};
use symm_core::{DType, Error, Result, Scalar, SymmTensor};

/// What an engine holds for one buffer it resolved until the op's work is enqueued: a cudarc
/// buffer's stream guard, held in place (an op allocates nothing, NOTE [raw-addresses] and
/// docs/ops.md), or nothing.
pub(crate) enum Guard<'s> {
    /// A cudarc buffer's guard (records its use on the op's stream when dropped).
    #[cfg(feature = "cuda")]
    #[allow(dead_code)] // held for its Drop, never read
    Cuda(cudarc::driver::SyncOnDrop<'s>),
    /// Nothing to hold (the lifetime alone).
    #[allow(dead_code)] // built only where no backend side holds a guard
    None(std::marker::PhantomData<&'s ()>),
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type the collectives reduce: `f32`, `half::f16`, `half::bf16`.
/// Accumulation is always in `f32`. Its [`DType`] is [`Scalar::DTYPE`] (symm-core's).
pub trait Element: Scalar + Default + PartialEq + std::fmt::Debug + sealed::Sealed {
    /// Widens to `f32` (exact).
    fn to_f32(self) -> f32;
    /// Narrows from `f32`, rounding to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Writes the little-endian bytes (`out.len() == DTYPE.size()`).
    fn write_le(self, out: &mut [u8]);
    /// Reads from little-endian bytes (`b.len() == DTYPE.size()`).
    fn read_le(b: &[u8]) -> Self;
    #[doc(hidden)]
    fn host_in(s: &[Self]) -> HostIn<'_>;
    #[doc(hidden)]
    fn host_out(s: &mut [Self]) -> HostOut<'_>;
}

impl Element for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn write_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn read_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn host_in(s: &[Self]) -> HostIn<'_> {
        HostIn::F32(s)
    }
    fn host_out(s: &mut [Self]) -> HostOut<'_> {
        HostOut::F32(s)
    }
}

impl Element for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn write_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_bits().to_le_bytes());
    }
    fn read_le(b: &[u8]) -> Self {
        f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
    fn host_in(s: &[Self]) -> HostIn<'_> {
        HostIn::F16(s)
    }
    fn host_out(s: &mut [Self]) -> HostOut<'_> {
        HostOut::F16(s)
    }
}

impl Element for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn write_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_bits().to_le_bytes());
    }
    fn read_le(b: &[u8]) -> Self {
        bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
    fn host_in(s: &[Self]) -> HostIn<'_> {
        HostIn::BF16(s)
    }
    fn host_out(s: &mut [Self]) -> HostOut<'_> {
        HostOut::BF16(s)
    }
}

/// A host slice an op reads (the host engine stages it through the
/// communicator's symmetric buffer).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum HostIn<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// A host slice an op writes.
#[derive(Debug)]
#[non_exhaustive]
pub enum HostOut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
}

fn encode<T: Element>(s: &[T], out: &mut [u8]) {
    for (v, o) in s.iter().zip(out.chunks_exact_mut(T::DTYPE.size())) {
        v.write_le(o);
    }
}

fn decode<T: Element>(b: &[u8], out: &mut [T]) {
    for (o, c) in out.iter_mut().zip(b.chunks_exact(T::DTYPE.size())) {
        *o = T::read_le(c);
    }
}

fn narrow<T: Element>(acc: &[f32], out: &mut [T]) {
    for (o, &a) in out.iter_mut().zip(acc) {
        *o = T::from_f32(a);
    }
}

impl HostIn<'_> {
    pub fn len(&self) -> usize {
        match self {
            HostIn::F32(s) => s.len(),
            HostIn::F16(s) => s.len(),
            HostIn::BF16(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dtype(&self) -> DType {
        match self {
            HostIn::F32(_) => DType::F32,
            HostIn::F16(_) => DType::F16,
            HostIn::BF16(_) => DType::BF16,
        }
    }
    /// The first element's address.
    pub(crate) fn address(&self) -> u64 {
        match self {
            HostIn::F32(s) => s.as_ptr() as u64,
            HostIn::F16(s) => s.as_ptr() as u64,
            HostIn::BF16(s) => s.as_ptr() as u64,
        }
    }
    /// Little-endian bytes of elements `[e0, e0 + n)` into `out` (`n * size` bytes).
    pub(crate) fn encode(&self, e0: usize, n: usize, out: &mut [u8]) {
        match self {
            HostIn::F32(s) => encode(&s[e0..e0 + n], out),
            HostIn::F16(s) => encode(&s[e0..e0 + n], out),
            HostIn::BF16(s) => encode(&s[e0..e0 + n], out),
        }
    }
}

impl HostOut<'_> {
    pub fn len(&self) -> usize {
        match self {
            HostOut::F32(s) => s.len(),
            HostOut::F16(s) => s.len(),
            HostOut::BF16(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dtype(&self) -> DType {
        match self {
            HostOut::F32(_) => DType::F32,
            HostOut::F16(_) => DType::F16,
            HostOut::BF16(_) => DType::BF16,
        }
    }
    /// The first element's address.
    pub(crate) fn address(&self) -> u64 {
        match self {
            HostOut::F32(s) => s.as_ptr() as u64,
            HostOut::F16(s) => s.as_ptr() as u64,
            HostOut::BF16(s) => s.as_ptr() as u64,
        }
    }
    pub(crate) fn encode(&self, e0: usize, n: usize, out: &mut [u8]) {
        match self {
            HostOut::F32(s) => encode(&s[e0..e0 + n], out),
            HostOut::F16(s) => encode(&s[e0..e0 + n], out),
            HostOut::BF16(s) => encode(&s[e0..e0 + n], out),
        }
    }
    /// Copies little-endian element bytes into elements starting at `e0`.
    pub(crate) fn decode(&mut self, e0: usize, b: &[u8]) {
        match self {
            HostOut::F32(s) => decode(b, &mut s[e0..]),
            HostOut::F16(s) => decode(b, &mut s[e0..]),
            HostOut::BF16(s) => decode(b, &mut s[e0..]),
        }
    }
    /// Stores `f32` accumulators (rounded to the element type) at `e0`.
    pub(crate) fn store(&mut self, e0: usize, acc: &[f32]) {
        match self {
            HostOut::F32(s) => narrow(acc, &mut s[e0..]),
            HostOut::F16(s) => narrow(acc, &mut s[e0..]),
            HostOut::BF16(s) => narrow(acc, &mut s[e0..]),
        }
    }
}

/// A raw device pointer to `len` contiguous elements of `dtype` on the
/// communicator's device, for memory that is neither a cudarc slice nor a
/// [`SymmTensor`] (e.g. a tensor of another framework). Nothing can check such
/// an address, so only [`RawDevicePtr::new`], an `unsafe fn`, makes one; the ops
/// check what they can (the engine, the element size's alignment, the length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDevicePtr {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

impl RawDevicePtr {
    /// `len` elements of `dtype` at device address `ptr`.
    ///
    /// # Safety
    /// `ptr .. ptr + len * dtype.size()` is memory of the communicator's device (or memory
    /// mapped for it) that stays allocated, and that nothing else writes (nor reads, where an
    /// op writes it), until the stream work of every op given this pointer has completed.
    #[allow(unsafe_code)] // declares the contract only; the body is safe
    pub unsafe fn new(ptr: u64, len: usize, dtype: DType) -> Self {
        RawDevicePtr { ptr, len, dtype }
    }

    /// The engines' own addresses, already checked against the buffers they came from.
    pub(crate) fn checked(ptr: u64, len: usize, dtype: DType) -> Self {
        RawDevicePtr { ptr, len, dtype }
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// Something an op reads (`#[non_exhaustive]`: kinds may be added, and `Device` exists only
/// with the `cuda` feature).
#[non_exhaustive]
pub enum Buf<'a> {
    /// A tensor in symmetric memory of the communicator's group: zero-copy.
    Symm(&'a SymmTensor),
    /// A host slice (host engine).
    Host(HostIn<'a>),
    /// A cudarc slice or view (CUDA engine): staged through the workspace.
    #[cfg(feature = "cuda")]
    Device(&'a dyn crate::device::DeviceInput),
    /// A raw device pointer (CUDA engine).
    Raw(RawDevicePtr),
}

/// Something an op writes (or, for in-place ops, reads and writes; `#[non_exhaustive]` as
/// [`Buf`]).
#[non_exhaustive]
pub enum BufMut<'a> {
    /// A tensor in symmetric memory (written locally; zero-copy as an in-place input).
    Symm(&'a SymmTensor),
    /// A host slice (host engine).
    Host(HostOut<'a>),
    /// A cudarc slice or view (CUDA engine).
    #[cfg(feature = "cuda")]
    Device(&'a mut dyn crate::device::DeviceOutput),
    /// A raw device pointer (CUDA engine).
    Raw(RawDevicePtr),
}

impl std::fmt::Debug for Buf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf::{}({} x {})", self.kind(), self.len(), self.dtype())
    }
}

impl std::fmt::Debug for BufMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufMut::{}({} x {})", self.kind(), self.len(), self.dtype())
    }
}

impl Buf<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Buf::Symm(t) => t.numel(),
            Buf::Host(h) => h.len(),
            #[cfg(feature = "cuda")]
            Buf::Device(d) => d.len(),
            Buf::Raw(r) => r.len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dtype(&self) -> DType {
        match self {
            Buf::Symm(t) => t.dtype(),
            Buf::Host(h) => h.dtype(),
            #[cfg(feature = "cuda")]
            Buf::Device(d) => d.dtype(),
            Buf::Raw(r) => r.dtype,
        }
    }
    /// The first byte's address (host or device); 0 for a cudarc buffer (its address needs a
    /// stream). Used to compare buffers for overlap.
    pub(crate) fn address(&self) -> u64 {
        match self {
            Buf::Symm(t) => t.ptr(),
            Buf::Host(h) => h.address(),
            #[cfg(feature = "cuda")]
            Buf::Device(_) => 0,
            Buf::Raw(r) => r.ptr,
        }
    }
    /// The device address where it is known before the engine resolves the buffer on the op's
    /// stream (symmetric tensors, raw pointers, symmetric views); `None` for host slices and
    /// cudarc's own buffers (never registered symmetric memory, never overlapping another
    /// buffer of the op): what the planner's buffer facts are computed from.
    pub(crate) fn known_address(&self) -> Option<u64> {
        match self {
            Buf::Symm(t) => Some(t.ptr()),
            Buf::Host(_) => None,
            #[cfg(feature = "cuda")]
            Buf::Device(d) => d.known_ptr(),
            Buf::Raw(r) => Some(r.ptr),
        }
    }
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Buf::Symm(_) => "Symm",
            Buf::Host(_) => "Host",
            #[cfg(feature = "cuda")]
            Buf::Device(_) => "Device",
            Buf::Raw(_) => "Raw",
        }
    }
}

impl BufMut<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            BufMut::Symm(t) => t.numel(),
            BufMut::Host(h) => h.len(),
            #[cfg(feature = "cuda")]
            BufMut::Device(d) => d.len(),
            BufMut::Raw(r) => r.len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dtype(&self) -> DType {
        match self {
            BufMut::Symm(t) => t.dtype(),
            BufMut::Host(h) => h.dtype(),
            #[cfg(feature = "cuda")]
            BufMut::Device(d) => d.dtype(),
            BufMut::Raw(r) => r.dtype,
        }
    }
    /// The first byte's address (host or device); 0 for a cudarc buffer (its address needs a
    /// stream). Used to compare buffers for overlap.
    pub(crate) fn address(&self) -> u64 {
        match self {
            BufMut::Symm(t) => t.ptr(),
            BufMut::Host(h) => h.address(),
            #[cfg(feature = "cuda")]
            BufMut::Device(_) => 0,
            BufMut::Raw(r) => r.ptr,
        }
    }
    /// As [`Buf::known_address`].
    pub(crate) fn known_address(&self) -> Option<u64> {
        match self {
            BufMut::Symm(t) => Some(t.ptr()),
            BufMut::Host(_) => None,
            #[cfg(feature = "cuda")]
            BufMut::Device(d) => d.known_ptr(),
            BufMut::Raw(r) => Some(r.ptr),
        }
    }
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            BufMut::Symm(_) => "Symm",
            BufMut::Host(_) => "Host",
            #[cfg(feature = "cuda")]
            BufMut::Device(_) => "Device",
            BufMut::Raw(_) => "Raw",
        }
    }
}

impl<'a, T: Element> From<&'a [T]> for Buf<'a> {
    fn from(s: &'a [T]) -> Self {
        Buf::Host(T::host_in(s))
    }
}
impl<'a, T: Element> From<&'a Vec<T>> for Buf<'a> {
    fn from(s: &'a Vec<T>) -> Self {
        Buf::Host(T::host_in(s))
    }
}
impl<'a, T: Element> From<&'a mut [T]> for BufMut<'a> {
    fn from(s: &'a mut [T]) -> Self {
        BufMut::Host(T::host_out(s))
    }
}
impl<'a, T: Element> From<&'a mut Vec<T>> for BufMut<'a> {
    fn from(s: &'a mut Vec<T>) -> Self {
        BufMut::Host(T::host_out(s))
    }
}
impl<'a> From<&'a SymmTensor> for Buf<'a> {
    fn from(t: &'a SymmTensor) -> Self {
        Buf::Symm(t)
    }
}
impl<'a> From<&'a SymmTensor> for BufMut<'a> {
    fn from(t: &'a SymmTensor) -> Self {
        BufMut::Symm(t)
    }
}
impl From<RawDevicePtr> for Buf<'_> {
    fn from(r: RawDevicePtr) -> Self {
        Buf::Raw(r)
    }
}
impl From<RawDevicePtr> for BufMut<'_> {
    fn from(r: RawDevicePtr) -> Self {
        BufMut::Raw(r)
    }
}
impl<'a> From<HostIn<'a>> for Buf<'a> {
    fn from(h: HostIn<'a>) -> Self {
        Buf::Host(h)
    }
}
impl<'a> From<HostOut<'a>> for BufMut<'a> {
    fn from(h: HostOut<'a>) -> Self {
        BufMut::Host(h)
    }
}

/// Checks that a symmetric tensor an engine reads or writes lies on the communicator's device
/// and is contiguous.
pub(crate) fn check_symm_tensor(t: &SymmTensor, device: symm_core::Device, what: &str) -> Result<()> {
    if t.device() != device {
        return Err(Error::InvalidArgument(format!(
            "{what} is on {}, the communicator on {device}",
            t.device()
        )));
    }
    if !t.is_contiguous() {
        return Err(Error::InvalidArgument(format!("{what} must be contiguous")));
    }
    Ok(())
}

/// Checks that `dtype` is one the collectives reduce.
pub(crate) fn check_dtype(dtype: DType, op: &'static str) -> Result<()> {
    if dtype.is_reducible_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            dtype: dtype.name().to_string(),
            op,
        })
    }
}

/// `n` default (zero) elements in host memory, allocated fallibly: a size
/// the allocator refuses is [`Error::OutOfMemory`] naming `what` and the
/// size asked for, never an abort. Every host allocation sized by the
/// user's config or an op's size goes through it.
pub(crate) fn try_zeroed<T: Clone + Default>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| Error::OutOfMemory {
        device: "host".into(),
        detail: format!(
            "{what}: {n} elements of {} bytes ({} bytes) asked: {e}",
            std::mem::size_of::<T>(),
            n as u128 * std::mem::size_of::<T>() as u128
        ),
    })?;
    v.resize(n, T::default());
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_round_trips() {
        let mut b = [0u8; 4];
        1.5f32.write_le(&mut b);
        assert_eq!(f32::read_le(&b), 1.5);
        let mut b = [0u8; 2];
        f16::from_f32(-2.25).write_le(&mut b);
        assert_eq!(f16::read_le(&b).to_f32(), -2.25);
        bf16::from_f32(3.0).write_le(&mut b);
        assert_eq!(bf16::read_le(&b).to_f32(), 3.0);
        // Round to nearest even on narrowing.
        assert_eq!(<bf16 as Element>::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
    }

    #[test]
    fn conversions_describe_buffers() {
        let v = [f16::ZERO; 5];
        let b: Buf<'_> = (&v[1..]).into();
        assert_eq!((b.len(), b.dtype()), (4, DType::F16));
        let mut w = vec![0f32; 3];
        let m: BufMut<'_> = (&mut w).into();
        assert_eq!((m.len(), m.dtype()), (3, DType::F32));
        let r: Buf<'_> = RawDevicePtr::checked(256, 7, DType::BF16).into();
        assert_eq!((r.len(), r.dtype(), r.kind()), (7, DType::BF16, "Raw"));
        assert!(check_dtype(DType::I32, "all_reduce").is_err());
    }
}
