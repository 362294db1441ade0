//! The layer's device calls: its NVRTC kernels (`kernels.cu`), their launches, and the cuBLAS
//! GEMMs: the example's driver module (the context setup in group.rs is its only other
//! `unsafe`). Each launch checks the lengths of the
//! buffers it is given against the dimensions it is told, so the kernels stay in bounds.

use std::sync::Arc;

use symm_ops::cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use symm_ops::cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use symm_ops::half::bf16;
use symm_ops::symm_cuda::kernels::{self, KernelSource};

use crate::model::{Shape, Shard, HEAD_DIM};
use crate::Res;

/// `kernels.cu`, compiled and cached (on disk and per context) by symm-cuda's kernel cache like
/// symm's own kernels.
pub const SOURCE: KernelSource = KernelSource {
    name: "tp_layer",
    source: include_str!("kernels.cu"),
};
/// Keys per attention block (`CHUNK` in kernels.cu).
pub const CHUNK: usize = 64;

/// NVRTC-compiles `kernels.cu` for `arch` (`sm_90`) into the kernel cache (PTX and the CUBIN a
/// load uses); returns their bytes.
pub fn compile(arch: &str) -> Res<usize> {
    Ok(kernels::compile_for_load(&SOURCE, "", arch)?)
}

/// The kernels loaded into one context.
pub struct Kernels {
    _module: Arc<CudaModule>,
    init: CudaFunction,
    add_rms_norm: CudaFunction,
    rope_kv: CudaFunction,
    attn_partial: CudaFunction,
    attn_combine: CudaFunction,
    silu_mul: CudaFunction,
}

fn check(what: &str, len: usize, want: usize) -> Res {
    if len < want {
        return Err(format!("{what}: a buffer of {len} elements where {want} are needed").into());
    }
    Ok(())
}

fn blocks(n: usize, threads: usize) -> u32 {
    n.div_ceil(threads).clamp(1, 65_535) as u32
}

