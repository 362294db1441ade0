// symm-cuda: collective kernels (all-reduce, reduce-scatter, all-gather, barrier over a subset).
//
// Compiled by NVRTC as common_header() (pad #defines + common.cuh) + defines + this file, for
// sm_80 or newer (bf16 conversions); launch configurations are sized for sm_90 (H100/H200).
// The Rust side is symm-cuda/src/collectives.rs; its `layout` module owns the workspace layout
// (offsets reach the kernels as arguments) and its `plan` module the chunking.
//
// Grids: at most one block per SM on a GPU of its own; ranks sharing a GPU get a share of its SMs
// so every rank's waiting kernels are resident together (NOTE [co-residency] in
// docs/architecture.md, GridBudget in plan.rs). Every kernel works at any grid size.
//
// NOTE [collectives-protocols]
// ============================
// Every rank owns one symmetric WORKSPACE (one symmetric allocation). Peers only ever WRITE into
// a rank's workspace (data and flags); nobody ever reads a peer's user buffers, except the
// copy-engine/pull paths, which are bracketed by barriers (see CE below). So user inputs need no
// staging and may be reused as soon as the op's stream work is done, and no op needs an end
// barrier.
//
// Workspace (per rank; offsets from layout.rs):
//   STATE  local words, written only by this rank's kernels (epochs advanced on the device):
//          ST_LAM_IDX, ST_LAM_ARRIVE, ST_LAM_USED (previous op's vectors), ST_RING_SEQ, ST_RING_ARRIVE, ST_BAR_CNT[64]
//   FLAGS  DATA[W1][S] and ACK[W1][S] (written by peers; W1 = world-1, S ring slots), SENT[S] (local)
//   LAMPORT 3 buffers x W1 slots x lam_slot_bytes
//   RING   W1 x S slots x slot_bytes (the staging area)
// Peer index: for rank r, the l-th peer (l = 0..W1-1) is p = (r+1+l) % world; r's slot at p is
// jr = world-2-l. A word written by peer p at r lives at index l(p) = (p-r-1+world) % world.
//
// Op state. All per-op epochs are read at kernel start; block 0, after its work, waits until
// ARRIVE == gridDim.x (every block has read the state), then advances the state and resets
// ARRIVE. The next kernel on the stream sees the new state. Ring: thread 0 of every block reads
// the state and does red.release.gpu.add(ARRIVE, 1) at once. Lamport: every thread reads the
// state itself; with one block, thread 0 advances it at the end (after a __syncthreads that
// follows every thread's read); with more, each block counts itself in after its push (a relaxed
// atomicAdd: the state values were consumed by the addresses of the block's pushes before its
// __syncthreads) and the last one to arrive advances the state there and then -- no block waits
// for the others. Fused pull: see below. Nothing epoch-like is a kernel argument, so CUDA-graph replay
// works; any grid size works (ranks must only agree on the ops' sequence and on nchunks).
//
// Lamport one-shot (data as flag). Buffers are pre-filled with the sentinel 0xFFFFFFFF per 32-bit
// word (a NaN in f32, two NaNs 0xFFFF in bf16/f16); an input lane equal to the sentinel NaN is
// canonicalised to another NaN (f32 0x7FC00000, bf16 0x7FC0, f16 0x7E00) -- the value (NaN) is
// unchanged, so results are exact; -0.0 stays -0.0 (why not -0.0 as sentinel: canonicalising it
// would change signed-zero results, and one all-ones pattern serves every dtype, so buffers can
// be shared across dtypes). Op k (k = ST_LAM_IDX, rotating 0,1,2):
//   1. every thread stores its canonicalised 16-byte vectors into every peer's buffer k, slot jr;
//   2. clears its own buffer (k+2)%3 (used by the previous op; ST_LAM_USED says how much);
//      the Lamport kernel reads the state in every thread (no barrier before its first store) and
//      counts a block in ARRIVE once its threads are past their pipelined loop (every thread of
//      it has read the state by then);
//   3. polls its own buffer k with ld.volatile.v4 until no lane is the sentinel, then reduces in
//      rank order 0..world-1 (own lanes from its canonicalised input) in fp32.
//   A thread with several vectors runs 1-3 as a software pipeline: at step i it pushes (and
//   clears) its i-th vector, then receives its (i-lag)-th (COLL_LAM_LAG), the rest after the
//   loop. Its waits are for vectors the peers' same thread pushes at earlier steps, and the grid
//   is one wave (all blocks resident), so it cannot deadlock.
//   Safety: the buffer cleared in op k was last written by peers in op k-1, and this rank saw all
//   of those writes. A peer writes buffer (k+2)%3 again only in op k+2, which needs this rank's
//   op k+1 data, sent after op k (and its clearing) ended. The spare buffer (k+1)%3 was cleared in
//   op k-1, before this rank sent op k's data, which peers need before they reach op k+1.
//
// Ring (chunked push with a release flag per chunk; used by one-shot, reduce-scatter,
// all-gather and, as RS then AG, two-shot). The op has nchunks chunks per peer (the same on every
// rank); chunk c has global sequence g = ST_RING_SEQ + c and uses ring slot g % S (S power of 2).
// Sender blocks (even blocks when senders and receivers are as many, else blockIdx < nsend), for
// their chunks c (c = sender index, +nsend, ...):
//   wait own ACK[l][slot] >= g-S+1 (the slot's previous chunk g-S was consumed by peer l;
//   ACK words start at 0 and the target is <= 0 while g < S) -> store the chunk's vectors into
//   peer's RING[jr][slot] -> __syncthreads -> st.release.sys peer DATA[jr][slot] = g+1
//   (-> st.release.gpu own SENT[slot] = g+1 when in place).
// Receiver blocks, for their chunks: wait own DATA[l][slot] >= g+1 for every peer (and SENT when
//   in place, so the result never overwrites input this rank has not sent yet) -> reduce / copy
//   (ring data read with ld.global.cg) -> __syncthreads -> st.release.sys peer ACK[jr][slot] = g+1.
//   A sender cannot overwrite a slot before its receiver acked the previous chunk in it, so the
//   data flag of a slot is exactly g+1 when the receiver looks. Dependencies always point to
//   smaller chunk sequence numbers, and grids are at most one block per SM, so all blocks of both
//   ranks are resident at once and it cannot deadlock. (Like NCCL's kernels, the spinning blocks
//   need their SMs: work that holds SMs forever on either GPU would stall them until the timeout.
//   The same holds for the Lamport kernel, whose grid is also at most one block per SM.)
//
// Barrier over a subset (pad OPS region). BAR_CNT[t] counts barriers this rank shared with t;
// for every t in the mask: e = ++BAR_CNT[t]; st.release.sys t's OPS[COLL_OPS_BAR][me] = e; wait own
// OPS[COLL_OPS_BAR][t] >= e. Optionally a check word (e.g. the offset of a zero-copy input) is
// written to t's OPS[COLL_OPS_CHECK][me] first, and compared after the wait (mismatch latches
// SYMM_ERR_MISMATCH).
//
// CE (copy engine, pull, zero-copy): barrier -> cuMemcpyDtoDAsync from the peers' symmetric
// inputs (+ reduce kernels for all-reduce) -> barrier; the host side is in collectives.rs.
//
// Fused pull (symm_pull_*: zero-copy all-reduce, reduce-scatter, all-gather of registered
// inputs): the barrier, the SM pull and the closing barrier in ONE kernel. Epochs come from
// BAR_CNT[t] (base): every block reads base, and its threads t (t a peer) store
// (check << 32 | base+1) with one st.release.sys.u64 into t's PULL64[me] (OPS rows 2-3; every block
// sends the same value, so no block depends on another being resident), then wait for the low half
// of PULL64[t] >= base+1 and compare its high half with their check word. After its reads a block
// counts itself in PULL_DONE (atom.acq_rel.gpu); the last one resets PULL_DONE, sends
// (check << 32 | base+2) to every peer, waits for base+2 from every peer (no rank returns while a
// peer may still read its input) and stores BAR_CNT[t] = base+2. It takes two epochs of
// symm_coll_barrier's count; since the ranks issue the same sequence of ops, each kind's slot sees
// increasing epochs only, and the two kinds interleave freely.
//
// Op agreement (NOTE [op-agreement] in docs/architecture.md). Every Lamport and ring launch carries
// the op's header (symm_core::OpDescriptor::header_words: kind, dtype, reduce op, count, variant;
// no word is the sentinel) and sends it in band, where the peers already look:
//   Lamport: thread 0 (the thread of vector 0) stores its header into every peer's HDR[idx][jr]
//   (after the three buffers) before vector 0, and polls its own HDR[idx][*] in the same loop as
//   vector 0; the clearing thread of vector 0 clears HDR[(idx+2)%3][*] with the buffer (same
//   safety argument as the data).
//   Ring: the threads that release DATA[jr][slot] store the header into the peer's HDR[jr][slot]
//   before the chunk's data (so the release covers it); a receiver reads HDR[l][slot] after its
//   acquire of DATA and compares it before it acks the slot.
//   Barrier and fused pull: the check word is a hash of the header and the geometry.
// A header that differs latches SYMM_ERR_OP_MISMATCH (every later wait of the object gives up at
// once: the ranks are out of step) and records both headers in STATE (COLL_ST_MISMATCH) for the
// host's error. Every rank compares every peer's header, so all of them see it. A rank that
// rejects its own arguments latches SYMM_ERR_PEER_REJECTED into every peer's pad
// (symm_coll_reject). Not covered: ranks whose ops run different mechanisms (Lamport against
// ring, say) never read each other's header; their waits end at the deadline (Timeout).
//
// Every wait is bounded: deadline from %globaltimer, the abort words, and an error already latched
// (then the wait gives up at once); failures latch SYMM_ERR_* into the pad's ERROR word. No trap.
// Accumulation is fp32 in rank order 0..world-1, so every rank gets bitwise the same result.

