// symm: The chunked ring push (one-shot and two-shot all-reduce, reduce-scatter, all-gather).
// Included by collectives.cu (symm_core::kernel_source::expand_includes expands the include:
// neither NVRTC nor hiprtc gets an include path), after its primitives and dtype helpers,
// which this file uses.

// ---------------------------------------------------------------- ring (chunked push)

// Elements of chunk c of a part holding `len` elements (0 when the chunk lies past the end).
__device__ __forceinline__ long long coll_chunk_len(unsigned long long len, unsigned long long ce,
                                                    unsigned long long c) {
    unsigned long long start = c * ce;
    if (start >= len) {
        return 0;
    }
    unsigned long long n = len - start;
    return (long long)(n < ce ? n : ce);
}

// Shard t of a vector of `total` elements cut in shards of `shard` elements: its length.
__device__ __forceinline__ unsigned long long coll_shard_len(unsigned long long total, unsigned long long shard,
                                                             unsigned int t) {
    unsigned long long start = (unsigned long long)t * shard;
    if (start >= total) {
        return 0;
    }
    unsigned long long n = total - start;
    return n < shard ? n : shard;
}

// NOTE [ring-unroll]: the ring's copies keep COLL_RING_UNROLL vectors in flight per thread, as
// the bandwidth probe's copy kernel does. Every store here is an asm volatile with a "memory"
// clobber, so the compiler cannot hoist the next vector's load above this one's store: one
// vector per thread at a time left each sender SM waiting out a load's latency per 16 bytes
// (bench-notes round 15).
#define COLL_RING_UNROLL 4

// Moves the n elements of a chunk by one block, U vectors in flight per thread: ld(v) loads
// vector v, st(v, x) stores it (each knows its addresses and the tail's length).
template <int DT, int U, typename Ld, typename St>
__device__ __forceinline__ void coll_copy_vectors_u(long long n, Ld ld, St st) {
    constexpr int VE = CollT<DT>::VE;
    const long long nvec = (n + VE - 1) / VE;
    const long long bd = blockDim.x;
    long long v = threadIdx.x;
    for (; v + (U - 1) * bd < nvec; v += U * bd) {
        uint4 x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            x[u] = ld(v + u * bd);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            st(v + u * bd, x[u]);
        }
    }
    for (; v < nvec; v += bd) {
        st(v, ld(v));
    }
}

// coll_copy_vectors_u with COLL_RING_UNROLL vectors in flight, or one with COLL_FLAG_UNROLL1.
template <int DT, typename Ld, typename St>
__device__ __forceinline__ void coll_copy_vectors(unsigned int flags, long long n, Ld ld, St st) {
    if (flags & COLL_FLAG_UNROLL1) {
        coll_copy_vectors_u<DT, 1>(n, ld, st);
    } else {
        coll_copy_vectors_u<DT, COLL_RING_UNROLL>(n, ld, st);
    }
}

// Copies n elements from src to dst (16-byte vectors where both are aligned) by one block.
template <int DT>
__device__ __forceinline__ void coll_block_copy(unsigned int flags, char* dst, const char* src, long long n) {
    constexpr int VE = CollT<DT>::VE;
    const bool al = ((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(dst)) & 15ull) == 0;
    coll_copy_vectors<DT>(
        flags, n, [&](long long v) { return coll_load<DT>(src + v * 16, n - v * VE, al); },
        [&](long long v, const uint4& x) { coll_store<DT>(dst + v * 16, x, n - v * VE, al); });
}

