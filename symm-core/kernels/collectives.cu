// symm: collective kernels (all-reduce, reduce-scatter, all-gather, barrier over a subset), one
// source for both vendors (symm_core::kernel_source::COLLECTIVES).
//
// Compiled as pad #defines + the vendor header + common.cuh + defines + this file: by NVRTC for
// CUDA (symm-cuda's kernels.rs, vendor header kernels/vendor.cuh; sm_80 or newer for the bf16
// conversions; launch configurations are sized for sm_90, H100/H200), and by hiprtc for ROCm
// (symm-rocm's kernels.rs: defines first, then kernels/vendor.hip.h; gfx908, gfx90a, gfx942).
// `#include "name.cuh"` lines are expanded with symm-core's embedded headers
// (kernel_source::expand_includes: neither compiler gets an include path). Both backends build
// the same entries, listed once in symm_core::kernel_source::COLLECTIVE_ENTRIES.
// The host side is symm-core's `coll` (`coll/layout.rs` the workspace layout, whose offsets reach
// the kernels as arguments; `coll/geometry.rs` the chunking and grids; `coll/launch.rs` every launch's
// entry and arguments), run by symm-cuda's collectives and symm-rocm's (symm-ops' rocm engine).
//
// Grids: at most one block per SM on a GPU of its own; ranks sharing a GPU get a share of its SMs
// so every rank's waiting kernels are resident together (NOTE [co-residency] in
// docs/architecture.md, GridBudget in coll/geometry.rs). Every kernel works at any grid size.
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
// Lamport two-shot (COLL_MODE_AR2 of the Lamport entries, NOTE [lamport-two-shot] in lamport.cuh):
//   the same buffers, headers, rotation and state; each slot holds two regions of one shard (the
//   peers' copies of this rank's shard, then their reduced shards), pushed in two exchanges of
//   one kernel; the safety argument above holds for both, as every write of op k into a peer
//   follows this rank's op k-1.
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
// Two-shot pull (COLL_MODE_AR2 of the fused pull; 3+ ranks, input and output both registered):
// between the same two barriers, rank r reduces shard r of the message (two_shot_shard) from
// every rank's input and stores the result into shard r of every rank's output. Shard r is read
// and written by rank r alone, everywhere, so the op may run in place. Every thread fences
// (fence.sc.sys) after its stores into peers' outputs, before its block counts itself in: the
// closing signal, sent once every block has counted in, then tells a peer that its output holds
// this rank's shard, and the peer returns only after every rank's closing signal.
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
// Every wait is bounded: deadline from symm_globaltimer (%globaltimer on NVIDIA, the wall clock on
// AMD), the abort words, and an error already latched (then the wait gives up at once); failures
// latch SYMM_ERR_* into the pad's ERROR word. No trap. Accumulation is fp32 in rank order
// 0..world-1, so every rank gets bitwise the same result.
//
// On ROCm (vendor.hip.h; ASSUMED, NOT VERIFIED: no AMD GPU has run these kernels, only hiprtc has
// compiled them). What holds above on NVIDIA rests on PTX's memory model and on measurements;
// on AMD the same text relies on the following, each an assumption until a CDNA machine (MI200 /
// MI300 over xGMI) runs symm-cuda's GPU suites' equivalents:
//   - Lamport sentinel visibility: a peer's 16-byte push is a non-temporal global store
//     (flat/global_store_dwordx4 glc slc on gfx90a, as RCCL's LL protocol stores), the poll a
//     volatile 16-byte load (glc: past the CU's L1). Assumed: such a store to a peer's memory
//     over xGMI reaches it in bounded time with no release or fence after it (no cache of the
//     sender holds it back), and the poll sees it (the owner's L2 holds no stale copy of a line
//     a peer wrote); and every 32-bit word of it is single-copy atomic, so a poll sees each
//     word either as the sentinel or as the value, never torn (a torn f32 lane that is neither
//     would be taken as data; bf16 / f16 lanes need 16 bits, which 32 give). Nothing assumes the
//     four words of a vector arrive together: every lane is checked.
//   - Store ordering: none assumed between a thread's pushes (each lane is its own flag), as on
//     NVIDIA. The op header and the clearing stores follow the same rule.
//   - Release / acquire: __hip_atomic_store / __hip_atomic_load with RELEASE / ACQUIRE at
//     system scope (buffer_wbl2 + waits before the store, buffer_invl2 / L1 invalidation after
//     the load on gfx90a). Assumed cumulative over the block as st.release.sys is: the ring
//     sender's data stores by the whole block, then __syncthreads, then one thread's release.
//     HIP's __syncthreads is a workgroup-scope fence and barrier, and LLVM's AMDGPU memory model
//     makes the later system-scope release cover what happened before at workgroup scope;
//     not tested on hardware.
//   - 64-bit release stores / acquire loads (the fused pull's check << 32 | epoch word):
//     assumed single-copy atomic over xGMI, so a peer never pairs one op's epoch with another's
//     check word.
//   - Wave64: the epilogue's sums combine 32-lane groups (symm_shfl_xor32 is __shfl_xor with
//     width 32), so each half of a wavefront reduces as a CUDA warp does and the lane order,
//     hence the bits within a vendor, is the same; coll_first_active_lane reads the 64-bit
//     EXEC mask. Not run.
//   - No PDL: symm_pdl_prologue is empty; HIP launches are plainly stream-ordered.
//   - Deadlines: wall_clock64() ticks converted to ns at SYMM_WALL_CLOCK_KHZ (100 MHz unless the
//     host defines otherwise); timeouts keep their nanosecond arguments on both vendors.
//   - Co-residency: the kernels assume every block of a grid is resident at once (one wave).
//     symm-rocm sizes grids as symm-cuda does, from symm-core's GridBudget with the device's
//     compute units in place of SMs: at most one block per CU (split among the ranks sharing
//     the device). Assumed: one block of up to COLL_MAX_THREADS threads, which the launch
//     bounds promise the compiler, always fits an otherwise idle CU, even where hiprtc spills
//     registers to scratch. Not run.
//   - Host side: symm-rocm launches exactly the argument lists, grids and op headers
//     symm-cuda launches (symm-core's coll::launch plans both; symm-cuda's GPU suites run
//     those plans), but not the epilogue entries (they compile and are not launched on ROCm)
//     nor the copy-engine paths (host code: copies on side streams). Its waits poll the pad's
//     ABORT word only (no pinned host abort word: abort_host is null).
//   - Numerics: f16 conversions are _Float16 (round to nearest even), bf16 rounding is done in
//     integers (nearest even, NaN -> 0x7FFF); rsqrtf and NaN payloads may differ from NVIDIA's,
//     so results are bitwise equal across ranks of one vendor, not across vendors.

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
// The two-shot all-reduce: the fused pull reduces this rank's shard from every rank's input and
// writes it into every rank's output (NOTE [collectives-protocols], "Two-shot pull"); the Lamport
// kernel pushes the shards and then the reduced shard as data (NOTE [lamport-two-shot]).
#define COLL_MODE_AR2 3