// STATE words of a recorded disagreement (layout.rs ST_MISMATCH, MISMATCH_*): peer+1 | kind<<16,
// the peer's four header words (or its check word), this rank's.
#define COLL_ST_MISMATCH 201
#define COLL_MISMATCH_HEADER 0
#define COLL_MISMATCH_CHECK 1
#define COLL_MISMATCH_REJECTED 2

#define COLL_F32 0
#define COLL_F16 1
#define COLL_BF16 2

#define COLL_SUM 0
#define COLL_AVG 1
#define COLL_MAX 2
#define COLL_MIN 3

#define COLL_MODE_AR 0
#define COLL_MODE_RS 1
#define COLL_MODE_AG 2

#define COLL_FLAG_INPLACE 1u
// Lamport `mode` argument bit: count blocks with atom.acq_rel.gpu instead of a relaxed atomic.
#define COLL_LAM_ACQREL_ARRIVE 0x100u
// Lamport software-pipeline lag (vectors per thread between a push and the receive of the same
// step's vector; the mode argument's bits 16-23 override it).
#define COLL_LAM_LAG 2u
// Where the lag sits in the mode argument (symm-cuda's args::LAMPORT_LAG_SHIFT).
#define COLL_LAM_LAG_SHIFT 16

// Largest world size the collective kernels handle (register arrays).
#define COLL_MAXW 8
// Most threads per block of the Lamport, ring and reduce kernels (launch bounds: <= 128
// registers per thread).
#define COLL_MAX_THREADS 512

