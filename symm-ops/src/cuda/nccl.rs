//! NCCL through cudarc's safe API: the fallback engine. Pointers that are
//! not cudarc slices (symmetric tensors, raw pointers, resolved slices) go
//! through [`RawDev`], a `DevicePtr` over a plain device address.

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{sys::CUdeviceptr, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use cudarc::nccl::{Comm, Id, NcclType};
use half::{bf16, f16};
use symm_core::{DType, Error, Group, ReduceOp, Result};
use symm_cuda::driver::nccl::MovableComm;

/// A device address as a cudarc `DevicePtr`; the caller orders the memory's
/// other uses against `stream` (no event tracking).
struct RawDev<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<T> RawDev<T> {
    fn new(ptr: u64, len: usize, stream: &Arc<CudaStream>) -> Self {
        RawDev {
            ptr,
            len,
            stream: stream.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> DeviceSlice<T> for RawDev<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for RawDev<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for RawDev<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

fn nccl_err(call: &str, e: cudarc::nccl::result::NcclError) -> Error {
    Error::Backend {
        backend: "nccl",
        call: call.to_string(),
        detail: format!("{:?}", e.0),
    }
}

/// Runs `f`, turning a panic of cudarc's (a library call it unwraps) into
/// [`Error::Unavailable`] where panics unwind. A missing libnccl never gets
/// this far: [`nccl_version`] checks for the library first
/// (`symm_cuda::driver::nccl::available`), which also holds under
/// `panic = "abort"`, where this catches nothing.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Error::Unavailable(format!("{what}: {msg}")))
        }
    }
}

/// Whether libnccl can be loaded (cudarc panics on first use otherwise).
pub(crate) fn nccl_version() -> Result<i32> {
    symm_cuda::driver::nccl::available()?;
    guarded("libnccl", || {
        cudarc::nccl::result::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e))
    })
}

/// Whether every rank can load libnccl: each rank checks locally, then the
/// ranks agree through the store (NCCL's setup is collective, so all or none
/// create it). `Ok(Err(reason))` when some rank cannot.
pub(crate) fn agree_available(group: &Arc<Group>, timeout: Duration) -> Result<std::result::Result<(), String>> {
    let mine = match nccl_version().and_then(|_| nvls_off()) {
        Ok(()) => String::new(),
        Err(e) => format!("rank {}: {e}", group.rank().get()),
    };
    let reasons: Vec<String> = group
        .exchange(group.next_prefix("nccl-check"), timeout)?
        .all_gather(group.rank().get(), group.world_size(), mine.as_bytes(), timeout)?
        .into_iter()
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .collect();
    Ok(if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons.join("; "))
    })
}

/// The variable that keeps NCCL off NVLink multicast (NVLS).
const NVLS_ENV: &str = crate::knobs::NCCL_NVLS_ENABLE;

/// NVLink multicast is out (docs/architecture.md, "No NVLink multicast"), and library code never writes the process environment:
/// NCCL runs only where the program or its launcher set `NCCL_NVLS_ENABLE=0` before starting
/// (symmrun, the bundle's run.sh and xtask do); elsewhere it is [`Error::Unavailable`] saying so,
/// and the kernels run without the fallback.
fn nvls_off() -> Result<()> {
    nvls_verdict(crate::knobs::get(NVLS_ENV))
}

/// [`nvls_off`]'s verdict on the variable's value (`None`: unset).
fn nvls_verdict(value: Option<&str>) -> Result<()> {
    match value {
        Some(v) if v.trim() == "0" => Ok(()),
        Some(v) => Err(Error::Unavailable(format!(
            "{NVLS_ENV}={v}: symm never lets NCCL use NVLink multicast; start the process with {NVLS_ENV}=0"
        ))),
        None => Err(Error::Unavailable(format!(
            "{NVLS_ENV} is not set: symm never lets NCCL use NVLink multicast, and NCCL would on \
             NVSwitch systems; start the process with {NVLS_ENV}=0 (symmrun does)"
        ))),
    }
}

fn to_nccl(op: ReduceOp) -> cudarc::nccl::ReduceOp {
    match op {
        ReduceOp::Sum => cudarc::nccl::ReduceOp::Sum,
        ReduceOp::Avg => cudarc::nccl::ReduceOp::Avg,
        ReduceOp::Max => cudarc::nccl::ReduceOp::Max,
        ReduceOp::Min => cudarc::nccl::ReduceOp::Min,
    }
}

/// One NCCL communicator on the communicator's stream.
pub(crate) struct Nccl {
    /// Behind a lock so the engine (and with it `Communicator`) is `Sync`: an NCCL communicator
    /// may be used from any thread, one at a time; ops hold the engine's op lock anyway, so this
    /// one is never contended.
    comm: Mutex<MovableComm>,
    stream: Arc<CudaStream>,
}

