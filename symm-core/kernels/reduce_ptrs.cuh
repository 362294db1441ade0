// symm: The reduction from pointers behind the copy-engine paths.
// Included by collectives.cu (symm_core::kernel_source::expand_includes expands the include:
// neither NVRTC nor hiprtc gets an include path), after its primitives and dtype helpers,
// which this file uses.

// ---------------------------------------------------------------- reduce from pointers (CE all-reduce)

// out[i] = reduce over ranks s = 0..world-1 of src_s[i] (src_rank = this rank's input, the others
// are peers' symmetric inputs read directly over NVLink, or copies of them in the workspace).
// Eight per-rank pointers as plain values (index = rank; unused entries null): kernel arguments
// of their own, picked with a switch, so they stay in registers (an array indexed at run time
// would go to local memory). CollSrcs: what is read; CollDsts: where the two-shot pull writes.
template <typename P>
struct CollPtrs8 {
    P p0;
    P p1;
    P p2;
    P p3;
    P p4;
    P p5;
    P p6;
    P p7;
};
typedef CollPtrs8<const char*> CollSrcs;
typedef CollPtrs8<char*> CollDsts;

template <typename P>
__device__ __forceinline__ P coll_pick(const CollPtrs8<P>& p, int s) {
    switch (s) {
        case 0:
            return p.p0;
        case 1:
            return p.p1;
        case 2:
            return p.p2;
        case 3:
            return p.p3;
        case 4:
            return p.p4;
        case 5:
            return p.p5;
        case 6:
            return p.p6;
        default:
            return p.p7;
    }
}

// Two ranks: COLL_PULL_UNROLL vectors per thread per step (strided by the grid, so warps stay
// coalesced), all loads issued before the first add: enough remote loads in flight to fill NVLink
// (one 16-byte load per thread leaves it latency-bound).
#define COLL_PULL_UNROLL 4
template <int DT, int OP>
__device__ __forceinline__ void coll_reduce_ptrs_2(int rank, char* out, unsigned long long n, const char* own_src,
                                                   const char* peer_src, bool al) {
    constexpr int VE = CollT<DT>::VE;
    constexpr int U = COLL_PULL_UNROLL;
    const unsigned long long nv = (n + VE - 1) / VE;
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long v = tid;
    for (; v + (U - 1) * nth < nv; v += U * nth) {
        uint4 a[U];
        uint4 b[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned long long x = v + u * nth;
            b[u] = coll_load<DT>(peer_src + x * 16, (long long)(n - x * VE), al);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned long long x = v + u * nth;
            a[u] = coll_load<DT>(own_src + x * 16, (long long)(n - x * VE), al);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned long long x = v + u * nth;
            uint4 pv[COLL_MAXW - 1];
            pv[0] = b[u];
            coll_store<DT>(out + x * 16, coll_reduce_ranks<DT, OP>(a[u], pv, rank, 2), (long long)(n - x * VE), al);
        }
    }
    for (; v < nv; v += nth) {
        const long long nvalid = (long long)(n - v * VE);
        uint4 pv[COLL_MAXW - 1];
        pv[0] = coll_load<DT>(peer_src + v * 16, nvalid, al);
        const uint4 own = coll_load<DT>(own_src + v * 16, nvalid, al);
        coll_store<DT>(out + v * 16, coll_reduce_ranks<DT, OP>(own, pv, rank, 2), nvalid, al);
    }
}

template <int DT, int OP>
__device__ __forceinline__ void coll_reduce_ptrs(unsigned int rank, unsigned int world, char* out,
                                                 unsigned long long n, CollSrcs src) {
    constexpr int VE = CollT<DT>::VE;
    // Own and peer pointers in peer order (l-th peer = rank (rank+1+l) % world).
    const char* own_src = coll_pick(src, (int)rank);
    const char* peer_src[COLL_MAXW - 1];
    bool al = ((reinterpret_cast<unsigned long long>(out) | reinterpret_cast<unsigned long long>(own_src)) & 15ull) == 0;
#pragma unroll
    for (int l = 0; l < COLL_MAXW - 1; ++l) {
        peer_src[l] = nullptr;
        if (l < (int)world - 1) {
            peer_src[l] = coll_pick(src, (int)((rank + 1 + l) % world));
            al = al && (reinterpret_cast<unsigned long long>(peer_src[l]) & 15ull) == 0;
        }
    }
    if (world == 2) {
        coll_reduce_ptrs_2<DT, OP>((int)rank, out, n, own_src, peer_src[0], al);
        return;
    }
    const unsigned long long nv = (n + VE - 1) / VE;
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long v = tid; v < nv; v += nth) {
        const long long nvalid = (long long)(n - v * VE);
        uint4 pv[COLL_MAXW - 1];
#pragma unroll
        for (int l = 0; l < COLL_MAXW - 1; ++l) {
            if (l < (int)world - 1) {
                pv[l] = coll_load<DT>(peer_src[l] + v * 16, nvalid, al);
            }
        }
        uint4 own = coll_load<DT>(own_src + v * 16, nvalid, al);
        coll_store<DT>(out + v * 16, coll_reduce_ranks<DT, OP>(own, pv, (int)rank, (int)world), nvalid, al);
    }
}

