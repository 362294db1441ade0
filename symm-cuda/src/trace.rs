//! The host side of NOTE [device-trace] (symm-core's `kernels/collectives.cu`): with
//! `SYMM_TRACE=1` ([`knobs::trace`]) the collectives module is compiled with `COLL_TRACE` and
//! every Lamport launch stamps `%globaltimer` at its phases into one buffer per context. A
//! diagnostic for timelines inside a model step (bench-notes round 18), not a feature: without
//! the switch nothing here runs and the kernels' code is unchanged.
//!
//! [`take`] waits for the context's control stream, reads the records and empties the buffer
//! (take once before the work of interest, to drop what ran earlier, and once after). Timestamps
//! are the device's `%globaltimer` in nanoseconds; GPUs of one host keep it within about a
//! microsecond of each other (the reader can bound the offset from the stamps themselves: a
//! rank's data arrives after its peers pushed it).

#![forbid(unsafe_code)]

mod handoff;

pub use handoff::{handoff_timeline, HandoffTimeline};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use symm_core::{Error, Result};

use crate::driver::from_driver;
use crate::driver::mem::{dtoh_sync, htod_sync};
use crate::knobs;
use crate::streams::{self, HOST_COPY_TIMEOUT};

/// u64 words per record (`COLL_TRACE_WORDS`).
pub const WORDS: usize = 8;
/// Records one buffer holds (`COLL_TRACE_CAP`; 64 MiB of device memory a traced context): the
/// per-block kinds 7 and 8 write up to ~160 records an op. Later records are dropped and
/// [`take`] fails.
pub const CAP: usize = 1 << 20;

/// The define the collectives module is compiled with when tracing ("" otherwise).
pub(crate) fn defines() -> &'static str {
    if knobs::trace() {
        "#define COLL_TRACE 1\n"
    } else {
        ""
    }
}

/// Kind of the records of every block of the handoff pair's epilogue half.
pub const KIND_HANDOFF_BLOCK: u8 = 7;
/// Kind of the records of every block of a Lamport all-reduce (kinds 1-2 are its launches).
pub const KIND_LAMPORT_BLOCK: u8 = 8;

/// One launch's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// 1: the generic Lamport entry; 2: an entry specialised for its world size; 3: the generic
    /// fused Lamport epilogue; 4: its entry for one world size; 5: the separate epilogue kernel (no
    /// exchange: its `rank` is 0 and its `ws` the residual's address); 6: the handoff pair's
    /// epilogue half (NOTE [fused-epilogue] "handoff"; stamps: entry, start (no PDL wait there),
    /// thread 0's first vector taken from HANDOFF, block 0's first row stored, exit after its
    /// final wait for the all-reduce: so `push` is the wait for the sums, `wait` the epilogue,
    /// `tail` the wait for the all-reduce to complete); 7: one block of that half (thread 0's
    /// stamps: entry, its first row's preload issued, its last row's block sum, its last row
    /// stored, exit after the end wait; [`handoff_timeline`] reads them, [`phases_by_kind`]
    /// leaves them out); 8: one block of a Lamport all-reduce (kinds 1-2; entry, start, exit;
    /// stamps 2 and 3 are block 0's only).
    pub kind: u8,
    pub world: u8,
    pub rank: u8,
    /// `COLL_MODE_*` (0 all-reduce, 1 reduce-scatter, 2 all-gather).
    pub mode: u8,
    /// Elements per peer slot.
    pub count: u64,
    /// The launching rank's workspace base (tells groups and ranks sharing a context apart).
    pub ws: u64,
    /// Entry (before the PDL wait), start (after it), thread 0's first vector pushed (fused:
    /// thread 0 of block 0 pushed all of its vectors), thread 0's first vector received from every peer,
    /// thread 0's exit; `%globaltimer` ns. The separate epilogue kernel repeats the start.
    pub t: [u64; 5],
}

impl TraceRecord {
    /// A kernel that exchanges data with the peers (kinds 1-4), whose `rank` is its rank.
    pub fn exchanges(&self) -> bool {
        (1..=4).contains(&self.kind)
    }

    /// A Lamport all-reduce launch (kinds 1-2: the generic entry, or one world's).
    pub fn lamport_launch(&self) -> bool {
        (1..=2).contains(&self.kind)
    }

