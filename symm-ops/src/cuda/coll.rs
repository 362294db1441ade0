//! Adapter over symm-cuda's collective kernels (`CudaCollectives`). Until
//! that lands, setup reports the engine as unavailable (force the nccl
//! engine meanwhile).

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use symm_core::{DType, Error, Group, Rank, ReduceOp, Result, SymmTensor};

use crate::select::{AllGatherAlgo, AllReduceAlgo};

pub(crate) struct Coll {
    _never: std::convert::Infallible,
}

impl Coll {
    pub fn new(
        _group: &Arc<Group>,
        _ctx: &Arc<CudaContext>,
        _staging_bytes: usize,
        _timeout: Duration,
    ) -> Result<Self> {
        Err(Error::Unavailable(
            "symm-cuda's collective kernels are not built in yet; use CommConfig { force_engine: Some(EngineKind::Nccl), .. }"
                .into(),
        ))
    }
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        _stream: &CudaStream,
        _algo: AllReduceAlgo,
        _input: u64,
        _output: u64,
        _count: usize,
        _dtype: DType,
        _op: ReduceOp,
    ) -> Result<()> {
        match self._never {}
    }
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_scatter(
        &self,
        _stream: &CudaStream,
        _input: u64,
        _output: u64,
        _count: usize,
        _dtype: DType,
        _op: ReduceOp,
    ) -> Result<()> {
        match self._never {}
    }
    pub fn all_gather(
        &self,
        _stream: &CudaStream,
        _input: u64,
        _output: u64,
        _count: usize,
        _dtype: DType,
        _algo: AllGatherAlgo,
    ) -> Result<()> {
        match self._never {}
    }
    pub fn barrier(&self, _stream: &CudaStream, _ranks: &[Rank]) -> Result<()> {
        match self._never {}
    }
    pub fn register(&self, _t: &SymmTensor) -> Result<()> {
        match self._never {}
    }
    pub fn check_error(&self) -> Result<()> {
        match self._never {}
    }
}
