//! [`RocmSymmetricMemory`]: one rank's handle on a rendezvoused ROCm
//! allocation: every peer's buffer and pad mapped on this device, device
//! arrays of their addresses, and the sync kernels (NOTE
//! [signal-pad-layout]; symm-core's shared `sync.cu`, the kernels symm-cuda
//! runs) launched on a stream of its own.
//!
//! Waits are bounded twice: on the device (a deadline in nanoseconds of the
//! wall clock, the ABORT word) and on the host (the stream is polled, never
//! synchronised without a limit). A device failure is latched in the pad's
//! ERROR word (the kernels get no status word) and returned as
//! [`Error::Timeout`] or [`Error::Aborted`].
//!
//! No collectives here: the all-reduce and the other collectives are
//! [`crate::RocmCollectives`]'s, which runs symm-core's shared collective kernels on a
//! symmetric workspace of its own.

#![forbid(unsafe_code)]

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use symm_core::{check_range, pad, Channel, Device, Error, Group, Rank, Result, SymmetricMemory};

use crate::allocator::Local;
use crate::driver::runtime::{self, DeviceBuffer, Function, Module, Stream};
use crate::driver::vmm::Mapping;
use crate::kernels;
use symm_core::coll::arg::KernelArg as Arg;

/// Extra host-side patience beyond a device wait's own timeout.
pub const HOST_MARGIN: Duration = Duration::from_secs(5);

/// A timeout as the sync kernels' `timeout_ns` (saturating: the device's deadline saturates too,
/// `symm_deadline` in common.cuh).
pub fn timeout_ns(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)
}

/// Threads of a `symm_barrier` block for `world` ranks: at least one per rank, a multiple of 32
/// (sync.cu's launch rule); at most 64, as a `Group` has at most `pad::MAX_WORLD_SIZE` ranks.
pub fn barrier_threads(world: usize) -> u32 {
    world.max(1).next_multiple_of(32) as u32
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
        let sync = kernels::load(dev, &kernels::SYNC, &kernels::clock_defines()?)?;
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
        // symm_barrier(pads, rank, world, channel, timeout_ns, abort_host, status): no pinned
        // abort or status word (0); the host aborts through the pad's ABORT word and reads the
        // outcome from its ERROR word.
        let world = self.group.world_size();
        let args = [
            Arg::U64(self.pad_ptrs_dev.ptr()),
            Arg::U32(self.group.rank().get() as u32),
            Arg::U32(world as u32),
            Arg::U32(channel.get() as u32),
            Arg::U64(timeout_ns(timeout)),
            Arg::U64(0),
            Arg::U64(0),
        ];
        self.run(
            &self.barrier_fn,
            barrier_threads(world),
            &args,
            &format!("rocm barrier on {channel}"),
            timeout,
        )
    }

    fn put_signal(&self, dst: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let dst = self.group.rank().peer(dst.get())?;
        // symm_put_signal(pads, rank, world, dst, channel, status)
        let args = [
            Arg::U64(self.pad_ptrs_dev.ptr()),
            Arg::U32(self.group.rank().get() as u32),
            Arg::U32(self.group.world_size() as u32),
            Arg::U32(dst.get() as u32),
            Arg::U32(channel.get() as u32),
            Arg::U64(0),
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
        // symm_wait_signal(pads, rank, world, src, channel, timeout_ns, abort_host, status)
        let args = [
            Arg::U64(self.pad_ptrs_dev.ptr()),
            Arg::U32(self.group.rank().get() as u32),
            Arg::U32(self.group.world_size() as u32),
            Arg::U32(src.get() as u32),
            Arg::U32(channel.get() as u32),
            Arg::U64(timeout_ns(timeout)),
            Arg::U64(0),
            Arg::U64(0),
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
    fn timeouts_convert_to_saturating_nanoseconds() {
        assert_eq!(timeout_ns(Duration::from_secs(1)), 1_000_000_000);
        assert_eq!(timeout_ns(Duration::from_micros(10)), 10_000);
        assert_eq!(timeout_ns(Duration::ZERO), 0);
        assert_eq!(timeout_ns(Duration::MAX), u64::MAX);
    }

    #[test]
    fn barrier_blocks_cover_every_rank_in_whole_warps() {
        for world in 1..=pad::MAX_WORLD_SIZE {
            let t = barrier_threads(world) as usize;
            assert!(t >= world && t.is_multiple_of(32) && t < world + 32, "{world}: {t}");
        }
        assert_eq!(barrier_threads(1), 32);
        assert_eq!(barrier_threads(33), 64);
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