    /// One block's record ([`KIND_HANDOFF_BLOCK`], [`KIND_LAMPORT_BLOCK`]), not a launch's.
    pub fn per_block(&self) -> bool {
        self.kind == KIND_HANDOFF_BLOCK || self.kind == KIND_LAMPORT_BLOCK
    }
}

/// One kind's phases over the launches of ONE rank (one context per rank, as on distinct GPUs),
/// medians in microseconds. Every phase is a difference of one GPU's own stamps, so no clock
/// offset between GPUs enters.
#[derive(Debug, Clone, PartialEq)]
pub struct KindPhases {
    pub kind: u8,
    /// Launches of this kind (those with a launch after them for `gap`).
    pub launches: usize,
    /// Entry to start: the PDL wait for the kernel before.
    pub pdl: f64,
    /// Start to the push stamp.
    pub push: f64,
    /// Push stamp to the arrival of thread 0's first vector from every peer.
    pub wait: f64,
    /// Arrival to exit (the reduction and, fused, the epilogue).
    pub tail: f64,
    /// Start to exit.
    pub kernel: f64,
    /// This launch's exit to the next launch's start (whatever its kind): what the boundary
    /// between two kernels costs.
    pub gap: f64,
}

fn median_us(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The phases of one rank's `records` (any order: sorted here by start), per kind, in kind
/// order. Launches are paired with the next one started, so the last launch counts only in the
/// phases inside it.
pub fn phases_by_kind(records: &[TraceRecord]) -> Vec<KindPhases> {
    let mut r: Vec<&TraceRecord> = records.iter().filter(|x| !x.per_block()).collect();
    r.sort_by_key(|x| x.t[1]);
    let us = |a: u64, b: u64| (b as f64 - a as f64) / 1e3;
    let mut kinds: Vec<u8> = r.iter().map(|x| x.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|k| {
            let mine: Vec<(usize, &&TraceRecord)> = r.iter().enumerate().filter(|(_, x)| x.kind == k).collect();
            let phase = |f: &dyn Fn(&TraceRecord) -> f64| median_us(mine.iter().map(|(_, x)| f(x)).collect());
            let gaps: Vec<f64> = mine
                .iter()
                .filter_map(|(i, x)| r.get(i + 1).map(|n| us(x.t[4], n.t[1])))
                .collect();
            KindPhases {
                kind: k,
                launches: mine.len(),
                pdl: phase(&|x| us(x.t[0], x.t[1])),
                push: phase(&|x| us(x.t[1], x.t[2])),
                wait: phase(&|x| us(x.t[2], x.t[3])),
                tail: phase(&|x| us(x.t[3], x.t[4])),
                kernel: phase(&|x| us(x.t[1], x.t[4])),
                gap: median_us(gaps),
            }
        })
        .collect()
}

impl TraceRecord {
    fn decode(w: &[u64]) -> TraceRecord {
        TraceRecord {
            kind: w[0] as u8,
            world: (w[0] >> 8) as u8,
            rank: (w[0] >> 16) as u8,
            mode: (w[0] >> 24) as u8,
            count: w[1],
            ws: w[2],
            t: [w[3], w[4], w[5], w[6], w[7]],
        }
    }
}

struct Buf {
    stream: Arc<CudaStream>,
    buf: CudaSlice<u64>,
    module: Arc<CudaModule>,
}

fn bufs() -> &'static Mutex<HashMap<usize, Buf>> {
    static B: OnceLock<Mutex<HashMap<usize, Buf>>> = OnceLock::new();
    B.get_or_init(Default::default)
}

fn ctx_key(ctx: &Arc<CudaContext>) -> usize {
    ctx.cu_ctx() as usize
}

fn write_global(b: &Buf, name: &str, bytes: &[u8]) -> Result<()> {
    let mut g = b
        .module
        .get_global(name, &b.stream)
        .map_err(|e| from_driver(e, "cuModuleGetGlobal"))?;
    if g.len() < bytes.len() {
        return Err(Error::InvalidArgument(format!(
            "trace global {name} has {} bytes, not {}",
            g.len(),
            bytes.len()
        )));
    }
    let (ptr, _sync) = g.device_ptr_mut(&b.stream);
    htod_sync(&b.stream, ptr, bytes)
}