impl Nccl {
    /// Collective, after [`agree_available`] said every rank can: rank 0 creates the unique id and publishes it through the
    /// group's store; every rank joins.
    pub fn new(group: &Arc<Group>, stream: &Arc<CudaStream>, timeout: Duration) -> Result<Self> {
        let exchange = group.exchange(group.next_prefix("nccl"), timeout)?;
        let (rank, world) = (group.rank().get(), group.world_size());
        let id = if rank == 0 {
            let id = match Id::new() {
                Ok(id) => id,
                Err(e) => {
                    // An empty id tells every peer at once (the marker below) instead of leaving
                    // them waiting for one.
                    let _ = exchange.broadcast(rank, world, 0, &[], timeout);
                    return Err(nccl_err("ncclGetUniqueId", e));
                }
            };
            let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
            exchange.broadcast(rank, world, 0, &bytes, timeout)?;
            id
        } else {
            let bytes = exchange.broadcast(rank, world, 0, &[], timeout)?;
            if bytes.is_empty() {
                // Rank 0's marker: its ncclGetUniqueId failed (it reports why).
                return Err(Error::Unavailable(
                    "NCCL: rank 0 could not create the group's unique id (ncclGetUniqueId failed there)".into(),
                ));
            }
            if bytes.len() != 128 {
                return Err(Error::InvalidArgument(format!(
                    "NCCL unique id of {} bytes in the store (expected 128)",
                    bytes.len()
                )));
            }
            let mut internal = [0 as std::ffi::c_char; 128];
            for (d, &s) in internal.iter_mut().zip(&bytes) {
                *d = s as std::ffi::c_char;
            }
            Id::uninit(internal)
        };
        let comm = Comm::from_rank(stream.clone(), group.rank().get(), group.world_size(), id)
            .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Ok(Nccl {
            comm: Mutex::new(MovableComm::new(comm)),
            stream: stream.clone(),
        })
    }

    /// Runs `f` on the NCCL communicator.
    fn with<R>(&self, f: impl FnOnce(&Comm) -> R) -> R {
        f(self.comm.lock().unwrap_or_else(|e| e.into_inner()).get())
    }

    fn ar<T: NcclType>(&self, input: u64, output: u64, count: usize, op: ReduceOp) -> Result<()> {
        let src = RawDev::<T>::new(input, count, &self.stream);
        let mut dst = RawDev::<T>::new(output, count, &self.stream);
        self.with(|c| c.all_reduce(&src, &mut dst, &to_nccl(op)))
            .map(|_| ())
            .map_err(|e| nccl_err("ncclAllReduce", e))
    }

    pub fn all_reduce(&self, input: u64, output: u64, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        match dtype {
            DType::F32 => self.ar::<f32>(input, output, count, op),
            DType::F16 => self.ar::<f16>(input, output, count, op),
            _ => self.ar::<bf16>(input, output, count, op),
        }
    }

    fn rs<T: NcclType>(&self, input: u64, output: u64, count: usize, op: ReduceOp) -> Result<()> {
        let src = RawDev::<T>::new(input, count * self.with(|c| c.world_size()), &self.stream);
        let mut dst = RawDev::<T>::new(output, count, &self.stream);
        self.with(|c| c.reduce_scatter(&src, &mut dst, &to_nccl(op)))
            .map(|_| ())
            .map_err(|e| nccl_err("ncclReduceScatter", e))
    }

    /// `count` = output elements.
    pub fn reduce_scatter(&self, input: u64, output: u64, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        match dtype {
            DType::F32 => self.rs::<f32>(input, output, count, op),
            DType::F16 => self.rs::<f16>(input, output, count, op),
            _ => self.rs::<bf16>(input, output, count, op),
        }
    }

    fn ag<T: NcclType>(&self, input: u64, output: u64, count: usize) -> Result<()> {
        let src = RawDev::<T>::new(input, count, &self.stream);
        let mut dst = RawDev::<T>::new(output, count * self.with(|c| c.world_size()), &self.stream);
        self.with(|c| c.all_gather(&src, &mut dst))
            .map(|_| ())
            .map_err(|e| nccl_err("ncclAllGather", e))
    }

    /// `count` = input elements.
    pub fn all_gather(&self, input: u64, output: u64, count: usize, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 => self.ag::<f32>(input, output, count),
            DType::F16 => self.ag::<f16>(input, output, count),
            _ => self.ag::<bf16>(input, output, count),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_needs_nvls_off_in_the_environment() {
        assert!(nvls_verdict(Some("0")).is_ok());
        assert!(nvls_verdict(Some(" 0\n")).is_ok());
        for (v, says) in [
            (None, "is not set"),
            (Some("1"), "NCCL_NVLS_ENABLE=1"),
            (Some(""), "NCCL_NVLS_ENABLE=:"),
        ] {
            match nvls_verdict(v) {
                Err(Error::Unavailable(m)) => {
                    assert!(m.contains(says) && m.contains("NCCL_NVLS_ENABLE=0"), "{m}")
                }
                other => panic!("{v:?}: {other:?}"),
            }
        }
    }
}
