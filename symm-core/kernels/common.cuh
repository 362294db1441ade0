// symm: device helpers shared by every kernel file of both vendors (symm_core::kernel_source).
//
// Each backend compiles a kernel as (symm-rocm: caller defines before its vendor header)
//     symm_core::pad::c_defines() + its vendor header + this file + caller defines + the file
// (symm-cuda's kernels/vendor.cuh for NVRTC, symm-rocm's kernels/vendor.hip.h for hiprtc), so
// the layout macros below are normally already defined (generated from symm-core/src/pad.rs).
// The hand copy keeps this file readable on its own; symm-cuda's unit test
// `common_cuh_defines_match_pad` checks it is identical. Everything vendor-specific (atomics and
// memory orders, the clock, PDL, lanes and shuffles, vector loads, half conversions) comes from
// the vendor header: this file and the collectives hold no `asm` and no `#if` on the vendor.
//
// Rules: no multicast, no multimem, no NVLS, no __trap(). Every wait is
// bounded (deadline from symm_globaltimer, abort word, latched error).

#ifndef SYMM_MAX_WORLD_SIZE
#define SYMM_MAX_WORLD_SIZE 64
#define SYMM_NUM_CHANNELS 32
#define SYMM_OPS_SLOTS 64
#define SYMM_BARRIER_BASE 0
#define SYMM_SIGNAL_BASE 2048
#define SYMM_OPS_BASE 4096
#define SYMM_LOCAL_BARRIER_EPOCH 8192
#define SYMM_LOCAL_SENT 8224
#define SYMM_LOCAL_RECV 10272
#define SYMM_LOCAL_OPS_EPOCH 12320
#define SYMM_ABORT_WORD 12384
#define SYMM_ERROR_WORD 12385
#define SYMM_SIGNAL_PAD_SIZE 65536
#define SYMM_ERR_TIMEOUT 1
#define SYMM_ERR_ABORTED 2
#define SYMM_ERR_MISMATCH 3
#define SYMM_ERR_OP_MISMATCH 4
#define SYMM_ERR_PEER_REJECTED 5
#endif

// How often a bounded wait looks at its deadline and the latched error
// (every 64 polls) and at the abort words (every 1024 polls: the host word
// lives in pinned host memory, so each read crosses PCIe).
#define SYMM_CHECK_EVERY 64u
#define SYMM_ABORT_EVERY 1024u

// The shared kernels reduce over groups of 32 lanes (symm_shfl_xor32): a vendor's warp or
// wavefront must hold whole groups.
static_assert(SYMM_WAVE_SIZE % 32 == 0, "the vendor header's SYMM_WAVE_SIZE");

// ---- programmatic dependent launch (PDL) ---------------------------------
//
// NOTE [pdl]
// ==========
// A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
// (symm-cuda's driver::launch, `Launch::pdl`) may START before the kernel ahead
// of it on the stream has finished: its blocks are scheduled once every block
// of that kernel has called symm_pdl_launch_dependents() (or exited), which
// hides the launch latency of back-to-back kernels. Such a kernel MUST call
// symm_pdl_wait() before its first access to global memory: it returns once
// the kernel ahead has completed and its writes are visible, so what follows
// sees exactly what a plain launch would. Hence the rule: every kernel that
// symm-cuda may launch with PDL calls symm_pdl_wait() first, then
// symm_pdl_launch_dependents() (nothing after it depends on the next kernel,
// whose own wait holds it back until this one has completed). Without the
// attribute both are no-ops.
// One exception, "handoff" (NOTE [fused-epilogue] in epilogue.cuh): the fused
// entry's handoff half waits only at its end (then releases the next kernel,
// so a rank still has at most two grids in flight, NOTE [co-residency]), so it
// runs beside the Lamport all-reduce launched just before it. That
// is sound because (1) that all-reduce called symm_pdl_wait() before it
// released this kernel, so every kernel before it has completed and its writes
// are in L2, which the half reads through (ld.cg: the residual and the weight);
// (2) of the all-reduce's own writes the half reads only its HANDOFF buffer,
// as Lamport data, valid by its value alone; (3) what the half writes (its
// outputs, HANDOFF's re-arming) the all-reduce never reads, except x when the
// norm output is x: a vector of x is written only after the row's sums were
// taken, which the all-reduce computed from that vector of x; and (4) its
// final wait makes its completion imply the all-reduce's, so the next kernel's
// own wait sees both done (the next Lamport launch reads the op state). The two are vendor primitives (symm-cuda's
// kernels/vendor.cuh: griddepcontrol from sm_90 on, nothing before it;
// symm-rocm's kernels/vendor.hip.h: nothing, HIP has no PDL), and the host never
// sets the attribute where they compile to nothing.

// The rule above in one call: the first statement of every kernel symm-cuda may launch with PDL
// (but the handoff half, above).
__device__ __forceinline__ void symm_pdl_prologue() {
    symm_pdl_wait();
    symm_pdl_launch_dependents();
}

// now + timeout_ns, saturating (a timeout of ~0 never expires).
__device__ __forceinline__ unsigned long long symm_deadline(unsigned long long timeout_ns) {
    unsigned long long now = symm_globaltimer();
    return (timeout_ns > ~0ull - now) ? ~0ull : now + timeout_ns;
}

