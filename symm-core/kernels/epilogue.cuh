// symm: all-reduce epilogues (residual add, RMSNorm). Included at the end of
// collectives.cu (symm_core::kernel_source::expand_includes expands the #include), so it uses
// the Lamport primitives there. The launches are planned in symm-core/src/coll/add_rms.rs.
//
// NOTE [fused-epilogue]
// =====================
// Rows: the ops work on [rows, hidden] of element type T with hidden * sizeof(T) a multiple of
// 16 bytes, so a row is `vr` whole 16-byte vectors. One block runs one row at a time (rows
// blockIdx.x, + gridDim.x, ...); thread t holds the row's vectors t, t + blockDim.x, ... (at most
// EPI_MAXV of them, `k`; blockDim.x a multiple of 32, chosen from vr alone: add_rms.rs
// `epilogue_threads`).
// Numerics, the same in every engine (docs/ops.md "Fused epilogues"):
//   a = T(sum over ranks of x)    f32 accumulation in rank order 0..world-1, rounded to T
//   s = T(f32(a) + f32(residual))                                        -> residual_out
//   n = T((f32(s) * rsqrt(ssq(s) / hidden + eps)) * f32(weight))           -> norm_out
// rounded exactly where the unfused sequence (all-reduce, add, RMSNorm of the stored residual)
// rounds. ssq: each thread sums f32(s)^2 over its lanes in vector order (fmaf), then a fixed
// butterfly over each group of 32 lanes (a warp on NVIDIA, half a wave64 on AMD:
// symm_shfl_xor32) and over the groups' sums (every lane ends with the same bits). The
// fused kernel and the separate one (epi_row) run the same steps (epi_add_val, epi_ssq_vec in
// vector order, epi_block_sum, epi_norm_val) with the same block size, so they give bitwise the
// same outputs, and every rank does.
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
//   Split rows (few rows, `parts` > 1; add_rms.rs `fused_geometry`): one block per row would
//     leave most SMs idle and push and poll a whole row from one SM (bench-notes round 14), so
//     each row is cut into `parts` blocks of one vector per thread. Each block pushes, receives
//     and adds its part (residual_out), then counts itself in on the row's STATE counter
//     (COLL_ST_EPI_ROWS + row; threadfence before, threadfence after: the CUDA threadfence-
//     reduction pattern); the last one reads the row's residual sums back and runs the RMSNorm
//     as a block of `big` threads would (epi_norm_split), so the bits equal epi_row's. No block
//     waits for another block of its own grid; the counter is reset by the last block.
//   Cluster rows (`flags & EPI_CLUSTER`, sm_90: a launch with clusters of `parts` blocks, one
//     cluster per row, blocks of big / parts threads): the row's block of `big` threads (the
//     separate kernel's) is cut into the cluster's blocks, block c holding that block's threads
//     c * blockDim.x + t with their vectors (t' + m * big); each pushes, receives, adds and sums
//     the squares of its vectors, writes its warps' sums into its shared memory, and after a
//     cluster barrier every block reads all the row's warp sums in warp order through the
//     cluster's shared memory (symm_cluster_ld_f32) and normalises its own vectors. The sums,
//     butterflies and warp order are epi_row's, so the bits are too; no global fence, no
//     counter, no re-read of the row. A second cluster barrier keeps every block's shared memory
//     alive until the others read it. Measured 0.1-1.1 us slower than whole rows at 2 and 4 ranks
//     (bench-notes round 19): off unless SYMM_EPI_CLUSTER=1.
//   Slot rows (`flags & EPI_SLOTS`, SYMM_EPI_SLOTS; add_rms.rs `fused_geometry`): cluster rows'
//     layout (block c of a row's `parts` holds the `big` block's threads c * blockDim.x + t) in an
//     ordinary launch, the warps' sums exchanged through global memory instead of the cluster's
//     shared memory: each warp stores its sum with the op's tag in one 64-bit word of STATE
//     (COLL_ST_EPI_SLOTS + row * big / 32 + its warp in the `big` block), and every warp of the
//     row's blocks polls all the row's words until they carry the tag, then sums them in warp
//     order (epi_block_sum's order, so the bits are epi_row's). No fence and no barrier: a word
//     is valid by its tag alone (a reader needs nothing else another block wrote). Measured no
//     faster than cluster rows (tail 2.8 us at 4 ranks: the wait is for the row's slowest part,
//     not the mechanism) and slower than whole rows (bench-notes round 21): off unless
//     SYMM_EPI_SLOTS is set. The tag is STATE's COLL_ST_EPI_TAG + 1 (never 0, STATE starts zeroed), stored back by
//     the last block to count in; a stale word matches only after 2^32 - 1 slot-rows ops. Every
//     block is resident (one wave) and writes its words whatever its receives did, so a poll
//     waits at most for another block's bounded waits.
//   Spread pushes (`flags & EPI_SPREAD`, `parts` > 1; add_rms.rs `fused_geometry`): whole rows,
//     but a row is pushed by `parts` blocks (block b pushes part b / rows of row b % rows), so the
//     row leaves through `parts` SMs instead of one (one SM's remote stores bound the whole-row
//     push: ~15 GB/s, bench-notes round 20); blocks 0 .. rows - 1 receive their row whole and
//     run the epilogue as whole rows do. No block waits for another: the receivers poll the
//     peers' pushes only, and the others exit after their push (and the block count).
//   Handoff (`flags & EPI_HANDOFF`, SYMM_EPI_HANDOFF; add_rms.rs `Rig::fused_add_rms`): the op as
//     two launches that overlap instead of one kernel. (A) is the plain Lamport all-reduce (any
//     of its entries, unchanged) with its output in this rank's HANDOFF buffer (layout.rs
//     `handoff_off`: one vector per vector of the op, filled with the sentinel at setup and
//     between ops). (B) is this entry with EPI_HANDOFF, launched right behind (A) with PDL, and
//     `input` the HANDOFF base: it does NOT wait for (A) at its start (NOTE [pdl], "handoff"): it
//     loads the first EPI_PRE vectors' residual and weight through L2 (ld.cg), takes each of its
//     vectors from HANDOFF as Lamport data (valid once no lane is the sentinel: (A)'s reduced
//     vectors never hold it, since every term is canonical and the arithmetic's NaN is the
//     canonical one), stores the sentinel back (re-arming the vector for the next op), and runs
//     epi_row over them, so the bits are the separate kernel's. At its end it waits for (A)
//     (symm_pdl_wait) and only then releases the next kernel: (B) completes after (A), so
//     whatever follows on the stream (the next op's Lamport launch reads the op state (A)
//     advanced) sees (A) done, and a rank never has more than two grids in flight. The exchange keeps the
//     all-reduce's own grid, and the epilogue's launch, loads and kernel boundary overlap it.
//     Rows of at most EPI_PRE vectors a thread only (the host checks: a later vector would be
//     read with plain loads); no op state, no counter, no cross-block wait in (B); a take that
//     gives up (timeout, abort, error latched) waits for (A) to end, then leaves the row
//     computed from whatever it held.
//   Preloaded: right after the PDL wait, before the op state, each thread loads the input,
//     residual and weight of the first EPI_PRE vectors of its first unit into registers. Those
//     loads overlap the exchange; the push sends from the registers, and once the peers' data
//     arrived the epilogue reads nothing from memory for them but the block sum's shared words.
//     Without it the fused kernel paid, after the data arrived, the same chain of dependent
//     loads as the separate kernel (residual, then after the block sum the weight; ~0.6-0.8 us a
//     trip on H100), and its push loaded each vector behind the previous vector's remote stores
//     (whose asm "memory" clobber keeps later loads behind them): bench-notes round 20. Vectors
//     past EPI_PRE are loaded at use and, for the norm, read back from residual_out, so a thread
//     holds two vectors in registers, not EPI_MAXV.
//   symm_lamport{W}_add_rms_{dt}, W = 2..8: the same kernel with the world fixed at W (NOTE
//     [lamport-world-entries]'s reason: the peer loops unrolled, a fraction of the registers and
//     code; ptxas for sm_90, git 4bc43a7: no spills at W = 2, 3, 5, 12 bytes at 4, 68-508 at 6-8).
// Aliasing: norm_out may be x and residual_out may be residual (each vector is read and then
// written by one thread; in the handoff pair x is read by the all-reduce and written by the
// epilogue half only after that vector's sum was taken, or after the all-reduce ended);
// no output may overlap anything else, the inputs (x, residual, weight) may overlap each other
// but x and residual (checked on the host, symm_core::coll::epilogue_check).
// A poll that gives up (timeout, abort, a latched error) leaves the row reduced from this rank's
// own input (the handoff half: from whatever its takes held, after waiting for the all-reduce
// to end, so the all-reduce still pushes only the op's own input, NOTE [latched-sends-nothing],
// and no sum lands after its vector was re-armed): the outputs of a failed op are garbage (the
// error reaches the caller, NOTE [error-mirror], and the communicator refuses further ops),
// never a wait without end.

