// symm-cuda: latency probes (diagnostics for the benchmark, `symm-bench --probe`).
//
// Minimal kernels that isolate the fixed costs of a cross-GPU kernel on a stream or in a CUDA
// graph: an empty kernel, a local state update, one remote store, a flag ping-pong (relaxed /
// volatile and release / acquire), and a 1 KiB data-as-flag exchange with and without a
// gpu-scope release after the remote stores. Host side: symm-cuda/src/probe.rs, which owns the
// buffer layout (NOTE [probe-layout] there). Each probe keeps its epoch counter in device memory
// (STATE, one word per probe), so graph replays work; both ranks run the same sequence of probes.
// Waits are bounded by %globaltimer (timeout_ns) and give up silently: a probe measures, it
// reports nothing (the benchmark checks the counters afterwards). Every latency probe starts with
// symm_pdl_prologue() (NOTE [pdl] in common.cuh), so symm-bench can time each one launched plainly
// and with programmatic dependent launch.

#define PROBE_STATE 0        // u32 words: one counter per probe
#define PROBE_FLAGS 1024     // u32 words [probe][src]
#define PROBE_DATA 16384     // bytes: [parity][src][64 x 16 B] (after STATE and FLAGS)
#define PROBE_VECS 64

__device__ __forceinline__ bool probe_expired(unsigned long long deadline) {
    return symm_globaltimer() >= deadline;
}

extern "C" __global__ void symm_probe_empty() { symm_pdl_prologue(); }

// One thread spins for `ns` nanoseconds of %globaltimer: a rank made late on purpose before a
// collective (`symm-bench --skew-us`, NOTE [host-abort-poll]).
extern "C" __global__ void symm_probe_spin(unsigned long long ns) {
    symm_pdl_prologue();
    const unsigned long long end = symm_globaltimer() + ns;
    while (symm_globaltimer() < end) {
    }
}

// 1: thread 0 increments this probe's counter (local global memory).
extern "C" __global__ void symm_probe_local(unsigned long long own) {
    symm_pdl_prologue();
    if (threadIdx.x == 0) {
        unsigned int* st = reinterpret_cast<unsigned int*>(own) + PROBE_STATE + 1;
        *st = *st + 1u;
    }
}

// 2: one remote store (volatile), no wait.
extern "C" __global__ void symm_probe_put(unsigned long long own, unsigned long long peer, unsigned int rank) {
    symm_pdl_prologue();
    if (threadIdx.x == 0) {
        unsigned int* st = reinterpret_cast<unsigned int*>(own) + PROBE_STATE + 2;
        const unsigned int e = *st + 1u;
        *st = e;
        volatile unsigned int* f = reinterpret_cast<volatile unsigned int*>(peer) + PROBE_FLAGS + 2 * 64 + rank;
        *f = e;
    }
}

// 3 (relaxed: volatile store / volatile poll) and 4 (st.release.sys / ld.acquire.sys): ping-pong
// of one flag with the peer.
extern "C" __global__ void symm_probe_flag(unsigned long long own, unsigned long long peer, unsigned int rank,
                                           unsigned int peer_rank, unsigned int release,
                                           unsigned long long timeout_ns) {
    symm_pdl_prologue();
    if (threadIdx.x != 0) {
        return;
    }
    const unsigned int k = release ? 4u : 3u;
    unsigned int* st = reinterpret_cast<unsigned int*>(own) + PROBE_STATE + k;
    const unsigned int e = *st + 1u;
    *st = e;
    unsigned int* mine = reinterpret_cast<unsigned int*>(own) + PROBE_FLAGS + k * 64 + peer_rank;
    unsigned int* theirs = reinterpret_cast<unsigned int*>(peer) + PROBE_FLAGS + k * 64 + rank;
    const unsigned long long deadline = symm_deadline(timeout_ns);
    if (release) {
        symm_st_release_sys(theirs, e);
        while (!symm_epoch_reached(symm_ld_acquire_sys(mine), e) && !probe_expired(deadline)) {
        }
    } else {
        *reinterpret_cast<volatile unsigned int*>(theirs) = e;
        while (!symm_epoch_reached(symm_ld_volatile(mine), e) && !probe_expired(deadline)) {
        }
    }
}

// 5 / 6: 1 KiB data as flag (64 threads x 16 bytes, every word carries the epoch, two buffers by
// epoch parity), the shape of the Lamport kernel at 1 KiB without its input, state rotation,
// sentinel clearing and reduction. `fence` (6): thread 0 does red.release.gpu on a local word after
// its remote store, as the Lamport kernel counts its blocks.
extern "C" __global__ void symm_probe_data(unsigned long long own, unsigned long long peer, unsigned int rank,
                                           unsigned int peer_rank, unsigned int fence,
                                           unsigned long long timeout_ns) {
    symm_pdl_prologue();
    const unsigned int k = fence ? 6u : 5u;
    unsigned int* st = reinterpret_cast<unsigned int*>(own) + PROBE_STATE + k;
    const unsigned int e = symm_ld_volatile(st) + 1u;
    const unsigned int t = threadIdx.x;
    if (t >= PROBE_VECS) {
        return;
    }
    const unsigned long long par = (unsigned long long)(e & 1u) * 8 * PROBE_VECS * 16;
    uint4* theirs = reinterpret_cast<uint4*>(peer + PROBE_DATA + par + (unsigned long long)rank * PROBE_VECS * 16);
    const uint4* mine = reinterpret_cast<const uint4*>(own + PROBE_DATA + par + (unsigned long long)peer_rank * PROBE_VECS * 16);
    const uint4 v = make_uint4(e, e ^ 1u, e ^ 2u, e ^ 3u);
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(theirs + t), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
    if (fence && t == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(st + 32), "r"(1u) : "memory");
    }
    const unsigned long long deadline = symm_deadline(timeout_ns);
    while (true) {
        uint4 got;
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(got.x), "=r"(got.y), "=r"(got.z), "=r"(got.w)
                     : "l"(mine + t)
                     : "memory");
        if ((got.x == e && got.w == (e ^ 3u)) || probe_expired(deadline)) {
            break;
        }
    }
    __syncthreads();
    if (t == 0) {
        *st = e;
    }
}

// Bandwidth probe: dst[v] = src[v] for `nvec` 16-byte vectors, grid-stride, PROBE_COPY_U vectors
// per thread in flight (loads first, then stores: the fused pull's shape). dst or src may be a
// peer's memory: a remote write (push) or a remote read (pull). No epochs and no waits: the host
// times the copies (symm-bench --probe-bw).
#define PROBE_COPY_U 4
extern "C" __global__ void __launch_bounds__(512, 1)
    symm_probe_copy(uint4* dst, const uint4* src, unsigned long long nvec) {
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long nth = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long v = tid;
    for (; v + (PROBE_COPY_U - 1) * nth < nvec; v += PROBE_COPY_U * nth) {
        uint4 x[PROBE_COPY_U];
#pragma unroll
        for (int u = 0; u < PROBE_COPY_U; ++u) {
            x[u] = src[v + u * nth];
        }
#pragma unroll
        for (int u = 0; u < PROBE_COPY_U; ++u) {
            dst[v + u * nth] = x[u];
        }
    }
    for (; v < nvec; v += nth) {
        dst[v] = src[v];
    }
}
