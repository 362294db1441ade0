//! The handoff pair's timeline from one rank's trace records (bench-notes round 25): the
//! all-reduce (kinds 1-2; kind 8 its blocks' exits) and, per block of the epilogue half, kind 7's stamps (entry, first
//! preload issued, last row's block sum, last row stored by thread 0, exit after the end wait).
//! Every figure is a difference of one GPU's stamps, relative to the op's all-reduce start.

use super::{median_us, TraceRecord, KIND_HANDOFF_BLOCK, KIND_LAMPORT_BLOCK};

/// Medians over the ops of one rank, in microseconds from the op's all-reduce start (its block
/// 0 past its PDL wait) unless said otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct HandoffTimeline {
    /// Ops with at least one kind-7 record.
    pub ops: usize,
    /// Half blocks an op.
    pub blocks: f64,
    /// The first and the last half block's entry (later than the start: the block waited for an SM).
    pub entry_first: f64,
    pub entry_last: f64,
    /// The first and the last block's block sum of its last row (all its sums taken); NaN
    /// without the norm (no block sum).
    pub sums_first: f64,
    pub sums_last: f64,
    /// The all-reduce's block 0 exit.
    pub ar_exit: f64,
    /// The all-reduce's last block exit (kind 8; NaN without those records).
    pub ar_last: f64,
    /// From the last block sum to the last row stored (NaN without the norm).
    pub epilogue: f64,
    /// From the last row stored to the last half block's exit (the end wait).
    pub end: f64,
    /// From the last half block's exit to the next op's all-reduce start (its launch after the
    /// release and its PDL wait); ops without a next one do not count.
    pub next: f64,
    /// From this op's all-reduce start to the next one's.
    pub period: f64,
}

