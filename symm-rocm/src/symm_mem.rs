//! [`RocmSymmetricMemory`]: one rank's handle on a rendezvoused ROCm
//! allocation: every peer's buffer and pad mapped on this device, device
//! arrays of their addresses, and the sync kernels (NOTE
//! [signal-pad-layout]) launched on a stream of its own.
//!
//! Waits are bounded twice: on the device (deadline in wall-clock ticks, the
//! ABORT word) and on the host (the stream is polled, never synchronised
//! without a limit). A device timeout is latched in the pad's ERROR word and
//! returned as [`Error::Timeout`].

// No unsafe code: `one_shot_all_reduce` takes a raw device address, so it only declares its
// contract (`unsafe fn`, NOTE [raw-addresses]); the driver layer does the rest.
#![deny(unsafe_code)]

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::{check_range, pad, Channel, DType, Device, Error, Group, Rank, ReduceOp, Result, SymmetricMemory};

use crate::allocator::Local;
use crate::driver::runtime::{self, DeviceBuffer, Function, Module, Stream};
use crate::driver::vmm::Mapping;
use crate::kernels;
use symm_core::coll::arg::KernelArg as Arg;

/// Ticks per second of the device wall clock (`wall_clock64`): 100 MHz on
/// CDNA2 / CDNA3 (MI200, MI300). `SYMM_ROCM_WALL_CLOCK_HZ` overrides it.
pub const DEFAULT_WALL_CLOCK_HZ: u64 = 100_000_000;
/// Extra host-side patience beyond a device wait's own timeout.
pub const HOST_MARGIN: Duration = Duration::from_secs(5);
/// Most ranks [`RocmSymmetricMemory::one_shot_all_reduce`] handles: the shared reduction
/// kernel takes one pointer per rank (`COLL_MAXW` in symm-core/kernels/collectives.cu).
pub const REDUCE_PTRS_MAX_WORLD: usize = 8;
/// Ops slots used by [`RocmSymmetricMemory::one_shot_all_reduce`].
pub const ALL_REDUCE_SLOT: usize = 0;
pub const ALL_REDUCE_EXIT_SLOT: usize = 1;

/// Converts a timeout to device wall-clock ticks (saturating).
pub fn timeout_ticks(timeout: Duration, hz: u64) -> u64 {
    let t = timeout.as_nanos().saturating_mul(u128::from(hz)) / 1_000_000_000;
    u64::try_from(t).unwrap_or(u64::MAX / 2).min(u64::MAX / 2)
}

fn wall_clock_hz() -> u64 {
    crate::knobs::get(crate::knobs::WALL_CLOCK_HZ)
        .and_then(|v| v.parse().ok())
        .filter(|&v: &u64| v > 0)
        .unwrap_or(DEFAULT_WALL_CLOCK_HZ)
}

/// The error an ERROR-word code stands for (`None` for no error).
pub fn pad_error(code: u32, what: &str, timeout: Duration) -> Option<Error> {
    pad::code_error(code, "rocm", what.to_string(), timeout)
}

/// The mappings a symmetric memory keeps alive.
#[derive(Debug)]
pub(crate) struct PeerMaps {
    pub(crate) local: Arc<Local>,
    /// `None` at this rank's own index (its mapping is `local.mapping`).
    pub(crate) peers: Vec<Option<Mapping>>,
    pub(crate) pad_offsets: Vec<usize>,
}

/// One rank's handle on a rendezvoused ROCm allocation.
pub struct RocmSymmetricMemory {
    group: Arc<Group>,
    device: Device,
    size: usize,
    buffer_ptrs: Vec<u64>,
    pad_ptrs: Vec<u64>,
    buffer_ptrs_dev: DeviceBuffer,
    pad_ptrs_dev: DeviceBuffer,
    stream: Stream,
    ctl: Stream,
    barrier_fn: Function,
    put_fn: Function,
    wait_fn: Function,
    _sync: Arc<Module>,
    ops_epochs: Mutex<[u32; 2]>,
    hz: u64,
    // Dropped last: the mappings outlive the streams and device arrays.
    _maps: PeerMaps,
}

impl std::fmt::Debug for RocmSymmetricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocmSymmetricMemory")
            .field("rank", &self.group.rank())
            .field("device", &self.device)
            .field("size", &self.size)
            .finish()
    }
}