// STATE words (must match layout.rs).
#define COLL_ST_LAM_IDX 0
#define COLL_ST_LAM_ARRIVE 1
#define COLL_ST_LAM_USED 2
#define COLL_ST_RING_SEQ 8
#define COLL_ST_RING_ARRIVE 9
#define COLL_ST_PULL_DONE 10
#define COLL_ST_BAR_CNT 64

// Pad OPS slots used here (must match layout.rs).
#define COLL_OPS_BAR 0
#define COLL_OPS_CHECK 1
// Fused pull: one 64-bit word per source rank (check << 32 | epoch) over OPS rows 2 and 3.
#define COLL_OPS_PULL64 2

#define COLL_SENTINEL 0xFFFFFFFFu

// ---------------------------------------------------------------- primitives

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

__device__ __forceinline__ uint4 coll_ld_volatile_v4(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
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

__device__ __forceinline__ void coll_st_v4(void* p, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// What a kernel needs to bound its waits.
struct CollWait {
    unsigned int* pad;             // own signal pad (ERROR / ABORT words)
    const unsigned int* abort_host; // pinned host abort word (may be null)
    unsigned long long timeout_ns;
};

// True when a wait of this object already timed out, was aborted, or its ranks fell out of step
// (op headers differ, a peer rejected an op): later waits give up at once (one dead peer costs
// one timeout, not one per wait). A latched SYMM_ERR_MISMATCH (check words of a barrier or pull)
// does not stop waits: the barriers of that op still complete, so the ranks stay in step.
__device__ __forceinline__ bool coll_fatal_latched(unsigned int* pad) {
    const unsigned int e = symm_latched_error(pad);
    return e == SYMM_ERR_TIMEOUT || e == SYMM_ERR_ABORTED || e == SYMM_ERR_OP_MISMATCH ||
           e == SYMM_ERR_PEER_REJECTED;
}

// NOTE [error-mirror]: `abort_host` points at word 0 of a pinned host page; word 1 mirrors the
// pad's ERROR word for the host, which reads it before every op without a launch or a
// synchronisation (symm-cuda's CudaCollectives::pending_error). Every kernel that latches an
// error, or gives up a wait because one is latched (a peer's rejection included), copies the
// latched code there.
__device__ __noinline__ void coll_mirror_error(unsigned int* pad, const unsigned int* abort_host) {
    if (abort_host != nullptr) {
        const unsigned int e = symm_latched_error(pad);
        if (e != 0u) {
            asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(abort_host + 1), "r"(e) : "memory");
        }
    }
}

// Latches `code` into `err` (an ERROR word, local or a peer's), replacing a latched
// SYMM_ERR_MISMATCH (which does not stop waits); true when this call latched it.
__device__ __forceinline__ bool coll_latch_over_mismatch(unsigned int* err, unsigned int code) {
    unsigned int prev = atomicCAS_system(err, 0u, code);
    if (prev == SYMM_ERR_MISMATCH) {
        prev = atomicCAS_system(err, SYMM_ERR_MISMATCH, code) == SYMM_ERR_MISMATCH ? 0u : prev;
    }
    return prev == 0u;
}

// Records a disagreement with `peer` in STATE (COLL_ST_MISMATCH) after latching `code`; only the
// call that latched the error writes the record, so it describes the error the host reads.
__device__ __noinline__ void coll_latch_disagreement(CollWait w, unsigned int* st, unsigned int code,
                                                     unsigned int kind, unsigned int peer, uint4 theirs, uint4 mine) {
    unsigned int* pad = w.pad;
    const bool won = code == SYMM_ERR_MISMATCH ? atomicCAS_system(pad + SYMM_ERROR_WORD, 0u, code) == 0u
                                               : coll_latch_over_mismatch(pad + SYMM_ERROR_WORD, code);
    if (won) {
        unsigned int* r = st + COLL_ST_MISMATCH;
        r[1] = theirs.x;
        r[2] = theirs.y;
        r[3] = theirs.z;
        r[4] = theirs.w;
        r[5] = mine.x;
        r[6] = mine.y;
        r[7] = mine.z;
        r[8] = mine.w;
        r[0] = (peer + 1u) | (kind << 16);
    }
    coll_mirror_error(pad, w.abort_host);
}

__device__ __forceinline__ bool coll_v4_eq(const uint4& a, const uint4& b) {
    return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w;
}

// The periodic check of a bounded poll (every SYMM_CHECK_EVERY polls, with the deadline the
// caller started at its first check): gives up on an error already latched, an abort, or the
// deadline. Out of line, so polling loops stay short (the code a launch runs is what its
// instruction cache must fetch); everything by value, so no caller needs a local-memory stack.
__device__ __noinline__ bool coll_poll_gives_up(unsigned int polls, unsigned long long deadline, CollWait w) {
    if (coll_fatal_latched(w.pad)) {
        coll_mirror_error(w.pad, w.abort_host);
        return true;
    }
    if ((polls % SYMM_ABORT_EVERY) == 0u && symm_abort_requested(w.abort_host, w.pad)) {
        symm_latch_error(w.pad, SYMM_ERR_ABORTED);
        coll_mirror_error(w.pad, w.abort_host);
        return true;
    }
    if (symm_globaltimer() >= deadline) {
        symm_latch_error(w.pad, SYMM_ERR_TIMEOUT);
        coll_mirror_error(w.pad, w.abort_host);
        return true;
    }
    return false;
}

// Starts `deadline` at the first periodic check of a poll (0: not started).
__device__ __forceinline__ void coll_start_deadline(unsigned long long& deadline, const CollWait& w) {
    if (deadline == 0) {
        deadline = symm_deadline(w.timeout_ns);
    }
}

// Slow path of a bounded wait: polls *p (acquire, system scope) until it reaches target
// (signed difference). Returns true on success; false once the deadline passed, an abort was
// requested, or an error is already latched (then the caller gives up its remaining work).
__device__ __noinline__ bool coll_wait_slow(const unsigned int* p, unsigned int target, CollWait w) {
    unsigned long long deadline = 0;
    unsigned int polls = 0;
    while (true) {
        if (symm_epoch_reached(symm_ld_acquire_sys(p), target)) {
            return true;
        }
        if ((++polls % SYMM_CHECK_EVERY) == 0u) {
            coll_start_deadline(deadline, w);
            if (coll_poll_gives_up(polls, deadline, w)) {
                return false;
            }
        }
    }
}

__device__ __forceinline__ bool coll_wait_geq(const unsigned int* p, unsigned int target, const CollWait& w) {
    if (symm_epoch_reached(symm_ld_acquire_sys(p), target)) {
        return true;
    }
    return coll_wait_slow(p, target, w);
}

// Block 0 / thread 0 at the end of a kernel: wait until every block read the op state.
__device__ __forceinline__ void coll_wait_arrivals(unsigned int* arrive, const CollWait& w) {
    unsigned long long deadline = 0;
    unsigned int polls = 0;
    while (coll_ld_acquire_gpu(arrive) < gridDim.x) {
        if (++polls % SYMM_CHECK_EVERY == 0u) {
            if (deadline == 0) {
                deadline = symm_deadline(w.timeout_ns);
            } else if (symm_globaltimer() >= deadline) {
                symm_latch_error(w.pad, SYMM_ERR_TIMEOUT);
                coll_mirror_error(w.pad, w.abort_host);
                return;
            }
        }
    }
}

// ---------------------------------------------------------------- dtypes

template <int DT>
struct CollT;
template <>
struct CollT<COLL_F32> {
    static constexpr int ES = 4;
    static constexpr int VE = 4;
};
template <>
struct CollT<COLL_F16> {
    static constexpr int ES = 2;
    static constexpr int VE = 8;
};
template <>
struct CollT<COLL_BF16> {
    static constexpr int ES = 2;
    static constexpr int VE = 8;
};

__device__ __forceinline__ unsigned int coll_word(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <int DT>
__device__ __forceinline__ void coll_unpack(const uint4& v, float* f) {
    if (DT == COLL_F32) {
        f[0] = __uint_as_float(v.x);
        f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z);
        f[3] = __uint_as_float(v.w);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned int w = coll_word(v, i);
            if (DT == COLL_BF16) {
                f[2 * i] = __uint_as_float(w << 16);
                f[2 * i + 1] = __uint_as_float(w & 0xFFFF0000u);
            } else {
                unsigned short lo = (unsigned short)(w & 0xFFFFu);
                unsigned short hi = (unsigned short)(w >> 16);
                float a, b;
                asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(lo));
                asm("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"(hi));
                f[2 * i] = a;
                f[2 * i + 1] = b;
            }
        }
    }
}

