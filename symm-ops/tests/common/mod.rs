//! Shared by the host and GPU op suites: deterministic inputs, float64
//! references, tolerance checks, poison and guard patterns, result hashes.
#![allow(dead_code)]

pub mod epilogue;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod matrix;

use half::{bf16, f16};
use symm_core::{DType, ReduceOp};
use symm_ops::Element;

/// How the last rank disagrees with the others in the op-agreement suites
/// (`host_mismatch`, `gpu_mismatch`; NOTE [op-agreement]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MismatchClass {
    Count,
    DtypeSameBytes,
    ReduceOp,
    OpKind,
    SkipsAnOp,
    RejectsItsArgument,
}

pub const MISMATCH_CLASSES: [MismatchClass; 6] = [
    MismatchClass::Count,
    MismatchClass::DtypeSameBytes,
    MismatchClass::ReduceOp,
    MismatchClass::OpKind,
    MismatchClass::SkipsAnOp,
    MismatchClass::RejectsItsArgument,
];

/// Elements of guard on each side of an output.
pub const GUARD: usize = 5;

/// A NaN with a recognisable payload, written around outputs (guards).
pub fn guard_value<T: Element>() -> T {
    from_bits::<T>(match T::DTYPE {
        DType::F32 => 0x7FC0_5A5A,
        DType::F16 => 0x7E5A,
        _ => 0x7FA5,
    })
}

/// The poison written into outputs before each run (a different NaN).
pub fn poison_value<T: Element>() -> T {
    from_bits::<T>(match T::DTYPE {
        DType::F32 => 0x7FC0_0BAD,
        DType::F16 => 0x7E0B,
        _ => 0x7F8B,
    })
}

pub fn from_bits<T: Element>(bits: u32) -> T {
    let b = bits.to_le_bytes();
    T::read_le(&b[..T::DTYPE.size()])
}

pub fn to_bits<T: Element>(v: T) -> u32 {
    let mut b = [0u8; 4];
    v.write_le(&mut b[..T::DTYPE.size()]);
    u32::from_le_bytes(b)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// How inputs are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// Uniform in [-1, 1).
    Random,
    /// Small integers in [-8, 8]: sums are exact in every dtype.
    Integers,
}

