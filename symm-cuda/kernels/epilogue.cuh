// symm-cuda: all-reduce epilogues (residual add, RMSNorm). Included at the end of
// collectives.cu (kernels::full_source expands the #include), so it uses the Lamport primitives
// there. The Rust side is symm-cuda/src/collectives/epilogue.rs.
//
// NOTE [fused-epilogue]
// =====================
// Rows: the ops work on [rows, hidden] of element type T with hidden * sizeof(T) a multiple of
// 16 bytes, so a row is `vr` whole 16-byte vectors. One block runs one row at a time (rows
// blockIdx.x, + gridDim.x, ...); thread t holds the row's vectors t, t + blockDim.x, ... (at most
// EPI_MAXV of them, `k`; blockDim.x a multiple of 32, chosen from vr alone: epilogue.rs
// `epilogue_threads`).
// Numerics, the same in every engine (docs/ops.md "Fused epilogues"):
//   a = T(sum over ranks of x)    f32 accumulation in rank order 0..world-1, rounded to T
//   s = T(f32(a) + f32(residual))                                        -> residual_out
//   n = T((f32(s) * rsqrt(ssq(s) / hidden + eps)) * f32(weight))           -> norm_out
// rounded exactly where the unfused sequence (all-reduce, add, RMSNorm of the stored residual)
// rounds. ssq: each thread sums f32(s)^2 over its lanes in vector order (fmaf), then a fixed
// butterfly over the warp and over the warps' sums (every lane ends with the same bits). The
// fused kernel and the separate one run the same epi_row with the same block size, so they give
// bitwise the same outputs, and every rank does.
//   symm_add_rms_{dt}: the epilogue alone, over an all-reduced `sum` (the unfused sequence: after
//     any symm all-reduce, after NCCL, and for messages beyond the Lamport buffers).
//   symm_lamport_add_rms_{dt}: the Lamport one-shot (NOTE [collectives-protocols]: the same
//     buffers, op state, op header and clearing as symm_lamport_*, with vector v = row * vr + j)
//     with the epilogue run on each row as soon as its vectors arrived. Phase 1 pushes every
//     vector of the block's rows into the peers' buffer (and clears the previous op's); the block
//     then counts itself in (the last advances the op state, as symm_lamport_* does); phase 2
//     receives a row, reduces it and runs the epilogue. Every wait is for a vector the peers push
//     in their phase 1 and all blocks are resident (one wave), so it cannot deadlock. At world 1
//     there is no exchange and no op state: a = x.
// Aliasing: norm_out may be x and residual_out may be residual (each vector is read and then
// written by one thread); no output may overlap anything else, the inputs (x, residual, weight)
// may overlap each other but x and residual (checked on the host, symm_core::epilogue).
// A poll that gives up (timeout, abort, a latched error) leaves the row reduced from this rank's
// own input: the outputs of a failed op are garbage (the error reaches the caller, NOTE
// [error-mirror], and the communicator refuses further ops), never a wait without end.

// Most vectors of one row per thread.
#define EPI_MAXV 8
// `flags` bit: compute the RMSNorm (else the residual add alone; weight and norm_out unused).
#define EPI_NORM 1u

// The block's sum of v (blockDim.x a multiple of 32, at most 1024): every thread gets the same
// bits. `red` holds 32 floats; the leading barrier lets a block reuse it row after row.
__device__ __forceinline__ float epi_block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0u) {
        red[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        t += __shfl_xor_sync(0xffffffffu, t, o);
    }
    return t;
}

// One row's epilogue. s[m] holds the all-reduced vector t + m * blockDim.x (for m < k and inside
// the row); it leaves with the residual sum. Every thread of the block calls it (barriers).
template <int DT>
__device__ __forceinline__ void epi_row(uint4 (&s)[EPI_MAXV], unsigned int k, unsigned int vr, const char* res,
                                        const char* weight, char* res_out, char* norm_out, float eps, bool norm,
                                        float* red) {
    constexpr int VE = CollT<DT>::VE;
    float ssq = 0.0f;
#pragma unroll
    for (int m = 0; m < EPI_MAXV; ++m) {
        const unsigned int j = threadIdx.x + (unsigned int)m * blockDim.x;
        if ((unsigned int)m < k && j < vr) {
            float a[VE];
            float r[VE];
            coll_unpack<DT>(s[m], a);
            coll_unpack<DT>(*reinterpret_cast<const uint4*>(res + (unsigned long long)j * 16ull), r);
#pragma unroll
            for (int i = 0; i < VE; ++i) {
                a[i] = __fadd_rn(a[i], r[i]);
            }
            s[m] = coll_pack<DT>(a);
            *reinterpret_cast<uint4*>(res_out + (unsigned long long)j * 16ull) = s[m];
            if (norm) {
                coll_unpack<DT>(s[m], a);
#pragma unroll
                for (int i = 0; i < VE; ++i) {
                    ssq = fmaf(a[i], a[i], ssq);
                }
            }
        }
    }
    if (!norm) {
        return;
    }
    const float total = epi_block_sum(ssq, red);
    const float rstd = rsqrtf(__fadd_rn(__fdiv_rn(total, (float)(vr * (unsigned int)VE)), eps));
#pragma unroll
    for (int m = 0; m < EPI_MAXV; ++m) {
        const unsigned int j = threadIdx.x + (unsigned int)m * blockDim.x;
        if ((unsigned int)m < k && j < vr) {
            float a[VE];
            float g[VE];
            coll_unpack<DT>(s[m], a);
            coll_unpack<DT>(*reinterpret_cast<const uint4*>(weight + (unsigned long long)j * 16ull), g);
#pragma unroll
            for (int i = 0; i < VE; ++i) {
                a[i] = __fmul_rn(__fmul_rn(a[i], rstd), g[i]);
            }
            *reinterpret_cast<uint4*>(norm_out + (unsigned long long)j * 16ull) = coll_pack<DT>(a);
        }
    }
}