impl RocmSymmetricMemory {
    pub(crate) fn new(group: Arc<Group>, maps: PeerMaps) -> Result<Self> {
        let dev = maps.local.device;
        runtime::set_device(dev)?;
        let rank = group.rank().get();
        let buffer_ptrs: Vec<u64> = maps
            .peers
            .iter()
            .enumerate()
            .map(|(p, m)| match m {
                Some(m) => m.ptr(),
                None if p == rank => maps.local.mapping.ptr(),
                None => 0,
            })
            .collect();
        if buffer_ptrs.contains(&0) {
            return Err(Error::InvalidArgument("a peer mapping is missing".into()));
        }
        let pad_ptrs: Vec<u64> = buffer_ptrs
            .iter()
            .zip(&maps.pad_offsets)
            .map(|(b, o)| b + *o as u64)
            .collect();
        let sync = kernels::load(dev, &kernels::SYNC, "")?;
        Ok(RocmSymmetricMemory {
            device: Device::rocm(dev),
            size: maps.local.layout.size,
            buffer_ptrs_dev: DeviceBuffer::from_u64s(&buffer_ptrs)?,
            pad_ptrs_dev: DeviceBuffer::from_u64s(&pad_ptrs)?,
            buffer_ptrs,
            pad_ptrs,
            stream: Stream::new()?,
            ctl: Stream::new()?,
            barrier_fn: sync.function("symm_barrier")?,
            put_fn: sync.function("symm_put_signal")?,
            wait_fn: sync.function("symm_wait_signal")?,
            _sync: sync,
            ops_epochs: Mutex::new([0; 2]),
            hz: wall_clock_hz(),
            group,
            _maps: maps,
        })
    }

    fn own_pad_word(&self, word: usize) -> u64 {
        self.pad_ptrs[self.group.rank().get()] + (word * 4) as u64
    }

    /// Reads and clears the ERROR word: `Ok` or the latched error.
    pub fn check_error(&self, what: &str, timeout: Duration) -> Result<()> {
        runtime::set_device(self.device.index)?;
        let mut w = [0u8; 4];
        self.ctl
            .copy_from_device_sync(&mut w, self.own_pad_word(pad::ERROR_WORD), HOST_MARGIN)?;
        match pad_error(u32::from_ne_bytes(w), what, timeout) {
            None => Ok(()),
            Some(e) => {
                self.ctl
                    .copy_to_device_sync(self.own_pad_word(pad::ERROR_WORD), &[0; 4], HOST_MARGIN)?;
                Err(e)
            }
        }
    }

    /// Launches `f` and waits for it within `timeout` plus a margin; then
    /// reports any error the device latched.
    fn run(&self, f: &Function, block: u32, args: &[Arg], what: &str, timeout: Duration) -> Result<()> {
        runtime::set_device(self.device.index)?;
        f.launch(&self.stream, 1, block, args)?;
        self.finish(what, timeout)
    }

    fn finish(&self, what: &str, timeout: Duration) -> Result<()> {
        match self.stream.wait(timeout.saturating_add(HOST_MARGIN), what) {
            Ok(()) => self.check_error(what, timeout),
            Err(Error::Timeout { .. }) => {
                // The device did not honour its deadline: abort it, then report.
                self.set_abort(true)?;
                let drained = self.stream.wait(HOST_MARGIN, what);
                self.set_abort(false)?;
                let _ = self.check_error(what, timeout);
                drained?;
                Err(Error::Timeout {
                    what: what.to_string(),
                    timeout,
                })
            }
            Err(e) => Err(e),
        }
    }

    fn rank_base(&self, rank: Rank) -> Result<u64> {
        let r = self.group.rank().peer(rank.get())?;
        Ok(self.buffer_ptrs[r.get()])
    }