template <int DT>
__device__ __forceinline__ uint4 coll_pack(const float* f) {
    if (DT == COLL_F32) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    } else {
        unsigned int w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned int r;
            if (DT == COLL_BF16) {
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f[2 * i + 1]), "f"(f[2 * i]));
            } else {
                asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f[2 * i + 1]), "f"(f[2 * i]));
            }
            w[i] = r;
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// A lane equal to the sentinel NaN becomes another NaN (Lamport only).
template <int DT>
__device__ __forceinline__ unsigned int coll_canon_word(unsigned int w) {
    if (DT == COLL_F32) {
        return w == COLL_SENTINEL ? 0x7FC00000u : w;
    } else {
        const unsigned int nan16 = (DT == COLL_BF16) ? 0x7FC0u : 0x7E00u;
        if ((w & 0xFFFFu) == 0xFFFFu) {
            w = (w & 0xFFFF0000u) | nan16;
        }
        if ((w >> 16) == 0xFFFFu) {
            w = (w & 0x0000FFFFu) | (nan16 << 16);
        }
        return w;
    }
}

template <int DT>
__device__ __forceinline__ uint4 coll_canon(uint4 v) {
    return make_uint4(coll_canon_word<DT>(v.x), coll_canon_word<DT>(v.y), coll_canon_word<DT>(v.z),
                      coll_canon_word<DT>(v.w));
}

// True while some lane of a received Lamport vector still holds the sentinel.
template <int DT>
__device__ __forceinline__ bool coll_pending(const uint4& v) {
    if (DT == COLL_F32) {
        return v.x == COLL_SENTINEL || v.y == COLL_SENTINEL || v.z == COLL_SENTINEL || v.w == COLL_SENTINEL;
    } else {
        bool p = false;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned int w = coll_word(v, i);
            p = p || ((w & 0xFFFFu) == 0xFFFFu) || ((w >> 16) == 0xFFFFu);
        }
        return p;
    }
}