#define COLL_FLAG_INPLACE 1u
// Bit of the ring kernel's `flags`: one vector in flight per thread, the order before NOTE
// [ring-unroll] in ring.cuh (a measurement switch, SYMM_RING_UNROLL1).
#define COLL_FLAG_UNROLL1 2u
// Lamport `mode` argument bit: count blocks with atom.acq_rel.gpu instead of a relaxed atomic.
#define COLL_LAM_ACQREL_ARRIVE 0x100u
// Bit of the Lamport kernel's mode argument: every polling thread reads the host abort word
// (CollWait::host_every_thread; measurement switch, NOTE [host-abort-poll]).
#define COLL_LAM_HOST_EVERY_THREAD 0x200u
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
// The fused epilogue's split-row counters: one word per row, COLL_EPI_SPLIT_MAX_ROWS of them.
#define COLL_ST_EPI_ROWS 256
#define COLL_EPI_SPLIT_MAX_ROWS 256
// The fused epilogue's slot rows: the last op's tag, then COLL_EPI_SLOTS_MAX 64-bit slots (a
// row's warps' sums of squares, rows * big / 32 of them) from word COLL_ST_EPI_SLOTS (8-byte
// aligned).
#define COLL_ST_EPI_TAG 11
#define COLL_ST_EPI_SLOTS 512
#define COLL_EPI_SLOTS_MAX 256

