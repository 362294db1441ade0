// The ops-slot barrier of RocmSymmetricMemory::one_shot_all_reduce (ROCm only; the collective
// kernels themselves are the shared source, symm_core::kernel_source, compiled with
// vendor.hip.h).
//
// `pads` is a device array of every rank's pad address as mapped here. `epoch` is the
// host-tracked sequence number of this barrier on ops slot `slot` (1, 2, ...; wraps modulo 2^32).
//
// Protocol: block 0 fences (__threadfence_system: what earlier work on the stream wrote, the
// op's input included, is visible system-wide) and release-stores `epoch` into every peer's
// OPS[slot][rank]; every block acquire-polls its own OPS[slot][p] for every p until it reaches
// `epoch` (bounded, like every wait: deadline + ABORT word, error latched in ERROR).
//
// one_shot_all_reduce runs: barrier on slot 0 (every rank's input is ready), the shared
// symm_reduce_ptrs_{dt} (reads every rank's input directly, reduces in f32 in rank order,
// writes `out`), barrier on slot 1 (no rank overwrites its input while peers still read it).

// Entry synchronisation; returns false if the wait failed (error latched).
__device__ bool symm_ops_entry(const symm_u64* pads, int rank, int world, int slot, symm_u32 epoch,
                               symm_u64 timeout_ticks) {
  symm_u32* local = (symm_u32*)pads[rank];
  __shared__ symm_u64 deadline;
  __shared__ int failed;
  if (threadIdx.x == 0) {
    deadline = symm_clock() + timeout_ticks;
    failed = 0;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    __threadfence_system();
    for (int p = threadIdx.x; p < world; p += blockDim.x)
      symm_st_release_sys((symm_u32*)pads[p] + SYMM_OPS_SLOT(slot, rank), epoch);
  }
  for (int p = threadIdx.x; p < world; p += blockDim.x)
    if (symm_bounded_wait(local + SYMM_OPS_SLOT(slot, p), epoch, deadline, local) != 0) failed = 1;
  __syncthreads();
  return failed == 0;
}

// A barrier over ops slot `slot`: one block, launched before and after the one-shot
// all-reduce's reduction.
extern "C" __global__ void symm_ops_barrier(const symm_u64* pads, int rank, int world, int slot, symm_u32 epoch,
                                            symm_u64 timeout_ticks) {
  symm_ops_entry(pads, rank, world, slot, epoch, timeout_ticks);
}