// Loads the 16-byte vector at p holding `nvalid` (>= 1) elements; lanes past nvalid are 0.
// `al`: p is 16-byte aligned (else element loads; elements are always aligned to their size).
// The element-wise paths are out of line: the hot path of a launch stays short.
template <int DT>
__device__ __noinline__ uint4 coll_load_slow(const char* p, long long nvalid) {
    unsigned int w[4] = {0u, 0u, 0u, 0u};
    if (CollT<DT>::ES == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (i < nvalid) {
                w[i] = reinterpret_cast<const unsigned int*>(p)[i];
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (i < nvalid) {
                unsigned int h = reinterpret_cast<const unsigned short*>(p)[i];
                w[i >> 1] |= h << ((i & 1) * 16);
            }
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int DT>
__device__ __forceinline__ uint4 coll_load(const char* p, long long nvalid, bool al) {
    constexpr int VE = CollT<DT>::VE;
    if (al && nvalid >= VE) {
        return *reinterpret_cast<const uint4*>(p);
    }
    return coll_load_slow<DT>(p, nvalid);
}

// Stores the first `nvalid` (>= 1) elements of v at p.
template <int DT>
__device__ __noinline__ void coll_store_slow(char* p, uint4 v, long long nvalid) {
    if (CollT<DT>::ES == 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (i < nvalid) {
                reinterpret_cast<unsigned int*>(p)[i] = coll_word(v, i);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (i < nvalid) {
                reinterpret_cast<unsigned short*>(p)[i] = (unsigned short)(coll_word(v, i >> 1) >> ((i & 1) * 16));
            }
        }
    }
}

template <int DT>
__device__ __forceinline__ void coll_store(char* p, const uint4& v, long long nvalid, bool al) {
    constexpr int VE = CollT<DT>::VE;
    if (al && nvalid >= VE) {
        *reinterpret_cast<uint4*>(p) = v;
        return;
    }
    coll_store_slow<DT>(p, v, nvalid);
}

template <int OP>
__device__ __forceinline__ float coll_apply(float a, float b) {
    if (OP == COLL_MAX) {
        return fmaxf(a, b);
    } else if (OP == COLL_MIN) {
        return fminf(a, b);
    } else {
        return a + b;
    }
}

// Reduces world vectors in rank order 0..world-1. `own` is rank `rank`'s vector; peer vectors
// are pv[l] for the l-th peer (rank (rank+1+l) % world).
template <int DT, int OP>
__device__ __forceinline__ uint4 coll_reduce_ranks(const uint4& own, const uint4* pv, int rank, int world) {
    constexpr int VE = CollT<DT>::VE;
    float acc[VE];
    float t[VE];
#pragma unroll
    for (int s = 0; s < COLL_MAXW; ++s) {
        if (s < world) {
            uint4 x = own;
            if (s != rank) {
                int l = (s - rank - 1 + world) % world;
#pragma unroll
                for (int k = 0; k < COLL_MAXW - 1; ++k) {
                    if (k == l) {
                        x = pv[k];
                    }
                }
            }
            if (s == 0) {
                coll_unpack<DT>(x, acc);
            } else {
                coll_unpack<DT>(x, t);
#pragma unroll
                for (int i = 0; i < VE; ++i) {
                    acc[i] = coll_apply<OP>(acc[i], t[i]);
                }
            }
        }
    }
    if (OP == COLL_AVG) {
        const float wf = (float)world;
#pragma unroll
        for (int i = 0; i < VE; ++i) {
            acc[i] = acc[i] / wf;
        }
    }
    return coll_pack<DT>(acc);
}

// ---------------------------------------------------------------- init / error

// Fills the workspace: `zero_words` 32-bit zeros from `ws` (state and flags), then `fill_bytes`
// of sentinel starting at ws + fill_off (the Lamport buffers). Run once, before rendezvous.
extern "C" __global__ void symm_coll_init(unsigned long long ws, unsigned long long zero_words,
                                          unsigned long long fill_off, unsigned long long fill_bytes) {
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    unsigned int* z = reinterpret_cast<unsigned int*>(ws);
    for (unsigned long long i = tid; i < zero_words; i += nth) {
        z[i] = 0u;
    }
    uint4* f = reinterpret_cast<uint4*>(ws + fill_off);
    const uint4 s = make_uint4(COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL);
    for (unsigned long long i = tid; i < fill_bytes / 16; i += nth) {
        f[i] = s;
    }
}

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
// False when the wait gave up. NP: the peer slots the unrolled loop visits (>= world - 1).
template <int DT, int NP>
__device__ __forceinline__ bool coll_lam_poll(uint4 (&pv)[COLL_MAXW - 1], const char* mine,
                                              unsigned long long slot_bytes, unsigned long long v, const char* hdrs,
                                              unsigned int idx, const uint4& hdr, unsigned int rank,
                                              unsigned int world, CollWait& w, unsigned int* st,
                                              unsigned long long& deadline) {
    const unsigned int w1 = world - 1u;
    unsigned int pending = (1u << w1) - 1u;
    if (v == 0ull) {
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
        if (pending != 0u && (++polls % SYMM_CHECK_EVERY) == 0u) {
            coll_start_deadline(deadline, w);
            if (coll_poll_gives_up(polls, deadline, w)) {
                return false;
            }
        }
    }
    return true;
}

// MODE >= 0 and W > 0 fix the mode and the world size at compile time (the specialised
// two-rank entries: a fraction of the generic kernel's code, so a cold instruction cache costs
// less at every launch); MODE < 0 / W == 0 take them from the arguments.
template <int DT, int OP, int MODE, int W>
__device__ __forceinline__ void coll_lamport(const CollWs8 wsv, unsigned int* pad,
                                             unsigned int rank, unsigned int world_arg, unsigned int mode_arg,
                                             const char* input, char* output, unsigned long long count,
                                             unsigned long long lam_off, unsigned long long slot_bytes,
                                             unsigned long long state_off, unsigned long long timeout_ns,
                                             const unsigned int* abort_host, unsigned long long hdr_off,
                                             const uint4 hdr) {
    symm_pdl_prologue();
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
            const uint4 r = coll_reduce_ranks<DT, OP>(own, pv, (int)rank, (int)world);
            coll_store<DT>(output + v * 16, r, nvalid, al_out);
        }
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
    // Every thread of this block has read the op state. One block: it advances the state at its
    // end (nothing to count). More: each block counts itself in, and the LAST one to arrive
    // advances the state at once (every block has read it; the next kernel on the stream starts
    // after this one ends) -- no block waits at the end.
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x > 1u) {
        // Relaxed: the block's state loads are complete (their values addressed every store
        // before the __syncthreads), and the acq_rel form measured 0.05-0.2 us slower.
        const unsigned int before = acq_rel_arrive ? coll_atom_add_acq_rel_gpu(st + COLL_ST_LAM_ARRIVE, 1u)
                                                   : atomicAdd(st + COLL_ST_LAM_ARRIVE, 1u);
        if (before == gridDim.x - 1u) {
            st[COLL_ST_LAM_ARRIVE] = 0u;
            st[COLL_ST_LAM_USED] = (unsigned int)nv;
            st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
        }
    }
    // The vectors not received in the pipeline.
    for (; rv < nv && !failed; rv += nth) {
        failed = !recv(rv);
    }

    // 4. one block: advance the op state (its threads all read it before the __syncthreads
    //    after the push)
    if (gridDim.x == 1u && threadIdx.x == 0) {
        st[COLL_ST_LAM_USED] = (unsigned int)nv;
        st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
    }
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

// mode: COLL_MODE_AR / RS / AG (the op is ignored for AG).
#define COLL_LAMPORT_ENTRY(NAME, DT)                                                          \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_LAMPORT_ARGS) { \
        const CollWs8 wsv = {ws0, ws1, ws2, ws3, ws4, ws5, ws6, ws7};                          \
        if (mode == COLL_MODE_AG) {                                                            \
            coll_lamport<DT, COLL_SUM, -1, 0>(COLL_LAMPORT_PASS);                              \
            return;                                                                            \
        }                                                                                      \
        switch (op) {                                                                          \
            case COLL_SUM:                                                                     \
                coll_lamport<DT, COLL_SUM, -1, 0>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
            case COLL_AVG:                                                                     \
                coll_lamport<DT, COLL_AVG, -1, 0>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
            case COLL_MAX:                                                                     \
                coll_lamport<DT, COLL_MAX, -1, 0>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
            default:                                                                           \
                coll_lamport<DT, COLL_MIN, -1, 0>(COLL_LAMPORT_PASS);                          \
                break;                                                                         \
        }                                                                                      \
    }

COLL_LAMPORT_ENTRY(symm_lamport_f32, COLL_F32)
COLL_LAMPORT_ENTRY(symm_lamport_f16, COLL_F16)
COLL_LAMPORT_ENTRY(symm_lamport_bf16, COLL_BF16)

// Two ranks, one (mode, op) per entry: symm_lamport2_{ar,rs}_{sum,avg,max,min}_{dt} and
// symm_lamport2_ag_{dt} (same arguments as the generic entry; `world`, `mode` and `op` are
// ignored).
#define COLL_LAMPORT2(NAME, DT, MODE, OP)                                                     \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_LAMPORT_ARGS) { \
        const CollWs8 wsv = {ws0, ws1, ws2, ws3, ws4, ws5, ws6, ws7};                          \
        coll_lamport<DT, OP, MODE, 2>(COLL_LAMPORT_PASS);                                      \
    }
