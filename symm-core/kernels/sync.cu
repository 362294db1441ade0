// barrier, put_signal and wait_signal over signal pads: one source for every GPU vendor
// (symm_core::kernel_source::SYNC), compiled after the pad defines, the backend's vendor header
// and common.cuh, as the collectives are (symm-cuda with NVRTC, symm-rocm with hiprtc).
//
// Protocol: NOTE [signal-pad-layout] in symm-core/src/pad.rs (epoch counters,
// no compare-and-swap). Each kernel runs one block; thread p handles peer p.
//
// Common arguments:
//   pads        device array of `world` u64: every rank's pad base address as
//               mapped in this process (SymmetricMemory::signal_pad_ptrs_dev)
//   rank, world this rank and the group size (world <= SYMM_MAX_WORLD_SIZE)
//   channel     < SYMM_NUM_CHANNELS (checked on the host)
//   timeout_ns  how long a wait may poll before it gives up (SYMM_ERR_TIMEOUT)
//   abort_host  device address of the pinned host abort word (0: none; symm-rocm
//               has none: its host aborts through the pad's ABORT word)
//   status      device address of a pinned host word that receives the
//               outcome (0 or SYMM_ERR_*), for blocking calls; 0 for
//               stream-ordered calls, whose failures are latched into the
//               pad's ERROR word instead (see symm_report in common.cuh;
//               symm-rocm passes 0 and reads the ERROR word after its wait)
//
// Epochs live in this rank's LOCAL pad region (device memory) and are
// advanced here (atomically), never passed in, so a captured CUDA graph
// replays correctly. Ops on different channels may run concurrently on
// different streams; ops on one channel must keep one order on every rank.
//
// Memory ordering: the releasing thread's st.release.sys is cumulative over
// what the block did before the __syncthreads() that precedes it, and stream
// order makes earlier kernels' writes part of that; the waiting thread's
// ld.acquire.sys followed by __syncthreads() makes peers' earlier writes
// visible to the whole block and to later kernels on the stream.
//
// Abort: with the pad's ABORT word set when a kernel starts, it reports
// SYMM_ERR_ABORTED and touches no epoch and no peer (as the host backend).
// While waiting, both the pinned host abort word and the pad's ABORT word are
// polled.

// barrier(channel): e = ++barrier_epoch[channel]; release-store e into every
// peer's BARRIER[channel][rank]; acquire-poll own BARRIER[channel][p] >= e for
// every peer p. Launch: 1 block of >= world threads (a multiple of 32).
extern "C" __global__ void symm_barrier(const unsigned long long* pads, unsigned int rank, unsigned int world,
                                        unsigned int channel, unsigned long long timeout_ns,
                                        const unsigned int* abort_host, unsigned int* status) {
    __shared__ unsigned int s_epoch;
    __shared__ unsigned long long s_deadline;
    __shared__ unsigned int s_code;
    __shared__ bool s_aborted;
    unsigned int* local = (unsigned int*)pads[rank];
    if (threadIdx.x == 0) {
        s_code = 0u;
        s_aborted = symm_ld_volatile(local + SYMM_ABORT_WORD) != 0u;
        if (!s_aborted) {
            // Atomic, so barriers on different channels (or, misused, on one
            // channel) from several streams never corrupt the counters.
            s_epoch = atomicAdd(local + SYMM_LOCAL_BARRIER_EPOCH + channel, 1u) + 1u;
            s_deadline = symm_deadline(timeout_ns);
        }
    }
    __syncthreads();
    if (s_aborted) {
        if (threadIdx.x == 0) {
            symm_report(local, status, SYMM_ERR_ABORTED);
        }
        return;
    }
    const unsigned int e = s_epoch;
    const unsigned int p = threadIdx.x;
    if (p < world && p != rank) {
        unsigned int* peer = (unsigned int*)pads[p];
        symm_st_release_sys(symm_barrier_slot(peer, channel, rank), e);
        unsigned int code =
            symm_bounded_wait_code(symm_barrier_slot(local, channel, p), e, s_deadline, abort_host, local);
        if (code != 0u) {
            atomicMax(&s_code, code);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        symm_report(local, status, s_code);
    }
}

// put_signal(dst, channel): e = ++sent[channel][dst]; release-store e into
// dst's SIGNAL[channel][rank]. Never waits. Launch: 1 block, 1 thread (more
// are harmless).
extern "C" __global__ void symm_put_signal(const unsigned long long* pads, unsigned int rank, unsigned int world,
                                           unsigned int dst, unsigned int channel, unsigned int* status) {
    if (threadIdx.x != 0 || blockIdx.x != 0 || dst >= world) {
        return;
    }
    unsigned int* local = (unsigned int*)pads[rank];
    if (symm_ld_volatile(local + SYMM_ABORT_WORD) != 0u) {
        symm_report(local, status, SYMM_ERR_ABORTED);
        return;
    }
    unsigned int e = atomicAdd(symm_sent_slot(local, channel, dst), 1u) + 1u;
    unsigned int* peer = (unsigned int*)pads[dst];
    symm_st_release_sys(symm_signal_slot(peer, channel, rank), e);
    symm_report(local, status, 0u);
}

// wait_signal(src, channel): e = ++recv[channel][src]; acquire-poll own
// SIGNAL[channel][src] >= e. On timeout or abort recv is rolled back, so the
// next wait expects the same signal. Launch: 1 block, 1 thread (more are
// harmless).
extern "C" __global__ void symm_wait_signal(const unsigned long long* pads, unsigned int rank, unsigned int world,
                                            unsigned int src, unsigned int channel, unsigned long long timeout_ns,
                                            const unsigned int* abort_host, unsigned int* status) {
    if (threadIdx.x != 0 || blockIdx.x != 0 || src >= world) {
        return;
    }
    unsigned long long deadline = symm_deadline(timeout_ns);
    unsigned int* local = (unsigned int*)pads[rank];
    unsigned int* rp = symm_recv_slot(local, channel, src);
    unsigned int e = atomicAdd(rp, 1u) + 1u;
    unsigned int code = symm_bounded_wait_code(symm_signal_slot(local, channel, src), e, deadline, abort_host, local);
    if (code != 0u) {
        // Not received: a later wait waits for the same signal again.
        atomicSub(rp, 1u);
    }
    symm_report(local, status, code);
}
