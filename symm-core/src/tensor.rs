//! Symmetric tensors: `empty_strided_p2p`, persistent allocations by
//! `alloc_id`, `rendezvous` and `get_symmetric_memory`.
//!
//! Persistent allocation (as torch.compile plans communication buffers): the
//! first request for an `alloc_id` allocates; the allocation is kept in a pool
//! keyed by (group, generation, rank, device, alloc_id). A later request with
//! the same id gets the same address once the previous tensor was dropped;
//! while that tensor lives, the request is an error ([`Error::AllocIdInUse`]).
//! A request larger than the pooled allocation is an error too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::allocator::{get_allocator, Allocation};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::memory::SymmetricMemory;
use crate::types::{DType, Device, DeviceType};

#[derive(Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    group: String,
    generation: u64,
    rank: usize,
    device: Device,
    alloc_id: u64,
}

struct PoolEntry {
    alloc: Arc<dyn Allocation>,
    in_use: Arc<AtomicBool>,
}

fn pool() -> &'static Mutex<HashMap<PoolKey, PoolEntry>> {
    static POOL: OnceLock<Mutex<HashMap<PoolKey, PoolEntry>>> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

/// Releases a persistent allocation id when the tensor holding it drops.
struct Lease(Arc<AtomicBool>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A tensor in symmetric memory: an allocation plus shape, stride (in
/// elements), dtype and byte offset.
pub struct SymmTensor {
    alloc: Arc<dyn Allocation>,
    shape: Vec<usize>,
    stride: Vec<usize>,
    dtype: DType,
    offset: usize,
    alloc_id: Option<u64>,
    _lease: Option<Lease>,
}

impl std::fmt::Debug for SymmTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmTensor")
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("shape", &self.shape)
            .field("stride", &self.stride)
            .field("dtype", &self.dtype)
            .field("device", &self.alloc.device())
            .field("alloc_id", &self.alloc_id)
            .finish()
    }
}

/// Bytes spanned by a strided tensor: `(1 + sum((shape_i - 1) * stride_i)) * elem`.
fn strided_span(shape: &[usize], stride: &[usize], dtype: DType) -> Result<usize> {
    if shape.len() != stride.len() {
        return Err(Error::InvalidArgument(format!(
            "shape {shape:?} and stride {stride:?} differ in rank"
        )));
    }
    if shape.contains(&0) {
        return Ok(0);
    }
    let mut last = 0usize;
    for (&d, &s) in shape.iter().zip(stride) {
        last = (d - 1)
            .checked_mul(s)
            .and_then(|x| x.checked_add(last))
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))?;
    }
    last.checked_add(1)
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))
}

/// Row-major (contiguous) strides for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1].max(1);
    }
    s
}

/// Allocates an uninitialised strided tensor in symmetric memory (PyTorch's
/// `empty_strided_p2p`). With `alloc_id`, the allocation is persistent (see
/// the module docs). The allocation is not rendezvoused yet.
pub fn empty_strided_p2p(
    shape: &[usize],
    stride: &[usize],
    dtype: DType,
    device: Device,
    group: &Arc<Group>,
    alloc_id: Option<u64>,
) -> Result<SymmTensor> {
    let bytes = strided_span(shape, stride, dtype)?.max(1);
    let allocator = get_allocator(device.ty)?;
    let (alloc, lease) = match alloc_id {
        None => (allocator.alloc(bytes, device, group)?, None),
        Some(id) => {
            let key = PoolKey {
                group: group.name().to_string(),
                generation: group.generation(),
                rank: group.rank().get(),
                device,
                alloc_id: id,
            };
            let mut pool = pool().lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = pool.get(&key) {
                if e.in_use.swap(true, Ordering::AcqRel) {
                    return Err(Error::AllocIdInUse { alloc_id: id });
                }
                if e.alloc.size() < bytes {
                    e.in_use.store(false, Ordering::Release);
                    return Err(Error::Mismatch {
                        what: "persistent allocation size",
                        detail: format!("alloc_id {id} holds {} bytes, {bytes} asked", e.alloc.size()),
                    });
                }
                (e.alloc.clone(), Some(Lease(e.in_use.clone())))
            } else {
                let alloc = allocator.alloc(bytes, device, group)?;
                let in_use = Arc::new(AtomicBool::new(true));
                pool.insert(
                    key,
                    PoolEntry {
                        alloc: alloc.clone(),
                        in_use: in_use.clone(),
                    },
                );
                (alloc, Some(Lease(in_use)))
            }
        }
    };
    Ok(SymmTensor {
        alloc,
        shape: shape.to_vec(),
        stride: stride.to_vec(),
        dtype,
        offset: 0,
        alloc_id,
        _lease: lease,
    })
}