    /// One-shot all-reduce of `count` elements at byte `in_offset` of every
    /// rank's buffer into `out` (a device address on this rank's GPU holding
    /// `count` elements). Collective; f32, f16 and bf16; at most [`REDUCE_PTRS_MAX_WORLD`]
    /// ranks. An ops-slot barrier (`kernels/ops.hip`), the shared collectives'
    /// `symm_reduce_ptrs_{dt}` (every rank's input read in place, f32 accumulation in rank
    /// order), a second barrier. The input range is checked against the buffer; `out` cannot be
    /// checked, hence `unsafe`.
    ///
    /// # Safety
    /// NOTE [raw-addresses]: `out .. out + count * dtype.size()` is device memory this rank's
    /// GPU can write (a `hipMalloc` allocation or a mapping made accessible to it), aligned to
    /// the element size, and stays allocated and untouched by anything but this op until the
    /// call returns; should it return an error after launching (a timeout the device did not
    /// honour), until the device has gone idle, as the kernel may still be writing it.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn one_shot_all_reduce(
        &self,
        in_offset: usize,
        out: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        timeout: Duration,
    ) -> Result<()> {
        // The reduction is the shared collectives' symm_reduce_ptrs_{dt} (symm_core::kernel_source:
        // the kernel symm-cuda's copy-engine all-reduce runs), between two ops-slot barriers.
        let kernel = match dtype {
            DType::F32 => "symm_reduce_ptrs_f32",
            DType::F16 => "symm_reduce_ptrs_f16",
            DType::BF16 => "symm_reduce_ptrs_bf16",
            other => {
                return Err(Error::UnsupportedDType {
                    dtype: other.to_string(),
                    op: "rocm one_shot_all_reduce",
                })
            }
        };
        let world = self.group.world_size();
        if world > REDUCE_PTRS_MAX_WORLD {
            return Err(Error::InvalidArgument(format!(
                "rocm one_shot_all_reduce: {world} ranks, at most {REDUCE_PTRS_MAX_WORLD} (the shared reduction kernel's)"
            )));
        }
        if in_offset % dtype.size() != 0 {
            return Err(Error::Misaligned {
                what: "all_reduce input offset",
                value: in_offset as u64,
                align: dtype.size() as u64,
            });
        }
        let bytes = count.checked_mul(dtype.size()).ok_or(Error::OutOfRange {
            what: "all_reduce count",
            value: count as u64,
            limit: self.size as u64,
        })?;
        check_range("all_reduce input", in_offset, bytes, self.size)?;
        if count == 0 {
            return Ok(());
        }
        let op_code = match op {
            ReduceOp::Sum => 0u32,
            ReduceOp::Avg => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        };
        runtime::set_device(self.device.index)?;
        let ops = kernels::load(self.device.index, &kernels::OPS, "")?;
        let barrier = ops.function("symm_ops_barrier")?;
        let reduce = kernels::load(self.device.index, &kernels::COLLECTIVES, "")?.function(kernel)?;
        let (e_in, e_out) = {
            let mut e = self.ops_epochs.lock().unwrap_or_else(|e| e.into_inner());
            e[0] = e[0].wrapping_add(1);
            e[1] = e[1].wrapping_add(1);
            (e[0], e[1])
        };
        let rank = self.group.rank().get();
        let ticks = timeout_ticks(timeout, self.hz);
        let barrier_args = |slot: usize, epoch: u32| {
            [
                Arg::U64(self.pad_ptrs_dev.ptr()),
                Arg::I32(rank as i32),
                Arg::I32(world as i32),
                Arg::I32(slot as i32),
                Arg::U32(epoch),
                Arg::U64(ticks),
            ]
        };
        barrier.launch(&self.stream, 1, 64, &barrier_args(ALL_REDUCE_SLOT, e_in))?;
        // symm_reduce_ptrs_{dt}(rank, world, op, out, n, s0..s7): every rank's input as mapped
        // here (the unused ones null), 16-byte vectors, any grid (grid-stride).
        let mut reduce_args = vec![
            Arg::U32(rank as u32),
            Arg::U32(world as u32),
            Arg::U32(op_code),
            Arg::U64(out),
            Arg::U64(count as u64),
        ];
        reduce_args.extend(
            (0..REDUCE_PTRS_MAX_WORLD).map(|r| Arg::U64(self.buffer_ptrs.get(r).map_or(0, |b| b + in_offset as u64))),
        );
        let blocks = bytes.div_ceil(16).div_ceil(256).clamp(1, 1024) as u32;
        reduce.launch(&self.stream, blocks, 256, &reduce_args)?;
        barrier.launch(&self.stream, 1, 64, &barrier_args(ALL_REDUCE_EXIT_SLOT, e_out))?;
        self.finish("rocm one_shot_all_reduce", timeout)
    }
}

