// symm: The Lamport kernels, data as flag: the one-shot (all-reduce, and reduce-scatter /
// all-gather through its modes; software-pipelined) and the two-shot all-reduce (NOTE
// [lamport-two-shot]).
// Included by collectives.cu (symm_core::kernel_source::expand_includes expands the include:
// neither NVRTC nor hiprtc gets an include path), after its primitives and dtype helpers,
// which this file uses.

// ---------------------------------------------------------------- Lamport one-shot all-reduce

// The workspace bases of ranks 0..7, passed by value (kernel parameters; no array, so no local
// memory). coll_ws(i) selects one without dynamic indexing.
struct CollWs8 {
    unsigned long long w0, w1, w2, w3, w4, w5, w6, w7;
};
__device__ __forceinline__ unsigned long long coll_ws(const CollWs8& w, unsigned int i) {
    return i < 4u ? (i < 2u ? (i == 0u ? w.w0 : w.w1) : (i == 2u ? w.w2 : w.w3))
                  : (i < 6u ? (i == 4u ? w.w4 : w.w5) : (i == 6u ? w.w6 : w.w7));
}

// Lamport op header (NOTE [op-agreement]): the thread of vector 0 stores this op's header into
// every peer's HDR[idx][jr] and clears its own HDR[(idx+2)%3][*] (the previous op's headers).
__device__ __forceinline__ void coll_lam_push_header(const CollWs8& wsv, char* ws, unsigned int rank,
                                                     unsigned int world, unsigned int idx,
                                                     unsigned long long hdr_off, const uint4& hdr) {
    const unsigned int w1 = world - 1u;
    const uint4 sentinel = make_uint4(COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL);
    for (unsigned int l = 0; l < w1; ++l) {
        const unsigned int p = (rank + 1 + l) % world;
        const unsigned int jr = world - 2 - l;
        coll_st_v4(reinterpret_cast<char*>(coll_ws(wsv, p)) + hdr_off + ((unsigned long long)idx * w1 + jr) * 16ull,
                   hdr);
        coll_st_v4(ws + hdr_off + ((unsigned long long)((idx + 2u) % 3u) * w1 + l) * 16ull, sentinel);
    }
}

// Polls vector v of the own Lamport buffer `mine` (slot l at l * slot_bytes) until no peer's
// lanes are the sentinel, into pv[l]; vector 0 also waits for every peer's op header in
// HDR[idx][*] (at `hdrs`) and compares it with `hdr` (a difference latches SYMM_ERR_OP_MISMATCH).
// False when the wait gave up. NP: the peer slots the unrolled loop visits (>= world - 1). HDR
// false: no header wait at vector 0 (the two-shot's second exchange, whose op the first checked).
template <int DT, int NP, bool HDR = true>
__device__ __forceinline__ bool coll_lam_poll(uint4 (&pv)[COLL_MAXW - 1], const char* mine,
                                              unsigned long long slot_bytes, unsigned long long v, const char* hdrs,
                                              unsigned int idx, const uint4& hdr, unsigned int rank,
                                              unsigned int world, CollWait& w, unsigned int* st,
                                              unsigned long long& deadline) {
    const unsigned int w1 = world - 1u;
    unsigned int pending = (1u << w1) - 1u;
    if (HDR && v == 0ull) {
        pending |= pending << 8;
    }
    unsigned int polls = 0;
    while (pending != 0u) {
#pragma unroll
        for (int l = 0; l < NP; ++l) {
            if (pending & (1u << l)) {
                pv[l] = coll_ld_volatile_v4(mine + (unsigned long long)l * slot_bytes + v * 16);
                if (!coll_pending<DT>(pv[l])) {
                    pending &= ~(1u << l);
                }
            }
            if (pending & (0x100u << l)) {
                const uint4 h = coll_ld_volatile_v4(hdrs + ((unsigned long long)idx * w1 + l) * 16ull);
                if (h.x != COLL_SENTINEL && h.y != COLL_SENTINEL && h.z != COLL_SENTINEL && h.w != COLL_SENTINEL) {
                    if (!coll_v4_eq(h, hdr)) {
                        coll_latch_disagreement(w, st, SYMM_ERR_OP_MISMATCH, COLL_MISMATCH_HEADER,
                                                (rank + 1 + l) % world, h, hdr);
                        return false;
                    }
                    pending &= ~(0x100u << l);
                }
            }
        }
        if (pending != 0u) {
            symm_backoff();
        }
        if (pending != 0u && (++polls % SYMM_CHECK_EVERY) == 0u) {
            coll_start_deadline(deadline, w);
            if (coll_poll_gives_up(polls, deadline, w)) {
                return false;
            }
        }
    }
    return true;
}