// Pad OPS slots used here (must match layout.rs).
#define COLL_OPS_BAR 0
#define COLL_OPS_CHECK 1
// Fused pull: one 64-bit word per source rank (check << 32 | epoch) over OPS rows 2 and 3.
#define COLL_OPS_PULL64 2

#define COLL_SENTINEL 0xFFFFFFFFu

// ---------------------------------------------------------------- primitives
// The vendor's (coll_atom_*, coll_ld_* / coll_st_*, coll_prefetch_*, coll_first_active_lane,
// symm_shfl_xor32, the f16 / bf16 conversions): symm-cuda's kernels/vendor.cuh,
// symm-rocm's kernels/vendor.hip.h.

// What a kernel needs to bound its waits.
struct CollWait {
    unsigned int* pad;             // own signal pad (ERROR / ABORT words)
    const unsigned int* abort_host; // pinned host abort word (may be null)
    unsigned long long timeout_ns;
    unsigned int host_every_thread; // 1: every polling thread reads abort_host from its 1024th poll
                                    // (the order before NOTE [host-abort-poll]; measurement switch)
};

// NOTE [host-abort-poll]: the host abort word lives in pinned host memory, so every read of it
// crosses PCIe, and a collective can have 67,584 threads polling at once (132 blocks of 512).
// Were each of them to read it every 1024 polls from the start of a wait, a wait that passes
// ~1024 polls (a peer a few hundred microseconds late: a GEMM's skew in a model layer) would
// queue tens of thousands of PCIe reads, and every one of those threads would then stand in
// that queue, past the moment its data arrived (bench-notes round 15). So only the first active
// lane of each warp reads it, and only once the wait has lasted SYMM_HOST_ABORT_AFTER polls
// (milliseconds); the pad's ABORT word and the latched error (device memory) every thread
// still checks at every periodic check. An abort stops a wait within a few milliseconds.
#define SYMM_HOST_ABORT_AFTER 8192u