impl SymmetricMemory for RocmSymmetricMemory {
    fn group(&self) -> &Arc<Group> {
        &self.group
    }
    fn device(&self) -> Device {
        self.device
    }
    fn buffer_size(&self) -> usize {
        self.size
    }
    fn signal_pad_size(&self) -> usize {
        pad::SIGNAL_PAD_SIZE
    }
    fn buffer_ptrs(&self) -> &[u64] {
        &self.buffer_ptrs
    }
    fn signal_pad_ptrs(&self) -> &[u64] {
        &self.pad_ptrs
    }
    fn buffer_ptrs_dev(&self) -> u64 {
        self.buffer_ptrs_dev.ptr()
    }
    fn signal_pad_ptrs_dev(&self) -> u64 {
        self.pad_ptrs_dev.ptr()
    }

    fn barrier(&self, channel: Channel, timeout: Duration) -> Result<()> {
        let args = [
            Arg::U64(self.pad_ptrs_dev.ptr()),
            Arg::I32(self.group.rank().get() as i32),
            Arg::I32(self.group.world_size() as i32),
            Arg::I32(channel.get() as i32),
            Arg::U64(timeout_ticks(timeout, self.hz)),
        ];
        self.run(
            &self.barrier_fn,
            64,
            &args,
            &format!("rocm barrier on {channel}"),
            timeout,
        )
    }

    fn put_signal(&self, dst: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let dst = self.group.rank().peer(dst.get())?;
        let args = [
            Arg::U64(self.pad_ptrs_dev.ptr()),
            Arg::I32(self.group.rank().get() as i32),
            Arg::I32(dst.get() as i32),
            Arg::I32(channel.get() as i32),
        ];
        self.run(
            &self.put_fn,
            1,
            &args,
            &format!("rocm put_signal to rank {} on {channel}", dst.get()),
            timeout,
        )
    }

    fn wait_signal(&self, src: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let src = self.group.rank().peer(src.get())?;
        let args = [
            Arg::U64(self.pad_ptrs_dev.ptr()),
            Arg::I32(self.group.rank().get() as i32),
            Arg::I32(src.get() as i32),
            Arg::I32(channel.get() as i32),
            Arg::U64(timeout_ticks(timeout, self.hz)),
        ];
        self.run(
            &self.wait_fn,
            1,
            &args,
            &format!("rocm wait_signal from rank {} on {channel}", src.get()),
            timeout,
        )
    }

    fn read_bytes(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range("read", offset, out.len(), self.size)?;
        let base = self.rank_base(rank)?;
        runtime::set_device(self.device.index)?;
        self.ctl
            .copy_from_device_sync(out, base + offset as u64, HOST_MARGIN.saturating_mul(6))
    }

    fn write_bytes(&self, rank: Rank, offset: usize, data: &[u8]) -> Result<()> {
        check_range("write", offset, data.len(), self.size)?;
        let base = self.rank_base(rank)?;
        runtime::set_device(self.device.index)?;
        self.ctl
            .copy_to_device_sync(base + offset as u64, data, HOST_MARGIN.saturating_mul(6))
    }

    fn read_signal_pad(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range("signal pad read", offset, out.len(), pad::SIGNAL_PAD_SIZE)?;
        let r = self.group.rank().peer(rank.get())?;
        runtime::set_device(self.device.index)?;
        self.ctl
            .copy_from_device_sync(out, self.pad_ptrs[r.get()] + offset as u64, HOST_MARGIN)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        runtime::set_device(self.device.index)?;
        let v = u32::from(abort).to_ne_bytes();
        self.ctl
            .copy_to_device_sync(self.own_pad_word(pad::ABORT_WORD), &v, HOST_MARGIN)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_and_saturate() {
        assert_eq!(timeout_ticks(Duration::from_secs(1), 100_000_000), 100_000_000);
        assert_eq!(timeout_ticks(Duration::from_micros(10), 100_000_000), 1000);
        assert_eq!(timeout_ticks(Duration::ZERO, 100_000_000), 0);
        // huge timeouts do not overflow the device's deadline arithmetic
        assert_eq!(timeout_ticks(Duration::MAX, u64::MAX), u64::MAX / 2);
    }

    #[test]
    fn pad_error_codes_convert() {
        let t = Duration::from_millis(5);
        assert!(pad_error(pad::ERR_NONE, "x", t).is_none());
        assert!(matches!(pad_error(pad::ERR_TIMEOUT, "x", t), Some(Error::Timeout { timeout, .. }) if timeout == t));
        assert!(matches!(pad_error(pad::ERR_ABORTED, "x", t), Some(Error::Aborted(_))));
        assert!(matches!(pad_error(77, "x", t), Some(Error::Backend { .. })));
    }
}
