//! One kernel argument and the packed parameter buffer every backend launches with: the
//! collective kernels take only scalars and device addresses (`u64`), so a launch is a slice
//! of [`KernelArg`]s, and the argument lists ([`super::args`]) are built by pure functions.

/// One kernel argument, passed by value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    U64(u64),
    U32(u32),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// Most arguments a kernel of this crate takes (the fused pull: 34; collectives' args tests
/// check every entry against it).
pub const MAX_ARGS: usize = 40;

/// The arguments packed as the kernel's parameter space lays them out: each at the next offset
/// aligned to its size (8-byte values to 8, 4-byte values to 4). Returns the buffer and its
/// length in bytes.
pub fn pack(args: &[KernelArg]) -> ([u64; MAX_ARGS], usize) {
    let mut words = [0u64; MAX_ARGS];
    let mut off = 0usize;
    for a in args {
        let (bytes, v): (usize, u64) = match *a {
            KernelArg::U64(v) => (8, v),
            KernelArg::I64(v) => (8, v as u64),
            KernelArg::U32(v) => (4, u64::from(v)),
            KernelArg::I32(v) => (4, u64::from(v as u32)),
            KernelArg::F32(v) => (4, u64::from(v.to_bits())),
        };
        off = off.next_multiple_of(bytes);
        let w = &mut words[off / 8];
        if bytes == 8 {
            *w = v;
        } else {
            // Little-endian: the 4-byte value at byte offset `off % 8` of its word.
            *w |= v << ((off % 8) * 8);
        }
        off += bytes;
    }
    (words, off)
}

/// Bytes a kernel parameter of this argument takes.
pub fn arg_bytes(a: &KernelArg) -> usize {
    match a {
        KernelArg::U64(_) | KernelArg::I64(_) => 8,
        KernelArg::U32(_) | KernelArg::I32(_) | KernelArg::F32(_) => 4,
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("symm's kernel launches pass 4-byte arguments in 8-byte cells: little-endian only");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_follows_natural_alignment() {
        let (w, len) = pack(&[KernelArg::U64(0x1122), KernelArg::U32(7), KernelArg::U64(9)]);
        // u64 at 0, u32 at 8, padding to 16, u64 at 16.
        assert_eq!(len, 24);
        assert_eq!(&w[..3], &[0x1122, 7, 9]);
        let (w, len) = pack(&[
            KernelArg::U32(1),
            KernelArg::U32(2),
            KernelArg::I32(-1),
            KernelArg::F32(1.0),
            KernelArg::U32(3),
        ]);
        assert_eq!(len, 20);
        assert_eq!(w[0], 1 | (2 << 32));
        assert_eq!(w[1], 0xFFFF_FFFF | (u64::from(1.0f32.to_bits()) << 32));
        assert_eq!(w[2], 3);
        let (_, len) = pack(&[KernelArg::U64(1); MAX_ARGS]);
        assert_eq!(len, MAX_ARGS * 8);
    }
}
