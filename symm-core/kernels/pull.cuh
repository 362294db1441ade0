// symm: The fused zero-copy pull (all-reduce, reduce-scatter, all-gather from registered inputs).
// Included by collectives.cu (symm_core::kernel_source::expand_includes expands the include:
// neither NVRTC nor hiprtc gets an include path), after its primitives and dtype helpers,
// which this file uses.

// ---------------------------------------------------------------- fused zero-copy pull

// out[s * n + i] = src_s[i] for every rank s (all-gather; rank s's slice is skipped when its source
// already is that slice: in place). Grid-stride, COLL_PULL_UNROLL vectors per source in flight;
// every step copies its vectors of every source, peers first and this rank's own (local) slice
// last, so both ranks read over NVLink at the same time all along (source after source, the
// ranks' local copies and remote reads would alternate: 467 against 410 us at 256 MiB).
template <int DT>
__device__ __forceinline__ void coll_gather_ptrs(unsigned int rank, unsigned int world, char* out,
                                                 unsigned long long n, CollSrcs src) {
    constexpr int VE = CollT<DT>::VE;
    constexpr int ES = CollT<DT>::ES;
    constexpr int U = COLL_PULL_UNROLL;
    const unsigned long long part = n * ES;
    const unsigned long long nv = (n + VE - 1) / VE;
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long v0 = tid; v0 < nv; v0 += U * nth) {
        for (unsigned int l = 0; l < world; ++l) {
            const unsigned int s = (rank + 1 + l) % world;  // l = world - 1: this rank
            const char* in = coll_pick(src, (int)s);
            char* dst = out + (unsigned long long)s * part;
            if (in == dst) {
                continue;
            }
            const bool al =
                ((reinterpret_cast<unsigned long long>(in) | reinterpret_cast<unsigned long long>(dst)) & 15ull) == 0;
            uint4 x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const unsigned long long v = v0 + u * nth;
                if (v < nv) {
                    x[u] = coll_load<DT>(in + v * 16, (long long)(n - v * VE), al);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const unsigned long long v = v0 + u * nth;
                if (v < nv) {
                    coll_store<DT>(dst + v * 16, x[u], (long long)(n - v * VE), al);
                }
            }
        }
    }
}

// One kernel for a zero-copy pull: the opening barrier, the pull, and the closing barrier, so the
// op costs one launch instead of three (NOTE [collectives-protocols], "Fused pull").
// Barrier epochs: base = BAR_CNT[t] (read by every block), opening = base + 1, closing =
// base + 2; the same counters as symm_coll_barrier (the fused pull counts as two full barriers).
// Every block sends the opening signal (idempotent: the same values), so no block waits on
// another being resident; every block waits for every peer's opening signal before it reads
// peers. The last block to finish (PULL_DONE, acq_rel) sends the closing signal, waits for the
// peers' and stores BAR_CNT = base + 2 (every block has read BAR_CNT before it counted itself in).
// mode: COLL_MODE_AR / COLL_MODE_RS (reduce the sources into out, n elements), COLL_MODE_AG
// (gather: rank s's n elements to out + s * n) or COLL_MODE_AR2 (the two-shot pull: reduce the
// sources, n elements, and store the result at every rank's destination d_s).
// The fused pull's signal word from rank `src` in `pad` (OPS rows COLL_OPS_PULL64, +1).
__device__ __forceinline__ unsigned long long* coll_pull_slot(unsigned int* pad, unsigned int src) {
    return reinterpret_cast<unsigned long long*>(pad + SYMM_OPS_BASE + COLL_OPS_PULL64 * SYMM_MAX_WORLD_SIZE) + src;
}

// Waits until the epoch (low half) of *p reaches `target` and stores the word in *out; false on a
// timeout / abort / error already latched.
__device__ __noinline__ bool coll_wait_pull(const unsigned long long* p, unsigned int target, CollWait w,
                                            unsigned long long* out) {
    unsigned long long deadline = 0;
    unsigned int polls = 0;
    while (true) {
        const unsigned long long v = coll_ld_acquire_sys_u64(p);
        if (symm_epoch_reached((unsigned int)v, target)) {
            *out = v;
            return true;
        }
        if (!coll_poll_again(polls, deadline, w)) {
            return false;
        }
    }
}

