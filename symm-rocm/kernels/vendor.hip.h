// symm-rocm: the ROCm side of the vendor header (AMD CDNA, compiled by hiprtc).
//
// kernels::full_source() compiles every kernel file of symm-core (sync.cu, collectives.cu) as
//     symm_core::pad::c_defines() + defines + this file + symm-core/kernels/common.cuh
//     + the file (its #includes expanded)
// as symm-cuda does with its kernels/vendor.cuh (which takes the defines after common.cuh; here
// they come first, so they can set the #ifndef defaults below): every name below is defined there too,
// with the same meaning, for NVIDIA. hiprtc pre-includes hip_runtime.h (atomics, uint4,
// __shfl_xor, wall_clock64); nothing here includes a header.
//
// Mapping (PTX on the left, what this file uses on the right; scopes: `sys` is
// __HIP_MEMORY_SCOPE_SYSTEM, `gpu` is __HIP_MEMORY_SCOPE_AGENT):
//   ld.acquire.sys / st.release.sys (32, 64 bit)  __hip_atomic_load / __hip_atomic_store, ACQUIRE /
//                                                 RELEASE, system scope
//   ld.volatile (32 bit)                          __hip_atomic_load RELAXED, system scope
//   st.relaxed.sys                                __hip_atomic_store RELAXED, system scope
//   ld.acquire.gpu / st.release.gpu,              __hip_atomic_* with agent scope
//   red.release.gpu.add / atom.acq_rel.gpu.add
//   ld.volatile.global.v4 (Lamport polls)         a volatile 16-byte load (a global_load_dwordx4
//                                                 the compiler keeps in every poll, caches bypassed)
//   ld.global.cg.v4 (ring data after an acquire)  a plain 16-byte load: the acquire before it
//                                                 invalidates the CU's L1 (and, at system scope,
//                                                 non-coherent L2 lines)
//   st.global.v4 (Lamport pushes, ring staging)   __builtin_nontemporal_store of 16 bytes (streams
//                                                 past the caches, as RCCL's LL stores do)
//   prefetch.global.L1 / .L2                      nothing
//   %globaltimer (ns)                             wall_clock64() (s_memrealtime) * ns per tick
//   griddepcontrol.* (PDL)                        nothing: HIP has no programmatic dependent launch
//   warp of 32, __shfl_xor_sync, %laneid,         wave64 (CDNA); __shfl_xor with width 32, so the
//   __activemask                                  shared reductions work on the same 32-lane groups;
//                                                 __lane_id(), the EXEC mask
//   cvt.f32.f16, cvt.rn.f16x2.f32                 _Float16 conversions (round to nearest even)
//   cvt.rn.bf16x2.f32                             integer rounding to nearest even, NaN -> 0x7FFF
// The assumptions behind this mapping that nobody has verified on AMD hardware are written
// in NOTE [collectives-protocols] (symm-core/kernels/collectives.cu), "On ROCm".

// Lanes per wavefront: 64 on every CDNA target symm compiles for (gfx908, gfx90a, gfx942).
#ifdef __AMDGCN_WAVEFRONT_SIZE
#define SYMM_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define SYMM_WAVE_SIZE 64
#endif

// Frequency of wall_clock64() in kHz (hipDeviceAttributeWallClockRate: 100 MHz on MI100,
// MI200 and MI300). A host whose device reports another rate sets SYMM_ROCM_WALL_CLOCK_HZ, which
// kernels::clock_defines() turns into `#define SYMM_WALL_CLOCK_KHZ <rate>ull` in the compile's
// defines (part of the cache key), which precede this file.
#ifndef SYMM_WALL_CLOCK_KHZ
#define SYMM_WALL_CLOCK_KHZ 100000ull
#endif
static_assert(1000000ull % (SYMM_WALL_CLOCK_KHZ) == 0ull, "SYMM_WALL_CLOCK_KHZ must divide 1 GHz");

// ---- memory-model primitives (generic addresses, system scope) ----------

__device__ __forceinline__ unsigned int symm_ld_acquire_sys(const unsigned int* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}

__device__ __forceinline__ void symm_st_release_sys(unsigned int* p, unsigned int v) {
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}

__device__ __forceinline__ unsigned int symm_ld_volatile(const unsigned int* p) {
    return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}

// ---- programmatic dependent launch: none on HIP (NOTE [pdl]) ------------

__device__ __forceinline__ void symm_pdl_wait() {}
__device__ __forceinline__ void symm_pdl_launch_dependents() {}

// ---- clock ---------------------------------------------------------------