// Most vectors of one row per thread.
#define EPI_MAXV 8
// The first EPI_PRE vectors of a thread's first unit are loaded into registers right after the
// PDL wait, before the op state: the input (pushed, then this rank's term of the sum), the
// residual and the weight. Their loads overlap the exchange, so once the peers' data arrived
// the epilogue reads nothing from memory for them (NOTE [fused-epilogue], "preloaded").
#define EPI_PRE 2
// `flags` bit: compute the RMSNorm (else the residual add alone; weight and norm_out unused).
#define EPI_NORM 1u
// `flags` bit: cluster rows (NOTE [fused-epilogue]); the launch has clusters of `parts` blocks.
#define EPI_CLUSTER 2u
// `flags` bit: spread pushes (NOTE [fused-epilogue]); `parts` blocks push each row.
#define EPI_SPREAD 4u
// `flags` bit: slot rows (NOTE [fused-epilogue]); a row's block cut into `parts` blocks that
// exchange their warps' sums through tagged slots in STATE (COLL_ST_EPI_SLOTS).
#define EPI_SLOTS 8u
// `flags` bit: the handoff pair's epilogue half (NOTE [fused-epilogue], "handoff"); `input` is
// this rank's HANDOFF buffer.
#define EPI_HANDOFF 16u

// The tag of the next op's slot words after `t` (never 0: STATE starts zeroed).
__device__ __forceinline__ unsigned int epi_next_tag(unsigned int t) {
    return t + 1u == 0u ? 1u : t + 1u;
}

// Publishes one warp's sum of squares in its slot: tag in the high word, the float's bits in the
// low word, one 64-bit store (single-copy atomic), so a reader sees the old word or this one.
__device__ __forceinline__ void epi_slot_put(unsigned long long* s, unsigned int tag, float v) {
    *reinterpret_cast<volatile unsigned long long*>(s) =
        ((unsigned long long)tag << 32) | (unsigned long long)__float_as_uint(v);
}

// Polls a slot until it carries `tag`; false when the wait gave up (timeout, abort, an error
// latched: coll_poll_gives_up).
__device__ __forceinline__ bool epi_slot_get(const unsigned long long* s, unsigned int tag, CollWait& w,
                                             unsigned long long& deadline, float& out) {
    unsigned int polls = 0;
    while (true) {
        const unsigned long long x = *reinterpret_cast<const volatile unsigned long long*>(s);
        if ((unsigned int)(x >> 32) == tag) {
            out = __uint_as_float((unsigned int)x);
            return true;
        }
        if (!coll_poll_again(polls, deadline, w)) {
            return false;
        }
    }
}

// The block's sum of v (blockDim.x a multiple of 32, at most 1024): every thread gets the same
// bits. `red` holds 32 floats; the leading barrier lets a block reuse it row after row.
__device__ __forceinline__ float epi_block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += symm_shfl_xor32(v, o);
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
        t += symm_shfl_xor32(t, o);
    }
    return t;
}

// s = T(f32(a) + f32(r)) for the residual's vector r, stored into res_out[j]; returns s.
template <int DT>
__device__ __forceinline__ uint4 epi_add_val(uint4 av, uint4 rv, char* res_out, unsigned int j) {
    constexpr int VE = CollT<DT>::VE;
    float a[VE];
    float r[VE];
    coll_unpack<DT>(av, a);
    coll_unpack<DT>(rv, r);
#pragma unroll
    for (int i = 0; i < VE; ++i) {
        a[i] = __fadd_rn(a[i], r[i]);
    }
    const uint4 s = coll_pack<DT>(a);
    *reinterpret_cast<uint4*>(res_out + (unsigned long long)j * 16ull) = s;
    return s;
}

