//! The all-reduce epilogue suite (#19, NOTE [fused-epilogue]), written once and run by the host
//! engine (`host_epilogue`) and the CUDA engine (`gpu_epilogue`): activations in symmetric
//! memory (`Communicator::alloc`), fresh pseudo-random inputs per case (a stateless hash of
//! (case, rank, element), so the float64 reference can compute any element of any rank), outputs
//! poisoned with NaN before each run, every algorithm compared bitwise with the planner's pick,
//! the in-place forms with the out-of-place one, the residual-only op with the norm op's
//! residual, and the outputs against the float64 reference within the documented tolerance.
//! (NaN written after an op returns is the GPU suite's `nan_after_return`: on the host engine an
//! op is over when it returns.)
//! Each case returns a hash of its outputs: the caller compares them across ranks (bitwise the
//! same on every rank).

use symm_ops::prelude::*;
use symm_ops::{EpilogueAlgo, RmsNorm};

use super::{hash, poison_value, to_bits};

/// One suite's cases: every (dtype, hidden, tokens) of the lists; `algos`: besides the planner's
/// pick ([`EpilogueAlgo::Auto`], the base), the forced algorithms each case also runs where they
/// apply (`Fused` only up to `fused_max_bytes`).
pub struct Plan {
    pub hiddens: Vec<usize>,
    pub tokens: Vec<usize>,
    pub algos: Vec<EpilogueAlgo>,
    pub fused_max_bytes: usize,
    /// Most rows compared with the float64 reference per case (spread over the rows; every row
    /// is compared bitwise across algorithms, forms and ranks).
    pub ref_rows: usize,
    /// Skip a case whose one buffer exceeds this many bytes.
    pub max_buffer_bytes: usize,
}

pub const EPS: f32 = 1e-5;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A value in [lo, hi) for (case seed, stream, element), rounded to `T`.
fn value<T: Element>(seed: u64, stream: u64, i: usize, lo: f32, hi: f32) -> T {
    let h = mix(seed ^ mix(stream.wrapping_mul(0x1000_0001) ^ mix(i as u64)));
    let u = (h >> 40) as f32 / (1u64 << 24) as f32;
    T::from_f32(lo + (hi - lo) * u)
}

/// Rank r's partial sums.
pub fn x_of<T: Element>(seed: u64, r: usize, i: usize) -> T {
    value(seed, 100 + r as u64, i, -1.0, 1.0)
}
/// The residual (the same on every rank, as in a tensor-parallel layer).
pub fn residual_of<T: Element>(seed: u64, i: usize) -> T {
    value(seed, 1, i, -2.0, 2.0)
}
/// The RMSNorm weight.
pub fn weight_of<T: Element>(seed: u64, i: usize) -> T {
    value(seed, 2, i, 0.5, 1.5)
}

/// Checks `row` of the outputs against the float64 reference: residual_out within
/// `(world + 2) u (sum |x_r| + |residual|)`, norm_out within `|w| rho (tol_s + |s| delta) + 2 u
/// |n|` with `delta` the bound on rstd's relative error that those residual errors imply (plus
/// 2^-21 for rsqrt): docs/ops.md, "Fused epilogues".
#[allow(clippy::too_many_arguments)]
pub fn check_row<T: Element>(
    what: &str,
    seed: u64,
    world: usize,
    hidden: usize,
    row: usize,
    res_out: &[T],
    norm_out: Option<&[T]>,
) -> Result<(), String> {
    let u = T::DTYPE.unit_roundoff();
    let mut s = vec![0f64; hidden];
    let mut tol_s = vec![0f64; hidden];
    for (j, (sj, tj)) in s.iter_mut().zip(&mut tol_s).enumerate() {
        let i = row * hidden + j;
        let mut sum = 0f64;
        let mut mag = 0f64;
        for r in 0..world {
            let v = x_of::<T>(seed, r, i).to_f32() as f64;
            sum += v;
            mag += v.abs();
        }
        let res = residual_of::<T>(seed, i).to_f32() as f64;
        *sj = sum + res;
        *tj = (world as f64 + 2.0) * u * (mag + res.abs()) + 1e-30;
    }
    for j in 0..hidden {
        let got = res_out[row * hidden + j].to_f32() as f64;
        if got.is_nan() || (got - s[j]).abs() > tol_s[j] {
            return Err(format!(
                "{what}: residual_out[{row}, {j}] = {got}, want {} (tolerance {:.3e})",
                s[j], tol_s[j]
            ));
        }
    }
    let Some(norm_out) = norm_out else {
        return Ok(());
    };
    let ms: f64 = s.iter().map(|v| v * v).sum::<f64>() / hidden as f64;
    let rho = 1.0 / (ms + EPS as f64).sqrt();
    // Relative error of mean(s^2) from the residual errors, halved by the square root.
    let d_ms: f64 = s
        .iter()
        .zip(&tol_s)
        .map(|(v, t)| 2.0 * v.abs() * t + t * t)
        .sum::<f64>()
        / hidden as f64;
    let delta = 0.5 * d_ms / (ms + EPS as f64) + 2f64.powi(-21) + 4.0 * u;
    for j in 0..hidden {
        let w = weight_of::<T>(seed, j).to_f32() as f64;
        let want = s[j] * rho * w;
        let tol = w.abs() * rho * (tol_s[j] + s[j].abs() * delta) + 2.0 * u * want.abs() + 1e-30;
        let got = norm_out[row * hidden + j].to_f32() as f64;
        if got.is_nan() || (got - want).abs() > tol {
            return Err(format!(
                "{what}: norm_out[{row}, {j}] = {got}, want {want} (tolerance {tol:.3e})"
            ));
        }
    }
    Ok(())
}

