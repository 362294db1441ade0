// barrier / put_signal / wait_signal over the signal pads (NOTE
// [signal-pad-layout]). `pads` is a device array of every rank's pad address
// as mapped on this device; `local` = pads[rank] is this rank's own pad.
//
// Memory ordering: a __threadfence_system() orders this rank's earlier writes
// (data in peers' buffers, written by earlier kernels or threads of this one)
// before the release store of the epoch into the peer's pad; the waiter's
// acquire load of that epoch makes those writes visible to it.
//
// Launch: symm_barrier with one block of >= 1 threads (threads stride over
// peers); symm_put_signal and symm_wait_signal with one block of one thread.

extern "C" __global__ void symm_barrier(const symm_u64* pads, int rank, int world, int channel,
                                        symm_u64 timeout_ticks) {
  symm_u32* local = (symm_u32*)pads[rank];
  __shared__ symm_u32 epoch;
  __shared__ symm_u64 deadline;
  if (threadIdx.x == 0) {
    epoch = local[SYMM_LOCAL_BARRIER_EPOCH + channel] + 1;
    local[SYMM_LOCAL_BARRIER_EPOCH + channel] = epoch;
    deadline = symm_clock() + timeout_ticks;
  }
  __syncthreads();
  __threadfence_system();
  for (int p = threadIdx.x; p < world; p += blockDim.x) {
    symm_u32* peer = (symm_u32*)pads[p];
    symm_st_release_sys(peer + SYMM_BARRIER_SLOT(channel, rank), epoch);
  }
  for (int p = threadIdx.x; p < world; p += blockDim.x) {
    if (symm_bounded_wait(local + SYMM_BARRIER_SLOT(channel, p), epoch, deadline, local) != 0) return;
  }
}

extern "C" __global__ void symm_put_signal(const symm_u64* pads, int rank, int dst, int channel) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  symm_u32* local = (symm_u32*)pads[rank];
  symm_u32 e = local[SYMM_SENT_SLOT(channel, dst)] + 1;
  local[SYMM_SENT_SLOT(channel, dst)] = e;
  __threadfence_system();
  symm_st_release_sys((symm_u32*)pads[dst] + SYMM_SIGNAL_SLOT(channel, rank), e);
}

extern "C" __global__ void symm_wait_signal(const symm_u64* pads, int rank, int src, int channel,
                                            symm_u64 timeout_ticks) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  symm_u32* local = (symm_u32*)pads[rank];
  symm_u64 deadline = symm_clock() + timeout_ticks;
  symm_u32 e = local[SYMM_RECV_SLOT(channel, src)] + 1;
  local[SYMM_RECV_SLOT(channel, src)] = e;
  symm_bounded_wait(local + SYMM_SIGNAL_SLOT(channel, src), e, deadline, local);
}
