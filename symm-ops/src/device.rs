//! Device buffers for the CUDA engine: cudarc slices and views behind two
//! object-safe traits, so [`crate::Buf`] / [`crate::BufMut`] can hold any of
//! them. Getting the pointer goes through cudarc's own `DevicePtr` /
//! `DevicePtrMut`, so cudarc's cross-stream event tracking stays correct.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
    SyncOnDrop,
};
use symm_core::DType;

use crate::buf::{Buf, BufMut, Element};

/// Only this crate implements the buffer traits: an op trusts the address and length they
/// report, so an implementation outside it could hand a safe op any address (NOTE
/// [raw-addresses]; memory this crate cannot check goes through the `unsafe`
/// `RawDevicePtr::new`).
///
/// ```compile_fail,E0277
/// use std::sync::Arc;
/// use symm_ops::cudarc::driver::{CudaContext, CudaStream, SyncOnDrop};
/// use symm_ops::symm_core::DType;
///
/// struct Anywhere(Arc<CudaContext>);
/// impl symm_ops::DeviceInput for Anywhere {
///     fn dtype(&self) -> DType {
///         DType::F32
///     }
///     fn len(&self) -> usize {
///         1
///     }
///     fn context(&self) -> &Arc<CudaContext> {
///         &self.0
///     }
///     fn read_ptr<'s>(&'s self, _: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
///         (0xdead_0000, SyncOnDrop::Sync(None))
///     }
///     fn tracks_events(&self) -> bool {
///         false
///     }
/// }
/// ```
mod sealed {
    pub trait Sealed {}
}

/// A device buffer an op reads: cudarc's `CudaSlice`, `CudaView` and `CudaViewMut`, and
/// symm-cuda's `SymmView` (sealed: other memory goes through `RawDevicePtr`).
pub trait DeviceInput: sealed::Sealed {
    fn dtype(&self) -> DType;
    /// Elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The context the memory belongs to.
    fn context(&self) -> &Arc<CudaContext>;
    /// The device address, ordered after pending writes on other streams;
    /// drop the guard after the op is enqueued.
    fn read_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>);
    /// Whether getting the address makes the stream wait on an event (cudarc's event
    /// tracking), which a stream being captured into a graph cannot do for events recorded
    /// before the capture.
    fn tracks_events(&self) -> bool;
    /// The device address where it is known without a stream (symmetric memory: a
    /// `symm_cuda::SymmView`), for the planner's buffer facts (in place, apart, registered).
    /// `None` (the default, and cudarc's own buffers) says the memory is no registered
    /// symmetric memory and overlaps no other buffer of the op.
    fn known_ptr(&self) -> Option<u64> {
        None
    }
}

/// A device buffer an op writes: cudarc's `CudaSlice` and `CudaViewMut`, and symm-cuda's
/// `SymmView` (sealed, as [`DeviceInput`]).
pub trait DeviceOutput: sealed::Sealed {
    fn dtype(&self) -> DType;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn context(&self) -> &Arc<CudaContext>;
    /// The device address, ordered after pending reads and writes on other
    /// streams; drop the guard after the op is enqueued.
    fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>);
    /// As [`DeviceInput::tracks_events`].
    fn tracks_events(&self) -> bool;
    /// As [`DeviceInput::known_ptr`].
    fn known_ptr(&self) -> Option<u64> {
        None
    }
}

/// Where a buffer type's address is known without a stream ([`DeviceInput::known_ptr`]).
trait KnownPtr {
    fn known(&self) -> Option<u64>;
}

impl<T> KnownPtr for CudaSlice<T> {
    fn known(&self) -> Option<u64> {
        None
    }
}
impl<T> KnownPtr for CudaView<'_, T> {
    fn known(&self) -> Option<u64> {
        None
    }
}
impl<T> KnownPtr for CudaViewMut<'_, T> {
    fn known(&self) -> Option<u64> {
        None
    }
}
impl<T> KnownPtr for symm_cuda::SymmView<T> {
    fn known(&self) -> Option<u64> {
        Some(self.ptr())
    }
}