// Whether the host or a peer asked this wait to stop (NOTE [host-abort-poll]); `polls` is a
// multiple of SYMM_CHECK_EVERY.
__device__ __forceinline__ bool coll_abort_requested(unsigned int polls, const CollWait& w) {
    if (symm_ld_volatile(w.pad + SYMM_ABORT_WORD) != 0u) {
        return true;
    }
    if (w.abort_host == nullptr || (polls % SYMM_ABORT_EVERY) != 0u) {
        return false;
    }
    if (!w.host_every_thread && (polls < SYMM_HOST_ABORT_AFTER || !coll_first_active_lane())) {
        return false;
    }
    return symm_ld_acquire_sys(w.abort_host) != 0u;
}

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
            coll_st_relaxed_sys_global(abort_host + 1, e);
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
    if (coll_abort_requested(polls, w)) {
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

// One more turn of a bounded poll whose value has not come: back off, and every
// SYMM_CHECK_EVERY polls start the deadline (at the first check) and ask coll_poll_gives_up.
// False: give up. The waits below and epi_slot_get poll through it.
__device__ __forceinline__ bool coll_poll_again(unsigned int& polls, unsigned long long& deadline,
                                                const CollWait& w) {
    symm_backoff();
    if ((++polls % SYMM_CHECK_EVERY) == 0u) {
        coll_start_deadline(deadline, w);
        if (coll_poll_gives_up(polls, deadline, w)) {
            return false;
        }
    }
    return true;
}

// Slow path of a bounded wait: polls *p (acquire, system scope) until it reaches target
// (signed difference). Returns true on success; false once the deadline passed, an abort was
// requested, or an error is already latched (then the caller gives up its remaining work).
__device__ __noinline__ bool coll_wait_slow(const unsigned int* p, unsigned int target, CollWait w) {
    unsigned long long deadline = 0;
    unsigned int polls = 0;
    while (!symm_epoch_reached(symm_ld_acquire_sys(p), target)) {
        if (!coll_poll_again(polls, deadline, w)) {
            return false;
        }
    }
    return true;
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
        symm_backoff();
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
                const unsigned short lo = (unsigned short)(w & 0xFFFFu);
                const unsigned short hi = (unsigned short)(w >> 16);
                const float a = symm_f16_to_f32(lo);
                const float b = symm_f16_to_f32(hi);
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
            w[i] = DT == COLL_BF16 ? symm_pack_bf16x2(f[2 * i + 1], f[2 * i]) : symm_pack_f16x2(f[2 * i + 1], f[2 * i]);
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

// Stores the first `nvalid` elements of v at p (none when nvalid <= 0: an empty shard's vector).
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
// NP: the peer vectors pv may hold (the world-specialised Lamport entries pass world - 1, so the
// selects below stop there).
template <int DT, int OP, int NP = COLL_MAXW - 1>
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
                for (int k = 0; k < NP; ++k) {
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

// NOTE [device-trace]: a diagnostic build (symm-cuda's `SYMM_TRACE=1` switch adds
// `#define COLL_TRACE 1`) stamps %globaltimer at the phases of every Lamport launch: entry
// (before the PDL wait), start (after it), thread 0's first vector pushed to every peer, thread
// 0's first vector received from every peer (the last peer's data arrived), and thread 0's exit.
// Thread 0 of block 0 writes one record of COLL_TRACE_WORDS u64 into the buffer at
// `symm_trace_buf` (0: nothing recorded): word 0 of the buffer counts records, records start at
// word COLL_TRACE_WORDS, a full buffer (COLL_TRACE_CAP) drops them (and `take` says so). Record: [kind | world << 8 |
// rank << 16 | mode << 24, count, own workspace base, the five stamps]; kind 1 the generic entry,
// 2 an entry specialised for its world size, and kind 8 thread 0 of EVERY block (entry, start,
// exit) (symm-cuda's trace.rs reads them; the epilogue kernels' kinds in epilogue.cuh). Without
// COLL_TRACE none of this is compiled, so the kernels' code is unchanged.
#ifdef COLL_TRACE
__device__ unsigned long long symm_trace_buf;
#define COLL_TRACE_WORDS 8
#define COLL_TRACE_CAP 1048576u
__device__ __forceinline__ void coll_trace_write(unsigned int kind, unsigned int world, unsigned int rank,
                                                 unsigned int mode, unsigned long long count, const char* ws,
                                                 const unsigned long long (&t)[5]) {
    unsigned long long* b = reinterpret_cast<unsigned long long*>(symm_trace_buf);
    if (b == nullptr) {
        return;
    }
    const unsigned int slot = atomicAdd(reinterpret_cast<unsigned int*>(b), 1u);
    if (slot >= COLL_TRACE_CAP) {
        return;
    }
    unsigned long long* r = b + COLL_TRACE_WORDS * (1ull + slot);
    r[0] = (unsigned long long)(kind | (world << 8) | (rank << 16) | ((mode & 0xFFu) << 24));
    r[1] = count;
    r[2] = reinterpret_cast<unsigned long long>(ws);
#pragma unroll
    for (int i = 0; i < 5; ++i) {
        r[3 + i] = t[i];
    }
}
#define COLL_TRACE_DECL unsigned long long coll_tr[5] = {0ull, 0ull, 0ull, 0ull, 0ull};
#define COLL_TRACE_AT(i, cond)              \
    if (cond) {                             \
        coll_tr[i] = symm_globaltimer();    \
    }
#else
#define COLL_TRACE_DECL
#define COLL_TRACE_AT(i, cond)
#endif

#include "lamport.cuh"
#include "ring.cuh"
#include "reduce_ptrs.cuh"
#include "pull.cuh"

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
    w.host_every_thread = 0u;
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
