//! Host reduction kernels: f32 accumulation for every dtype (as the GPU
//! kernels do), contributions added in a fixed rank order (rank 0 first), so
//! every rank computes bitwise the same result.

use half::{bf16, f16};
use symm_core::{DType, ReduceOp};

use crate::buf::Element;

fn load_t<T: Element>(bytes: &[u8], acc: &mut [f32]) {
    for (a, b) in acc.iter_mut().zip(bytes.chunks_exact(T::DTYPE.size())) {
        *a = T::read_le(b).to_f32();
    }
}

fn combine_t<T: Element>(op: ReduceOp, bytes: &[u8], acc: &mut [f32]) {
    let it = acc.iter_mut().zip(bytes.chunks_exact(T::DTYPE.size()));
    match op {
        ReduceOp::Sum | ReduceOp::Avg => it.for_each(|(a, b)| *a += T::read_le(b).to_f32()),
        ReduceOp::Max => it.for_each(|(a, b)| *a = a.max(T::read_le(b).to_f32())),
        ReduceOp::Min => it.for_each(|(a, b)| *a = a.min(T::read_le(b).to_f32())),
    }
}

fn narrow_t<T: Element>(acc: &[f32], out: &mut [u8]) {
    for (a, o) in acc.iter().zip(out.chunks_exact_mut(T::DTYPE.size())) {
        T::from_f32(*a).write_le(o);
    }
}

/// `acc[i] = bytes[i]` (rank 0's contribution), widened to f32.
pub(crate) fn load(dtype: DType, bytes: &[u8], acc: &mut [f32]) {
    match dtype {
        DType::F16 => load_t::<f16>(bytes, acc),
        DType::BF16 => load_t::<bf16>(bytes, acc),
        _ => load_t::<f32>(bytes, acc),
    }
}

/// `acc[i] = op(acc[i], bytes[i])` (the next rank's contribution).
pub(crate) fn combine(dtype: DType, op: ReduceOp, bytes: &[u8], acc: &mut [f32]) {
    match dtype {
        DType::F16 => combine_t::<f16>(op, bytes, acc),
        DType::BF16 => combine_t::<bf16>(op, bytes, acc),
        _ => combine_t::<f32>(op, bytes, acc),
    }
}

/// Finishes a reduction over `world` contributions (avg divides).
pub(crate) fn finish(op: ReduceOp, world: usize, acc: &mut [f32]) {
    if op == ReduceOp::Avg {
        let w = world as f32;
        acc.iter_mut().for_each(|a| *a /= w);
    }
}

/// Narrows the accumulators to `dtype` little-endian bytes.
pub(crate) fn narrow(dtype: DType, acc: &[f32], out: &mut [u8]) {
    match dtype {
        DType::F16 => narrow_t::<f16>(acc, out),
        DType::BF16 => narrow_t::<bf16>(acc, out),
        _ => narrow_t::<f32>(acc, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reduces_in_rank_order() {
        let ranks = [[1.0f32, -2.0, 5.0], [3.0, 7.0, -1.0], [0.5, 0.0, 2.0]];
        for (op, want) in [
            (ReduceOp::Sum, [4.5f32, 5.0, 6.0]),
            (ReduceOp::Avg, [1.5, 5.0 / 3.0, 2.0]),
            (ReduceOp::Max, [3.0, 7.0, 5.0]),
            (ReduceOp::Min, [0.5, -2.0, -1.0]),
        ] {
            let mut acc = [0f32; 3];
            load(DType::F32, &bytes_f32(&ranks[0]), &mut acc);
            for r in &ranks[1..] {
                combine(DType::F32, op, &bytes_f32(r), &mut acc);
            }
            finish(op, 3, &mut acc);
            assert_eq!(acc, want, "{op}");
        }
    }

    #[test]
    fn half_types_accumulate_in_f32() {
        // 2048 + 1 + 1 is not representable step by step in f16 (2049 rounds to
        // 2048), but is in f32 before the final narrowing.
        let enc = |v: f32| f16::from_f32(v).to_bits().to_le_bytes().to_vec();
        let mut acc = [0f32];
        load(DType::F16, &enc(2048.0), &mut acc);
        combine(DType::F16, ReduceOp::Sum, &enc(1.0), &mut acc);
        combine(DType::F16, ReduceOp::Sum, &enc(1.0), &mut acc);
        let mut out = [0u8; 2];
        narrow(DType::F16, &acc, &mut out);
        assert_eq!(f16::from_bits(u16::from_le_bytes(out)).to_f32(), 2050.0);
        let mut out = [0u8; 2];
        narrow(DType::BF16, &[3.0], &mut out);
        assert_eq!(bf16::from_bits(u16::from_le_bytes(out)).to_f32(), 3.0);
    }
}