/// Gives `module` (the collectives of `ctx`, compiled with [`defines`]) the context's trace
/// buffer, made at the first call. Nothing when tracing is off.
pub(crate) fn install(ctx: &Arc<CudaContext>, module: &Arc<CudaModule>) -> Result<()> {
    if !knobs::trace() {
        return Ok(());
    }
    let mut m = bufs().lock().unwrap_or_else(|e| e.into_inner());
    if m.contains_key(&ctx_key(ctx)) {
        return Ok(());
    }
    let stream = streams::control(ctx)?;
    let buf = stream
        .alloc_zeros::<u64>(WORDS * (CAP + 1))
        .map_err(|e| from_driver(e, "allocating the trace buffer"))?;
    let ptr = buf.device_ptr(&stream).0;
    let b = Buf {
        stream,
        buf,
        module: module.clone(),
    };
    write_global(&b, "symm_trace_buf", &ptr.to_le_bytes())?;
    m.insert(ctx_key(ctx), b);
    Ok(())
}

/// The records of `ctx` (in the order the launches took their slots) and an empty buffer
/// afterwards; empty when tracing is off. Waits for the control stream (at most
/// [`HOST_COPY_TIMEOUT`]): call it after the traced work finished. `OutOfRange` (the buffer
/// emptied all the same) when more records were written than [`CAP`]: a partial timeline would
/// describe only the first launches.
pub fn take(ctx: &Arc<CudaContext>) -> Result<Vec<TraceRecord>> {
    let m = bufs().lock().unwrap_or_else(|e| e.into_inner());
    let Some(b) = m.get(&ctx_key(ctx)) else {
        return Ok(Vec::new());
    };
    streams::wait_idle(&b.stream, HOST_COPY_TIMEOUT, "reading the device trace")?;
    let base = b.buf.device_ptr(&b.stream).0;
    let mut head = [0u8; 8];
    dtoh_sync(&b.stream, &mut head, base)?;
    let written = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if written > CAP {
        htod_sync(&b.stream, base, &[0u8; 8])?;
        return Err(Error::OutOfRange {
            what: "device trace records since the last take (take more often)",
            value: written as u64,
            limit: CAP as u64,
        });
    }
    let mut raw = vec![0u8; written * WORDS * 8];
    dtoh_sync(&b.stream, &mut raw, base + (WORDS * 8) as u64)?;
    htod_sync(&b.stream, base, &[0u8; 8])?;
    let words: Vec<u64> = raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect();
    Ok(words.chunks_exact(WORDS).map(TraceRecord::decode).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of rank 0 of two (the timeline tests of `handoff` use it too).
    pub(super) fn rec(kind: u8, t: [u64; 5]) -> TraceRecord {
        TraceRecord {
            kind,
            world: 2,
            rank: 0,
            mode: 0,
            count: 1,
            ws: 0,
            t,
        }
    }

    /// Lamport (kind 2) then the separate epilogue (kind 5), three times, recorded out of order:
    /// each kind's phases, and the gap to whichever kernel starts next.
    #[test]
    fn phases_of_alternating_kernels() {
        let mut v = Vec::new();
        for i in 0..3u64 {
            let b = i * 10_000;
            // Lamport: pdl 0.5 us, push 0.3, wait 1.2, tail 0.4 (kernel 1.9); the epilogue
            // starts 0.8 us after its exit.
            v.push(rec(2, [b, b + 500, b + 800, b + 2000, b + 2400]));
            // Epilogue: pdl 2.0, kernel 1.1; the next Lamport starts 10 us after the last one.
            v.push(rec(5, [b + 1200, b + 3200, b + 3200, b + 3200, b + 4300]));
        }
        v.reverse();
        let p = phases_by_kind(&v);
        assert_eq!(p.len(), 2);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let (l, e) = (&p[0], &p[1]);
        assert_eq!((l.kind, l.launches, e.kind, e.launches), (2, 3, 5, 3));
        assert!(close(l.pdl, 0.5) && close(l.push, 0.3) && close(l.wait, 1.2) && close(l.tail, 0.4));
        assert!(close(l.kernel, 1.9) && close(l.gap, 0.8), "{l:?}");
        assert!(close(e.pdl, 2.0) && close(e.kernel, 1.1) && close(e.push, 0.0));
        // 4.3 -> 10.5: 6.2 us (two gaps; the last epilogue has no launch after it).
        assert!(close(e.gap, 6.2), "{e:?}");
    }
}
