// tp-layer: the decoder layer's own kernels (everything but the GEMMs and the collectives).
// Compiled by NVRTC at run time (gpu.rs), no headers: bf16 is stored as unsigned short and
// all arithmetic is f32. Plain and correct first; no kernel here synchronises with the host.
//
// Layouts (row-major, one rank's shard):
//   qkv   [tokens][(q_heads + 2 kv_heads) * HD]   the QKV GEMM's output: q heads, k heads, v heads
//   cache [kv_heads][lmax][HD]                     keys (after rotary) and values by position
//   attn  [tokens][q_heads * HD]                   the O projection's input
//   gu    [tokens][2 * inter]                      gate then up

typedef unsigned short bf16;

#define HD 128      // head dim (model.rs HEAD_DIM)
#define CHUNK 64    // keys per attention block (gpu.rs CHUNK)
#define GMAX 8      // largest GQA group (query heads per KV head)
#define TP_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf(bf16 h) { return __uint_as_float(((unsigned int)h) << 16); }

__device__ __forceinline__ bf16 tobf(float f) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

__device__ __forceinline__ unsigned long long tp_splitmix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// NOTE [tp-uniform] (model.rs): uniform in [-1, 1) on a grid of 2^-23, exact in f32.
__device__ __forceinline__ float tp_uniform(unsigned long long seed, unsigned long long i) {
    unsigned long long z = tp_splitmix(seed + (i + 1ull) * 0x9E3779B97F4A7C15ull);
    return __fsub_rn(__fmul_rn((float)(z >> 40), 1.0f / 8388608.0f), 1.0f);
}

// out[r][c] = bf16(offset + scale * uniform(seed, (global_row + r) * global_cols + global_col + c))
// for a rows x cols segment: one rounding per operation, as model.rs::Tensor::value.
extern "C" __global__ void tp_init(bf16* out, unsigned long long rows, unsigned int cols,
                                   unsigned long long global_row, unsigned long long global_col,
                                   unsigned long long global_cols, unsigned long long seed,
                                   float scale, float offset) {
    const unsigned long long n = rows * cols;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const unsigned long long r = i / cols, c = i % cols;
        const unsigned long long g = (global_row + r) * global_cols + global_col + c;
        out[i] = tobf(__fadd_rn(offset, __fmul_rn(scale, tp_uniform(seed, g))));
    }
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float tp_block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) part[w] = v;
    __syncthreads();
    float s = 0.0f;
    for (unsigned i = 0; i < blockDim.x / 32; ++i) s += part[i];
    __syncthreads();
    return s;
}

// The 8 bf16 of a 16-byte vector, widened.
__device__ __forceinline__ void tp_unpack8(const uint4 v, float (&f)[8]) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

