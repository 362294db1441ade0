//! The checks every backend makes on an op's device addresses before it plans a launch: not
//! null, aligned to the element, sizes that do not overflow, and input and output either equal
//! (in place) or apart. Pure arithmetic on the addresses; whether they point at memory the
//! caller owns is the `unsafe fn` entries' contract (NOTE [raw-addresses]).

use crate::{DType, Error, Result};

use super::geometry::{kernel_dtype, KernelDtype};

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte.
pub fn ranges_overlap(a: u64, a_len: usize, b: u64, b_len: usize) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len as u64) && b < a.saturating_add(a_len as u64)
}

/// Bytes of `count` elements of `dtype`, or an error when that overflows.
pub(crate) fn byte_len(count: usize, dtype: DType) -> Result<usize> {
    count
        .checked_mul(dtype.size())
        .ok_or_else(|| Error::InvalidArgument(format!("{count} elements of {dtype} overflow")))
}

/// `ptr` is not null and aligned to `dtype`'s size.
pub fn check_ptr(what: &'static str, ptr: u64, dtype: DType) -> Result<()> {
    if ptr == 0 {
        return Err(Error::InvalidArgument(format!("{what} is a null device address")));
    }
    if !ptr.is_multiple_of(dtype.size() as u64) {
        return Err(Error::Misaligned {
            what,
            value: ptr,
            align: dtype.size() as u64,
        });
    }
    Ok(())
}

/// An all-reduce's addresses checked: the kernels' element type and the message's bytes, or
/// `None` when there is nothing to move.
pub fn all_reduce(input: u64, output: u64, count: usize, dtype: DType) -> Result<Option<(KernelDtype, usize)>> {
    let dt = kernel_dtype(dtype, "all_reduce")?;
    if count == 0 {
        return Ok(None);
    }
    check_ptr("all_reduce input", input, dtype)?;
    check_ptr("all_reduce output", output, dtype)?;
    let bytes = byte_len(count, dtype)?;
    if input != output && ranges_overlap(input, bytes, output, bytes) {
        return Err(Error::InvalidArgument(
            "all_reduce input and output overlap without being equal".into(),
        ));
    }
    Ok(Some((dt, bytes)))
}

/// A checked reduce-scatter / all-gather: `part` holds `count` elements, `whole` holds `count *
/// world`; `own` is this rank's shard of the whole, `whole_bytes` the whole's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGeometry {
    pub own: u64,
    pub whole_bytes: usize,
}

/// Checks the buffers of a reduce-scatter (`whole` = input, `part` = output) or an all-gather
/// (`part` = input, `whole` = output): aligned, sizes that do not overflow, and the part either
/// this rank's shard of the whole (in place) or apart from it.
pub(crate) fn shard_geometry(
    op: &'static str,
    (whole_name, whole): (&'static str, u64),
    (part_name, part): (&'static str, u64),
    count: usize,
    dtype: DType,
    (rank, world): (usize, usize),
) -> Result<ShardGeometry> {
    check_ptr(whole_name, whole, dtype)?;
    check_ptr(part_name, part, dtype)?;
    let bytes = byte_len(count, dtype)?;
    let total = count
        .checked_mul(world)
        .ok_or_else(|| Error::InvalidArgument(format!("{op} count overflows")))?;
    let whole_bytes = byte_len(total, dtype)?;
    let own = whole + (rank * bytes) as u64;
    if part != own && ranges_overlap(whole, whole_bytes, part, bytes) {
        return Err(Error::InvalidArgument(format!(
            "{part_name} overlaps the {whole_name} other than at this rank's shard"
        )));
    }
    Ok(ShardGeometry { own, whole_bytes })
}

/// A reduce-scatter's addresses checked (`count` output elements; the input holds `count *
/// world`): the element type and the geometry, or `None` for an empty shard.
pub fn reduce_scatter(
    input: u64,
    output: u64,
    count: usize,
    dtype: DType,
    (rank, world): (usize, usize),
) -> Result<Option<(KernelDtype, ShardGeometry)>> {
    let dt = kernel_dtype(dtype, "reduce_scatter")?;
    if count == 0 {
        return Ok(None);
    }
    let g = shard_geometry(
        "reduce_scatter",
        ("reduce_scatter input", input),
        ("reduce_scatter output", output),
        count,
        dtype,
        (rank, world),
    )?;
    Ok(Some((dt, g)))
}

/// An all-gather's addresses checked (`count` input elements; the output holds `count * world`):
/// the lanes it moves (any 4-byte type as f32, any 2-byte type as f16: it moves bits), or `None`
/// when there is nothing to move.
pub fn all_gather(
    input: u64,
    output: u64,
    count: usize,
    dtype: DType,
    (rank, world): (usize, usize),
) -> Result<Option<KernelDtype>> {
    let dt = match dtype.size() {
        4 => KernelDtype::F32,
        2 => KernelDtype::F16,
        _ => {
            return Err(Error::UnsupportedDType {
                dtype: dtype.name().to_string(),
                op: "all_gather",
            })
        }
    };
    if count == 0 {
        return Ok(None);
    }
    shard_geometry(
        "all_gather",
        ("all_gather output", output),
        ("all_gather input", input),
        count,
        dtype,
        (rank, world),
    )?;
    Ok(Some(dt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_math() {
        assert!(ranges_overlap(100, 10, 105, 10));
        assert!(!ranges_overlap(100, 10, 110, 10));
        assert!(!ranges_overlap(100, 0, 100, 10));
        assert!(ranges_overlap(100, 10, 90, 11));
        assert!(!ranges_overlap(100, 10, 90, 10));
    }

    #[test]
    fn pointers_and_geometry() {
        assert!(check_ptr("x", 0, DType::F32).is_err());
        assert!(check_ptr("x", 2, DType::F32).is_err());
        assert!(check_ptr("x", 2, DType::BF16).is_ok());
        assert_eq!(all_reduce(0x100, 0x100, 0, DType::F32).unwrap(), None);
        assert!(all_reduce(0x100, 0x104, 4, DType::F32).is_err());
        assert_eq!(
            all_reduce(0x100, 0x100, 4, DType::F32).unwrap(),
            Some((KernelDtype::F32, 16))
        );
        // In place at this rank's shard, apart, or overlapping elsewhere (refused).
        let g = reduce_scatter(0x1000, 0x1010, 4, DType::F32, (1, 2))
            .unwrap()
            .unwrap()
            .1;
        assert_eq!(
            g,
            ShardGeometry {
                own: 0x1010,
                whole_bytes: 32
            }
        );
        assert!(reduce_scatter(0x1000, 0x2000, 4, DType::F32, (1, 2)).is_ok());
        assert!(reduce_scatter(0x1000, 0x1004, 4, DType::F32, (1, 2)).is_err());
        assert_eq!(
            all_gather(0x10, 0x1000, 3, DType::BF16, (0, 3)).unwrap(),
            Some(KernelDtype::F16)
        );
        assert!(all_gather(0x10, 0x1000, 3, DType::U8, (0, 3)).is_err());
    }
}