template <int DT, int OP>
__device__ __forceinline__ void coll_ring(const unsigned long long* bufs, const unsigned long long* pads,
                                          unsigned int rank, unsigned int world, unsigned int mode, const char* input,
                                          char* output, unsigned long long total, unsigned long long shard,
                                          unsigned long long ce, unsigned int nchunks, unsigned int nsend,
                                          unsigned int slots, unsigned long long slot_bytes,
                                          unsigned long long flags_off, unsigned long long ring_off,
                                          unsigned long long state_off, unsigned long long timeout_ns,
                                          const unsigned int* abort_host, unsigned int flags,
                                          unsigned long long hdr_off, const uint4 hdr) {
    symm_pdl_prologue();
    constexpr int VE = CollT<DT>::VE;
    constexpr int ES = CollT<DT>::ES;
    __shared__ unsigned int s_base;
    __shared__ int s_fail;
    __shared__ unsigned long long s_bufs[COLL_MAXW];
    unsigned int* pad = reinterpret_cast<unsigned int*>(pads[rank]);
    char* ws = reinterpret_cast<char*>(bufs[rank]);
    unsigned int* st = reinterpret_cast<unsigned int*>(ws + state_off);
    if (threadIdx.x == 0) {
        s_base = symm_ld_volatile(st + COLL_ST_RING_SEQ);
        // NOTE [latched-sends-nothing]: after a timeout or abort on this rank, its kernels send
        // nothing (a two-shot's all-gather would otherwise push a shard its failed
        // reduce-scatter never reduced, and the peers would return it as a result).
        s_fail = coll_fatal_latched(pad) ? 1 : 0;
        coll_atom_add_release_gpu(st + COLL_ST_RING_ARRIVE, 1u);
    }
    if (threadIdx.x < world) {
        s_bufs[threadIdx.x] = bufs[threadIdx.x];
    }
    __syncthreads();
    const unsigned int base = s_base;
    const unsigned int w1 = world - 1;
    const unsigned int smask = slots - 1;
    unsigned int* data_flags = reinterpret_cast<unsigned int*>(ws + flags_off);  // [w1][slots]
    unsigned int* ack_flags = data_flags + (unsigned long long)w1 * slots;       // [w1][slots]
    unsigned int* sent_flags = ack_flags + (unsigned long long)w1 * slots;       // [slots]
    const unsigned long long peer_ack_off = flags_off + (unsigned long long)w1 * slots * 4ull;
    // hdr_off: the op headers HDR[w1][slots] (layout.rs ring_headers_off).
    CollWait w;
    w.pad = pad;
    w.abort_host = abort_host;
    w.timeout_ns = timeout_ns;
    w.host_every_thread = 0u;
    const unsigned long long my_len =
        (mode == COLL_MODE_AR) ? total : coll_shard_len(total, shard, rank);
    // With as many senders as receivers, even blocks send and odd blocks receive, so any prefix
    // of the grid that is resident (the scheduler starts blocks in index order) holds both roles.
    const bool interleaved = nsend > 0 && 2 * nsend == gridDim.x;
    const bool is_sender = interleaved ? (blockIdx.x & 1u) == 0u : blockIdx.x < nsend;
    const unsigned int role_idx = interleaved ? (blockIdx.x >> 1) : (is_sender ? blockIdx.x : blockIdx.x - nsend);

    if (is_sender) {
        // ------------------------------------------------ sender
        for (unsigned int c = role_idx; c < nchunks; c += nsend) {
            const unsigned int g = base + c;
            const unsigned int slot = g & smask;
            if (threadIdx.x < w1) {
                if (!coll_wait_geq(ack_flags + threadIdx.x * slots + slot, g - slots + 1u, w)) {
                    s_fail = 1;
                }
            }
            __syncthreads();
            if (s_fail) {
                break;
            }
            if (threadIdx.x < w1) {
                // This chunk's op header, before its data: the flag's release covers both.
                const unsigned int p = (rank + 1 + threadIdx.x) % world;
                const unsigned int jr = world - 2 - threadIdx.x;
                coll_st_v4(reinterpret_cast<char*>(s_bufs[p]) + hdr_off + ((unsigned long long)jr * slots + slot) * 16ull,
                           hdr);
            }
            if (mode == COLL_MODE_RS) {
                for (unsigned int l = 0; l < w1; ++l) {
                    const unsigned int p = (rank + 1 + l) % world;
                    const unsigned int jr = world - 2 - l;
                    const long long n = coll_chunk_len(coll_shard_len(total, shard, p), ce, c);
                    const char* src = input + ((unsigned long long)p * shard + (unsigned long long)c * ce) * ES;
                    char* dst = reinterpret_cast<char*>(s_bufs[p]) + ring_off +
                                ((unsigned long long)jr * slots + slot) * slot_bytes;
                    const bool al = (reinterpret_cast<unsigned long long>(src) & 15ull) == 0;
                    coll_copy_vectors<DT>(
                        flags, n, [&](long long v) { return coll_load<DT>(src + v * 16, n - v * VE, al); },
                        [&](long long v, const uint4& x) { coll_st_v4(dst + v * 16, x); });
                }
            } else {
                // AR: chunk c of the whole input; AG: chunk c of this rank's shard (= input).
                const long long n = coll_chunk_len(my_len, ce, c);
                const char* src = input + (unsigned long long)c * ce * ES;
                const bool al = (reinterpret_cast<unsigned long long>(src) & 15ull) == 0;
                // Indexed by unrolled constants only, so the array lives in registers.
                char* dsts[COLL_MAXW - 1];
#pragma unroll
                for (unsigned int l = 0; l < COLL_MAXW - 1; ++l) {
                    const unsigned int p = (rank + 1 + l) % world;
                    const unsigned int jr = world - 2 - l;
                    dsts[l] = l < w1 ? reinterpret_cast<char*>(s_bufs[p]) + ring_off +
                                           ((unsigned long long)jr * slots + slot) * slot_bytes
                                     : nullptr;
                }
                coll_copy_vectors<DT>(
                    flags, n, [&](long long v) { return coll_load<DT>(src + v * 16, n - v * VE, al); },
                    [&](long long v, const uint4& x) {
#pragma unroll
                        for (unsigned int l = 0; l < COLL_MAXW - 1; ++l) {
                            if (l < w1) {
                                coll_st_v4(dsts[l] + v * 16, x);
                            }
                        }
                    });
            }
            __syncthreads();
            if (threadIdx.x < w1) {
                const unsigned int p = (rank + 1 + threadIdx.x) % world;
                const unsigned int jr = world - 2 - threadIdx.x;
                unsigned int* f = reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(s_bufs[p]) + flags_off);
                symm_st_release_sys(f + (unsigned long long)jr * slots + slot, g + 1u);
            }
            if ((flags & COLL_FLAG_INPLACE) && threadIdx.x == 0) {
                coll_st_release_gpu(sent_flags + slot, g + 1u);
            }
        }
    } else {
        // ------------------------------------------------ receiver
        const unsigned int nrecv = gridDim.x - nsend;
        for (unsigned int c = role_idx; c < nchunks; c += nrecv) {
            const unsigned int g = base + c;
            const unsigned int slot = g & smask;
            if (threadIdx.x < w1) {
                if (!coll_wait_geq(data_flags + threadIdx.x * slots + slot, g + 1u, w)) {
                    s_fail = 1;
                }
            } else if (threadIdx.x == w1 && (flags & COLL_FLAG_INPLACE) && w1 > 0) {
                if (!coll_wait_geq(sent_flags + slot, g + 1u, w)) {
                    s_fail = 1;
                }
            }
            __syncthreads();
            if (s_fail) {
                break;
            }
            // The peer's op header for this chunk (its flag was acquired above): loaded beside the
            // chunk's data, compared before the slot is acked.
            uint4 theirs = hdr;
            if (threadIdx.x < w1) {
                theirs = coll_ld_volatile_v4(ws + hdr_off + ((unsigned long long)threadIdx.x * slots + slot) * 16ull);
            }
            const char* ring = ws + ring_off + (unsigned long long)slot * slot_bytes;
            const unsigned long long ring_stride = (unsigned long long)slots * slot_bytes;  // per peer l
            if (mode == COLL_MODE_AG) {
                for (unsigned int l = 0; l < w1; ++l) {
                    const unsigned int t = (rank + 1 + l) % world;
                    const long long n = coll_chunk_len(coll_shard_len(total, shard, t), ce, c);
                    char* dst = output + ((unsigned long long)t * shard + (unsigned long long)c * ce) * ES;
                    const char* src = ring + l * ring_stride;
                    const bool al = (reinterpret_cast<unsigned long long>(dst) & 15ull) == 0;
                    coll_copy_vectors<DT>(
                        flags, n, [&](long long v) { return coll_ld_cg_v4(src + v * 16); },
                        [&](long long v, const uint4& x) { coll_store<DT>(dst + v * 16, x, n - v * VE, al); });
                }
                char* own_dst = output + ((unsigned long long)rank * shard + (unsigned long long)c * ce) * ES;
                const char* own_src = input + (unsigned long long)c * ce * ES;
                if (own_dst != own_src) {
                    coll_block_copy<DT>(flags, own_dst, own_src, coll_chunk_len(my_len, ce, c));
                }
            } else {
                // AR: output chunk c of the whole vector; RS: chunk c of this rank's shard.
                const long long n = coll_chunk_len(my_len, ce, c);
                const unsigned long long in_elem =
                    (mode == COLL_MODE_AR ? 0ull : (unsigned long long)rank * shard) + (unsigned long long)c * ce;
                const char* loc = input + in_elem * ES;
                char* dst = output + (unsigned long long)c * ce * ES;
                const bool al_loc = (reinterpret_cast<unsigned long long>(loc) & 15ull) == 0;
                const bool al_dst = (reinterpret_cast<unsigned long long>(dst) & 15ull) == 0;
                const long long nvec = (n + VE - 1) / VE;
                for (long long v = threadIdx.x; v < nvec; v += blockDim.x) {
                    const long long nvalid = n - v * VE;
                    uint4 pv[COLL_MAXW - 1];
#pragma unroll
                    for (int l = 0; l < COLL_MAXW - 1; ++l) {
                        if (l < (int)w1) {
                            pv[l] = coll_ld_cg_v4(ring + l * ring_stride + v * 16);
                        }
                    }
                    uint4 own = coll_load<DT>(loc + v * 16, nvalid, al_loc);
                    coll_store<DT>(dst + v * 16, coll_reduce_ranks<DT, OP>(own, pv, (int)rank, (int)world), nvalid,
                                   al_dst);
                }
            }
            if (threadIdx.x < w1 && !coll_v4_eq(theirs, hdr)) {
                coll_latch_disagreement(w, st, SYMM_ERR_OP_MISMATCH, COLL_MISMATCH_HEADER,
                                        (rank + 1 + threadIdx.x) % world, theirs, hdr);
                s_fail = 1;
            }
            __syncthreads();
            if (threadIdx.x < w1) {
                const unsigned int p = (rank + 1 + threadIdx.x) % world;
                const unsigned int jr = world - 2 - threadIdx.x;
                unsigned int* f = reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(s_bufs[p]) + peer_ack_off);
                symm_st_release_sys(f + (unsigned long long)jr * slots + slot, g + 1u);
            }
        }
    }

    if (blockIdx.x == 0 && threadIdx.x == 0) {
        coll_wait_arrivals(st + COLL_ST_RING_ARRIVE, w);
        st[COLL_ST_RING_SEQ] = base + nchunks;
        st[COLL_ST_RING_ARRIVE] = 0u;
    }
}