// epi_add_val with the residual's vector j read from `res`.
template <int DT>
__device__ __forceinline__ uint4 epi_add_vec(uint4 av, const char* res, char* res_out, unsigned int j) {
    return epi_add_val<DT>(av, *reinterpret_cast<const uint4*>(res + (unsigned long long)j * 16ull), res_out, j);
}

// ssq + the squares of s's lanes, in lane order (fmaf).
template <int DT>
__device__ __forceinline__ float epi_ssq_vec(uint4 s, float ssq) {
    constexpr int VE = CollT<DT>::VE;
    float a[VE];
    coll_unpack<DT>(s, a);
#pragma unroll
    for (int i = 0; i < VE; ++i) {
        ssq = fmaf(a[i], a[i], ssq);
    }
    return ssq;
}

// norm_out[j] = T((f32(s) * rstd) * f32(g)) for the weight's vector g.
template <int DT>
__device__ __forceinline__ void epi_norm_val(uint4 s, uint4 gv, char* norm_out, unsigned int j, float rstd) {
    constexpr int VE = CollT<DT>::VE;
    float a[VE];
    float g[VE];
    coll_unpack<DT>(s, a);
    coll_unpack<DT>(gv, g);
#pragma unroll
    for (int i = 0; i < VE; ++i) {
        a[i] = __fmul_rn(__fmul_rn(a[i], rstd), g[i]);
    }
    *reinterpret_cast<uint4*>(norm_out + (unsigned long long)j * 16ull) = coll_pack<DT>(a);
}

// epi_norm_val with the weight's vector j read from `weight`.
template <int DT>
__device__ __forceinline__ void epi_norm_vec(uint4 s, const char* weight, char* norm_out, unsigned int j, float rstd) {
    epi_norm_val<DT>(s, *reinterpret_cast<const uint4*>(weight + (unsigned long long)j * 16ull), norm_out, j, rstd);
}

// rsqrt(total / hidden + eps), hidden = vr * VE.
template <int DT>
__device__ __forceinline__ float epi_rstd(float total, unsigned int vr, float eps) {
    return rsqrtf(__fadd_rn(__fdiv_rn(total, (float)(vr * (unsigned int)CollT<DT>::VE)), eps));
}

// One row's epilogue, the one sequence both kernels run (NOTE [fused-epilogue]). This thread's
// vectors of the row are vec_j(m), m < per_thread (>= vr: none); early(m, j) gives the
// all-reduced vector for m < EPI_PRE (m a constant: the loop is unrolled), late(m, j) for the
// others. The residual and weight of the first EPI_PRE vectors are rp / gp when `pre`, else read
// at use; only those vectors stay in registers, later ones are read back from res_out for the
// norm (this thread stored them). block_sum(ssq) sums the row's squares over the row's block
// (every thread gets the same bits); every thread of the row's block calls this (barriers).
template <int DT, class Early, class Late, class VecJ, class BlockSum>
__device__ __forceinline__ void epi_row(Early early, Late late, VecJ vec_j, unsigned int per_thread, unsigned int vr,
                                        const char* res, const char* weight, char* res_out, char* norm_out,
                                        float eps, bool norm, bool pre, const uint4 (&rp)[EPI_PRE],
                                        const uint4 (&gp)[EPI_PRE], BlockSum block_sum) {
    uint4 s[EPI_PRE];
    float ssq = 0.0f;
#pragma unroll
    for (int m = 0; m < EPI_PRE; ++m) {
        const unsigned int j = vec_j((unsigned int)m);
        if (j < vr) {
            const uint4 a = early(m, j);
            s[m] = pre ? epi_add_val<DT>(a, rp[m], res_out, j) : epi_add_vec<DT>(a, res, res_out, j);
            if (norm) {
                ssq = epi_ssq_vec<DT>(s[m], ssq);
            }
        }
    }
    for (unsigned int m = EPI_PRE; m < per_thread; ++m) {
        const unsigned int j = vec_j(m);
        if (j < vr) {
            const uint4 sv = epi_add_vec<DT>(late(m, j), res, res_out, j);
            if (norm) {
                ssq = epi_ssq_vec<DT>(sv, ssq);
            }
        }
    }
    if (!norm) {
        return;
    }
    const float rstd = epi_rstd<DT>(block_sum(ssq), vr, eps);
#pragma unroll
    for (int m = 0; m < EPI_PRE; ++m) {
        const unsigned int j = vec_j((unsigned int)m);
        if (j < vr) {
            if (pre) {
                epi_norm_val<DT>(s[m], gp[m], norm_out, j, rstd);
            } else {
                epi_norm_vec<DT>(s[m], weight, norm_out, j, rstd);
            }
        }
    }
    for (unsigned int m = EPI_PRE; m < per_thread; ++m) {
        const unsigned int j = vec_j(m);
        if (j < vr) {
            const uint4 sv = *reinterpret_cast<const uint4*>(res_out + (unsigned long long)j * 16ull);
            epi_norm_vec<DT>(sv, weight, norm_out, j, rstd);
        }
    }
}

// The RMSNorm of one row whose residual sums are already in `sums` (the row's res_out, stored by
// other blocks of this grid: read through L2), in the layout of a block of T = g * blockDim.x
// threads: thread t stands for the threads t + i * blockDim.x (i < g) of that block, each with
// the vectors (t + i * blockDim.x) + m * T, m < k. Sums, warp butterflies and the warps' sums
// run in the same order as epi_row's with blockDim.x = T, so the bits are the same
// (NOTE [fused-epilogue], "split rows").
template <int DT>
__device__ __forceinline__ void epi_norm_split(const char* sums, const char* weight, char* norm_out,
                                               unsigned int vr, unsigned int k, unsigned int big, float eps,
                                               float* red) {
    const unsigned int g = big / blockDim.x;
    const unsigned int lane = threadIdx.x & 31u;
    __syncthreads();
    for (unsigned int i = 0; i < g; ++i) {
        const unsigned int t = threadIdx.x + i * blockDim.x;
        float ssq = 0.0f;
        for (unsigned int m = 0; m < k; ++m) {
            const unsigned int j = t + m * big;
            if (j < vr) {
                ssq = epi_ssq_vec<DT>(coll_ld_cg_v4(sums + (unsigned long long)j * 16ull), ssq);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            ssq += symm_shfl_xor32(ssq, o);
        }
        if (lane == 0u) {
            red[t >> 5] = ssq;
        }
    }
    __syncthreads();
    float total = lane < (big >> 5) ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        total += symm_shfl_xor32(total, o);
    }
    const float rstd = epi_rstd<DT>(total, vr, eps);
    for (unsigned int i = 0; i < g; ++i) {
        const unsigned int t = threadIdx.x + i * blockDim.x;
        for (unsigned int m = 0; m < k; ++m) {
            const unsigned int j = t + m * big;
            if (j < vr) {
                epi_norm_vec<DT>(coll_ld_cg_v4(sums + (unsigned long long)j * 16ull), weight, norm_out, j, rstd);
            }
        }
    }
}

