//! Plain types: devices, dtypes, reduce ops, and checked rank/channel indices.

use std::fmt;

use crate::error::{Error, Result};
use crate::pad;

/// A kind of device a backend serves. Non-exhaustive: a match outside symm-core keeps an arm
/// for the kinds it does not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DeviceType {
    /// CPU memory (the host backend in symm-testkit).
    Host,
    /// NVIDIA GPUs (symm-cuda).
    Cuda,
    /// AMD GPUs (symm-rocm).
    Rocm,
    /// Any other device, named: a backend outside this workspace (a test's mock among them)
    /// registers its allocator and collectives for `Other(name)` as symm-cuda does for `Cuda`.
    /// Shown as `other:{name}` (so no name passes for a built-in kind in the ranks' setup
    /// records); the name is one line of printable text.
    Other(&'static str),
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceType::Host => "host",
            DeviceType::Cuda => "cuda",
            DeviceType::Rocm => "rocm",
            DeviceType::Other(name) => return write!(f, "other:{name}"),
        })
    }
}

/// One device: a type and an ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    pub ty: DeviceType,
    pub index: u32,
}

impl Device {
    pub const fn new(ty: DeviceType, index: u32) -> Self {
        Device { ty, index }
    }
    pub const fn host(index: u32) -> Self {
        Device::new(DeviceType::Host, index)
    }
    pub const fn cuda(index: u32) -> Self {
        Device::new(DeviceType::Cuda, index)
    }
    pub const fn rocm(index: u32) -> Self {
        Device::new(DeviceType::Rocm, index)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ty, self.index)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A Rust element type the collectives reduce (`f32`, `half::f16`, `half::bf16`; they
/// accumulate in `f32`), with its [`DType`]: what the typed, safe entry points of the backends
/// and of symm-ops take.
pub trait Scalar: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The matching [`DType`].
    const DTYPE: DType;
}

impl Scalar for f32 {
    const DTYPE: DType = DType::F32;
}
impl Scalar for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Scalar for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

/// Element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I32,
    I64,
    U8,
    U32,
}

impl DType {
    /// Every element type, in declaration order (the order op records encode).
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
    ];
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::U8 => 1,
        }
    }
    /// The name used in kernels and tables ("f32", "bf16", ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U32 => "u32",
        }
    }
    /// True for the floating types the collectives reduce (f32, f16, bf16).
    pub const fn is_reducible_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
    /// Unit roundoff of a floating type (half an ulp at 1: 2^-24 f32, 2^-11 f16, 2^-8 bf16,
    /// 2^-53 f64), the unit of every stated tolerance; 0 for the integer types (exact).
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => 5.960_464_477_539_063e-8,
            DType::F16 => 4.882_812_5e-4,
            DType::BF16 => 3.906_25e-3,
            DType::F64 => 1.110_223_024_625_156_5e-16,
            _ => 0.0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Avg,
    Max,
    Min,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A rank checked against a world size once, when built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rank {
    rank: u32,
    world: u32,
}

impl Rank {
    /// Checks `rank < world_size <= pad::MAX_WORLD_SIZE`.
    pub fn new(rank: usize, world_size: usize) -> Result<Self> {
        if world_size == 0 || world_size > pad::MAX_WORLD_SIZE {
            return Err(Error::OutOfRange {
                what: "world size",
                value: world_size as u64,
                limit: pad::MAX_WORLD_SIZE as u64,
            });
        }
        if rank >= world_size {
            return Err(Error::OutOfRange {
                what: "rank",
                value: rank as u64,
                limit: world_size as u64,
            });
        }
        Ok(Rank {
            rank: rank as u32,
            world: world_size as u32,
        })
    }
    pub fn get(self) -> usize {
        self.rank as usize
    }
    pub fn world_size(self) -> usize {
        self.world as usize
    }
    /// Another rank of the same world, checked.
    pub fn peer(self, rank: usize) -> Result<Rank> {
        Rank::new(rank, self.world as usize)
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.rank, self.world)
    }
}

/// A signal-pad channel checked against [`pad::NUM_CHANNELS`] once, when built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Channel(u32);

impl Channel {
    pub fn new(channel: usize) -> Result<Self> {
        if channel >= pad::NUM_CHANNELS {
            return Err(Error::OutOfRange {
                what: "channel",
                value: channel as u64,
                limit: pad::NUM_CHANNELS as u64,
            });
        }
        Ok(Channel(channel as u32))
    }
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "channel {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::DType;

    #[test]
    fn unit_roundoff_is_half_an_ulp_at_one() {
        for (d, bits) in [(DType::F32, 24), (DType::F16, 11), (DType::BF16, 8), (DType::F64, 53)] {
            assert_eq!(d.unit_roundoff(), 2f64.powi(-bits), "{d}");
        }
        assert_eq!(DType::I32.unit_roundoff(), 0.0);
    }
}