// True when epoch v has reached target, modulo 2^32 (signed difference).
__device__ __forceinline__ bool symm_epoch_reached(unsigned int v, unsigned int target) {
    return (int)(v - target) >= 0;
}

// ---- pad slots (word pointers into a pad base) ---------------------------

__device__ __forceinline__ unsigned int* symm_barrier_slot(unsigned int* pad, unsigned int channel, unsigned int src) {
    return pad + SYMM_BARRIER_BASE + channel * SYMM_MAX_WORLD_SIZE + src;
}
__device__ __forceinline__ unsigned int* symm_signal_slot(unsigned int* pad, unsigned int channel, unsigned int src) {
    return pad + SYMM_SIGNAL_BASE + channel * SYMM_MAX_WORLD_SIZE + src;
}
__device__ __forceinline__ unsigned int* symm_ops_slot(unsigned int* pad, unsigned int slot, unsigned int src) {
    return pad + SYMM_OPS_BASE + slot * SYMM_MAX_WORLD_SIZE + src;
}
__device__ __forceinline__ unsigned int* symm_sent_slot(unsigned int* pad, unsigned int channel, unsigned int dst) {
    return pad + SYMM_LOCAL_SENT + channel * SYMM_MAX_WORLD_SIZE + dst;
}
__device__ __forceinline__ unsigned int* symm_recv_slot(unsigned int* pad, unsigned int channel, unsigned int src) {
    return pad + SYMM_LOCAL_RECV + channel * SYMM_MAX_WORLD_SIZE + src;
}

// ---- errors ----------------------------------------------------------------

// Latches `code` into the local ERROR word unless an error is already there;
// returns the code now latched. The host reads (and clears) it with
// CudaSymmetricMemory::check_error after synchronising the stream.
__device__ __forceinline__ unsigned int symm_latch_error(unsigned int* pad, unsigned int code) {
    unsigned int prev = atomicCAS(pad + SYMM_ERROR_WORD, 0u, code);
    return prev == 0u ? code : prev;
}

// The error latched in the local pad (0 if none).
__device__ __forceinline__ unsigned int symm_latched_error(unsigned int* pad) {
    return symm_ld_volatile(pad + SYMM_ERROR_WORD);
}

// True if the host asked every wait to stop: the pinned host abort word
// (abort_host, may be null) or the pad's ABORT word.
__device__ __forceinline__ bool symm_abort_requested(const unsigned int* abort_host, unsigned int* pad) {
    return (abort_host != nullptr && symm_ld_acquire_sys(abort_host) != 0u) ||
           symm_ld_volatile(pad + SYMM_ABORT_WORD) != 0u;
}

// Polls *slot (a word of this rank's own pad that one peer writes with
// st.release.sys) with ld.acquire.sys until it reaches `target`. Gives up with
// SYMM_ERR_TIMEOUT once symm_globaltimer() passes `deadline`, or with
// SYMM_ERR_ABORTED when an abort word is set. Returns 0 on success, else the
// code; latches nothing (the caller reports it, see symm_report).
__device__ __noinline__ unsigned int symm_bounded_wait_code(const unsigned int* slot, unsigned int target,
                                                           unsigned long long deadline, const unsigned int* abort_host,
                                                           unsigned int* pad) {
    unsigned int polls = 0;
    while (true) {
        if (symm_epoch_reached(symm_ld_acquire_sys(slot), target)) {
            return 0u;
        }
        symm_backoff();
        ++polls;
        if ((polls % SYMM_CHECK_EVERY) == 0u) {
            if ((polls % SYMM_ABORT_EVERY) == 0u && symm_abort_requested(abort_host, pad)) {
                return SYMM_ERR_ABORTED;
            }
            if (symm_globaltimer() >= deadline) {
                // One last look: the value may have landed meanwhile.
                return symm_epoch_reached(symm_ld_acquire_sys(slot), target) ? 0u : SYMM_ERR_TIMEOUT;
            }
        }
    }
}

// symm_bounded_wait_code, then a failure latched into the local ERROR word
// (the host reads and clears it with CudaSymmetricMemory::check_error).
__device__ __forceinline__ unsigned int symm_bounded_wait(const unsigned int* slot, unsigned int target,
                                                         unsigned long long deadline, const unsigned int* abort_host,
                                                         unsigned int* pad) {
    unsigned int code = symm_bounded_wait_code(slot, target, deadline, abort_host, pad);
    return code == 0u ? 0u : symm_latch_error(pad, code);
}

// Reports the outcome of one operation. With `status` (a word of pinned host
// memory the host waits on: blocking operations), the code is stored there,
// 0 included, and nothing is latched, so concurrent operations never see each
// other's failures. Without it (stream-ordered operations), a failure is
// latched into the pad's ERROR word for check_error.
__device__ __forceinline__ void symm_report(unsigned int* pad, unsigned int* status, unsigned int code) {
    if (status != nullptr) {
        symm_st_release_sys(status, code);
    } else if (code != 0u) {
        symm_latch_error(pad, code);
    }
}
