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

/// A device buffer an op reads.
pub trait DeviceInput {
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
}

/// A device buffer an op writes.
pub trait DeviceOutput {
    fn dtype(&self) -> DType;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn context(&self) -> &Arc<CudaContext>;
    /// The device address, ordered after pending reads and writes on other
    /// streams; drop the guard after the op is enqueued.
    fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>);
}

impl<T: Element + DeviceRepr> DeviceInput for CudaSlice<T> {
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
}

impl<T: Element + DeviceRepr> DeviceInput for CudaView<'_, T> {
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
}

impl<T: Element + DeviceRepr> DeviceInput for CudaViewMut<'_, T> {
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
}

impl<T: Element + DeviceRepr> DeviceOutput for CudaSlice<T> {
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
}

impl<T: Element + DeviceRepr> DeviceOutput for CudaViewMut<'_, T> {
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
}

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

/// symm-cuda's typed views of symmetric memory (any rank's buffer).
impl<T: Element> DeviceInput for symm_cuda::SymmView<T> {
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
}

impl<T: Element> DeviceOutput for symm_cuda::SymmView<T> {
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
}

impl<'a, T: Element> From<&'a symm_cuda::SymmView<T>> for Buf<'a> {
    fn from(s: &'a symm_cuda::SymmView<T>) -> Self {
        Buf::Device(s)
    }
}
impl<'a, T: Element> From<&'a mut symm_cuda::SymmView<T>> for BufMut<'a> {
    fn from(s: &'a mut symm_cuda::SymmView<T>) -> Self {
        BufMut::Device(s)
    }
}
