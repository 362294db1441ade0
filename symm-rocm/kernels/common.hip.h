// symm-rocm device helpers, shared by every kernel of the crate.
//
// At compile time this file is prefixed with symm_core::pad::c_defines() (the
// signal-pad layout, NOTE [signal-pad-layout] in symm-core/src/pad.rs) and
// each kernel source follows it. The protocol is the one symm-cuda's
// symm-core/kernels/common.cuh implements: epoch counters, release stores into peers'
// pads, acquire polls on the own pad, every poll bounded by a deadline and by
// the ABORT word; a timeout or abort is latched into the ERROR word (first
// error wins) and the kernel returns -- no trap, the context survives.

#ifndef SYMM_SIGNAL_PAD_SIZE
#error "symm: the pad layout #defines (symm_core::pad::c_defines) must precede common.hip.h"
#endif

static_assert(SYMM_SIGNAL_BASE == SYMM_BARRIER_BASE + SYMM_NUM_CHANNELS * SYMM_MAX_WORLD_SIZE, "pad layout");
static_assert(SYMM_OPS_BASE == SYMM_SIGNAL_BASE + SYMM_NUM_CHANNELS * SYMM_MAX_WORLD_SIZE, "pad layout");
static_assert(SYMM_ERROR_WORD == SYMM_ABORT_WORD + 1, "pad layout");
static_assert((SYMM_ERROR_WORD + 1) * 4 <= SYMM_SIGNAL_PAD_SIZE, "pad layout");

typedef unsigned int symm_u32;
typedef unsigned long long symm_u64;

#define SYMM_BARRIER_SLOT(c, src) (SYMM_BARRIER_BASE + (c) * SYMM_MAX_WORLD_SIZE + (src))
#define SYMM_SIGNAL_SLOT(c, src) (SYMM_SIGNAL_BASE + (c) * SYMM_MAX_WORLD_SIZE + (src))
#define SYMM_OPS_SLOT(s, src) (SYMM_OPS_BASE + (s) * SYMM_MAX_WORLD_SIZE + (src))
#define SYMM_SENT_SLOT(c, dst) (SYMM_LOCAL_SENT + (c) * SYMM_MAX_WORLD_SIZE + (dst))
#define SYMM_RECV_SLOT(c, src) (SYMM_LOCAL_RECV + (c) * SYMM_MAX_WORLD_SIZE + (src))

// System-scope acquire load / release store (peers write over xGMI / PCIe).
__device__ __forceinline__ symm_u32 symm_ld_acquire_sys(const symm_u32* p) {
#if __has_builtin(__hip_atomic_load)
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

__device__ __forceinline__ symm_u32 symm_ld_relaxed_sys(const symm_u32* p) {
#if __has_builtin(__hip_atomic_load)
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

__device__ __forceinline__ void symm_st_release_sys(symm_u32* p, symm_u32 v) {
#if __has_builtin(__hip_atomic_store)
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

// The constant-rate wall clock (s_memrealtime; 100 MHz on CDNA2/CDNA3). The
// host converts timeouts to ticks of this clock.
__device__ __forceinline__ symm_u64 symm_clock() { return (symm_u64)wall_clock64(); }

__device__ __forceinline__ bool symm_epoch_reached(symm_u32 v, symm_u32 target) {
  return (int)(v - target) >= 0;
}

// Records the first error in the owner's ERROR word.
__device__ __forceinline__ void symm_latch_error(symm_u32* local, symm_u32 code) {
  atomicCAS(local + SYMM_ERROR_WORD, 0u, code);
}

// Polls `slot` (in the own pad) until it reaches `target`, the deadline passes,
// the ABORT word is set, or another thread already latched an error.
// Returns 0 on success, SYMM_ERR_TIMEOUT or SYMM_ERR_ABORTED otherwise.
__device__ symm_u32 symm_bounded_wait(const symm_u32* slot, symm_u32 target, symm_u64 deadline, symm_u32* local) {
  for (;;) {
    if (symm_epoch_reached(symm_ld_acquire_sys(slot), target)) return 0;
    if (symm_ld_relaxed_sys(local + SYMM_ABORT_WORD) != 0) {
      symm_latch_error(local, SYMM_ERR_ABORTED);
      return SYMM_ERR_ABORTED;
    }
    if (symm_clock() > deadline) {
      symm_latch_error(local, SYMM_ERR_TIMEOUT);
      return SYMM_ERR_TIMEOUT;
    }
    if (symm_ld_relaxed_sys(local + SYMM_ERROR_WORD) != 0) return SYMM_ERR_ABORTED;
    __builtin_amdgcn_s_sleep(1);
  }
}