// The op state's advance, after every push of the op (NOTE [collectives-protocols], Lamport):
// every thread of this block has read the op state by the __syncthreads. One block: it advances
// the state at its end (coll_lam_advance_alone; nothing to count). More: each block counts
// itself in, and the LAST one to arrive advances the state at once (every block has read it;
// the next kernel on the stream starts after this one ends) -- no block waits at the end.
// `used`: the 16-byte vectors a slot this op wrote (the next op clears them).
__device__ __forceinline__ void coll_lam_arrive(unsigned int* st, unsigned int idx, unsigned long long used,
                                                bool acq_rel_arrive) {
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x > 1u) {
        // Relaxed: the block's state loads are complete (their values addressed every store
        // before the __syncthreads), and the acq_rel form measured 0.05-0.2 us slower.
        const unsigned int before = acq_rel_arrive ? coll_atom_add_acq_rel_gpu(st + COLL_ST_LAM_ARRIVE, 1u)
                                                   : atomicAdd(st + COLL_ST_LAM_ARRIVE, 1u);
        if (before == gridDim.x - 1u) {
            st[COLL_ST_LAM_ARRIVE] = 0u;
            st[COLL_ST_LAM_USED] = (unsigned int)used;
            st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
        }
    }
}

// One block: advance the op state at the kernel's end (its threads all read it before the
// __syncthreads of coll_lam_arrive).
__device__ __forceinline__ void coll_lam_advance_alone(unsigned int* st, unsigned int idx, unsigned long long used) {
    if (gridDim.x == 1u && threadIdx.x == 0) {
        st[COLL_ST_LAM_USED] = (unsigned int)used;
        st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
    }
}

#ifdef COLL_TRACE
// Kind 8: every block's thread 0 (entry, start, exit; stamps 2 and 3 only block 0's), with the
// exit stamp of block 0's kind 1 (generic entry) / 2 (world entry) record.
__device__ __forceinline__ void coll_lam_trace_exit(unsigned long long (&tr)[5], bool world_entry,
                                                    unsigned int world, unsigned int rank, unsigned int mode,
                                                    unsigned long long count, const char* ws,
                                                    unsigned long long tid) {
    if (threadIdx.x == 0u) {
        tr[4] = symm_globaltimer();
        if (tid == 0ull) {
            coll_trace_write(world_entry ? 2u : 1u, world, rank, mode, count, ws, tr);
        }
        coll_trace_write(8u, world, rank, mode, count, ws, tr);
    }
}
#define COLL_LAM_TRACE_EXIT(WORLD_ENTRY, MODE) \
    coll_lam_trace_exit(coll_tr, WORLD_ENTRY, world, rank, MODE, count, ws, tid);
#else
#define COLL_LAM_TRACE_EXIT(WORLD_ENTRY, MODE)
#endif