fn poison<T: Element>(n: usize) -> Vec<T> {
    vec![poison_value::<T>(); n]
}

fn bits_equal<T: Element>(what: &str, a: &[T], b: &[T]) -> Result<(), String> {
    if let Some(i) = a.iter().zip(b).position(|(x, y)| to_bits(*x) != to_bits(*y)) {
        return Err(format!(
            "{what}: element {i} differs: {} against {}",
            a[i].to_f32(),
            b[i].to_f32()
        ));
    }
    Ok(())
}

type Res<T = ()> = Result<T, String>;

/// Waits for the ops enqueued so far (CUDA: the communicator's stream). `SymmBuffer`'s host
/// copies run on the memory's own stream, unordered with the ops' stream, so a read after an
/// op waits for it first.
pub fn sync(comm: &Communicator) -> Res {
    #[cfg(feature = "cuda")]
    if let Some(s) = comm.stream() {
        s.synchronize().map_err(|e| format!("synchronising the stream: {e}"))?;
    }
    comm.check_error().map_err(|e| format!("after the op: {e}"))
}

fn e<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |err| format!("{what}: {err}")
}

/// One (dtype, hidden, tokens) case on this rank; returns the hash of its outputs.
pub fn case<T: Element>(comm: &Communicator, plan: &Plan, seed: u64, hidden: usize, tokens: usize) -> Res<u64> {
    let (r, world) = (comm.rank().get(), comm.world_size());
    let n = hidden * tokens;
    let bytes = n * T::DTYPE.size();
    let label = format!("rank {r}/{world} {} hidden {hidden} tokens {tokens}", T::DTYPE);
    let x_h: Vec<T> = (0..n).map(|i| x_of::<T>(seed, r, i)).collect();
    let res_h: Vec<T> = (0..n).map(|i| residual_of::<T>(seed, i)).collect();
    let w_h: Vec<T> = (0..hidden).map(|i| weight_of::<T>(seed, i)).collect();
    let x = comm.alloc::<T>(n).map_err(e(&label))?;
    let res = comm.alloc::<T>(n).map_err(e(&label))?;
    let weight = comm.alloc::<T>(hidden).map_err(e(&label))?;
    let mut norm_out = comm.alloc::<T>(n).map_err(e(&label))?;
    let mut res_out = comm.alloc::<T>(n).map_err(e(&label))?;
    x.copy_from_host(&x_h).map_err(e(&label))?;
    res.copy_from_host(&res_h).map_err(e(&label))?;
    weight.copy_from_host(&w_h).map_err(e(&label))?;

    // The planner's pick, then every forced algorithm that applies: bitwise the same. From three
    // ranks on, NCCL (which the planner may pick) sums in the element type, so its bits may
    // differ from the kernels' (common::Accum): there the kernels are bitwise equal among
    // themselves and every result is checked against the reference.
    let mut base: Option<(Vec<T>, Vec<T>)> = None;
    let mut kernels_base: Option<(Vec<T>, Vec<T>)> = None;
    let auto_may_be_nccl = world > 2
        && [true, false]
            .into_iter()
            .any(|z| comm.all_reduce_pick(bytes, z) == AllReduceAlgo::Nccl);
    let fused_fits = world == 1 || bytes <= plan.fused_max_bytes;
    let mut algos = vec![EpilogueAlgo::Auto];
    algos.extend(plan.algos.iter().copied().filter(|a| match a {
        EpilogueAlgo::Fused | EpilogueAlgo::Separate(AllReduceAlgo::Lamport) => fused_fits,
        _ => true,
    }));
    for algo in algos {
        let what = format!("{label} {algo:?}");
        norm_out.copy_from_host(&poison::<T>(n)).map_err(e(&what))?;
        res_out.copy_from_host(&poison::<T>(n)).map_err(e(&what))?;
        comm.ops()
            .all_reduce_residual_rms_norm_with(algo, &x, &res, RmsNorm::new(&weight, EPS), &mut norm_out, &mut res_out)
            .map_err(e(&what))?;
        sync(comm)?;
        let got = (
            norm_out.to_host().map_err(e(&what))?,
            res_out.to_host().map_err(e(&what))?,
        );
        let check_rows = |got: &(Vec<T>, Vec<T>)| -> Res {
            let step = (tokens / plan.ref_rows.max(1)).max(1);
            let mut rows: Vec<usize> = (0..tokens).step_by(step).collect();
            rows.push(tokens - 1);
            for row in rows {
                check_row(&what, seed, world, hidden, row, &got.1, Some(&got.0))?;
            }
            Ok(())
        };
        match (&base, &kernels_base) {
            (None, _) => {
                check_rows(&got)?;
                base = Some(got);
            }
            (Some(b), _) if !auto_may_be_nccl => {
                bits_equal(&format!("{what} norm_out against Auto"), &got.0, &b.0)?;
                bits_equal(&format!("{what} residual_out against Auto"), &got.1, &b.1)?;
            }
            (Some(_), None) => {
                check_rows(&got)?;
                kernels_base = Some(got);
            }
            (Some(_), Some(k)) => {
                bits_equal(&format!("{what} norm_out against the first kernel"), &got.0, &k.0)?;
                bits_equal(&format!("{what} residual_out against the first kernel"), &got.1, &k.1)?;
            }
        }
    }
    let (b_norm, b_res) = base.ok_or("no run")?;

    // The residual add alone: the norm op's residual_out.
    res_out.copy_from_host(&poison::<T>(n)).map_err(e(&label))?;
    comm.all_reduce_residual(&x, &res, &mut res_out, hidden)
        .map_err(e(&label))?;
    sync(comm)?;
    bits_equal(
        &format!("{label} all_reduce_residual"),
        &res_out.to_host().map_err(e(&label))?,
        &b_res,
    )?;

    // The in-place forms, on copies.
    let mut x2 = comm.alloc::<T>(n).map_err(e(&label))?;
    let mut r2 = comm.alloc::<T>(n).map_err(e(&label))?;
    x2.copy_from_host(&x_h).map_err(e(&label))?;
    r2.copy_from_host(&res_h).map_err(e(&label))?;
    comm.all_reduce_residual_rms_norm_in_place(&mut x2, &mut r2, RmsNorm::new(&weight, EPS))
        .map_err(e(&label))?;
    sync(comm)?;
    bits_equal(
        &format!("{label} in place norm"),
        &x2.to_host().map_err(e(&label))?,
        &b_norm,
    )?;
    bits_equal(
        &format!("{label} in place residual"),
        &r2.to_host().map_err(e(&label))?,
        &b_res,
    )?;
    x2.copy_from_host(&x_h).map_err(e(&label))?;
    r2.copy_from_host(&res_h).map_err(e(&label))?;
    comm.all_reduce_residual_in_place(&mut x2, &mut r2, hidden)
        .map_err(e(&label))?;
    sync(comm)?;
    bits_equal(
        &format!("{label} in place add"),
        &r2.to_host().map_err(e(&label))?,
        &b_res,
    )?;

    Ok(hash(&b_norm) ^ hash(&b_res).rotate_left(1))
}

/// Every case of `plan` for one dtype; the hashes in case order.
pub fn suite_dtype<T: Element>(comm: &Communicator, plan: &Plan, salt: u64) -> Res<Vec<u64>> {
    let mut out = Vec::new();
    for (hi, &hidden) in plan.hiddens.iter().enumerate() {
        for (ti, &tokens) in plan.tokens.iter().enumerate() {
            if hidden * tokens * T::DTYPE.size() > plan.max_buffer_bytes {
                continue;
            }
            let seed = mix(salt ^ ((hi as u64) << 32) ^ (ti as u64) << 16 ^ T::DTYPE.size() as u64);
            out.push(case::<T>(comm, plan, seed, hidden, tokens)?);
        }
    }
    Ok(out)
}

/// The whole suite: f32, f16, bf16.
pub fn suite(comm: &Communicator, plan: &Plan) -> Res<Vec<u64>> {
    let mut v = suite_dtype::<f32>(comm, plan, 1)?;
    v.extend(suite_dtype::<half::f16>(comm, plan, 2)?);
    v.extend(suite_dtype::<half::bf16>(comm, plan, 3)?);
    Ok(v)
}