// The nine two-rank entries of one kernel KIND and dtype, named symm_KIND_{ar,rs}_{op}_SUFFIX and
// symm_KIND_ag_SUFFIX; ENTRY(NAME, DT, MODE, OP) defines one. symm-cuda's `two_rank_names` lists
// the same names in the same order.
#define COLL_TWO_RANK_ENTRIES(ENTRY, KIND, SUFFIX, DT)                 \
    ENTRY(symm_##KIND##_ar_sum_##SUFFIX, DT, COLL_MODE_AR, COLL_SUM)   \
    ENTRY(symm_##KIND##_ar_avg_##SUFFIX, DT, COLL_MODE_AR, COLL_AVG)   \
    ENTRY(symm_##KIND##_ar_max_##SUFFIX, DT, COLL_MODE_AR, COLL_MAX)   \
    ENTRY(symm_##KIND##_ar_min_##SUFFIX, DT, COLL_MODE_AR, COLL_MIN)   \
    ENTRY(symm_##KIND##_rs_sum_##SUFFIX, DT, COLL_MODE_RS, COLL_SUM)   \
    ENTRY(symm_##KIND##_rs_avg_##SUFFIX, DT, COLL_MODE_RS, COLL_AVG)   \
    ENTRY(symm_##KIND##_rs_max_##SUFFIX, DT, COLL_MODE_RS, COLL_MAX)   \
    ENTRY(symm_##KIND##_rs_min_##SUFFIX, DT, COLL_MODE_RS, COLL_MIN)   \
    ENTRY(symm_##KIND##_ag_##SUFFIX, DT, COLL_MODE_AG, COLL_SUM)

COLL_TWO_RANK_ENTRIES(COLL_LAMPORT2, lamport2, f32, COLL_F32)
COLL_TWO_RANK_ENTRIES(COLL_LAMPORT2, lamport2, f16, COLL_F16)
COLL_TWO_RANK_ENTRIES(COLL_LAMPORT2, lamport2, bf16, COLL_BF16)

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

// Copies n elements from src to dst (16-byte vectors where both are aligned) by one block.
template <int DT>
__device__ __forceinline__ void coll_block_copy(char* dst, const char* src, long long n) {
    constexpr int VE = CollT<DT>::VE;
    const bool al = ((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(dst)) & 15ull) == 0;
    const long long nvec = (n + VE - 1) / VE;
    for (long long v = threadIdx.x; v < nvec; v += blockDim.x) {
        long long nvalid = n - v * VE;
        uint4 x = coll_load<DT>(src + v * 16, nvalid, al);
        coll_store<DT>(dst + v * 16, x, nvalid, al);
    }
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
                    const long long nvec = (n + VE - 1) / VE;
                    for (long long v = threadIdx.x; v < nvec; v += blockDim.x) {
                        coll_st_v4(dst + v * 16, coll_load<DT>(src + v * 16, n - v * VE, al));
                    }
                }
            } else {
                // AR: chunk c of the whole input; AG: chunk c of this rank's shard (= input).
                const long long n = coll_chunk_len(my_len, ce, c);
                const char* src = input + (unsigned long long)c * ce * ES;
                const bool al = (reinterpret_cast<unsigned long long>(src) & 15ull) == 0;
                const long long nvec = (n + VE - 1) / VE;
                for (long long v = threadIdx.x; v < nvec; v += blockDim.x) {
                    uint4 x = coll_load<DT>(src + v * 16, n - v * VE, al);
                    for (unsigned int l = 0; l < w1; ++l) {
                        const unsigned int p = (rank + 1 + l) % world;
                        const unsigned int jr = world - 2 - l;
                        char* dst = reinterpret_cast<char*>(s_bufs[p]) + ring_off +
                                    ((unsigned long long)jr * slots + slot) * slot_bytes;
                        coll_st_v4(dst + v * 16, x);
                    }
                }
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
                    const long long nvec = (n + VE - 1) / VE;
                    for (long long v = threadIdx.x; v < nvec; v += blockDim.x) {
                        coll_store<DT>(dst + v * 16, coll_ld_cg_v4(src + v * 16), n - v * VE, al);
                    }
                }
                char* own_dst = output + ((unsigned long long)rank * shard + (unsigned long long)c * ce) * ES;
                const char* own_src = input + (unsigned long long)c * ce * ES;
                if (own_dst != own_src) {
                    coll_block_copy<DT>(own_dst, own_src, coll_chunk_len(my_len, ce, c));
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

// ---------------------------------------------------------------- reduce from pointers (CE all-reduce)

// out[i] = reduce over ranks s = 0..world-1 of src_s[i] (src_rank = this rank's input, the others
// are peers' symmetric inputs read directly over NVLink, or copies of them in the workspace).
struct CollSrcs {
    const char* s0;
    const char* s1;
    const char* s2;
    const char* s3;
    const char* s4;
    const char* s5;
    const char* s6;
    const char* s7;
};

__device__ __forceinline__ const char* coll_pick(const CollSrcs& p, int s) {
    switch (s) {
        case 0:
            return p.s0;
        case 1:
            return p.s1;
        case 2:
            return p.s2;
        case 3:
            return p.s3;
        case 4:
            return p.s4;
        case 5:
            return p.s5;
        case 6:
            return p.s6;
        default:
            return p.s7;
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
// mode: COLL_MODE_AR / COLL_MODE_RS (reduce the sources into out, n elements) or COLL_MODE_AG
// (gather: rank s's n elements to out + s * n).
// The fused pull's signal word from rank `src` in `pad` (OPS rows COLL_OPS_PULL64, +1).
__device__ __forceinline__ unsigned long long* coll_pull_slot(unsigned int* pad, unsigned int src) {
    return reinterpret_cast<unsigned long long*>(pad + SYMM_OPS_BASE + COLL_OPS_PULL64 * SYMM_MAX_WORLD_SIZE) + src;
}

__device__ __forceinline__ unsigned long long coll_ld_acquire_sys_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void coll_st_release_sys_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
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
        if ((++polls % SYMM_CHECK_EVERY) == 0u) {
            coll_start_deadline(deadline, w);
            if (coll_poll_gives_up(polls, deadline, w)) {
                return false;
            }
        }
    }
}

// MODE >= 0 / W > 0: mode and world size fixed at compile time (two-rank entries), as for the
// Lamport kernel.
template <int DT, int OP, int MODE, int W>
__device__ __forceinline__ void coll_pull(const CollWs8 pads, const CollSrcs src, unsigned int* st, unsigned int rank,
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
        const char *s6, const char *s7, unsigned long long state, unsigned int rank, unsigned int world,    \
        unsigned int mode, unsigned int op, char *out, unsigned long long n, unsigned int check,            \
        unsigned long long timeout_ns, const unsigned int *abort_host

#define COLL_PULL_ENTRY(NAME, DT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1)                                                 \
        NAME(COLL_PULL_ARGS) {                                                                                        \
        const CollWs8 pads = {p0, p1, p2, p3, p4, p5, p6, p7};                                                      \
        const CollSrcs src = {s0, s1, s2, s3, s4, s5, s6, s7};                                                      \
        unsigned int* st = reinterpret_cast<unsigned int*>(state);                                                  \
        if (mode == COLL_MODE_AG) {                                                                                 \
            coll_pull<DT, COLL_SUM, -1, 0>(pads, src, st, rank, world, mode, out, n, check, timeout_ns, abort_host);       \
            return;                                                                                                 \
        }                                                                                                           \
        switch (op) {                                                                                               \
            case COLL_SUM:                                                                                          \
                coll_pull<DT, COLL_SUM, -1, 0>(pads, src, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
                break;                                                                                              \
            case COLL_AVG:                                                                                          \
                coll_pull<DT, COLL_AVG, -1, 0>(pads, src, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
                break;                                                                                              \
            case COLL_MAX:                                                                                          \
                coll_pull<DT, COLL_MAX, -1, 0>(pads, src, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
                break;                                                                                              \
            default:                                                                                                \
                coll_pull<DT, COLL_MIN, -1, 0>(pads, src, st, rank, world, mode, out, n, check, timeout_ns, abort_host);   \
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
        coll_pull<DT, OP, MODE, 2>(pads, src, reinterpret_cast<unsigned int*>(state), rank, world, mode, out, n,   \
                                   check, timeout_ns, abort_host);                                                  \
    }
COLL_TWO_RANK_ENTRIES(COLL_PULL2, pull2, f32, COLL_F32)
COLL_TWO_RANK_ENTRIES(COLL_PULL2, pull2, f16, COLL_F16)
COLL_TWO_RANK_ENTRIES(COLL_PULL2, pull2, bf16, COLL_BF16)

// ---------------------------------------------------------------- barrier over a subset

// One block; thread t handles rank t (t < world, t != rank, bit t of mask set). check == 0: no
// check word; else every rank of the barrier must pass the same check (mismatch latches
// SYMM_ERR_MISMATCH).
extern "C" __global__ void symm_coll_barrier(const unsigned long long* bufs, const unsigned long long* pads,
                                             unsigned int rank, unsigned int world, unsigned long long mask,
                                             unsigned long long state_off, unsigned long long timeout_ns,
                                             const unsigned int* abort_host, unsigned int check) {
    symm_pdl_prologue();
    const unsigned int t = threadIdx.x;
    if (t >= world || t == rank || ((mask >> t) & 1ull) == 0ull) {
        return;
    }
    unsigned int* pad = reinterpret_cast<unsigned int*>(pads[rank]);
    unsigned int* st = reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(bufs[rank]) + state_off);
    unsigned int* peer_pad = reinterpret_cast<unsigned int*>(pads[t]);
    const unsigned int e = st[COLL_ST_BAR_CNT + t] + 1u;
    st[COLL_ST_BAR_CNT + t] = e;
    if (check != 0u) {
        coll_st_relaxed_sys(symm_ops_slot(peer_pad, COLL_OPS_CHECK, rank), check);
    }
    symm_st_release_sys(symm_ops_slot(peer_pad, COLL_OPS_BAR, rank), e);
    CollWait w;
    w.pad = pad;
    w.abort_host = abort_host;
    w.timeout_ns = timeout_ns;
    if (!coll_wait_geq(symm_ops_slot(pad, COLL_OPS_BAR, t), e, w)) {
        return;
    }
    const unsigned int theirs = symm_ld_volatile(symm_ops_slot(pad, COLL_OPS_CHECK, t));
    if (check != 0u && theirs != check) {
        coll_latch_disagreement(w, st, SYMM_ERR_MISMATCH, COLL_MISMATCH_CHECK, t, make_uint4(theirs, 0u, 0u, 0u),
                                make_uint4(check, 0u, 0u, 0u));
    }
}

// This rank rejected its own arguments for an op (NOTE [op-agreement]): latch
// SYMM_ERR_PEER_REJECTED into every peer's ERROR word and record this rank in its STATE, so the
// peers' waits give up at once instead of pairing with this rank's next op. One block, thread t
// handles rank t.
extern "C" __global__ void symm_coll_reject(const unsigned long long* bufs, const unsigned long long* pads,
                                            unsigned int rank, unsigned int world, unsigned long long state_off) {
    symm_pdl_prologue();
    const unsigned int t = threadIdx.x;
    if (t >= world || t == rank) {
        return;
    }
    unsigned int* peer_pad = reinterpret_cast<unsigned int*>(pads[t]);
    if (coll_latch_over_mismatch(peer_pad + SYMM_ERROR_WORD, SYMM_ERR_PEER_REJECTED)) {
        unsigned int* r =
            reinterpret_cast<unsigned int*>(reinterpret_cast<char*>(bufs[t]) + state_off) + COLL_ST_MISMATCH;
        symm_st_release_sys(r, (rank + 1u) | (COLL_MISMATCH_REJECTED << 16));
    }
}

// Reads and clears the ERROR word into *out (one thread).
extern "C" __global__ void symm_coll_take_error(unsigned int* err, unsigned int* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        *out = atomicExch(err, 0u);
    }
}

// All-reduce epilogues (residual add, RMSNorm): NOTE [fused-epilogue].
#include "epilogue.cuh"