// MODE >= 0 and W > 0 fix the mode and the world size at compile time (the specialised
// entries, NOTE [lamport-world-entries]: a fraction of the generic kernel's code, so a cold
// instruction cache costs less at every launch); MODE < 0 / W == 0 take them from the arguments.
template <int DT, int OP, int MODE, int W>
__device__ __forceinline__ void coll_lamport(const CollWs8 wsv, unsigned int* pad,
                                             unsigned int rank, unsigned int world_arg, unsigned int mode_arg,
                                             const char* input, char* output, unsigned long long count,
                                             unsigned long long lam_off, unsigned long long slot_bytes,
                                             unsigned long long state_off, unsigned long long timeout_ns,
                                             const unsigned int* abort_host, unsigned long long hdr_off,
                                             const uint4 hdr) {
    COLL_TRACE_DECL
    COLL_TRACE_AT(0, true)
    symm_pdl_prologue();
    COLL_TRACE_AT(1, true)
    // count: AR the message's elements; RS the elements of one shard (the output); AG the
    // elements of one rank's input. Every slot holds nv = ceil(count / VE) vectors.
    // Latency: the workspace bases and the own pad come as kernel arguments (no dependent global
    // load), every thread reads the op state itself (no __syncthreads before the first remote
    // store), and the first input vector is loaded before the state, so both loads are in flight
    // together.
    constexpr int VE = CollT<DT>::VE;
    constexpr int ES = CollT<DT>::ES;
    // Peer slots the unrolled loops visit.
    constexpr int NP = W > 0 ? W - 1 : COLL_MAXW - 1;
    const unsigned int world = W > 0 ? (unsigned int)W : world_arg;
    const unsigned int mode = MODE >= 0 ? (unsigned int)MODE : (mode_arg & 0xFFu);
    // COLL_LAM_ACQREL_ARRIVE in mode_arg: count blocks with atom.acq_rel.gpu instead of a
    // relaxed atomic (measurement switch).
    const bool acq_rel_arrive = (mode_arg & COLL_LAM_ACQREL_ARRIVE) != 0u;
    // Pipeline lag in vectors per thread (bits 16-23 of mode_arg, COLL_LAM_LAG_SHIFT; 0: COLL_LAM_LAG; 255: receive
    // only after every push, the order before round 5 -- a measurement switch).
    const unsigned int lag_arg = (mode_arg >> COLL_LAM_LAG_SHIFT) & 0xFFu;
    const unsigned int lag = lag_arg == 0u ? COLL_LAM_LAG : (lag_arg == 255u ? 0xFFFFFFFFu : lag_arg);
    char* ws = reinterpret_cast<char*>(coll_ws(wsv, rank));
    unsigned int* st = reinterpret_cast<unsigned int*>(ws + state_off);
    const unsigned int w1 = world - 1;
    const unsigned long long buf_bytes = (unsigned long long)w1 * slot_bytes;
    const unsigned long long nv = (count + VE - 1) / VE;
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long part_bytes = count * ES;  // RS: input shard stride; AG: output stride
    // This rank's own contribution: AR the input; RS its shard of the input; AG the input.
    const char* own_in = input + (mode == COLL_MODE_RS ? (unsigned long long)rank * part_bytes : 0ull);
    const bool al_own = (reinterpret_cast<unsigned long long>(own_in) & 15ull) == 0;
    const bool al_out = (reinterpret_cast<unsigned long long>(output) & 15ull) == 0;
    const bool al_part = (part_bytes & 15ull) == 0;
    const bool al_in = (reinterpret_cast<unsigned long long>(input) & 15ull) == 0;
    // One pushed vector per step (AR, AG, and RS with one peer: the peer's shard) is loaded a
    // step ahead (`xn` below), so the load's latency hides behind the step's stores and receive;
    // RS with more peers loads one vector per peer inside the step.
    const bool one_vec = mode != COLL_MODE_RS || w1 == 1u;
    const char* const push_src =
        input + (mode == COLL_MODE_RS ? (unsigned long long)((rank + 1u) % world) * part_bytes : 0ull);
    const bool al_push = al_in && (mode != COLL_MODE_RS || al_part);
    uint4 x0 = make_uint4(0u, 0u, 0u, 0u);
    if (one_vec && tid < nv) {
        x0 = coll_load<DT>(push_src + tid * 16, (long long)(count - tid * VE), al_push);
    }
    const unsigned int idx = symm_ld_volatile(st + COLL_ST_LAM_IDX) % 3u;
    const unsigned int prev_used = symm_ld_volatile(st + COLL_ST_LAM_USED);
    CollWait w;
    w.pad = pad;
    w.abort_host = abort_host;
    w.timeout_ns = timeout_ns;
    w.host_every_thread = (mode_arg & COLL_LAM_HOST_EVERY_THREAD) != 0u ? 1u : 0u;

    const unsigned long long prev = prev_used;
    char* const cb = ws + lam_off + ((idx + 2u) % 3u) * buf_bytes;
    const char* const mine = ws + lam_off + idx * buf_bytes;
    const uint4 sentinel = make_uint4(COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL);
    // hdr_off: the op headers HDR[3][w1] (NOTE [op-agreement] above; layout.rs
    // lamport_headers_off).
    unsigned long long deadline = 0;
    bool failed = false;

    // 1. push vector v (canonicalised: no lane ever equals the sentinel) into every peer's buffer
    //    idx, slot jr, and clear vector v of the previous op's buffer (k+2)%3.
    auto push = [&](unsigned long long v, uint4 xv) {
        const long long nvalid = (long long)(count - v * VE);
        if (v == 0ull) {
            coll_lam_push_header(wsv, ws, rank, world, idx, hdr_off, hdr);
        }
        if (!one_vec) {
            for (unsigned int l = 0; l < w1; ++l) {
                const unsigned int p = (rank + 1 + l) % world;
                const unsigned int jr = world - 2 - l;
                const uint4 x = coll_canon<DT>(
                    coll_load<DT>(input + (unsigned long long)p * part_bytes + v * 16, nvalid, al_in && al_part));
                coll_st_v4(reinterpret_cast<char*>(coll_ws(wsv, p)) + lam_off + idx * buf_bytes + jr * slot_bytes +
                               v * 16,
                           x);
            }
        } else {
            const uint4 x = coll_canon<DT>(xv);
            for (unsigned int l = 0; l < w1; ++l) {
                const unsigned int p = (rank + 1 + l) % world;
                const unsigned int jr = world - 2 - l;
                coll_st_v4(reinterpret_cast<char*>(coll_ws(wsv, p)) + lam_off + idx * buf_bytes + jr * slot_bytes +
                               v * 16,
                           x);
            }
        }
        if (v < prev) {
            for (unsigned int j = 0; j < w1; ++j) {
                coll_st_v4(cb + j * slot_bytes + v * 16, sentinel);
            }
        }
        COLL_TRACE_AT(2, v == 0ull)
    };
    // 3. poll vector v of the own buffer idx until no lane is the sentinel, then reduce (AR, RS)
    //    or place (AG). False when the wait gave up.
    auto recv = [&](unsigned long long v) -> bool {
        const long long nvalid = (long long)(count - v * VE);
        const uint4 own = coll_canon<DT>(coll_load<DT>(own_in + v * 16, nvalid, al_own));
        uint4 pv[COLL_MAXW - 1];
        if (!coll_lam_poll<DT, NP>(pv, mine, slot_bytes, v, ws + hdr_off, idx, hdr, rank, world, w, st, deadline)) {
            return false;
        }
        if (mode == COLL_MODE_AG) {
            const bool al = al_out && al_part;
            coll_store<DT>(output + (unsigned long long)rank * part_bytes + v * 16, own, nvalid, al);
#pragma unroll
            for (int l = 0; l < NP; ++l) {
                if (l < (int)w1) {
                    const unsigned int t = (rank + 1 + l) % world;
                    coll_store<DT>(output + (unsigned long long)t * part_bytes + v * 16, pv[l], nvalid, al);
                }
            }
        } else {
            const uint4 r = coll_reduce_ranks<DT, OP, NP>(own, pv, (int)rank, (int)world);
            coll_store<DT>(output + v * 16, r, nvalid, al_out);
        }
        COLL_TRACE_AT(3, v == 0ull)
        return true;
    };

    // 2. Software pipeline over this thread's vectors v = tid, tid + nth, ...: push vector i, then
    //    receive vector i - lag (pushed by the peers' same thread `lag` steps ago, so it is most
    //    likely there), so the receiving side's local work (poll, reduce, store, clear) overlaps
    //    the pushes instead of following them (bench-notes.md, round 5). Every wait is for a
    //    vector the peers push at an earlier step than the one this thread is at, and all blocks
    //    are resident (one wave), so it cannot deadlock. One vector per thread (small messages):
    //    push, then receive, as before.
    unsigned long long rv = tid;  // next vector to receive
    {
        unsigned int step = 0;
        uint4 xn = x0;
        for (unsigned long long v = tid; v < nv; v += nth) {
            const uint4 xv = xn;
            if (one_vec && v + nth < nv) {
                xn = coll_load<DT>(push_src + (v + nth) * 16, (long long)(count - (v + nth) * VE), al_push);
            }
            push(v, xv);
            if (++step > lag && !failed) {
                failed = !recv(rv);
                rv += nth;
            }
        }
        // Clear what the previous op used beyond this op's vectors.
        for (unsigned long long v = (nv > tid ? tid + ((nv - tid + nth - 1) / nth) * nth : tid); v < prev; v += nth) {
            for (unsigned int j = 0; j < w1; ++j) {
                coll_st_v4(cb + j * slot_bytes + v * 16, sentinel);
            }
        }
    }
    coll_lam_arrive(st, idx, nv, acq_rel_arrive);
    // The vectors not received in the pipeline.
    for (; rv < nv && !failed; rv += nth) {
        failed = !recv(rv);
    }

    // 4. one block: advance the op state.
    coll_lam_advance_alone(st, idx, nv);
    COLL_LAM_TRACE_EXIT(W > 0, mode)
}