/// The timeline of the pair in `records` (one rank's, any order); `None` without kind-7 records.
pub fn handoff_timeline(records: &[TraceRecord]) -> Option<HandoffTimeline> {
    let mut ars: Vec<&TraceRecord> = records.iter().filter(|r| r.lamport_launch()).collect();
    ars.sort_by_key(|r| r.t[1]);
    let mut per_op: Vec<Vec<&TraceRecord>> = vec![Vec::new(); ars.len()];
    let mut ar_blocks: Vec<u64> = vec![0; ars.len()];
    for b in records {
        // The op whose all-reduce started last before this half block stored its last row, or
        // this all-reduce block exited (the next op's all-reduce starts after both).
        let at = match b.kind {
            KIND_HANDOFF_BLOCK => b.t[3],
            KIND_LAMPORT_BLOCK => b.t[4],
            _ => continue,
        };
        let i = ars.partition_point(|a| a.t[1] <= at);
        if i == 0 {
            continue;
        }
        if b.kind == KIND_HANDOFF_BLOCK {
            per_op[i - 1].push(b);
        } else {
            ar_blocks[i - 1] = ar_blocks[i - 1].max(b.t[4]);
        }
    }
    let us = |a: u64, b: u64| (b as f64 - a as f64) / 1e3;
    let mut cols: [Vec<f64>; 11] = Default::default();
    let mut ops = 0;
    for (i, blocks) in per_op.iter().enumerate() {
        if blocks.is_empty() {
            continue;
        }
        ops += 1;
        let s = ars[i].t[1];
        let min = |k: usize| blocks.iter().map(|b| b.t[k]).min().unwrap_or(s);
        let max = |k: usize| blocks.iter().map(|b| b.t[k]).max().unwrap_or(s);
        // Without the norm there is no block sum (stamp 2 stays 0): no sums, no epilogue.
        let summed = blocks.iter().all(|b| b.t[2] != 0);
        let or_nan = |ok: bool, v: f64| if ok { v } else { f64::NAN };
        let vals = [
            blocks.len() as f64,
            us(s, min(0)),
            us(s, max(0)),
            or_nan(summed, us(s, min(2))),
            or_nan(summed, us(s, max(2))),
            us(s, ars[i].t[4]),
            if ar_blocks[i] == 0 {
                f64::NAN
            } else {
                us(s, ar_blocks[i])
            },
            or_nan(summed, us(max(2), max(3))),
            us(max(3), max(4)),
        ];
        for (c, v) in cols.iter_mut().zip(vals) {
            c.push(v);
        }
        if let Some(n) = ars.get(i + 1) {
            cols[9].push(us(max(4), n.t[1]));
            cols[10].push(us(s, n.t[1]));
        }
    }
    if ops == 0 {
        return None;
    }
    let [blocks, entry_first, entry_last, sums_first, sums_last, ar_exit, ar_last, epilogue, end, next, period] =
        cols.map(median_us);
    Some(HandoffTimeline {
        ops,
        blocks,
        entry_first,
        entry_last,
        sums_first,
        sums_last,
        ar_exit,
        ar_last,
        epilogue,
        end,
        next,
        period,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::tests::rec;

    /// Three ops 10 us apart, each an all-reduce and two half blocks (the second entering 3 us
    /// late), shuffled: each figure is the construction's.
    #[test]
    fn timeline_of_three_ops() {
        let mut v = Vec::new();
        for i in 0..3u64 {
            let b = 1_000_000 + i * 10_000;
            // All-reduce: entry 0.2 us before its start; block 0 exits at +4.0.
            v.push(rec(2, [b - 200, b, b + 300, b + 3000, b + 4000]));
            // Block A enters at +0.5, sums at +3.5, stored +3.9, exits +4.3.
            v.push(rec(7, [b + 500, b + 600, b + 3500, b + 3900, b + 4300]));
            // Block B enters at +3.0 (no SM before), sums at +4.2, stored +4.8, exits +5.0.
            v.push(rec(7, [b + 3000, b + 3100, b + 4200, b + 4800, b + 5000]));
            // The all-reduce's other block exits at +4.1 (then block 0's own kind-8 record).
            v.push(rec(8, [b - 100, b + 100, 0, 0, b + 4100]));
            v.push(rec(8, [b - 200, b, 0, 0, b + 4000]));
            // Noise the timeline ignores: the separate kernel and the half's block-0 record.
            v.push(rec(6, [b + 500, b + 500, b + 3500, b + 3900, b + 5000]));
            v.push(rec(5, [b + 6000, b + 6000, b + 6000, b + 6000, b + 6500]));
        }
        v.reverse();
        let t = handoff_timeline(&v).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert_eq!(t.ops, 3);
        assert!(
            close(t.blocks, 2.0) && close(t.entry_first, 0.5) && close(t.entry_last, 3.0),
            "{t:?}"
        );
        assert!(
            close(t.sums_first, 3.5) && close(t.sums_last, 4.2) && close(t.ar_exit, 4.0),
            "{t:?}"
        );
        assert!(close(t.ar_last, 4.1), "{t:?}");
        // Without the norm (no block sum, stamp 2 left 0) the blocks still line up by their
        // stores: no sums, the rest as before.
        let plain: Vec<TraceRecord> = v
            .iter()
            .map(|r| {
                let mut r = *r;
                if r.kind == 7 {
                    r.t[2] = 0;
                }
                r
            })
            .collect();
        let p = handoff_timeline(&plain).unwrap();
        assert_eq!(p.ops, 3);
        assert!(
            p.sums_first.is_nan() && p.sums_last.is_nan() && p.epilogue.is_nan(),
            "{p:?}"
        );
        assert!(
            close(p.end, 0.2) && close(p.next, 5.0) && close(p.ar_last, 4.1),
            "{p:?}"
        );
        assert!(close(t.epilogue, 0.6) && close(t.end, 0.2), "{t:?}");
        // The last block exits at +5.0; the next all-reduce starts at +10.0.
        assert!(close(t.next, 5.0) && close(t.period, 10.0), "{t:?}");
        assert!(handoff_timeline(&v.iter().filter(|r| r.kind != 7).copied().collect::<Vec<_>>()).is_none());
    }
}