// The two-shot pull's work (COLL_MODE_AR2): for its shard of n elements, each thread loads the
// vector from every rank's input (peers' over NVLink), reduces them in rank order (the bits
// every other all-reduce kernel gives) and stores the result into every rank's output, peers
// first. Each element of the message is reduced by one rank only, which alone reads and writes
// that range everywhere, so the op may run in place.
template <int DT, int OP>
__device__ __forceinline__ void coll_reduce_push_ptrs(unsigned int rank, unsigned int world, unsigned long long n,
                                                      CollSrcs src, CollDsts dst) {
    constexpr int VE = CollT<DT>::VE;
    const char* own_src = coll_pick(src, (int)rank);
    char* own_dst = coll_pick(dst, (int)rank);
    const char* peer_src[COLL_MAXW - 1];
    char* peer_dst[COLL_MAXW - 1];
    bool al = ((reinterpret_cast<unsigned long long>(own_dst) | reinterpret_cast<unsigned long long>(own_src)) & 15ull) == 0;
#pragma unroll
    for (int l = 0; l < COLL_MAXW - 1; ++l) {
        peer_src[l] = nullptr;
        peer_dst[l] = nullptr;
        if (l < (int)world - 1) {
            const int s = (int)((rank + 1 + l) % world);
            peer_src[l] = coll_pick(src, s);
            peer_dst[l] = coll_pick(dst, s);
            al = al && ((reinterpret_cast<unsigned long long>(peer_src[l]) |
                         reinterpret_cast<unsigned long long>(peer_dst[l])) & 15ull) == 0;
        }
    }
    const unsigned long long nv = (n + VE - 1) / VE;
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long v = tid; v < nv; v += nth) {
        const long long nvalid = (long long)(n - v * VE);
        uint4 pv[COLL_MAXW - 1];
#pragma unroll
        for (int l = 0; l < COLL_MAXW - 1; ++l) {
            if (l < (int)world - 1) {
                pv[l] = coll_load<DT>(peer_src[l] + v * 16, nvalid, al);
            }
        }
        const uint4 own = coll_load<DT>(own_src + v * 16, nvalid, al);
        const uint4 r = coll_reduce_ranks<DT, OP>(own, pv, (int)rank, (int)world);
#pragma unroll
        for (int l = 0; l < COLL_MAXW - 1; ++l) {
            if (l < (int)world - 1) {
                coll_store<DT>(peer_dst[l] + v * 16, r, nvalid, al);
            }
        }
        coll_store<DT>(own_dst + v * 16, r, nvalid, al);
    }
}

#define COLL_REDUCE_PTRS_ENTRY(NAME, DT)                                                                              \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1)                                                    \
        NAME(unsigned int rank, unsigned int world, unsigned int op, char* out, unsigned long long n, const char* s0, \
             const char* s1, const char* s2, const char* s3, const char* s4, const char* s5, const char* s6,          \
             const char* s7) {                                                                                        \
        const CollSrcs src = {s0, s1, s2, s3, s4, s5, s6, s7};                                                        \
        symm_pdl_prologue();                                                                                          \
        switch (op) {                                                                                                 \
            case COLL_SUM:                                                                                            \
                coll_reduce_ptrs<DT, COLL_SUM>(rank, world, out, n, src);                                             \
                break;                                                                                                \
            case COLL_AVG:                                                                                            \
                coll_reduce_ptrs<DT, COLL_AVG>(rank, world, out, n, src);                                             \
                break;                                                                                                \
            case COLL_MAX:                                                                                            \
                coll_reduce_ptrs<DT, COLL_MAX>(rank, world, out, n, src);                                             \
                break;                                                                                                \
            default:                                                                                                  \
                coll_reduce_ptrs<DT, COLL_MIN>(rank, world, out, n, src);                                             \
                break;                                                                                                \
        }                                                                                                             \
    }

COLL_REDUCE_PTRS_ENTRY(symm_reduce_ptrs_f32, COLL_F32)
COLL_REDUCE_PTRS_ENTRY(symm_reduce_ptrs_f16, COLL_F16)
COLL_REDUCE_PTRS_ENTRY(symm_reduce_ptrs_bf16, COLL_BF16)