// ---------------------------------------------------------------- Lamport two-shot all-reduce

// NOTE [lamport-two-shot]: the all-reduce as a reduce-scatter and an all-gather, both data as
// flag, in one kernel (COLL_MODE_AR2 of the Lamport entries). The message is cut into `world`
// shards of q elements (symm_core::coll::geometry::two_shot_shard: whole vectors, the last ones
// shorter or empty); every slot of the op's Lamport buffer holds two regions of nv = q / VE
// vectors: [0, nv) the reduce-scatter's (the sender's copy of this rank's shard), [nv, 2 nv) the
// all-gather's (the sender's reduced shard). (1) every rank pushes shard p of its input into
// peer p's first region; (2) it polls its own first region, reduces its shard in rank order (the
// one-shot's coll_reduce_ranks, so the sums are the one-shot's bit for bit), stores it and pushes
// it into every peer's second region; (3) it polls its second region and stores each peer's
// reduced shard. Each rank's links carry 2 (world - 1) / world of the message where the one-shot
// pushes world - 1 copies of it, for one more exchange's latency. No wait depends on a later
// one: (2) waits for (1) pushes, which every thread makes first, and (3) for (2) pushes, which
// depend on (1) alone; all blocks are resident (one wave). Re-arming, headers and the op state
// are the one-shot's: the previous op's buffer is cleared over `used` vectors (2 nv here), the
// header is pushed with the first vector and checked with the first poll of (2). A rank pushes
// in (2) only sums of what it took in this op, and nothing in (2) once an error is latched on it
// (a buffer an earlier op gave up on may hold a late peer's stale vectors): NOTE
// [latched-sends-nothing]. A rank whose wait in (2) gives up pushes no sums for the vectors it
// did not take, so its peers wait out their own deadlines (the one-shot's peers finish). The host plans it where 2 q elements fit a slot (symm_core::coll::geometry::
// lamport_two_shot_plan).
template <int DT, int OP, int W>
__device__ __forceinline__ void coll_lamport2(const CollWs8 wsv, unsigned int* pad, unsigned int rank,
                                              unsigned int world_arg, unsigned int mode_arg, const char* input,
                                              char* output, unsigned long long count, unsigned long long lam_off,
                                              unsigned long long slot_bytes, unsigned long long state_off,
                                              unsigned long long timeout_ns, const unsigned int* abort_host,
                                              unsigned long long hdr_off, const uint4 hdr) {
    COLL_TRACE_DECL
    COLL_TRACE_AT(0, true)
    symm_pdl_prologue();
    COLL_TRACE_AT(1, true)
    constexpr int VE = CollT<DT>::VE;
    constexpr int ES = CollT<DT>::ES;
    constexpr int NP = W > 0 ? W - 1 : COLL_MAXW - 1;
    const unsigned int world = W > 0 ? (unsigned int)W : world_arg;
    const bool acq_rel_arrive = (mode_arg & COLL_LAM_ACQREL_ARRIVE) != 0u;
    char* ws = reinterpret_cast<char*>(coll_ws(wsv, rank));
    unsigned int* st = reinterpret_cast<unsigned int*>(ws + state_off);
    const unsigned int w1 = world - 1;
    const unsigned long long buf_bytes = (unsigned long long)w1 * slot_bytes;
    // Shard of q elements (whole vectors), nv vectors; every shard starts 16-byte aligned
    // relative to the buffers.
    const unsigned long long q = ((count + world - 1) / world + VE - 1) / VE * VE;
    const unsigned long long nv = q / VE;
    const unsigned long long shard_bytes = q * ES;
    const unsigned long long ag_off = nv * 16ull;
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    const bool al_in = (reinterpret_cast<unsigned long long>(input) & 15ull) == 0;
    const bool al_out = (reinterpret_cast<unsigned long long>(output) & 15ull) == 0;
    const unsigned int idx = symm_ld_volatile(st + COLL_ST_LAM_IDX) % 3u;
    const unsigned long long prev = symm_ld_volatile(st + COLL_ST_LAM_USED);
    CollWait w;
    w.pad = pad;
    w.abort_host = abort_host;
    w.timeout_ns = timeout_ns;
    w.host_every_thread = (mode_arg & COLL_LAM_HOST_EVERY_THREAD) != 0u ? 1u : 0u;
    char* const cb = ws + lam_off + ((idx + 2u) % 3u) * buf_bytes;
    const char* const mine = ws + lam_off + idx * buf_bytes;
    const uint4 sentinel = make_uint4(COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL);
    unsigned long long deadline = 0;
    // NOTE [latched-sends-nothing]: after a timeout or abort latched on this rank, the second
    // exchange sends nothing. A buffer an earlier op gave up on may hold a late peer's stale
    // vectors, which a poll takes as present; the one-shot only ever pushes its own input, but
    // the sums pushed here are derived from what arrived. The own input still goes out in (1),
    // and the buffer is still re-armed and the state advanced.
    // The host learns of it here, as a poll that gives up on it would tell it (NOTE
    // [error-mirror]): the error may be a peer's rejection latched into this pad, which no
    // kernel of this rank has mirrored yet.
    bool failed = coll_fatal_latched(pad);
    if (failed && tid == 0ull) {
        coll_mirror_error(pad, abort_host);
    }
    // Elements of shard t valid from its vector v on (<= 0: none).
    auto valid = [&](unsigned int t, unsigned long long v) -> long long {
        return (long long)count - (long long)(t * q + v * VE);
    };

    // 1. Shard p's vector v into peer p's first region (items (l, v): a warp's stores go to one
    //    peer, consecutive), then the previous op's buffer re-armed.
    for (unsigned long long i = tid; i < (unsigned long long)w1 * nv; i += nth) {
        const unsigned int l = (unsigned int)(i / nv);
        const unsigned long long v = i - (unsigned long long)l * nv;
        if (i == 0ull) {
            coll_lam_push_header(wsv, ws, rank, world, idx, hdr_off, hdr);
        }
        const unsigned int p = (rank + 1 + l) % world;
        const unsigned int jr = world - 2 - l;
        const uint4 x = coll_canon<DT>(coll_load<DT>(input + p * shard_bytes + v * 16, valid(p, v), al_in));
        coll_st_v4(reinterpret_cast<char*>(coll_ws(wsv, p)) + lam_off + idx * buf_bytes + jr * slot_bytes + v * 16, x);
        COLL_TRACE_AT(2, i == 0ull)
    }
    for (unsigned long long v = tid; v < prev; v += nth) {
        for (unsigned int j = 0; j < w1; ++j) {
            coll_st_v4(cb + j * slot_bytes + v * 16, sentinel);
        }
    }
    coll_lam_arrive(st, idx, 2ull * nv, acq_rel_arrive);

    // 2. This rank's shard: poll, reduce, store, push into every peer's second region.
    for (unsigned long long v = tid; v < nv && !failed; v += nth) {
        const long long nvalid = valid(rank, v);
        const uint4 own = coll_canon<DT>(coll_load<DT>(input + rank * shard_bytes + v * 16, nvalid, al_in));
        uint4 pv[COLL_MAXW - 1];
        if (!coll_lam_poll<DT, NP>(pv, mine, slot_bytes, v, ws + hdr_off, idx, hdr, rank, world, w, st, deadline)) {
            failed = true;
            break;
        }
        const uint4 r = coll_canon<DT>(coll_reduce_ranks<DT, OP, NP>(own, pv, (int)rank, (int)world));
#pragma unroll
        for (int l = 0; l < NP; ++l) {
            if (l < (int)w1) {
                const unsigned int p = (rank + 1 + l) % world;
                const unsigned int jr = world - 2 - l;
                coll_st_v4(reinterpret_cast<char*>(coll_ws(wsv, p)) + lam_off + idx * buf_bytes + jr * slot_bytes +
                               ag_off + v * 16,
                           r);
            }
        }
        coll_store<DT>(output + rank * shard_bytes + v * 16, r, nvalid, al_out);
        COLL_TRACE_AT(3, v == 0ull)
    }
    // 3. The peers' reduced shards (items (l, v)): the sender of slot l is rank + 1 + l. One
    //    slot a poll: the one-shot's poll over a world of 2 (one peer slot, at the region's vector
    //    v), without the header wait (step 2's first poll checked the op's headers).
    for (unsigned long long i = tid; i < (unsigned long long)w1 * nv && !failed; i += nth) {
        const unsigned int l = (unsigned int)(i / nv);
        const unsigned long long v = i - (unsigned long long)l * nv;
        uint4 pv[COLL_MAXW - 1];
        if (!coll_lam_poll<DT, 1, false>(pv, mine + l * slot_bytes + ag_off, slot_bytes, v, ws + hdr_off, idx, hdr,
                                         rank, 2u, w, st, deadline)) {
            failed = true;
            break;
        }
        const unsigned int t = (rank + 1 + l) % world;
        coll_store<DT>(output + t * shard_bytes + v * 16, pv[0], valid(t, v), al_out);
    }
    coll_lam_advance_alone(st, idx, 2ull * nv);
    COLL_LAM_TRACE_EXIT(W > 0, COLL_MODE_AR2)
}

