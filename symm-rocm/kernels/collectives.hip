// One-shot all-reduce over symmetric buffers (the ROCm counterpart of
// symm-cuda's one-shot kernel, in its plainest form).
//
// Every rank's input lies in its own symmetric buffer at `in_offset`; `bufs`
// and `pads` are device arrays of every rank's buffer / pad address as mapped
// here. `epoch` is the host-tracked sequence number of this op on ops slot
// `slot` (1, 2, ...; wraps modulo 2^32).
//
// Protocol:
//   entry: block 0 fences (__threadfence_system: the input written by earlier
//          work is visible system-wide) and release-stores `epoch` into every
//          peer's OPS[slot][rank]; every block acquire-polls its own
//          OPS[slot][p] for every p until it reaches `epoch` (bounded, like
//          every wait: deadline + ABORT word, error latched in ERROR).
//   body:  grid-stride over `count` elements; each reads all ranks' inputs,
//          reduces in f32 in rank order (so every rank gets bit-identical
//          results) and writes `out` (local memory).
//   exit:  none here: the caller enqueues a barrier before any rank may
//          overwrite its input again.
//
// op: 0 sum, 1 avg, 2 max, 3 min (symm_core::ReduceOp order).

__device__ __forceinline__ float symm_bf16_to_f32(unsigned short h) {
  union { unsigned int u; float f; } v;
  v.u = ((unsigned int)h) << 16;
  return v.f;
}

__device__ __forceinline__ unsigned short symm_f32_to_bf16(float f) {
  union { unsigned int u; float f; } v;
  v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((v.u >> 16) | 0x40u);  // quiet NaN
  v.u += 0x7fffu + ((v.u >> 16) & 1u);  // round to nearest even
  return (unsigned short)(v.u >> 16);
}

__device__ __forceinline__ float symm_f16_to_f32(unsigned short h) {
  union { unsigned short u; _Float16 f; } v;
  v.u = h;
  return (float)v.f;
}

__device__ __forceinline__ unsigned short symm_f32_to_f16(float f) {
  union { unsigned short u; _Float16 f; } v;
  v.f = (_Float16)f;
  return v.u;
}

__device__ __forceinline__ float symm_reduce(float a, float b, int op) {
  switch (op) {
    case 2: return fmaxf(a, b);
    case 3: return fminf(a, b);
    default: return a + b;
  }
}

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

#define SYMM_ONE_SHOT(NAME, T, LOAD, STORE)                                                                  \
  extern "C" __global__ void NAME(const symm_u64* bufs, const symm_u64* pads, int rank, int world,             \
                                  symm_u64 in_offset, T* out, symm_u64 count, int op, int slot, symm_u32 epoch, \
                                  symm_u64 timeout_ticks) {                                                    \
    if (!symm_ops_entry(pads, rank, world, slot, epoch, timeout_ticks)) return;                               \
    const symm_u64 stride = (symm_u64)gridDim.x * blockDim.x;                                                  \
    for (symm_u64 i = (symm_u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {             \
      float acc = LOAD(((const T*)(bufs[0] + in_offset))[i]);                                                  \
      for (int p = 1; p < world; ++p) acc = symm_reduce(acc, LOAD(((const T*)(bufs[p] + in_offset))[i]), op); \
      if (op == 1) acc = acc / (float)world;                                                                   \
      out[i] = STORE(acc);                                                                                     \
    }                                                                                                          \
  }

__device__ __forceinline__ float symm_id_load(float x) { return x; }
__device__ __forceinline__ float symm_id_store(float x) { return x; }

SYMM_ONE_SHOT(symm_one_shot_all_reduce_f32, float, symm_id_load, symm_id_store)
SYMM_ONE_SHOT(symm_one_shot_all_reduce_f16, unsigned short, symm_f16_to_f32, symm_f32_to_f16)
SYMM_ONE_SHOT(symm_one_shot_all_reduce_bf16, unsigned short, symm_bf16_to_f32, symm_f32_to_bf16)

// A barrier over ops slot `slot` (entry protocol only); the exit of a
// one-shot all-reduce, so no rank overwrites its input while peers read it.
extern "C" __global__ void symm_ops_barrier(const symm_u64* pads, int rank, int world, int slot, symm_u32 epoch,
                                            symm_u64 timeout_ticks) {
  symm_ops_entry(pads, rank, world, slot, epoch, timeout_ticks);
}