__device__ __forceinline__ uint4 tp_pack8(const float (&f)[8]) {
    unsigned int w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = (unsigned int)tobf(f[2 * i]) | ((unsigned int)tobf(f[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

#define NORM_MAXV 4  // 16-byte vectors per thread: hidden up to 4 * 1024 * 8

// One block per row of `hidden` (a multiple of 8, at most 32768), one 16-byte vector per
// thread and pass: y = x (+ res); res_out = bf16(y) when given; normed = bf16(y' * rsqrt(mean(y'^2)
// + eps) * w) with y' = bf16(y), the rounding of symm's epilogue (NOTE [fused-epilogue]). res and
// res_out may be null (the input norm). The row stays in registers between the two passes.
extern "C" __global__ void __launch_bounds__(1024)
    tp_add_rms_norm(const bf16* x, const bf16* res, bf16* res_out, const bf16* w, bf16* normed,
                    unsigned int hidden, float eps) {
    const size_t base = (size_t)blockIdx.x * hidden;
    const unsigned nv = hidden / 8;
    float y[NORM_MAXV][8];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NORM_MAXV; ++k) {
        const unsigned v = threadIdx.x + k * blockDim.x;
        if (v < nv) {
            float r[8];
            tp_unpack8(*reinterpret_cast<const uint4*>(x + base + (size_t)v * 8), y[k]);
            if (res) {
                tp_unpack8(*reinterpret_cast<const uint4*>(res + base + (size_t)v * 8), r);
#pragma unroll
                for (int i = 0; i < 8; ++i) y[k][i] += r[i];
            }
            const uint4 yb = tp_pack8(y[k]);
            if (res_out) *reinterpret_cast<uint4*>(res_out + base + (size_t)v * 8) = yb;
            tp_unpack8(yb, y[k]);
#pragma unroll
            for (int i = 0; i < 8; ++i) ss += y[k][i] * y[k][i];
        }
    }
    const float inv = rsqrtf(tp_block_sum(ss) / (float)hidden + eps);
#pragma unroll
    for (int k = 0; k < NORM_MAXV; ++k) {
        const unsigned v = threadIdx.x + k * blockDim.x;
        if (v < nv) {
            float g[8];
            tp_unpack8(*reinterpret_cast<const uint4*>(w + (size_t)v * 8), g);
#pragma unroll
            for (int i = 0; i < 8; ++i) y[k][i] = y[k][i] * inv * g[i];
            *reinterpret_cast<uint4*>(normed + base + (size_t)v * 8) = tp_pack8(y[k]);
        }
    }
}

// Grid (tokens, q_heads + kv_heads), HD/2 threads: rotary embedding (Llama's rotate_half pairs,
// frequency theta^(-2i/HD)) of every query and key head of token t at position kv_len + t, in
// place; each key head's rotated key and its value go into the caches at that position.
extern "C" __global__ void tp_rope_kv(bf16* qkv, bf16* kc, bf16* vc, unsigned int q_heads,
                                      unsigned int kv_heads, unsigned int lmax, unsigned int kv_len,
                                      float theta) {
    const unsigned t = blockIdx.x, head = blockIdx.y, i = threadIdx.x;
    const size_t row = (size_t)(q_heads + 2 * kv_heads) * HD;
    bf16* p = qkv + t * row + (size_t)head * HD;
    const unsigned pos = kv_len + t;
    const float freq = powf(theta, -2.0f * (float)i / (float)HD);
    float s, c;
    sincosf((float)pos * freq, &s, &c);
    const float a = bf(p[i]), b = bf(p[i + HD / 2]);
    const bf16 ra = tobf(a * c - b * s), rb = tobf(b * c + a * s);
    p[i] = ra;
    p[i + HD / 2] = rb;
    if (head >= q_heads) {
        const unsigned kvh = head - q_heads;
        const size_t at = ((size_t)kvh * lmax + pos) * HD;
        const bf16* v = qkv + t * row + (size_t)(q_heads + kv_heads + kvh) * HD;
        kc[at + i] = ra;
        kc[at + i + HD / 2] = rb;
        vc[at + i] = v[i];
        vc[at + i + HD / 2] = v[i + HD / 2];
    }
}

// Split-KV decode attention, pass 1. Grid (chunks, kv_heads, tokens), 128 threads: one block
// takes CHUNK keys of one KV head for every query head of its GQA group and one token, which
// attends causally to positions 0..kv_len + t. Writes, per (token, query head, chunk), the
// chunk's score maximum m, its sum of exp(score - m), and sum of exp(score - m) * v.
extern "C" __global__ void __launch_bounds__(128)
    tp_attn_partial(const bf16* qkv, const bf16* kc, const bf16* vc, float* part_o, float* part_ml,
                    unsigned int q_heads, unsigned int kv_heads, unsigned int lmax, unsigned int kv_len,
                    unsigned int nchunk) {
    const unsigned chunk = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const unsigned pos = kv_len + t;
    const unsigned key0 = chunk * CHUNK;
    if (key0 > pos) return;  // uniform across the block
    const unsigned G = q_heads / kv_heads;
    const size_t row = (size_t)(q_heads + 2 * kv_heads) * HD;
    __shared__ float qs[GMAX][HD];
    __shared__ float sc[GMAX][CHUNK];
    const float scale = rsqrtf((float)HD);
    for (unsigned i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const unsigned g = i / HD, d = i % HD;
        qs[g][d] = bf(qkv[t * row + (size_t)(kvh * G + g) * HD + d]) * scale;
    }
    __syncthreads();
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (unsigned j = warp; j < CHUNK; j += 4) {
        const unsigned key = key0 + j;
        const bool valid = key <= pos;
        float k[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (valid) {
            const uint2 raw = *reinterpret_cast<const uint2*>(kc + ((size_t)kvh * lmax + key) * HD + lane * 4);
            k[0] = __uint_as_float(raw.x << 16);
            k[1] = __uint_as_float(raw.x & 0xFFFF0000u);
            k[2] = __uint_as_float(raw.y << 16);
            k[3] = __uint_as_float(raw.y & 0xFFFF0000u);
        }
        for (unsigned g = 0; g < G; ++g) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) dot += qs[g][lane * 4 + e] * k[e];
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (lane == 0) sc[g][j] = valid ? dot : TP_NEG_INF;
        }
    }
    __syncthreads();
    for (unsigned g = warp; g < G; g += 4) {
        const float a = sc[g][lane], b = sc[g][lane + 32];
        float m = fmaxf(a, b);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float pa = expf(a - m), pb = expf(b - m);  // masked keys: exp(-inf) = 0
        float l = pa + pb;
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        sc[g][lane] = pa;
        sc[g][lane + 32] = pb;
        if (lane == 0) {
            const size_t at = (((size_t)t * q_heads + kvh * G + g) * nchunk + chunk) * 2;
            part_ml[at] = m;
            part_ml[at + 1] = l;
        }
    }
    __syncthreads();
    const unsigned d = threadIdx.x;
    const unsigned nvalid = min((unsigned)CHUNK, pos - key0 + 1);
    float acc[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) acc[g] = 0.0f;
    for (unsigned j = 0; j < nvalid; ++j) {
        const float v = bf(vc[((size_t)kvh * lmax + key0 + j) * HD + d]);
#pragma unroll
        for (unsigned g = 0; g < GMAX; ++g)
            if (g < G) acc[g] += sc[g][j] * v;
    }
#pragma unroll
    for (unsigned g = 0; g < GMAX; ++g)
        if (g < G) part_o[(((size_t)t * q_heads + kvh * G + g) * nchunk + chunk) * HD + d] = acc[g];
}

// Pass 2. Grid (q_heads, tokens), HD threads: merges the chunks token t used into its output.
extern "C" __global__ void tp_attn_combine(const float* part_o, const float* part_ml, bf16* attn,
                                           unsigned int q_heads, unsigned int kv_len, unsigned int nchunk) {
    const unsigned h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    const unsigned nc = (kv_len + t) / CHUNK + 1;
    const size_t base = ((size_t)t * q_heads + h) * nchunk;
    float m = TP_NEG_INF;
    for (unsigned c = 0; c < nc; ++c) m = fmaxf(m, part_ml[(base + c) * 2]);
    float l = 0.0f, o = 0.0f;
    for (unsigned c = 0; c < nc; ++c) {
        const float w = expf(part_ml[(base + c) * 2] - m);
        l += w * part_ml[(base + c) * 2 + 1];
        o += w * part_o[(base + c) * HD + d];
    }
    attn[((size_t)t * q_heads + h) * HD + d] = tobf(o / l);
}

// act[t][i] = bf16(silu(gate) * up), gate = gu[t][i], up = gu[t][inter + i].
extern "C" __global__ void tp_silu_mul(const bf16* gu, bf16* act, unsigned int tokens, unsigned int inter) {
    const size_t n = (size_t)tokens * inter;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const size_t t = i / inter, c = i % inter;
        const float g = bf(gu[t * 2 * inter + c]), u = bf(gu[t * 2 * inter + inter + c]);
        act[i] = tobf(g / (1.0f + expf(-g)) * u);
    }
}