// The first EPI_PRE vectors of this thread in a row ("preloaded", NOTE [fused-epilogue]): vector
// m is the row's j = vec_j(m) (>= vr: none, left zero), at byte j * 16 of the row at `o`; `load`
// reads the sums (SUMS: at `sum`) and the residual there, and with the norm the weight at j * 16.
// The separate kernel and the fused one load plainly; the handoff half through L2, without the
// sums (it takes them from HANDOFF).
template <bool SUMS, class Load, class VecJ>
__device__ __forceinline__ void epi_preload(Load load, VecJ vec_j, unsigned int vr, const char* sum, const char* res,
                                            unsigned long long o, const char* weight, bool norm,
                                            uint4 (&ap)[EPI_PRE], uint4 (&rp)[EPI_PRE], uint4 (&gp)[EPI_PRE]) {
#pragma unroll
    for (int m = 0; m < EPI_PRE; ++m) {
        ap[m] = make_uint4(0u, 0u, 0u, 0u);
        rp[m] = ap[m];
        gp[m] = ap[m];
        const unsigned int j = vec_j((unsigned int)m);
        if (j < vr) {
            if (SUMS) {
                ap[m] = load(sum + o + (unsigned long long)j * 16ull);
            }
            rp[m] = load(res + o + (unsigned long long)j * 16ull);
            if (norm) {
                gp[m] = load(weight + (unsigned long long)j * 16ull);
            }
        }
    }
}

// Plain 16-byte loads (the preloads after the PDL wait) and L2-only ones (the handoff half's,
// before it), as epi_preload takes them.
struct EpiLdPlain {
    __device__ __forceinline__ uint4 operator()(const char* p) const {
        return *reinterpret_cast<const uint4*>(p);
    }
};
struct EpiLdL2 {
    __device__ __forceinline__ uint4 operator()(const char* p) const {
        return coll_ld_cg_v4(p);
    }
};

// The epilogue over every row of this block, from `sum` (already all-reduced; may be norm_out or
// residual_out, read before they are written: each vector by the thread that writes it). The
// row's block is blockDim.x threads with k vectors each (t + m * blockDim.x); the first EPI_PRE
// vectors' sum, residual and weight are loaded together before the row's sequence starts.
// `red`: the block's 32-float scratch.
template <int DT>
__device__ __forceinline__ void epi_rows(const char* sum, const char* res, const char* weight, char* res_out,
                                         char* norm_out, unsigned long long rows, unsigned int vr, unsigned int k,
                                         float eps, bool norm, float* red) {
    const unsigned long long row_bytes = (unsigned long long)vr * 16ull;
    auto vec_j = [&](unsigned int m) -> unsigned int { return m < k ? threadIdx.x + m * blockDim.x : vr; };
    for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const unsigned long long o = row * row_bytes;
        uint4 ap[EPI_PRE];
        uint4 rp[EPI_PRE];
        uint4 gp[EPI_PRE];
        epi_preload<true>(EpiLdPlain{}, vec_j, vr, sum, res, o, weight, norm, ap, rp, gp);
        epi_row<DT>([&](int m, unsigned int) { return ap[m]; },
                    [&](unsigned int, unsigned int j) {
                        return *reinterpret_cast<const uint4*>(sum + o + (unsigned long long)j * 16ull);
                    },
                    vec_j, k, vr, res + o, weight, res_out + o, norm_out + o, eps, norm, true, rp, gp,
                    [&](float ssq) { return epi_block_sum(ssq, red); });
    }
}

// NOTE [device-trace] records of the epilogue kernels: kind 3 the generic fused entry, 4 a
// world entry (stamps as the Lamport entries': entry, start, thread 0 of block 0 after it pushed
// all of its vectors and cleared its share of the previous op's, after its first vector arrived
// from every peer, exit), 5 the
// separate kernel (entry, start, start, start, exit). `count`: the vectors of the op.
#ifdef COLL_TRACE
// Thread 0's stamps of one block of the handoff half (kind 7); stamp 0 at the block's entry.
#define EPI_TRACE_BLOCK_DECL                                                        \
    unsigned long long epi_tr[5] = {0ull, 0ull, 0ull, 0ull, 0ull};                  \
    if (threadIdx.x == 0u) {                                                        \
        epi_tr[0] = symm_globaltimer();                                             \
    }
#define EPI_TRACE_BLOCK_AT(i, cond)                                                 \
    if (threadIdx.x == 0u && (cond)) {                                              \
        epi_tr[i] = symm_globaltimer();                                             \
    }
#define EPI_TRACE_SEPARATE(NV)                                                      \
    if (blockIdx.x == 0u && threadIdx.x == 0u) {                                    \
        coll_tr[2] = coll_tr[1];                                                    \
        coll_tr[3] = coll_tr[1];                                                    \
        coll_tr[4] = symm_globaltimer();                                            \
        coll_trace_write(5u, 1u, 0u, 0u, (NV), reinterpret_cast<const char*>(res), coll_tr); \
    }
#else
#define EPI_TRACE_SEPARATE(NV)
#define EPI_TRACE_BLOCK_DECL
#define EPI_TRACE_BLOCK_AT(i, cond)
#endif

#define EPI_ARGS                                                                                          \
    const char *sum, const char *res, const char *weight, char *res_out, char *norm_out, unsigned long long rows, \
        unsigned int vr, unsigned int k, float eps, unsigned int flags