#define COLL_RING_ARGS                                                                                                \
    const unsigned long long *bufs, const unsigned long long *pads, unsigned int rank, unsigned int world,            \
        unsigned int mode, unsigned int op, const char *input, char *output, unsigned long long total,                \
        unsigned long long shard, unsigned long long ce, unsigned int nchunks, unsigned int nsend, unsigned int slots, \
        unsigned long long slot_bytes, unsigned long long flags_off, unsigned long long ring_off,                     \
        unsigned long long state_off, unsigned long long timeout_ns, const unsigned int *abort_host,                  \
        unsigned int flags, unsigned long long hdr_off, unsigned long long oph0, unsigned long long oph1
#define COLL_RING_PASS                                                                                                 \
    bufs, pads, rank, world, mode, input, output, total, shard, ce, nchunks, nsend, slots, slot_bytes, flags_off,      \
        ring_off, state_off, timeout_ns, abort_host, flags, hdr_off,                                                   \
        make_uint4((unsigned int)oph0, (unsigned int)(oph0 >> 32), (unsigned int)oph1, (unsigned int)(oph1 >> 32))

#define COLL_RING_ENTRY(NAME, DT)                                              \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_RING_ARGS) { \
        switch (op) {                                                          \
            case COLL_SUM:                                                     \
                coll_ring<DT, COLL_SUM>(COLL_RING_PASS);                       \
                break;                                                         \
            case COLL_AVG:                                                     \
                coll_ring<DT, COLL_AVG>(COLL_RING_PASS);                       \
                break;                                                         \
            case COLL_MAX:                                                     \
                coll_ring<DT, COLL_MAX>(COLL_RING_PASS);                       \
                break;                                                         \
            default:                                                           \
                coll_ring<DT, COLL_MIN>(COLL_RING_PASS);                       \
                break;                                                         \
        }                                                                      \
    }

COLL_RING_ENTRY(symm_ring_f32, COLL_F32)
COLL_RING_ENTRY(symm_ring_f16, COLL_F16)
COLL_RING_ENTRY(symm_ring_bf16, COLL_BF16)