// Nanoseconds of the constant-rate wall clock (the deadlines' clock; the kernels' arguments
// carry nanoseconds on both vendors).
__device__ __forceinline__ unsigned long long symm_globaltimer() {
    return (unsigned long long)wall_clock64() * (1000000ull / (SYMM_WALL_CLOCK_KHZ));
}

// Thread-block clusters do not exist on AMD GPUs: a launch's cluster is one block (the host
// never plans more), so the cluster barrier is the block's and the cluster's shared memory its own.
__device__ __forceinline__ void symm_cluster_sync() { __syncthreads(); }
__device__ __forceinline__ float symm_cluster_ld_f32(const float* p, unsigned int cta) {
    (void)cta;
    return *p;
}

// Called once per poll of a bounded wait: a short sleep (64 clocks), so the waves spinning on
// a SIMD leave issue slots to the others.
__device__ __forceinline__ void symm_backoff() {
    __builtin_amdgcn_s_sleep(1);
}

// ---- the collectives' primitives (symm-core/kernels/collectives.cu) -------

__device__ __forceinline__ void coll_atom_add_release_gpu(unsigned int* p, unsigned int v) {
    __hip_atomic_fetch_add(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}

__device__ __forceinline__ unsigned int coll_atom_add_acq_rel_gpu(unsigned int* p, unsigned int v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
}

__device__ __forceinline__ unsigned int coll_ld_acquire_gpu(const unsigned int* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}

__device__ __forceinline__ void coll_st_release_gpu(unsigned int* p, unsigned int v) {
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}

__device__ __forceinline__ void coll_st_relaxed_sys(unsigned int* p, unsigned int v) {
    __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}

__device__ __forceinline__ void coll_st_relaxed_sys_global(const unsigned int* p, unsigned int v) {
    __hip_atomic_store(const_cast<unsigned int*>(p), v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}

__device__ __forceinline__ unsigned long long coll_ld_acquire_sys_u64(const unsigned long long* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}

__device__ __forceinline__ void coll_st_release_sys_u64(unsigned long long* p, unsigned long long v) {
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}

typedef unsigned int symm_u32x4 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ uint4 coll_ld_volatile_v4(const void* p) {
    const symm_u32x4 v = *reinterpret_cast<const volatile symm_u32x4*>(p);
    return make_uint4(v.x, v.y, v.z, v.w);
}

__device__ __forceinline__ void coll_prefetch_l1(const void* p) { (void)p; }
__device__ __forceinline__ void coll_prefetch_l2(const void* p) { (void)p; }

__device__ __forceinline__ uint4 coll_ld_cg_v4(const void* p) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);  // as the PTX form's "memory" clobber
    const symm_u32x4 v = *reinterpret_cast<const symm_u32x4*>(p);
    return make_uint4(v.x, v.y, v.z, v.w);
}

__device__ __forceinline__ void coll_st_v4(void* p, uint4 v) {
    symm_u32x4 x;
    x.x = v.x;
    x.y = v.y;
    x.z = v.z;
    x.w = v.w;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __builtin_nontemporal_store(x, reinterpret_cast<symm_u32x4*>(p));
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

// True in the first active lane of the calling wavefront.
__device__ __forceinline__ bool coll_first_active_lane() {
    const unsigned long long active = __builtin_amdgcn_read_exec();
    return (active & ((1ull << __lane_id()) - 1ull)) == 0ull;
}

// Butterfly step over 32 lanes: width 32 keeps each half of a wave64 to itself, so the shared
// reductions combine the same lanes in the same order as on a 32-lane warp.
__device__ __forceinline__ float symm_shfl_xor32(float v, int lane_mask) {
    return __shfl_xor(v, lane_mask, 32);
}

// ---- half / bfloat16 (bit patterns in unsigned integers) -------------------

__device__ __forceinline__ float symm_f16_to_f32(unsigned short h) {
    union {
        unsigned short u;
        _Float16 f;
    } v;
    v.u = h;
    return (float)v.f;
}

__device__ __forceinline__ unsigned int symm_f32_to_f16_bits(float f) {
    union {
        unsigned short u;
        _Float16 h;
    } v;
    v.h = (_Float16)f;
    return v.u;
}

__device__ __forceinline__ unsigned int symm_pack_f16x2(float hi, float lo) {
    return (symm_f32_to_f16_bits(hi) << 16) | symm_f32_to_f16_bits(lo);
}

// f32 -> bf16 bits, round to nearest even; NaN -> 0x7FFF (PTX's canonical NaN).
__device__ __forceinline__ unsigned int symm_f32_to_bf16_bits(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0x7FFFu;
    }
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ unsigned int symm_pack_bf16x2(float hi, float lo) {
    return (symm_f32_to_bf16_bits(hi) << 16) | symm_f32_to_bf16_bits(lo);
}