#define EPI_ENTRY(NAME, DT)                                                                            \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS) NAME(EPI_ARGS) {                     \
        COLL_TRACE_DECL                                                                                 \
        COLL_TRACE_AT(0, true)                                                                          \
        symm_pdl_prologue();                                                                            \
        COLL_TRACE_AT(1, true)                                                                          \
        __shared__ float red[32];                                                                       \
        epi_rows<DT>(sum, res, weight, res_out, norm_out, rows, vr, k, eps, (flags & EPI_NORM) != 0u, red); \
        EPI_TRACE_SEPARATE(rows * vr)                                                                   \
    }
EPI_ENTRY(symm_add_rms_f32, COLL_F32)
EPI_ENTRY(symm_add_rms_f16, COLL_F16)
EPI_ENTRY(symm_add_rms_bf16, COLL_BF16)


// The handoff pair's epilogue half (NOTE [fused-epilogue], "handoff"): the rows of `hand` (this
// rank's HANDOFF buffer, where the all-reduce launched just before stores the sums), each vector
// taken once it is there and re-armed with the sentinel, run through epi_row. Called first thing
// in the entry: no PDL wait before its loads (NOTE [pdl], "handoff"); the wait, then the
// release of the next kernel, at its end. Needs
// k <= EPI_PRE (the residual and weight of every vector preloaded through L2). Trace kind 6:
// entry, start, thread 0's first vector taken, its row stored, exit (after the wait).
template <int DT>
__device__ __forceinline__ void epi_handoff(char* hand, unsigned long long rows, unsigned int vr, unsigned int k,
                                            const char* res, const char* weight, char* res_out, char* norm_out,
                                            float eps, bool norm, const CollWait& w, unsigned int world,
                                            unsigned int rank, const char* ws) {
    COLL_TRACE_DECL
    COLL_TRACE_AT(0, true)
    COLL_TRACE_AT(1, true)
    __shared__ float red[32];
    const unsigned long long row_bytes = (unsigned long long)vr * 16ull;
    const uint4 sentinel = make_uint4(COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL);
    unsigned long long deadline = 0;
    bool failed = false;
    // Rows of more vectors a thread are the host's error (Rig::fused_add_rms never plans them);
    // clamped, so no vector past the preloaded ones is ever read with a plain load here.
    const unsigned int kp = min(k, (unsigned int)EPI_PRE);
    auto vec_j = [&](unsigned int m) -> unsigned int { return m < kp ? threadIdx.x + m * blockDim.x : vr; };
    // Vector v of the sums once no lane is the sentinel, re-armed for the next op.
    auto take = [&](unsigned long long v) -> uint4 {
        char* p = hand + v * 16ull;
        uint4 a = coll_ld_volatile_v4(p);
        unsigned int polls = 0;
        while (!failed && coll_pending<DT>(a)) {
            if (!coll_poll_again(polls, deadline, w)) {
                // Given up: wait for the all-reduce to end before this thread writes anything,
                // so it never pushes a vector of x the outputs overwrote (norm_out may be x)
                // nor stores a sum after its vector was re-armed (its waits are bounded).
                failed = true;
                symm_pdl_wait();
            }
            a = coll_ld_volatile_v4(p);
        }
        coll_st_v4(p, sentinel);
        COLL_TRACE_AT(2, v == 0ull)
        return a;
    };
    (void)ws;
    (void)world;
    (void)rank;
    // Kind 7, one record a block (trace builds only): entry, its first row's preload issued,
    // the block sum of its last row (every thread took its sums), its last row stored by thread
    // 0, exit after the end wait.
    EPI_TRACE_BLOCK_DECL
    for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const unsigned long long o = row * row_bytes;
        uint4 ap[EPI_PRE];
        uint4 rp[EPI_PRE];
        uint4 gp[EPI_PRE];
        epi_preload<false>(EpiLdL2{}, vec_j, vr, nullptr, res, o, weight, norm, ap, rp, gp);
        EPI_TRACE_BLOCK_AT(1, row == blockIdx.x)
        epi_row<DT>([&](int, unsigned int j) { return take(row * vr + j); },
                    [&](unsigned int, unsigned int j) { return take(row * vr + j); }, vec_j, kp, vr, res + o,
                    weight, res_out + o, norm_out + o, eps, norm, true, rp, gp, [&](float ssq) {
                        const float t = epi_block_sum(ssq, red);
                        EPI_TRACE_BLOCK_AT(2, true)
                        return t;
                    });
        COLL_TRACE_AT(3, row == 0ull && threadIdx.x == 0u)
        EPI_TRACE_BLOCK_AT(3, true)
    }
    // (A) completes before this kernel does, and the next kernel is released only now, so a
    // rank has at most two grids in flight (NOTE [pdl], "handoff"; NOTE [co-residency]).
    symm_pdl_wait();
    symm_pdl_launch_dependents();
#ifdef COLL_TRACE
    if (threadIdx.x == 0u) {
        // One exit stamp for both records (block 0's kind 6 is written first).
        const unsigned long long exit_at = symm_globaltimer();
        if (blockIdx.x == 0u) {
            coll_tr[4] = exit_at;
            coll_trace_write(6u, world, rank, 0u, rows * vr, ws, coll_tr);
        }
        epi_tr[4] = exit_at;
        coll_trace_write(7u, world, rank, 0u, rows * vr, ws, epi_tr);
    }
#endif
}