/// Element `i` of rank `r`'s input for case `seed`.
pub fn input_value<T: Element>(values: Values, seed: u64, r: usize, i: usize) -> T {
    let h = splitmix(seed ^ splitmix((r as u64) << 40 ^ i as u64));
    match values {
        Values::Random => T::from_f32(((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0),
        Values::Integers => T::from_f32((h % 17) as f32 - 8.0),
    }
}

/// Rank `r`'s whole input of `n` elements.
pub fn input<T: Element>(values: Values, seed: u64, r: usize, n: usize) -> Vec<T> {
    (0..n).map(|i| input_value(values, seed, r, i)).collect()
}

/// float64 reduction of element `i` over `world` ranks' inputs at element
/// `i + off`; also returns the sum of magnitudes (for the tolerance).
pub fn reference<T: Element>(values: Values, seed: u64, world: usize, op: ReduceOp, i: usize) -> (f64, f64) {
    let mut acc: Option<f64> = None;
    let mut mag = 0.0;
    for r in 0..world {
        let x = input_value::<T>(values, seed, r, i).to_f32() as f64;
        mag += x.abs();
        acc = Some(match (acc, op) {
            (None, _) => x,
            (Some(a), ReduceOp::Sum | ReduceOp::Avg) => a + x,
            (Some(a), ReduceOp::Max) => a.max(x),
            (Some(a), ReduceOp::Min) => a.min(x),
        });
    }
    let a = acc.unwrap_or(0.0);
    (if op == ReduceOp::Avg { a / world as f64 } else { a }, mag)
}

/// Relative half-ulp of the element type.
fn rel(dtype: DType) -> f64 {
    dtype.unit_roundoff()
}

/// How an engine sums: in f32 with one rounding to the element type at the end
/// (the symm kernels, the host engine), or in the element type itself, rounding
/// after each of the `world - 1` additions (NCCL's reduction kernels). With two
/// ranks both round once, so they agree bit for bit; from three ranks on NCCL's
/// result may differ from the correctly rounded sum by up to `world - 1`
/// roundings of the partial sums (bounded by the sum of magnitudes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accum {
    F32,
    Element,
}

impl Accum {
    /// NCCL's accumulation where `nccl` ran the op, else the kernels'.
    pub fn of(nccl: bool) -> Accum {
        if nccl {
            Accum::Element
        } else {
            Accum::F32
        }
    }
}

/// Checks one result element against its reference; exact for max/min and
/// for integer sums.
pub fn check_value<T: Element>(values: Values, op: ReduceOp, world: usize, got: T, want: f64, mag: f64) -> bool {
    check_value_acc(values, op, world, got, want, mag, Accum::F32)
}

/// [`check_value`] for a result summed the way `acc` says.
pub fn check_value_acc<T: Element>(
    values: Values,
    op: ReduceOp,
    world: usize,
    got: T,
    want: f64,
    mag: f64,
    acc: Accum,
) -> bool {
    let g = got.to_f32() as f64;
    if g.is_nan() {
        return false;
    }
    let exact = matches!(op, ReduceOp::Max | ReduceOp::Min) || (values == Values::Integers && op == ReduceOp::Sum);
    if exact {
        return g == want;
    }
    let floor = if T::DTYPE == DType::F16 { 2f64.powi(-24) } else { 1e-30 };
    // The additions' error: f32 roundings, or element-type roundings of the partial sums.
    let sums = match acc {
        Accum::F32 => world as f64 * 2f64.powi(-23) * mag,
        Accum::Element => world.saturating_sub(1) as f64 * rel(T::DTYPE) * mag,
    };
    let tol = 2.0 * (sums + rel(T::DTYPE) * want.abs()) + floor;
    (g - want).abs() <= tol
}

/// FNV-1a over the elements' bits.
pub fn hash<T: Element>(v: &[T]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &x in v {
        h ^= to_bits(x) as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Checks a whole all-reduce result; an error names the first bad element.
pub fn check_all_reduce<T: Element>(
    values: Values,
    seed: u64,
    world: usize,
    op: ReduceOp,
    out: &[T],
) -> Result<(), String> {
    check_all_reduce_acc(values, seed, world, op, out, Accum::F32)
}

/// [`check_all_reduce`] for a result summed the way `acc` says.
pub fn check_all_reduce_acc<T: Element>(
    values: Values,
    seed: u64,
    world: usize,
    op: ReduceOp,
    out: &[T],
    acc: Accum,
) -> Result<(), String> {
    for (i, &g) in out.iter().enumerate() {
        let (want, mag) = reference::<T>(values, seed, world, op, i);
        if !check_value_acc(values, op, world, g, want, mag, acc) {
            return Err(format!(
                "element {i} of {}: got {} want {want} ({} {op} {values:?})",
                out.len(),
                g.to_f32(),
                T::DTYPE
            ));
        }
    }
    Ok(())
}

/// Checks rank `me`'s reduce-scatter result (`out.len()` = segment).
pub fn check_reduce_scatter<T: Element>(
    values: Values,
    seed: u64,
    world: usize,
    me: usize,
    op: ReduceOp,
    out: &[T],
) -> Result<(), String> {
    let n = out.len();
    for (i, &g) in out.iter().enumerate() {
        let (want, mag) = reference::<T>(values, seed, world, op, me * n + i);
        if !check_value(values, op, world, g, want, mag) {
            return Err(format!(
                "segment {me} element {i}: got {} want {want} ({} {op})",
                g.to_f32(),
                T::DTYPE
            ));
        }
    }
    Ok(())
}

/// Checks an all-gather result (`out.len()` = world * n): bit exact.
pub fn check_all_gather<T: Element>(values: Values, seed: u64, world: usize, out: &[T]) -> Result<(), String> {
    let n = out.len() / world;
    for (j, &g) in out.iter().enumerate() {
        let (r, i) = (j / n.max(1), j % n.max(1));
        let want = input_value::<T>(values, seed, r, i);
        if to_bits(g) != to_bits(want) {
            return Err(format!(
                "element {i} of rank {r}: got {:?} want {:?} ({})",
                g,
                want,
                T::DTYPE
            ));
        }
    }
    Ok(())
}

/// Checks the guards around `v[GUARD..GUARD + n]` are untouched.
pub fn check_guards<T: Element>(v: &[T]) -> Result<(), String> {
    let g = to_bits(guard_value::<T>());
    let n = v.len() - 2 * GUARD;
    for (k, &x) in v[..GUARD].iter().chain(&v[GUARD + n..]).enumerate() {
        if to_bits(x) != g {
            return Err(format!("guard element {k} overwritten: {:#x}", to_bits(x)));
        }
    }
    Ok(())
}

/// A guarded output: `GUARD` guard elements, `n` poisoned ones, `GUARD` guards.
pub fn guarded_output<T: Element>(n: usize) -> Vec<T> {
    let mut v = vec![guard_value::<T>(); n + 2 * GUARD];
    v[GUARD..GUARD + n].fill(poison_value::<T>());
    v
}

pub fn dtype_name<T: Element>() -> &'static str {
    T::DTYPE.name()
}

/// Marker for f16/bf16 imports in users of this module.
pub type F16 = f16;
pub type BF16 = bf16;