// The epilogue over every row of this block, from `sum` (already all-reduced; may be norm_out or
// residual_out, read before they are written). `red`: the block's 32-float scratch.
template <int DT>
__device__ __forceinline__ void epi_rows(const char* sum, const char* res, const char* weight, char* res_out,
                                         char* norm_out, unsigned long long rows, unsigned int vr, unsigned int k,
                                         float eps, bool norm, float* red) {
    const unsigned long long row_bytes = (unsigned long long)vr * 16ull;
    for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const unsigned long long o = row * row_bytes;
        uint4 s[EPI_MAXV];
#pragma unroll
        for (int m = 0; m < EPI_MAXV; ++m) {
            const unsigned int j = threadIdx.x + (unsigned int)m * blockDim.x;
            if ((unsigned int)m < k && j < vr) {
                s[m] = *reinterpret_cast<const uint4*>(sum + o + (unsigned long long)j * 16ull);
            }
        }
        epi_row<DT>(s, k, vr, res + o, weight, res_out + o, norm_out + o, eps, norm, red);
    }
}

#define EPI_ARGS                                                                                          \
    const char *sum, const char *res, const char *weight, char *res_out, char *norm_out, unsigned long long rows, \
        unsigned int vr, unsigned int k, float eps, unsigned int flags
#define EPI_ENTRY(NAME, DT)                                                                            \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) NAME(EPI_ARGS) {                     \
        symm_pdl_prologue();                                                                            \
        __shared__ float red[32];                                                                       \
        epi_rows<DT>(sum, res, weight, res_out, norm_out, rows, vr, k, eps, (flags & EPI_NORM) != 0u, red); \
    }
EPI_ENTRY(symm_add_rms_f32, COLL_F32)
EPI_ENTRY(symm_add_rms_f16, COLL_F16)
EPI_ENTRY(symm_add_rms_bf16, COLL_BF16)

// The Lamport one-shot all-reduce (sum) of `input` with the epilogue applied row by row.
template <int DT>
__device__ __forceinline__ void coll_lamport_epi(const CollWs8 wsv, unsigned int* pad, unsigned int rank,
                                                 unsigned int world, const char* input, unsigned long long rows,
                                                 unsigned int vr, unsigned int k, unsigned long long lam_off,
                                                 unsigned long long slot_bytes, unsigned long long timeout_ns,
                                                 const unsigned int* abort_host, unsigned long long hdr_off,
                                                 const uint4 hdr, const char* res, const char* weight, char* res_out,
                                                 char* norm_out, float eps, bool norm) {
    symm_pdl_prologue();
    __shared__ float red[32];
    const unsigned long long row_bytes = (unsigned long long)vr * 16ull;
    if (world == 1u) {
        // Nothing to exchange: the sum is the input.
        epi_rows<DT>(input, res, weight, res_out, norm_out, rows, vr, k, eps, norm, red);
        return;
    }
    char* ws = reinterpret_cast<char*>(coll_ws(wsv, rank));
    unsigned int* st = reinterpret_cast<unsigned int*>(ws);
    const unsigned int w1 = world - 1u;
    const unsigned long long buf_bytes = (unsigned long long)w1 * slot_bytes;
    const unsigned long long nv = rows * vr;
    const unsigned int idx = symm_ld_volatile(st + COLL_ST_LAM_IDX) % 3u;
    const unsigned long long prev = symm_ld_volatile(st + COLL_ST_LAM_USED);
    char* const cb = ws + lam_off + ((idx + 2u) % 3u) * buf_bytes;
    const char* const mine = ws + lam_off + idx * buf_bytes;
    const uint4 sentinel = make_uint4(COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL);
    CollWait w;
    w.pad = pad;
    w.abort_host = abort_host;
    w.timeout_ns = timeout_ns;

    // Phase 1: push every vector of this block's rows (vector 0 with the op header) and clear
    // the previous op's vectors at the same places.
    for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {
#pragma unroll
        for (int m = 0; m < EPI_MAXV; ++m) {
            const unsigned int j = threadIdx.x + (unsigned int)m * blockDim.x;
            if ((unsigned int)m < k && j < vr) {
                const unsigned long long v = row * vr + j;
                if (v == 0ull) {
                    coll_lam_push_header(wsv, ws, rank, world, idx, hdr_off, hdr);
                }
                const uint4 x = coll_canon<DT>(*reinterpret_cast<const uint4*>(input + v * 16ull));
                for (unsigned int l = 0; l < w1; ++l) {
                    const unsigned int p = (rank + 1u + l) % world;
                    const unsigned int jr = world - 2u - l;
                    coll_st_v4(reinterpret_cast<char*>(coll_ws(wsv, p)) + lam_off + idx * buf_bytes + jr * slot_bytes +
                                   v * 16ull,
                               x);
                }
                if (v < prev) {
                    for (unsigned int jj = 0; jj < w1; ++jj) {
                        coll_st_v4(cb + jj * slot_bytes + v * 16ull, sentinel);
                    }
                }
            }
        }
    }
    {
        const unsigned long long gt = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
        const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
        for (unsigned long long v = nv + gt; v < prev; v += nth) {
            for (unsigned int jj = 0; jj < w1; ++jj) {
                coll_st_v4(cb + jj * slot_bytes + v * 16ull, sentinel);
            }
        }
    }
    // Every thread of the block has read the op state: count the block in; the last advances it
    // (as symm_lamport_*; one block advances it at its end).
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x > 1u) {
        if (atomicAdd(st + COLL_ST_LAM_ARRIVE, 1u) == gridDim.x - 1u) {
            st[COLL_ST_LAM_ARRIVE] = 0u;
            st[COLL_ST_LAM_USED] = (unsigned int)nv;
            st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
        }
    }

    // Phase 2: receive, reduce and finish one row at a time.
    unsigned long long deadline = 0;
    bool failed = false;
    for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const unsigned long long o = row * row_bytes;
        uint4 s[EPI_MAXV];