// The Lamport one-shot all-reduce (sum) of `input` with the epilogue applied row by row.
// parts == 1: blocks of `big` threads take whole rows (rows blockIdx.x, + gridDim.x, ...).
// parts > 1 (rows <= COLL_EPI_SPLIT_MAX_ROWS, rows * parts <= gridDim.x): block u takes part
// u % parts of row u / parts, one vector per thread per pass; the last of a row's blocks to count
// itself in runs the row's RMSNorm in the layout of a `big`-thread block (epi_norm_split).
// W: the world size of the specialised entries symm_lamport{W}_add_rms_{dt}, 0 generic.
template <int DT, int W>
__device__ __forceinline__ void coll_lamport_epi(const CollWs8 wsv, unsigned int* pad, unsigned int rank,
                                                 unsigned int world_arg, const char* input, unsigned long long rows,
                                                 unsigned int vr, unsigned int k, unsigned int parts,
                                                 unsigned int big, unsigned long long lam_off,
                                                 unsigned long long slot_bytes, unsigned long long timeout_ns,
                                                 const unsigned int* abort_host, unsigned long long hdr_off,
                                                 const uint4 hdr, const char* res, const char* weight, char* res_out,
                                                 char* norm_out, float eps, bool norm, bool clustered,
                                                 bool spread, bool slots, bool handoff) {
    constexpr int NP = W > 0 ? W - 1 : COLL_MAXW - 1;
    const unsigned int world = W > 0 ? (unsigned int)W : world_arg;
    if (handoff) {
        CollWait hw;
        hw.pad = pad;
        hw.abort_host = abort_host;
        hw.timeout_ns = timeout_ns;
        hw.host_every_thread = 0u;
        epi_handoff<DT>(const_cast<char*>(input), rows, vr, k, res, weight, res_out, norm_out, eps, norm, hw, world,
                        rank, reinterpret_cast<const char*>(coll_ws(wsv, rank)));
        return;
    }
    COLL_TRACE_DECL
    COLL_TRACE_AT(0, true)
    symm_pdl_prologue();
    COLL_TRACE_AT(1, true)
    __shared__ float red[32];
    __shared__ unsigned int last_of_row;
    const unsigned long long row_bytes = (unsigned long long)vr * 16ull;
    if (world == 1u) {
        // Nothing to exchange: the sum is the input.
        epi_rows<DT>(input, res, weight, res_out, norm_out, rows, vr, k, eps, norm, red);
        return;
    }
    // Cluster rows and slot rows: the row's block of `big` threads cut into `parts` blocks.
    slots = slots && !clustered && parts > 1u;
    const bool rowblock = clustered || slots;
    // Spread pushes: `parts` blocks push a row, the first of them (blocks 0 .. rows - 1) receives
    // it as a whole row.
    spread = spread && parts > 1u && !rowblock;
    const bool parted = parts > 1u && !spread;
    const bool split = parted && !rowblock;
    // Units (what a block receives): a whole row, or one (row, part) pair of a split or cluster
    // row.
    const unsigned long long units = parted ? rows * parts : rows;
    const unsigned int part_vectors = split ? (vr + parts - 1u) / parts : vr;
    // Vectors a thread holds in one unit (m = 0 .. per_thread - 1).
    const unsigned int per_thread = split ? (part_vectors + blockDim.x - 1u) / blockDim.x : k;
    // The row of unit u, and the index in that row of this thread's vector m (>= vr: none).
    auto row_of = [&](unsigned long long u) -> unsigned long long { return parted ? u / parts : u; };
    auto vec_j = [&](unsigned long long u, unsigned int m) -> unsigned int {
        if (rowblock) {
            return m < k ? (unsigned int)(u % parts) * blockDim.x + threadIdx.x + m * big : vr;
        }
        if (split) {
            const unsigned int lo = (unsigned int)(u % parts) * part_vectors;
            const unsigned int j = lo + threadIdx.x + m * blockDim.x;
            return j < min(vr, lo + part_vectors) ? j : vr;
        }
        return m < k ? threadIdx.x + m * blockDim.x : vr;
    };

    // Preload (EPI_PRE above): the first unit's first vectors. Split rows normalise in the
    // row's last block, which reads the weight itself (prefetched into L2 below).
    const unsigned long long u0 = blockIdx.x;
    uint4 xp[EPI_PRE];
    uint4 rp[EPI_PRE];
    uint4 gp[EPI_PRE];
#pragma unroll
    for (int m = 0; m < EPI_PRE; ++m) {
        xp[m] = make_uint4(0u, 0u, 0u, 0u);
        rp[m] = xp[m];
        gp[m] = xp[m];
        const unsigned int j = u0 < units ? vec_j(u0, (unsigned int)m) : vr;
        if (j < vr) {
            const unsigned long long o = row_of(u0) * row_bytes + (unsigned long long)j * 16ull;
            xp[m] = *reinterpret_cast<const uint4*>(input + o);
            rp[m] = *reinterpret_cast<const uint4*>(res + o);
            if (norm && !split) {
                gp[m] = *reinterpret_cast<const uint4*>(weight + (unsigned long long)j * 16ull);
            }
        }
    }
    // The rest of the first unit's epilogue inputs into L1 (the split rows' weight into L2 for the
    // row's last block): after the polls they are cache hits instead of DRAM round trips (a
    // polling load's "memory" clobber keeps the compiler from hoisting the loads themselves).
    if (u0 < units) {
        for (unsigned int m = 0; m < per_thread; ++m) {
            const unsigned int j = vec_j(u0, m);
            if (j >= vr) {
                continue;
            }
            if (m >= EPI_PRE) {
                coll_prefetch_l1(res + row_of(u0) * row_bytes + (unsigned long long)j * 16ull);
                if (norm && !split) {
                    coll_prefetch_l1(weight + (unsigned long long)j * 16ull);
                }
            }
            if (norm && split) {
                coll_prefetch_l2(weight + (unsigned long long)j * 16ull);
            }
        }
    }

    char* ws = reinterpret_cast<char*>(coll_ws(wsv, rank));
    unsigned int* st = reinterpret_cast<unsigned int*>(ws);
    const unsigned int w1 = world - 1u;
    const unsigned long long buf_bytes = (unsigned long long)w1 * slot_bytes;
    const unsigned long long nv = rows * vr;
    const unsigned int idx = symm_ld_volatile(st + COLL_ST_LAM_IDX) % 3u;
    const unsigned long long prev = symm_ld_volatile(st + COLL_ST_LAM_USED);
    // Slot rows: this op's tag (the last block to count in stores it for the next op).
    const unsigned int tag = slots ? epi_next_tag(symm_ld_volatile(st + COLL_ST_EPI_TAG)) : 0u;
    char* const cb = ws + lam_off + ((idx + 2u) % 3u) * buf_bytes;
    const char* const mine = ws + lam_off + idx * buf_bytes;
    const uint4 sentinel = make_uint4(COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL, COLL_SENTINEL);
    CollWait w;
    w.pad = pad;
    w.abort_host = abort_host;
    w.timeout_ns = timeout_ns;
    w.host_every_thread = 0u;

    // This rank's vector m of unit u: preloaded, or loaded now.
    auto own_vec = [&](unsigned long long u, int m, unsigned int j) -> uint4 {
        if (u == u0 && m < EPI_PRE) {
            return xp[m];
        }
        return *reinterpret_cast<const uint4*>(input + row_of(u) * row_bytes + (unsigned long long)j * 16ull);
    };
    // Vector v (= row * vr + j) with value x: push it (vector 0 with the op header) into every
    // peer's buffer and clear the previous op's vector at the same place.
    auto push = [&](unsigned long long v, uint4 xv) {
        if (v == 0ull) {
            coll_lam_push_header(wsv, ws, rank, world, idx, hdr_off, hdr);
        }
        const uint4 x = coll_canon<DT>(xv);
        for (unsigned int l = 0; l < w1; ++l) {
            const unsigned int p = (rank + 1u + l) % world;
            const unsigned int jr = world - 2u - l;
            coll_st_v4(reinterpret_cast<char*>(coll_ws(wsv, p)) + lam_off + idx * buf_bytes + jr * slot_bytes + v * 16ull,
                       x);
        }
        if (v < prev) {
            for (unsigned int jj = 0; jj < w1; ++jj) {
                coll_st_v4(cb + jj * slot_bytes + v * 16ull, sentinel);
            }
        }
    };
    // The all-reduced vector v, this rank's term `ownv` (the term alone where a wait gave up).
    unsigned long long deadline = 0;
    bool failed = false;
    auto receive = [&](unsigned long long v, uint4 ownv) -> uint4 {
        const uint4 own = coll_canon<DT>(ownv);
        uint4 pv[COLL_MAXW - 1];
        if (!failed) {
            failed = !coll_lam_poll<DT, NP>(pv, mine, slot_bytes, v, ws + hdr_off, idx, hdr, rank, world, w, st,
                                            deadline);
        }
        COLL_TRACE_AT(3, v == 0ull)
        return failed ? own : coll_reduce_ranks<DT, COLL_SUM>(own, pv, (int)rank, (int)world);
    };

    // Phase 1: push every vector of this block's units; spread pushes: block b pushes part
    // b / rows (ceil(vr / parts) vectors) of row b % rows.
    if (spread) {
        const unsigned int pv = (vr + parts - 1u) / parts;
        for (unsigned long long b = blockIdx.x; b < rows * parts; b += gridDim.x) {
            const unsigned long long row = b % rows;
            const unsigned int lo = (unsigned int)(b / rows) * pv;
            const unsigned int hi = min(vr, lo + pv);
            for (unsigned int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
                // Vector 0 of this thread in the row it receives is preloaded.
                const bool pre0 = b == u0 && j == threadIdx.x;
                push(row * vr + j, pre0 ? xp[0] : *reinterpret_cast<const uint4*>(input + (row * vr + j) * 16ull));
            }
        }
    }
    for (unsigned long long u = blockIdx.x; u < units && !spread; u += gridDim.x) {
        const unsigned long long vb = row_of(u) * vr;
#pragma unroll
        for (int m = 0; m < EPI_PRE; ++m) {
            const unsigned int j = vec_j(u, (unsigned int)m);
            if (j < vr) {
                push(vb + j, own_vec(u, m, j));
            }
        }
        for (unsigned int m = EPI_PRE; m < per_thread; ++m) {
            const unsigned int j = vec_j(u, m);
            if (j < vr) {
                push(vb + j, own_vec(u, EPI_PRE, j));
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
    COLL_TRACE_AT(2, blockIdx.x == 0u && threadIdx.x == 0u)
    // Every thread of the block has read the op state: count the block in; the last advances it
    // (as symm_lamport_*; one block advances it at its end).
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x > 1u) {
        if (atomicAdd(st + COLL_ST_LAM_ARRIVE, 1u) == gridDim.x - 1u) {
            st[COLL_ST_LAM_ARRIVE] = 0u;
            st[COLL_ST_LAM_USED] = (unsigned int)nv;
            st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
            if (slots) {
                st[COLL_ST_EPI_TAG] = tag;
            }
        }
    }

    // Phase 2: receive and reduce; whole rows and cluster rows finish here, split rows in their
    // last block.
    for (unsigned long long u = blockIdx.x; u < units; u += gridDim.x) {
        const unsigned long long row = row_of(u);
        const unsigned long long o = row * row_bytes;
        const bool pre = u == u0;
        if (!split) {
            // Whole rows and cluster rows: the separate kernel's sequence (epi_row) over this
            // thread's vectors of the row, each received as it is needed. Cluster rows sum the
            // squares over the row's `big`-thread block with its warps spread over the cluster
            // (epi_block_sum's order, the warps' sums read through the cluster's shared memory).
            auto block_sum = [&](float ssq) -> float {
                if (slots) {
                    // Each warp publishes its sum in the row's slot of its warp in the `big`
                    // block; every warp then reads all of them in warp order (epi_block_sum's
                    // order, so the bits are epi_row's). No fence: a slot carries its op's tag.
#pragma unroll
                    for (int of = 16; of > 0; of >>= 1) {
                        ssq += symm_shfl_xor32(ssq, of);
                    }
                    const unsigned int lane = threadIdx.x & 31u;
                    unsigned long long* sl = reinterpret_cast<unsigned long long*>(st + COLL_ST_EPI_SLOTS) +
                                             row * (unsigned long long)(big >> 5);
                    if (lane == 0u) {
                        epi_slot_put(sl + (u % parts) * (blockDim.x >> 5) + (threadIdx.x >> 5), tag, ssq);
                    }
                    float total = 0.0f;
                    if (lane < (big >> 5) && !failed) {
                        failed = !epi_slot_get(sl + lane, tag, w, deadline, total);
                    }
#pragma unroll
                    for (int of = 16; of > 0; of >>= 1) {
                        total += symm_shfl_xor32(total, of);
                    }
                    return total;
                }
                if (!clustered) {
                    return epi_block_sum(ssq, red);
                }
#pragma unroll
                for (int of = 16; of > 0; of >>= 1) {
                    ssq += symm_shfl_xor32(ssq, of);
                }
                const unsigned int lane = threadIdx.x & 31u;
                const unsigned int wpb = blockDim.x >> 5;
                if (lane == 0u) {
                    red[threadIdx.x >> 5] = ssq;
                }
                symm_cluster_sync();
                float total = lane < (big >> 5) ? symm_cluster_ld_f32(&red[lane % wpb], lane / wpb) : 0.0f;
#pragma unroll
                for (int of = 16; of > 0; of >>= 1) {
                    total += symm_shfl_xor32(total, of);
                }
                return total;
            };
            epi_row<DT>([&](int m, unsigned int j) { return receive(row * vr + j, own_vec(u, m, j)); },
                        [&](unsigned int, unsigned int j) { return receive(row * vr + j, own_vec(u, EPI_PRE, j)); },
                        [&](unsigned int m) { return vec_j(u, m); }, per_thread, vr, res + o, weight, res_out + o,
                        norm_out + o, eps, norm, pre, rp, gp, block_sum);
            if (clustered && norm) {
                // Every block of the cluster keeps its shared memory until the others read it.
                symm_cluster_sync();
            }
            continue;
        }
#pragma unroll
        for (int m = 0; m < EPI_PRE; ++m) {
            const unsigned int j = vec_j(u, (unsigned int)m);
            if (j < vr) {
                const uint4 a = receive(row * vr + j, own_vec(u, m, j));
                if (pre) {
                    epi_add_val<DT>(a, rp[m], res_out + o, j);
                } else {
                    epi_add_vec<DT>(a, res + o, res_out + o, j);
                }
            }
        }
        for (unsigned int m = EPI_PRE; m < per_thread; ++m) {
            const unsigned int j = vec_j(u, m);
            if (j < vr) {
                epi_add_vec<DT>(receive(row * vr + j, own_vec(u, EPI_PRE, j)), res + o, res_out + o, j);
            }
        }
        if (!norm) {
            continue;
        }
        // The row's residual sums are stored by `parts` blocks: the last to count itself in
        // (threadfence, then the counter; the counter, then threadfence) reads them all.
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            unsigned int* cnt = st + COLL_ST_EPI_ROWS + row;
            const unsigned int before = atomicAdd(cnt, 1u);
            last_of_row = before == parts - 1u ? 1u : 0u;
            if (last_of_row != 0u) {
                *cnt = 0u;
                __threadfence();
            }
        }
        __syncthreads();
        if (last_of_row != 0u) {
            epi_norm_split<DT>(res_out + o, weight, norm_out + o, vr, k, big, eps, red);
        }
    }
    if (gridDim.x == 1u && threadIdx.x == 0) {
        st[COLL_ST_LAM_USED] = (unsigned int)nv;
        st[COLL_ST_LAM_IDX] = (idx + 1u) % 3u;
    }
#ifdef COLL_TRACE
    if (blockIdx.x == 0u && threadIdx.x == 0u) {
        coll_tr[4] = symm_globaltimer();
        coll_trace_write(W > 0 ? 4u : 3u, world, rank, 0u, nv, ws, coll_tr);
    }
#endif
}

#define COLL_LAMPORT_EPI_ARGS                                                                                 \
    unsigned long long ws0, unsigned long long ws1, unsigned long long ws2, unsigned long long ws3,             \
        unsigned long long ws4, unsigned long long ws5, unsigned long long ws6, unsigned long long ws7,         \
        unsigned long long pad_ptr, unsigned int rank, unsigned int world, const char *input,                  \
        unsigned long long rows, unsigned int vr, unsigned int k, unsigned int parts, unsigned int big,         \
        unsigned long long lam_off, unsigned long long slot_bytes, unsigned long long timeout_ns,               \
        const unsigned int *abort_host, unsigned long long hdr_off, unsigned long long oph0,                   \
        unsigned long long oph1, const char *res, const char *weight, char *res_out, char *norm_out, float eps, \
        unsigned int flags
// W: 0 for the generic entries symm_lamport_add_rms_{dt}, else the world size of
// symm_lamport{W}_add_rms_{dt} (the same arguments; `world` ignored).
#define COLL_LAMPORT_EPI_ENTRY(NAME, DT, W)                                                                     \
    extern "C" __global__ void __launch_bounds__(COLL_MAX_THREADS, 1) NAME(COLL_LAMPORT_EPI_ARGS) {               \
        const CollWs8 wsv = {ws0, ws1, ws2, ws3, ws4, ws5, ws6, ws7};                                             \
        coll_lamport_epi<DT, W>(wsv, reinterpret_cast<unsigned int*>(pad_ptr), rank, world, input, rows, vr, k,  \
                                parts, big, lam_off, slot_bytes, timeout_ns, abort_host, hdr_off,                \
                                make_uint4((unsigned int)oph0, (unsigned int)(oph0 >> 32), (unsigned int)oph1,    \
                                           (unsigned int)(oph1 >> 32)),                                          \
                                res, weight, res_out, norm_out, eps, (flags & EPI_NORM) != 0u,                   \
                                (flags & EPI_CLUSTER) != 0u, (flags & EPI_SPREAD) != 0u,                          \
                                (flags & EPI_SLOTS) != 0u, (flags & EPI_HANDOFF) != 0u);                           \
    }
COLL_LAMPORT_EPI_ENTRY(symm_lamport_add_rms_f32, COLL_F32, 0)
COLL_LAMPORT_EPI_ENTRY(symm_lamport_add_rms_f16, COLL_F16, 0)
COLL_LAMPORT_EPI_ENTRY(symm_lamport_add_rms_bf16, COLL_BF16, 0)
// The entries specialised for one world size W = 2..8 (NOTE [lamport-world-entries]'s reason:
// the peer loops unrolled to W - 1, a fraction of the generic entry's registers and code).
#define COLL_LAMPORT_EPI_WORLD(W)                                           \
    COLL_LAMPORT_EPI_ENTRY(symm_lamport##W##_add_rms_f32, COLL_F32, W)     \
    COLL_LAMPORT_EPI_ENTRY(symm_lamport##W##_add_rms_f16, COLL_F16, W)     \
    COLL_LAMPORT_EPI_ENTRY(symm_lamport##W##_add_rms_bf16, COLL_BF16, W)
COLL_LAMPORT_EPI_WORLD(2)
COLL_LAMPORT_EPI_WORLD(3)
COLL_LAMPORT_EPI_WORLD(4)
COLL_LAMPORT_EPI_WORLD(5)
COLL_LAMPORT_EPI_WORLD(6)
COLL_LAMPORT_EPI_WORLD(7)
COLL_LAMPORT_EPI_WORLD(8)