/// Contiguous [`empty_strided_p2p`].
pub fn empty_p2p(
    shape: &[usize],
    dtype: DType,
    device: Device,
    group: &Arc<Group>,
    alloc_id: Option<u64>,
) -> Result<SymmTensor> {
    empty_strided_p2p(shape, &contiguous_strides(shape), dtype, device, group, alloc_id)
}

/// Drops every pooled persistent allocation of `group` that no tensor holds;
/// returns how many were released.
pub fn release_persistent(group: &Group) -> usize {
    let mut pool = pool().lock().unwrap_or_else(|e| e.into_inner());
    let before = pool.len();
    pool.retain(|k, e| {
        !(k.group == group.name()
            && k.generation == group.generation()
            && k.rank == group.rank().get()
            && !e.in_use.load(Ordering::Acquire))
    });
    before - pool.len()
}

impl SymmTensor {
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn stride(&self) -> &[usize] {
        &self.stride
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> Device {
        self.alloc.device()
    }
    pub fn device_type(&self) -> DeviceType {
        self.alloc.device().ty
    }
    pub fn alloc_id(&self) -> Option<u64> {
        self.alloc_id
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// Byte offset of element 0 inside the allocation.
    pub fn storage_offset(&self) -> usize {
        self.offset
    }
    pub fn is_contiguous(&self) -> bool {
        self.stride == contiguous_strides(&self.shape)
    }
    /// Local address of element 0.
    pub fn ptr(&self) -> u64 {
        self.alloc.ptr() + self.offset as u64
    }
    pub fn allocation(&self) -> &Arc<dyn Allocation> {
        &self.alloc
    }
    /// Exchanges handles with every rank of the tensor's group (collective).
    pub fn rendezvous(&self, timeout: Duration) -> Result<Arc<dyn SymmetricMemory>> {
        self.alloc.rendezvous(timeout)
    }
    /// A contiguous view of `numel` elements starting `elem_offset` elements
    /// into this (contiguous) tensor, sharing the allocation.
    pub fn narrow(&self, elem_offset: usize, numel: usize) -> Result<SymmTensor> {
        if !self.is_contiguous() {
            return Err(Error::InvalidArgument("narrow needs a contiguous tensor".into()));
        }
        let end = elem_offset.checked_add(numel).ok_or(Error::OutOfRange {
            what: "narrow",
            value: u64::MAX,
            limit: self.numel() as u64,
        })?;
        if end > self.numel() {
            return Err(Error::OutOfRange {
                what: "narrow",
                value: end as u64,
                limit: self.numel() as u64,
            });
        }
        Ok(SymmTensor {
            alloc: self.alloc.clone(),
            shape: vec![numel],
            stride: vec![1],
            dtype: self.dtype,
            offset: self.offset + elem_offset * self.dtype.size(),
            alloc_id: None,
            _lease: None,
        })
    }
}

/// The symmetric memory of a tensor, if its allocation was rendezvoused
/// (PyTorch's `get_symmetric_memory`).
pub fn get_symmetric_memory(t: &SymmTensor) -> Option<Arc<dyn SymmetricMemory>> {
    t.alloc.symmetric_memory()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        assert_eq!(strided_span(&[2, 3], &[3, 1], DType::F32).unwrap(), 24);
        assert_eq!(strided_span(&[2, 3], &[1, 2], DType::BF16).unwrap(), 12);
        assert_eq!(strided_span(&[0, 3], &[3, 1], DType::F32).unwrap(), 0);
        assert!(strided_span(&[2], &[1, 1], DType::F32).is_err());
        assert!(strided_span(&[usize::MAX, 2], &[2, 1], DType::F32).is_err());
        assert_eq!(contiguous_strides(&[4, 5, 6]), vec![30, 6, 1]);
    }
}