fn cfg(grid: (u32, u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A device buffer's address. Event tracking is off on the layer's contexts (main.rs), so the
/// guard cudarc returns records nothing.
fn addr<T>(b: &impl DevicePtr<T>, s: &CudaStream) -> u64 {
    b.device_ptr(s).0
}

fn addr_mut<T>(b: &mut impl DevicePtrMut<T>, s: &CudaStream) -> u64 {
    b.device_ptr_mut(s).0
}

impl Kernels {
    /// Loads the kernels into `ctx`, each onto the device now: under CUDA's lazy loading a
    /// first launch loads the function and may wait for the whole device, which on a shared GPU
    /// waits for a peer's spinning collective (NOTE [co-residency]).
    pub fn load(ctx: &Arc<CudaContext>) -> Res<Kernels> {
        let m = kernels::load(ctx, &SOURCE, "")?;
        let f = |n: &str| -> Res<CudaFunction> { Ok(symm_ops::symm_cuda::driver::load_function(&m, n)?) };
        Ok(Kernels {
            init: f("tp_init")?,
            add_rms_norm: f("tp_add_rms_norm")?,
            rope_kv: f("tp_rope_kv")?,
            attn_partial: f("tp_attn_partial")?,
            attn_combine: f("tp_attn_combine")?,
            silu_mul: f("tp_silu_mul")?,
            _module: m,
        })
    }

    /// Fills `dst` with the shard's values (model.rs, NOTE [tp-uniform]).
    pub fn init(
        &self,
        s: &CudaStream,
        dst: &mut impl DevicePtrMut<bf16>,
        shard: &Shard,
        shape: &Shape,
        seed: u64,
    ) -> Res {
        check("init", dst.len(), shard.rows * shard.cols)?;
        if shard
            .segments
            .iter()
            .any(|g| g.local_row + g.rows > shard.rows || g.cols != shard.cols)
        {
            return Err(format!("init: {:?}'s segments do not stack into its shard", shard.tensor).into());
        }
        let (scale, offset) = shard.tensor.dist(shape);
        let tseed = shard.tensor.seed(seed);
        let gcols = shard.tensor.global_cols(shape) as u64;
        let base = addr_mut(dst, s);
        for g in &shard.segments {
            let out = base + (g.local_row * shard.cols * 2) as u64;
            let (rows, cols) = (g.rows as u64, g.cols as u32);
            let (grow, gcol) = (g.global_row as u64, g.global_col as u64);
            // SAFETY: the segment's rows x cols elements lie inside `dst` (checked above: the
            // segments stack within the shard's rows); the kernel writes only those.
            unsafe {
                s.launch_builder(&self.init)
                    .arg(&out)
                    .arg(&rows)
                    .arg(&cols)
                    .arg(&grow)
                    .arg(&gcol)
                    .arg(&gcols)
                    .arg(&tseed)
                    .arg(&scale)
                    .arg(&offset)
                    .launch(cfg((blocks(g.rows * g.cols, 256).min(4096), 1, 1), 256))?;
            }
        }
        Ok(())
    }

    /// `normed = RMSNorm(x (+ res)) * w` per row of `hidden`; `res_out = x + res` when
    /// `res` is given. `rows` rows.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        s: &CudaStream,
        x: &impl DevicePtr<bf16>,
        res: Option<(&impl DevicePtr<bf16>, &mut impl DevicePtrMut<bf16>)>,
        w: &impl DevicePtr<bf16>,
        normed: &mut impl DevicePtrMut<bf16>,
        rows: usize,
        hidden: usize,
        eps: f32,
    ) -> Res {
        let n = rows * hidden;
        if !hidden.is_multiple_of(8) || hidden > 32_768 {
            return Err(format!("add_rms_norm: hidden {hidden} is not a multiple of 8 up to 32768").into());
        }
        check("add_rms_norm x", x.len(), n)?;
        check("add_rms_norm weight", w.len(), hidden)?;
        check("add_rms_norm out", normed.len(), n)?;
        let (r, ro) = match res {
            Some((r, ro)) => {
                check("add_rms_norm residual", r.len(), n)?;
                check("add_rms_norm residual out", ro.len(), n)?;
                (addr(r, s), addr_mut(ro, s))
            }
            None => (0u64, 0u64),
        };
        let (x, w, out, hidden32) = (addr(x, s), addr(w, s), addr_mut(normed, s), hidden as u32);
        // One 16-byte vector per thread and pass, at most 4 passes (NORM_MAXV in kernels.cu).
        let threads = (hidden / 8).next_multiple_of(32).clamp(32, 1024) as u32;
        if [x, r, ro, w, out].iter().any(|a| a % 16 != 0) {
            return Err("add_rms_norm: a buffer not aligned to 16 bytes".into());
        }
        // SAFETY: every buffer holds rows x hidden elements (the weight `hidden`), checked
        // above; every address is 16-byte aligned and hidden a multiple of 8 (checked), so rows
        // are whole 16-byte vectors; null residuals are skipped by the kernel.
        unsafe {
            s.launch_builder(&self.add_rms_norm)
                .arg(&x)
                .arg(&r)
                .arg(&ro)
                .arg(&w)
                .arg(&out)
                .arg(&hidden32)
                .arg(&eps)
                .launch(cfg((rows as u32, 1, 1), threads))?;
        }
        Ok(())
    }

    /// Rotary embedding of the new tokens' query and key heads in `qkv`, and their keys and
    /// values into the caches (`lmax` positions per head) at `kv_len + t`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv(
        &self,
        s: &CudaStream,
        qkv: &mut impl DevicePtrMut<bf16>,
        kc: &mut impl DevicePtrMut<bf16>,
        vc: &mut impl DevicePtrMut<bf16>,
        (q_heads, kv_heads): (usize, usize),
        tokens: usize,
        (kv_len, lmax): (usize, usize),
        theta: f32,
    ) -> Res {
        check("rope qkv", qkv.len(), tokens * (q_heads + 2 * kv_heads) * HEAD_DIM)?;
        check("rope k cache", kc.len(), kv_heads * lmax * HEAD_DIM)?;
        check("rope v cache", vc.len(), kv_heads * lmax * HEAD_DIM)?;
        if kv_len + tokens > lmax {
            return Err(format!("rope: positions up to {} in a cache of {lmax}", kv_len + tokens).into());
        }
        let (p, k, v) = (addr_mut(qkv, s), addr_mut(kc, s), addr_mut(vc, s));
        let (qh, kvh, lm, kl) = (q_heads as u32, kv_heads as u32, lmax as u32, kv_len as u32);
        // SAFETY: sizes checked above; position kv_len + t < lmax for every token.
        unsafe {
            s.launch_builder(&self.rope_kv)
                .arg(&p)
                .arg(&k)
                .arg(&v)
                .arg(&qh)
                .arg(&kvh)
                .arg(&lm)
                .arg(&kl)
                .arg(&theta)
                .launch(cfg(
                    (tokens as u32, (q_heads + kv_heads) as u32, 1),
                    (HEAD_DIM / 2) as u32,
                ))?;
        }
        Ok(())
    }

    /// Causal attention of the new tokens over the cache (split over chunks of keys, then
    /// merged): `attn[t][head]`. `part_o` / `part_ml` are f32 scratch for `nchunk` chunks.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        s: &CudaStream,
        qkv: &impl DevicePtr<bf16>,
        (kc, vc): (&impl DevicePtr<bf16>, &impl DevicePtr<bf16>),
        (part_o, part_ml): (&mut impl DevicePtrMut<f32>, &mut impl DevicePtrMut<f32>),
        attn: &mut impl DevicePtrMut<bf16>,
        (q_heads, kv_heads): (usize, usize),
        tokens: usize,
        (kv_len, lmax): (usize, usize),
    ) -> Res {
        let nchunk = lmax.div_ceil(CHUNK);
        check("attention qkv", qkv.len(), tokens * (q_heads + 2 * kv_heads) * HEAD_DIM)?;
        check("attention k cache", kc.len(), kv_heads * lmax * HEAD_DIM)?;
        check("attention v cache", vc.len(), kv_heads * lmax * HEAD_DIM)?;
        check(
            "attention partial o",
            part_o.len(),
            tokens * q_heads * nchunk * HEAD_DIM,
        )?;
        check("attention partial m/l", part_ml.len(), tokens * q_heads * nchunk * 2)?;
        check("attention out", attn.len(), tokens * q_heads * HEAD_DIM)?;
        if kv_len + tokens > lmax || q_heads % kv_heads != 0 || q_heads / kv_heads > 8 {
            return Err("attention: positions past the cache, or a GQA group over 8".into());
        }
        let (q, k, v) = (addr(qkv, s), addr(kc, s), addr(vc, s));
        let (po, pml, out) = (addr_mut(part_o, s), addr_mut(part_ml, s), addr_mut(attn, s));
        let (qh, kvh, lm, kl, nc) = (
            q_heads as u32,
            kv_heads as u32,
            lmax as u32,
            kv_len as u32,
            nchunk as u32,
        );
        let used = (kv_len + tokens).div_ceil(CHUNK) as u32;
        // SAFETY: sizes checked above; a block reads keys below kv_len + tokens <= lmax and
        // writes its (token, head, chunk) slot, chunk < nchunk.
        unsafe {
            s.launch_builder(&self.attn_partial)
                .arg(&q)
                .arg(&k)
                .arg(&v)
                .arg(&po)
                .arg(&pml)
                .arg(&qh)
                .arg(&kvh)
                .arg(&lm)
                .arg(&kl)
                .arg(&nc)
                .launch(cfg((used, kv_heads as u32, tokens as u32), 128))?;
            s.launch_builder(&self.attn_combine)
                .arg(&po)
                .arg(&pml)
                .arg(&out)
                .arg(&qh)
                .arg(&kl)
                .arg(&nc)
                .launch(cfg((q_heads as u32, tokens as u32, 1), HEAD_DIM as u32))?;
        }
        Ok(())
    }

    /// `act = silu(gate) * up` for `tokens` rows of `[gate | up]`, `inter` each.
    pub fn silu_mul(
        &self,
        s: &CudaStream,
        gu: &impl DevicePtr<bf16>,
        act: &mut impl DevicePtrMut<bf16>,
        tokens: usize,
        inter: usize,
    ) -> Res {
        check("silu gate/up", gu.len(), tokens * 2 * inter)?;
        check("silu out", act.len(), tokens * inter)?;
        let (g, a, t, i) = (addr(gu, s), addr_mut(act, s), tokens as u32, inter as u32);
        // SAFETY: sizes checked above.
        unsafe {
            s.launch_builder(&self.silu_mul)
                .arg(&g)
                .arg(&a)
                .arg(&t)
                .arg(&i)
                .launch(cfg((blocks(tokens * inter, 256).min(4096), 1, 1), 256))?;
        }
        Ok(())
    }
}