#pragma unroll
        for (int m = 0; m < EPI_MAXV; ++m) {
            const unsigned int j = threadIdx.x + (unsigned int)m * blockDim.x;
            if ((unsigned int)m < k && j < vr) {
                const unsigned long long v = row * vr + j;
                const uint4 own = coll_canon<DT>(*reinterpret_cast<const uint4*>(input + v * 16ull));
                uint4 pv[COLL_MAXW - 1];
                if (!failed) {
                    failed = !coll_lam_poll<DT, COLL_MAXW - 1>(pv, mine, slot_bytes, v, ws + hdr_off, idx, hdr, rank,
                                                              world, w, st, deadline);
                }
                s[m] = failed ? own : coll_reduce_ranks<DT, COLL_SUM>(own, pv, (int)rank, (int)world);
            }
        }
        epi_row<DT>(s, k, vr, res + o, weight, res_out + o, norm_out + o, eps, norm, red);
    }
    if (gridDim.x == 1u && threadIdx.x == 0) {
        st[COLL_ST_LAM_USED] = (unsigned int)nv;
        st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
    }
}

#define COLL_LAMPORT_EPI_ARGS                                                                                 \
    unsigned long long ws0, unsigned long long ws1, unsigned long long ws2, unsigned long long ws3,             \
        unsigned long long ws4, unsigned long long ws5, unsigned long long ws6, unsigned long long ws7,         \
        unsigned long long pad_ptr, unsigned int rank, unsigned int world, const char *input,                  \
        unsigned long long rows, unsigned int vr, unsigned int k, unsigned long long lam_off,                   \
        unsigned long long slot_bytes, unsigned long long timeout_ns, const unsigned int *abort_host,           \
        unsigned long long hdr_off, unsigned long long oph0, unsigned long long oph1, const char *res,          \
        const char *weight, char *res_out, char *norm_out, float eps, unsigned int flags
#define COLL_LAMPORT_EPI_ENTRY(NAME, DT)                                                                         \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_LAMPORT_EPI_ARGS) {               \
        const CollWs8 wsv = {ws0, ws1, ws2, ws3, ws4, ws5, ws6, ws7};                                             \
        coll_lamport_epi<DT>(wsv, reinterpret_cast<unsigned int*>(pad_ptr), rank, world, input, rows, vr, k, lam_off, \
                             slot_bytes, timeout_ns, abort_host, hdr_off,                                        \
                             make_uint4((unsigned int)oph0, (unsigned int)(oph0 >> 32), (unsigned int)oph1,       \
                                        (unsigned int)(oph1 >> 32)),                                             \
                             res, weight, res_out, norm_out, eps, (flags & EPI_NORM) != 0u);                     \
    }
COLL_LAMPORT_EPI_ENTRY(symm_lamport_add_rms_f32, COLL_F32)
COLL_LAMPORT_EPI_ENTRY(symm_lamport_add_rms_f16, COLL_F16)
COLL_LAMPORT_EPI_ENTRY(symm_lamport_add_rms_bf16, COLL_BF16)
