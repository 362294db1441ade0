//! [`HostSymmetricMemory`]: the host backend's `SymmetricMemory`, with the
//! signal-pad protocol of NOTE [signal-pad-layout] (`symm_core::pad`) on
//! `AtomicU32` words: release stores into the peer's slot, acquire polls of
//! the own slot, monotonic epochs compared modulo 2^32, every poll bounded by
//! a deadline and the own `ABORT` word.
#![forbid(unsafe_code)]

use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_core::pad::{self, SIGNAL_PAD_SIZE};
use symm_core::{check_range, Channel, Device, Error, Group, Rank, Result, SymmetricMemory};

use super::mapping::Region;
use symm_core::fault_point;

/// Spins before yielding, yields before sleeping.
const SPIN_POLLS: u32 = 256;
const YIELD_POLLS: u32 = 64;
/// Sleep between polls once spinning and yielding did not succeed.
const POLL_SLEEP: Duration = Duration::from_micros(30);
/// How often a waiter checks that a peer process is still alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);

/// One rank's view of a rendezvoused host allocation.
pub struct HostSymmetricMemory {
    group: Arc<Group>,
    device: Device,
    rank: usize,
    buffer_size: usize,
    pad_offset: usize,
    regions: Vec<Arc<Region>>,
    buffer_ptrs: Vec<u64>,
    pad_ptrs: Vec<u64>,
    /// For peers in another process of this pid namespace: their pid, polled
    /// for liveness while waiting on them.
    peer_pids: Vec<Option<i32>>,
}

impl std::fmt::Debug for HostSymmetricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSymmetricMemory")
            .field("group", &self.group.name())
            .field("rank", &self.rank)
            .field("world", &self.regions.len())
            .field("buffer_size", &self.buffer_size)
            .finish()
    }
}

impl HostSymmetricMemory {
    pub(crate) fn new(
        group: Arc<Group>,
        device: Device,
        buffer_size: usize,
        pad_offset: usize,
        regions: Vec<Arc<Region>>,
        peer_pids: Vec<Option<i32>>,
    ) -> Self {
        let buffer_ptrs = regions.iter().map(|r| r.addr()).collect();
        let pad_ptrs = regions.iter().map(|r| r.addr() + pad_offset as u64).collect();
        HostSymmetricMemory {
            rank: group.rank().get(),
            group,
            device,
            buffer_size,
            pad_offset,
            regions,
            buffer_ptrs,
            pad_ptrs,
            peer_pids,
        }
    }

    fn world(&self) -> usize {
        self.regions.len()
    }

    /// Word `index` of `rank`'s signal pad.
    fn pad_word(&self, rank: usize, index: usize) -> Result<&AtomicU32> {
        let region = self.regions.get(rank).ok_or(Error::OutOfRange {
            what: "rank",
            value: rank as u64,
            limit: self.world() as u64,
        })?;
        if index * 4 >= SIGNAL_PAD_SIZE {
            return Err(Error::OutOfRange {
                what: "pad word",
                value: index as u64,
                limit: (SIGNAL_PAD_SIZE / 4) as u64,
            });
        }
        region.word(self.pad_offset + index * 4)
    }

    fn own(&self, index: usize) -> Result<&AtomicU32> {
        self.pad_word(self.rank, index)
    }

    fn check_rank(&self, what: &'static str, r: Rank) -> Result<usize> {
        if r.get() >= self.world() {
            return Err(Error::OutOfRange {
                what,
                value: r.get() as u64,
                limit: self.world() as u64,
            });
        }
        Ok(r.get())
    }

    fn check_abort(&self, what: impl FnOnce() -> String) -> Result<()> {
        if self.own(pad::ABORT_WORD)?.load(Ordering::Acquire) != 0 {
            return Err(Error::Aborted(what()));
        }
        Ok(())
    }

    /// False once a peer process has exited (gone, or a zombie not yet reaped).
    fn peer_alive(&self, rank: usize) -> bool {
        let Some(pid) = self.peer_pids.get(rank).copied().flatten() else {
            return true;
        };
        symm_store::process::alive(pid)
    }