#define COLL_LAMPORT_ARGS                                                                                        \
    unsigned long long ws0, unsigned long long ws1, unsigned long long ws2, unsigned long long ws3,                \
        unsigned long long ws4, unsigned long long ws5, unsigned long long ws6, unsigned long long ws7,            \
        unsigned long long pad_ptr, unsigned int rank, unsigned int world, unsigned int mode, unsigned int op,     \
        const char *input, char *output, unsigned long long count, unsigned long long lam_off,                    \
        unsigned long long slot_bytes, unsigned long long state_off, unsigned long long timeout_ns,               \
        const unsigned int *abort_host, unsigned long long hdr_off, unsigned long long oph0, unsigned long long oph1
// The op header: words 0-1 in oph0 (low half first), 2-3 in oph1.
#define COLL_LAMPORT_PASS                                                                                  \
    wsv, reinterpret_cast<unsigned int*>(pad_ptr), rank, world, mode, input, output, count, lam_off, slot_bytes, \
        state_off, timeout_ns, abort_host, hdr_off,                                                             \
        make_uint4((unsigned int)oph0, (unsigned int)(oph0 >> 32), (unsigned int)oph1, (unsigned int)(oph1 >> 32))

// mode: COLL_MODE_AR / RS / AG (the op is ignored for AG), COLL_MODE_AR2 the two-shot (NOTE
// [lamport-two-shot]). W: 0 for any world (the generic
// entry), else the world size the entry is specialised for.
#define COLL_LAMPORT_ENTRY(NAME, DT, W)                                                       \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_LAMPORT_ARGS) { \
        const CollWs8 wsv = {ws0, ws1, ws2, ws3, ws4, ws5, ws6, ws7};                          \
        if ((mode & 0xFFu) == COLL_MODE_AR2) {                                                 \
            switch (op) {                                                                      \
                case COLL_SUM:                                                                 \
                    coll_lamport2<DT, COLL_SUM, W>(COLL_LAMPORT_PASS);                         \
                    break;                                                                     \
                case COLL_AVG:                                                                 \
                    coll_lamport2<DT, COLL_AVG, W>(COLL_LAMPORT_PASS);                         \
                    break;                                                                     \
                case COLL_MAX:                                                                 \
                    coll_lamport2<DT, COLL_MAX, W>(COLL_LAMPORT_PASS);                         \
                    break;                                                                     \
                default:                                                                       \
                    coll_lamport2<DT, COLL_MIN, W>(COLL_LAMPORT_PASS);                         \
                    break;                                                                     \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        if (mode == COLL_MODE_AG) {                                                            \
            coll_lamport<DT, COLL_SUM, -1, W>(COLL_LAMPORT_PASS);                              \
            return;                                                                            \
        }                                                                                      \
        switch (op) {                                                                          \
            case COLL_SUM:                                                                     \
                coll_lamport<DT, COLL_SUM, -1, W>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
            case COLL_AVG:                                                                     \
                coll_lamport<DT, COLL_AVG, -1, W>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
            case COLL_MAX:                                                                     \
                coll_lamport<DT, COLL_MAX, -1, W>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
            default:                                                                           \
                coll_lamport<DT, COLL_MIN, -1, W>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
        }                                                                                      \
    }

COLL_LAMPORT_ENTRY(symm_lamport_f32, COLL_F32, 0)
COLL_LAMPORT_ENTRY(symm_lamport_f16, COLL_F16, 0)
COLL_LAMPORT_ENTRY(symm_lamport_bf16, COLL_BF16, 0)

// NOTE [lamport-world-entries]: entries specialised for one world size 2..8 and one (mode, op),
// symm_lamport{W}_{ar,rs}_{sum,avg,max,min}_{dt} and symm_lamport{W}_ag_{dt} (same arguments as
// the generic entry; `world`, `mode` and `op` are ignored). With the world fixed at compile time
// every loop over the peers is unrolled to exactly world - 1 iterations, the peer index
// arithmetic is by a constant and the reduction selects among world - 1 vectors, not seven; with
// the mode and op fixed, one entry holds one path. Their code is a fraction of the generic
// entry's, and they fit in the registers that COLL_MAX_THREADS leaves a thread (ptxas for sm_90:
// the generic entry spills 248 bytes (236 in bf16 since it also holds the two-shot), an entry of one world but every (mode, op) spills up to
// 1.9 KiB at 8 ranks; these none). Inside a model step the GEMMs between two all-reduces leave
// the instruction cache and L2 cold, so each line of code and each spill a launch touches can
// cost a trip to memory (bench-notes round 18 measures it). symm_core::coll::launch's
// Entry::LamportWorld names them, mode_op_names lists them in its order; the generic entry stays
// for the SYMM_LAMPORT_GENERIC comparison.
#define COLL_LAMPORTW(NAME, DT, MODE, OP, W)                                                  \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_LAMPORT_ARGS) { \
        const CollWs8 wsv = {ws0, ws1, ws2, ws3, ws4, ws5, ws6, ws7};                          \
        coll_lamport<DT, OP, MODE, W>(COLL_LAMPORT_PASS);                                      \
    }