/// The trait impls for one cudarc-compatible buffer type (they differ only in the type).
macro_rules! device_buffer {
    (input, tracked $tracked:literal: $($ty:ty),+) => {$(
        impl<T: Element + DeviceRepr> DeviceInput for $ty {
            fn dtype(&self) -> DType {
                T::DTYPE
            }
            fn len(&self) -> usize {
                DeviceSlice::len(self)
            }
            fn context(&self) -> &Arc<CudaContext> {
                DeviceSlice::stream(self).context()
            }
            fn read_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
                self.device_ptr(stream)
            }
            fn tracks_events(&self) -> bool {
                $tracked && DeviceInput::context(self).is_managing_stream_synchronization()
            }
            fn known_ptr(&self) -> Option<u64> {
                KnownPtr::known(self)
            }
        }
    )+};
    (output, tracked $tracked:literal: $($ty:ty),+) => {$(
        impl<T: Element + DeviceRepr> DeviceOutput for $ty {
            fn dtype(&self) -> DType {
                T::DTYPE
            }
            fn len(&self) -> usize {
                DeviceSlice::len(self)
            }
            fn context(&self) -> &Arc<CudaContext> {
                DeviceSlice::stream(self).context()
            }
            fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
                self.device_ptr_mut(stream)
            }
            fn tracks_events(&self) -> bool {
                $tracked && DeviceOutput::context(self).is_managing_stream_synchronization()
            }
            fn known_ptr(&self) -> Option<u64> {
                KnownPtr::known(self)
            }
        }
    )+};
}

// cudarc's slices and views, and symm-cuda's typed views of symmetric memory (any rank's buffer).
// cudarc's own types track their uses with events (unless the context's tracking is off);
// symmetric memory is ordered by the caller's streams only.
impl<T> sealed::Sealed for CudaSlice<T> {}
impl<T> sealed::Sealed for CudaView<'_, T> {}
impl<T> sealed::Sealed for CudaViewMut<'_, T> {}
impl<T> sealed::Sealed for symm_cuda::SymmView<T> {}
device_buffer!(input, tracked true: CudaSlice<T>, CudaView<'_, T>, CudaViewMut<'_, T>);
device_buffer!(output, tracked true: CudaSlice<T>, CudaViewMut<'_, T>);
device_buffer!(input, tracked false: symm_cuda::SymmView<T>);
device_buffer!(output, tracked false: symm_cuda::SymmView<T>);

impl<'a, T: Element + DeviceRepr> From<&'a CudaSlice<T>> for Buf<'a> {
    fn from(s: &'a CudaSlice<T>) -> Self {
        Buf::Device(s)
    }
}
impl<'a, 'b: 'a, T: Element + DeviceRepr> From<&'a CudaView<'b, T>> for Buf<'a> {
    fn from(s: &'a CudaView<'b, T>) -> Self {
        Buf::Device(s)
    }
}
impl<'a, 'b: 'a, T: Element + DeviceRepr> From<&'a CudaViewMut<'b, T>> for Buf<'a> {
    fn from(s: &'a CudaViewMut<'b, T>) -> Self {
        Buf::Device(s)
    }
}
impl<'a, T: Element + DeviceRepr> From<&'a mut CudaSlice<T>> for BufMut<'a> {
    fn from(s: &'a mut CudaSlice<T>) -> Self {
        BufMut::Device(s)
    }
}
impl<'a, 'b: 'a, T: Element + DeviceRepr> From<&'a mut CudaViewMut<'b, T>> for BufMut<'a> {
    fn from(s: &'a mut CudaViewMut<'b, T>) -> Self {
        BufMut::Device(s)
    }
}

impl<'a, T: Element + DeviceRepr> From<&'a symm_cuda::SymmView<T>> for Buf<'a> {
    fn from(s: &'a symm_cuda::SymmView<T>) -> Self {
        Buf::Device(s)
    }
}
impl<'a, T: Element + DeviceRepr> From<&'a mut symm_cuda::SymmView<T>> for BufMut<'a> {
    fn from(s: &'a mut symm_cuda::SymmView<T>) -> Self {
        BufMut::Device(s)
    }
}