    /// Acquire-polls `word` until it reaches epoch `target`, the deadline
    /// passes, the abort word is set, or the peer `src` is seen dead.
    fn wait_epoch(
        &self,
        word: &AtomicU32,
        target: u32,
        src: usize,
        deadline: Instant,
        timeout: Duration,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        let abort = self.own(pad::ABORT_WORD)?;
        let mut polls = 0u32;
        let mut next_liveness = Instant::now() + LIVENESS_EVERY;
        loop {
            if pad::epoch_reached(word.load(Ordering::Acquire), target) {
                return Ok(());
            }
            if abort.load(Ordering::Acquire) != 0 {
                return Err(Error::Aborted(what()));
            }
            if polls < SPIN_POLLS {
                polls += 1;
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                if pad::epoch_reached(word.load(Ordering::Acquire), target) {
                    return Ok(());
                }
                return Err(Error::Timeout { what: what(), timeout });
            }
            if now >= next_liveness {
                next_liveness = now + LIVENESS_EVERY;
                if !self.peer_alive(src) {
                    // The peer may have signalled just before exiting.
                    if pad::epoch_reached(word.load(Ordering::Acquire), target) {
                        return Ok(());
                    }
                    return Err(Error::PeerLost {
                        rank: src,
                        reason: format!("process exited while {} waited on it", what()),
                    });
                }
            }
            if polls < SPIN_POLLS + YIELD_POLLS {
                polls += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
    }
}

impl SymmetricMemory for HostSymmetricMemory {
    fn group(&self) -> &Arc<Group> {
        &self.group
    }
    fn device(&self) -> Device {
        self.device
    }
    fn buffer_size(&self) -> usize {
        self.buffer_size
    }
    fn signal_pad_size(&self) -> usize {
        SIGNAL_PAD_SIZE
    }
    fn buffer_ptrs(&self) -> &[u64] {
        &self.buffer_ptrs
    }
    fn signal_pad_ptrs(&self) -> &[u64] {
        &self.pad_ptrs
    }
    fn buffer_ptrs_dev(&self) -> u64 {
        self.buffer_ptrs.as_ptr() as u64
    }
    fn signal_pad_ptrs_dev(&self) -> u64 {
        self.pad_ptrs.as_ptr() as u64
    }

    fn barrier(&self, channel: Channel, timeout: Duration) -> Result<()> {
        let c = channel.get();
        let me = self.rank;
        let deadline = Instant::now() + timeout;
        self.check_abort(|| format!("barrier on {channel} (rank {me})"))?;
        let e = self
            .own(pad::LOCAL_BARRIER_EPOCH + c)?
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        // A rank dying here has signalled nobody: every peer's barrier times out.
        fault_point("barrier.mid")?;
        for p in (0..self.world()).filter(|&p| p != me) {
            self.pad_word(p, pad::barrier_slot(c, me))?.store(e, Ordering::Release);
        }
        for p in (0..self.world()).filter(|&p| p != me) {
            let word = self.own(pad::barrier_slot(c, p))?;
            let what = || format!("barrier on {channel} (rank {me} waiting for rank {p}, epoch {e})");
            self.wait_epoch(word, e, p, deadline, timeout, &what)?;
        }
        Ok(())
    }

    fn put_signal(&self, dst: Rank, channel: Channel, _timeout: Duration) -> Result<()> {
        let c = channel.get();
        let d = self.check_rank("put_signal destination rank", dst)?;
        let me = self.rank;
        self.check_abort(|| format!("put_signal to rank {d} on {channel} (rank {me})"))?;
        let target = self.pad_word(d, pad::signal_slot(c, me))?;
        let e = self
            .own(pad::sent_slot(c, d))?
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        target.store(e, Ordering::Release);
        Ok(())
    }

    fn wait_signal(&self, src: Rank, channel: Channel, timeout: Duration) -> Result<()> {
        let c = channel.get();
        let s = self.check_rank("wait_signal source rank", src)?;
        let me = self.rank;
        let deadline = Instant::now() + timeout;
        let recv = self.own(pad::recv_slot(c, s))?;
        let word = self.own(pad::signal_slot(c, s))?;
        let e = recv.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let what = || format!("wait_signal from rank {s} on {channel} (rank {me}, signal {e})");
        let r = self.wait_epoch(word, e, s, deadline, timeout, &what);
        if r.is_err() {
            // Not received: a later wait waits for the same signal again.
            recv.fetch_sub(1, Ordering::Relaxed);
        }
        r
    }

    fn read_bytes(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.check_rank("read rank", rank)?;
        check_range("read", offset, out.len(), self.buffer_size)?;
        self.regions[r].read(offset, out)
    }

    fn write_bytes(&self, rank: Rank, offset: usize, data: &[u8]) -> Result<()> {
        let r = self.check_rank("write rank", rank)?;
        check_range("write", offset, data.len(), self.buffer_size)?;
        self.regions[r].write(offset, data)
    }

    fn read_signal_pad(&self, rank: Rank, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.check_rank("signal pad rank", rank)?;
        check_range("signal pad read", offset, out.len(), SIGNAL_PAD_SIZE)?;
        self.regions[r].read(self.pad_offset + offset, out)
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        self.own(pad::ABORT_WORD)?.store(u32::from(abort), Ordering::Release);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
