// symm-cuda: the CUDA side of the vendor header (NVIDIA, PTX for NVRTC).
//
// kernels::common_header() compiles every kernel file as
//     symm_core::pad::c_defines() + this file + symm-core/kernels/common.cuh + defines + the file,
// so everything the shared kernel text (symm-core/kernels/: common.cuh, collectives.cu and its
// headers) needs from the vendor is defined here, once per vendor; symm-rocm/kernels/vendor.hip.h
// defines the same names for AMD GPUs (hiprtc). The shared text holds no `asm` and no `#if` on
// the vendor: what differs between the vendors lives in the two vendor headers.
//
// Memory orders and scopes are spelled in the names: `_sys` is system scope (peers' GPUs and the
// host), `_gpu` this GPU only; `acquire` / `release` / `relaxed` / `volatile` as in PTX.

// Threads per warp. The shared kernels' reductions work on groups of 32 lanes whatever the
// vendor's width (symm_shfl_xor32), so their bits do not depend on it.
#define SYMM_WAVE_SIZE 32

// ---- memory-model primitives (generic addresses, system scope) ----------

// Acquire load at system scope: pairs with a peer's st.release.sys, so the
// peer's writes before its release are visible after this load sees the value.
__device__ __forceinline__ unsigned int symm_ld_acquire_sys(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Release store at system scope: every write this thread made (or observed,
// e.g. through __syncthreads) before it is visible to whoever acquires it.
// Used as a posted store into a peer's pad: one one-way NVLink trip.
__device__ __forceinline__ void symm_st_release_sys(unsigned int* p, unsigned int v) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Plain volatile load (no ordering), for words only read as flags.
__device__ __forceinline__ unsigned int symm_ld_volatile(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.volatile.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ---- programmatic dependent launch (NOTE [pdl] in common.cuh) -------------

__device__ __forceinline__ void symm_pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void symm_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// ---- thread-block clusters (the fused epilogue's cluster rows, NOTE [fused-epilogue]) ----
// From sm_90 on; before it a launch has no clusters (a cluster of one block), and these are the
// one-block forms: the block's barrier, its own shared memory.

// Barrier of every thread of every block of the cluster; shared-memory writes before it are
// visible to the cluster's blocks after it (release / acquire at cluster scope).
__device__ __forceinline__ void symm_cluster_sync() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __syncthreads();
#endif
}

// The float at shared address `p` of the cluster's block `cta` (its rank in the cluster).
__device__ __forceinline__ float symm_cluster_ld_f32(const float* p, unsigned int cta) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    unsigned int local;
    unsigned int remote;
    float v;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(local) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(cta));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
#else
    return *p;
#endif
}

// ---- clock ---------------------------------------------------------------

// Nanoseconds of the GPU's global timer.
__device__ __forceinline__ unsigned long long symm_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Called once per poll of a bounded wait: nothing on NVIDIA (the waits spin; their SMs are
// theirs, NOTE [co-residency]).
__device__ __forceinline__ void symm_backoff() {}

// ---- the collectives' primitives (symm-core/kernels/collectives.cu) -------

__device__ __forceinline__ void coll_atom_add_release_gpu(unsigned int* p, unsigned int v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned int coll_atom_add_acq_rel_gpu(unsigned int* p, unsigned int v) {
    unsigned int old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

__device__ __forceinline__ unsigned int coll_ld_acquire_gpu(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void coll_st_release_gpu(unsigned int* p, unsigned int v) {
    asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void coll_st_relaxed_sys(unsigned int* p, unsigned int v) {
    asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The same into global memory (the pinned host page's error mirror, NOTE [error-mirror]).
__device__ __forceinline__ void coll_st_relaxed_sys_global(const unsigned int* p, unsigned int v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// 64-bit acquire load / release store at system scope (the fused pull's signal words).
__device__ __forceinline__ unsigned long long coll_ld_acquire_sys_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void coll_st_release_sys_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// 16-byte load that every poll repeats (the Lamport buffers and op headers): never cached.
__device__ __forceinline__ uint4 coll_ld_volatile_v4(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Cache hints (no value, no ordering): bring the line of `p` into this SM's L1 / into L2.
__device__ __forceinline__ void coll_prefetch_l1(const void* p) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}
__device__ __forceinline__ void coll_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Ring data: read once, L2 only (never a stale L1 line of the slot's previous chunk).
__device__ __forceinline__ uint4 coll_ld_cg_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// 16-byte store (weak; the "memory" clobber keeps it in program order for the compiler): the
// Lamport pushes, the ring's staging stores, the sentinel fills.
__device__ __forceinline__ void coll_st_v4(void* p, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// True in the first active lane of the calling warp.
__device__ __forceinline__ bool coll_first_active_lane() {
    unsigned int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return (__activemask() & ((1u << lane) - 1u)) == 0u;
}

// Butterfly step over 32 lanes (every lane of the warp takes part).
__device__ __forceinline__ float symm_shfl_xor32(float v, int lane_mask) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

// ---- half / bfloat16 (bit patterns in unsigned integers; no cuda_fp16.h under NVRTC) --------

// f16 bits -> f32 (exact).
__device__ __forceinline__ float symm_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Two f32 -> f16x2 (round to nearest even; `hi` in the upper half).
__device__ __forceinline__ unsigned int symm_pack_f16x2(float hi, float lo) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two f32 -> bf16x2 (round to nearest even; `hi` in the upper half).
__device__ __forceinline__ unsigned int symm_pack_bf16x2(float hi, float lo) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