// The nine (mode, op) entries of one kernel KIND and dtype, named symm_KIND_{ar,rs}_{op}_SUFFIX and
// symm_KIND_ag_SUFFIX; ENTRY(NAME, DT, MODE, OP) defines one. symm-core's `mode_op_names` lists
// the same names in the same order.
#define COLL_MODE_OP_ENTRIES(ENTRY, KIND, SUFFIX, DT)                  \
    ENTRY(symm_##KIND##_ar_sum_##SUFFIX, DT, COLL_MODE_AR, COLL_SUM)   \
    ENTRY(symm_##KIND##_ar_avg_##SUFFIX, DT, COLL_MODE_AR, COLL_AVG)   \
    ENTRY(symm_##KIND##_ar_max_##SUFFIX, DT, COLL_MODE_AR, COLL_MAX)   \
    ENTRY(symm_##KIND##_ar_min_##SUFFIX, DT, COLL_MODE_AR, COLL_MIN)   \
    ENTRY(symm_##KIND##_rs_sum_##SUFFIX, DT, COLL_MODE_RS, COLL_SUM)   \
    ENTRY(symm_##KIND##_rs_avg_##SUFFIX, DT, COLL_MODE_RS, COLL_AVG)   \
    ENTRY(symm_##KIND##_rs_max_##SUFFIX, DT, COLL_MODE_RS, COLL_MAX)   \
    ENTRY(symm_##KIND##_rs_min_##SUFFIX, DT, COLL_MODE_RS, COLL_MIN)   \
    ENTRY(symm_##KIND##_ag_##SUFFIX, DT, COLL_MODE_AG, COLL_SUM)

// The entries of world W for every element type.
#define COLL_LAMPORT_WORLD(W)                                                        \
    COLL_MODE_OP_ENTRIES(COLL_LAMPORT_W##W, lamport##W, f32, COLL_F32)               \
    COLL_MODE_OP_ENTRIES(COLL_LAMPORT_W##W, lamport##W, f16, COLL_F16)               \
    COLL_MODE_OP_ENTRIES(COLL_LAMPORT_W##W, lamport##W, bf16, COLL_BF16)
#define COLL_LAMPORT_W2(NAME, DT, MODE, OP) COLL_LAMPORTW(NAME, DT, MODE, OP, 2)
#define COLL_LAMPORT_W3(NAME, DT, MODE, OP) COLL_LAMPORTW(NAME, DT, MODE, OP, 3)
#define COLL_LAMPORT_W4(NAME, DT, MODE, OP) COLL_LAMPORTW(NAME, DT, MODE, OP, 4)
#define COLL_LAMPORT_W5(NAME, DT, MODE, OP) COLL_LAMPORTW(NAME, DT, MODE, OP, 5)
#define COLL_LAMPORT_W6(NAME, DT, MODE, OP) COLL_LAMPORTW(NAME, DT, MODE, OP, 6)
#define COLL_LAMPORT_W7(NAME, DT, MODE, OP) COLL_LAMPORTW(NAME, DT, MODE, OP, 7)
#define COLL_LAMPORT_W8(NAME, DT, MODE, OP) COLL_LAMPORTW(NAME, DT, MODE, OP, 8)
COLL_LAMPORT_WORLD(2)
COLL_LAMPORT_WORLD(3)
COLL_LAMPORT_WORLD(4)
COLL_LAMPORT_WORLD(5)
COLL_LAMPORT_WORLD(6)
COLL_LAMPORT_WORLD(7)
COLL_LAMPORT_WORLD(8)

// The two-shot all-reduce's entries (NOTE [lamport-two-shot]) for one world size 3..8 and op,
// symm_lamport{W}_ar2_{sum,avg,max,min}_{dt} (the generic entry's arguments; `world`, `mode`
// and `op` are ignored). Two ranks have none: there the two-shot moves as many bytes as the
// one-shot (the generic entry still runs it). symm_core::coll::launch's Entry::LamportTwoShotWorld
// names them, lamport_two_shot_names lists them.
#define COLL_LAMPORT2W(NAME, DT, OP, W)                                                       \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_LAMPORT_ARGS) { \
        const CollWs8 wsv = {ws0, ws1, ws2, ws3, ws4, ws5, ws6, ws7};                          \
        coll_lamport2<DT, OP, W>(COLL_LAMPORT_PASS);                                           \
    }
#define COLL_LAMPORT2_OPS(W, SUFFIX, DT)                                       \
    COLL_LAMPORT2W(symm_lamport##W##_ar2_sum_##SUFFIX, DT, COLL_SUM, W)        \
    COLL_LAMPORT2W(symm_lamport##W##_ar2_avg_##SUFFIX, DT, COLL_AVG, W)        \
    COLL_LAMPORT2W(symm_lamport##W##_ar2_max_##SUFFIX, DT, COLL_MAX, W)        \
    COLL_LAMPORT2W(symm_lamport##W##_ar2_min_##SUFFIX, DT, COLL_MIN, W)
#define COLL_LAMPORT2_WORLD(W)         \
    COLL_LAMPORT2_OPS(W, f32, COLL_F32) \
    COLL_LAMPORT2_OPS(W, f16, COLL_F16) \
    COLL_LAMPORT2_OPS(W, bf16, COLL_BF16)
COLL_LAMPORT2_WORLD(3)
COLL_LAMPORT2_WORLD(4)
COLL_LAMPORT2_WORLD(5)
COLL_LAMPORT2_WORLD(6)
COLL_LAMPORT2_WORLD(7)
COLL_LAMPORT2_WORLD(8)