// MODE >= 0 / W > 0: mode and world size fixed at compile time (two-rank entries), as for the
// Lamport kernel.
template <int DT, int OP, int MODE, int W>
__device__ __forceinline__ void coll_pull(const CollWs8 pads, const CollSrcs src, const CollDsts dst, unsigned int* st,
                                          unsigned int rank,
                                          unsigned int world_arg, unsigned int mode_arg, char* out,
                                          unsigned long long n, unsigned int check, unsigned long long timeout_ns,
                                          const unsigned int* abort_host) {
    symm_pdl_prologue();
    const unsigned int world = W > 0 ? (unsigned int)W : world_arg;
    const unsigned int mode = MODE >= 0 ? (unsigned int)MODE : mode_arg;
    __shared__ int s_last;
    unsigned int* pad = reinterpret_cast<unsigned int*>(coll_ws(pads, rank));
    CollWait w;
    w.pad = pad;
    w.abort_host = abort_host;
    w.timeout_ns = timeout_ns;
    w.host_every_thread = 0u;
    const unsigned int t = threadIdx.x;
    const bool peer = t < world && t != rank;
    unsigned int base = 0;
    int ok = 1;
    const unsigned long long hi = (unsigned long long)check << 32;
    if (peer) {
        base = coll_ld_acquire_gpu(st + COLL_ST_BAR_CNT + t);
        // Epoch and check word in one release store: no second remote store whose
        // acknowledgement the release would wait for.
        coll_st_release_sys_u64(coll_pull_slot(reinterpret_cast<unsigned int*>(coll_ws(pads, t)), rank),
                                hi | (base + 1u));
        unsigned long long got = 0;
        if (!coll_wait_pull(coll_pull_slot(pad, t), base + 1u, w, &got)) {
            ok = 0;
        } else if ((unsigned int)(got >> 32) != check) {
            // Peers passed another op or geometry: reading their buffers could leave their
            // allocation.
            coll_latch_disagreement(w, st, SYMM_ERR_MISMATCH, COLL_MISMATCH_CHECK, t,
                                    make_uint4((unsigned int)(got >> 32), 0u, 0u, 0u), make_uint4(check, 0u, 0u, 0u));
            ok = 0;
        }
    }
    if (__syncthreads_and(ok)) {
        if (mode == COLL_MODE_AG) {
            coll_gather_ptrs<DT>(rank, world, out, n, src);
        } else if (mode == COLL_MODE_AR2) {
            coll_reduce_push_ptrs<DT, OP>(rank, world, n, src, dst);
            // This thread's stores into peers' outputs are visible system-wide before its block
            // counts itself in, so the closing signal (sent after every block counted in) tells
            // each peer that its output holds this rank's shard.
            __threadfence_system();
        } else {
            coll_reduce_ptrs<DT, OP>(rank, world, out, n, src);
        }
    }
    __syncthreads();
    if (t == 0) {
        s_last = coll_atom_add_acq_rel_gpu(st + COLL_ST_PULL_DONE, 1u) == gridDim.x - 1u;
    }
    __syncthreads();
    if (!s_last) {
        return;
    }
    if (t == 0) {
        st[COLL_ST_PULL_DONE] = 0u;
    }
    if (peer) {
        // Every block's reads of peers are done (they counted themselves in after them): peers
        // may reuse their inputs once they see this.
        // The same check word: a peer still waiting for base+1 may see base+2 first.
        coll_st_release_sys_u64(coll_pull_slot(reinterpret_cast<unsigned int*>(coll_ws(pads, t)), rank),
                                hi | (base + 2u));
        unsigned long long got = 0;
        coll_wait_pull(coll_pull_slot(pad, t), base + 2u, w, &got);
        st[COLL_ST_BAR_CNT + t] = base + 2u;
    }
}