/// Holds cuBLAS's GEMMs on this handle to `sms` SMs. For ranks sharing a GPU: cuBLAS's
/// persistent (stream-K) kernels size their grid to the SMs they may use and have blocks wait
/// for other blocks of the grid, so on a GPU whose other SMs hold peers' spinning collectives
/// (NOTE [co-residency]) an unlimited GEMM waits for blocks that cannot start.
pub fn limit_gemm_sms(blas: &CudaBlas, sms: usize) -> Res {
    let sms = i32::try_from(sms.max(1)).map_err(|_| "SM count out of range")?;
    // SAFETY: a live handle; the call only sets one of its fields.
    unsafe { symm_ops::cudarc::cublas::sys::cublasSetSmCountTarget(*blas.handle(), sms) }.result()?;
    Ok(())
}

/// `y[tokens x n] = x[tokens x k] * w[n x k]^T` (row-major; `w` in PyTorch `Linear` layout), bf16
/// with f32 accumulation.
pub fn linear(
    blas: &CudaBlas,
    x: &impl DevicePtr<bf16>,
    w: &impl DevicePtr<bf16>,
    y: &mut impl DevicePtrMut<bf16>,
    (tokens, n, k): (usize, usize, usize),
) -> Res {
    check("linear x", x.len(), tokens * k)?;
    check("linear w", w.len(), n * k)?;
    check("linear y", y.len(), tokens * n)?;
    // Column-major: y^T (n x tokens) = (w^T)^T (n x k) * x^T (k x tokens).
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: tokens as i32,
        k: k as i32,
        alpha: bf16::ONE,
        lda: k as i32,
        ldb: k as i32,
        beta: bf16::ZERO,
        ldc: n as i32,
    };
    // SAFETY: the three buffers hold at least the elements the configuration names (checked).
    unsafe { blas.gemm(cfg, w, x, y) }?;
    Ok(())
}