// The pull entries' parameters (generic and two-rank entries alike; symm-cuda's args::pull).
#define COLL_PULL_ARGS                                                                                    \
    unsigned long long p0, unsigned long long p1, unsigned long long p2, unsigned long long p3,             \
        unsigned long long p4, unsigned long long p5, unsigned long long p6, unsigned long long p7,         \
        const char *s0, const char *s1, const char *s2, const char *s3, const char *s4, const char *s5,    \
        const char *s6, const char *s7, char *d0, char *d1, char *d2, char *d3, char *d4, char *d5, char *d6,  \
        char *d7, unsigned long long state, unsigned int rank, unsigned int world, unsigned int mode,           \
        unsigned int op, char *out, unsigned long long n, unsigned int check, unsigned long long timeout_ns,    \
        const unsigned int *abort_host

#define COLL_PULL_ENTRY(NAME, DT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1)                                                 \
        NAME(COLL_PULL_ARGS) {                                                                                        \
        const CollWs8 pads = {p0, p1, p2, p3, p4, p5, p6, p7};                                                      \
        const CollSrcs src = {s0, s1, s2, s3, s4, s5, s6, s7};                                                      \
        const CollDsts dst = {d0, d1, d2, d3, d4, d5, d6, d7};                                                      \
        unsigned int* st = reinterpret_cast<unsigned int*>(state);                                                  \
        if (mode == COLL_MODE_AG) {                                                                                 \
            coll_pull<DT, COLL_SUM, -1, 0>(pads, src, dst, st, rank, world, mode, out, n, check, timeout_ns, abort_host);       \
            return;                                                                                                 \
        }                                                                                                           \
        switch (op) {                                                                                               \
            case COLL_SUM:                                                                                          \
                coll_pull<DT, COLL_SUM, -1, 0>(pads, src, dst, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
                break;                                                                                              \
            case COLL_AVG:                                                                                          \
                coll_pull<DT, COLL_AVG, -1, 0>(pads, src, dst, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
                break;                                                                                              \
            case COLL_MAX:                                                                                          \
                coll_pull<DT, COLL_MAX, -1, 0>(pads, src, dst, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
                break;                                                                                              \
            default:                                                                                                \
                coll_pull<DT, COLL_MIN, -1, 0>(pads, src, dst, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
                break;                                                                                              \
        }                                                                                                           \
    }

COLL_PULL_ENTRY(symm_pull_f32, COLL_F32)
COLL_PULL_ENTRY(symm_pull_f16, COLL_F16)
COLL_PULL_ENTRY(symm_pull_bf16, COLL_BF16)

// Two ranks, one (mode, op) per entry: symm_pull2_{ar,rs}_{sum,avg,max,min}_{dt} and
// symm_pull2_ag_{dt} (the generic entry's arguments; `world`, `mode` and `op` are ignored).
#define COLL_PULL2(NAME, DT, MODE, OP)                                                                               \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1)                                                 \
        NAME(COLL_PULL_ARGS) {                                                                                        \
        const CollWs8 pads = {p0, p1, p2, p3, p4, p5, p6, p7};                                                      \
        const CollSrcs src = {s0, s1, s2, s3, s4, s5, s6, s7};                                                      \
        const CollDsts dst = {d0, d1, d2, d3, d4, d5, d6, d7};                                                      \
        coll_pull<DT, OP, MODE, 2>(pads, src, dst, reinterpret_cast<unsigned int*>(state), rank, world, mode, out, n, \
                                   check, timeout_ns, abort_host);                                                  \
    }
COLL_MODE_OP_ENTRIES(COLL_PULL2, pull2, f32, COLL_F32)
COLL_MODE_OP_ENTRIES(COLL_PULL2, pull2, f16, COLL_F16)
COLL_MODE_OP_ENTRIES(COLL_PULL2, pull2, bf16, COLL_BF16)
