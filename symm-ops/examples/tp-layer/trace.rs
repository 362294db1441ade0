//! The Lamport kernels' timeline inside the layer (`SYMM_TRACE=1`, symm-cuda's NOTE
//! [device-trace]): each rank's records of one timed run, lined up op by op across the ranks,
//! and the medians of each phase.
//!
//! Per op (the k-th launch of every rank), with `%globaltimer` stamps: `skew` the last rank's
//! start minus the first's (start: after the PDL wait); `pdl` entry to start; `push` start to
//! thread 0's first vector in every peer; `arrive` the last peer's data at this rank after the
//! last rank started (the protocol's own cost once everyone is there); `wait` push to arrival
//! (skew plus protocol); `tail` arrival to exit; `kernel` entry to exit; `span` first start to
//! last exit.
//!
//! The GPUs' `%globaltimer`s are not one clock: on 4 x H100 they were hundreds of microseconds
//! apart (round 18). The cross-rank phases (`skew`, `arrive`, `span`) therefore use each rank's
//! offset from rank 0, estimated from the stamps themselves: rank r's data reaches rank p no
//! earlier than r pushed it, so over the ops `min(t_arrived[p] - t_pushed[r]) = latency +
//! off[p] - off[r]` where r was p's last peer at least once, and the same the other way round;
//! half their difference is the offset, half their sum the one-way `latency` (printed).

use symm_ops::symm_cuda::trace::TraceRecord;

/// Medians (and 90th percentiles) of the phases, microseconds.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub ops: usize,
    pub kinds: Vec<u8>,
    /// The one-way latency each rank pair's offset estimate implies (rank r with rank 0), us.
    pub latency: Vec<f64>,
    pub phases: Vec<(&'static str, f64, f64)>,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Lines up `records` (every rank's, each rank's in launch order) op by op; `None` when a rank
/// recorded nothing or the ranks recorded different numbers of ops.
pub fn summarise(records: &[TraceRecord]) -> Option<Summary> {
    let world = records.iter().find(|r| r.exchanges())?.world as usize;
    let mut per_rank: Vec<Vec<&TraceRecord>> = vec![Vec::new(); world];
    // The exchange kernels alone: the separate epilogue kernel's records (kind 5) name no rank.
    for r in records.iter().filter(|r| r.exchanges()) {
        per_rank.get_mut(r.rank as usize)?.push(r);
    }
    let ops = per_rank.iter().map(Vec::len).min()?;
    if ops == 0 || per_rank.iter().any(|v| v.len() != ops) {
        return None;
    }
    // Nanoseconds as signed numbers: the clocks' offsets are removed before any difference.
    let ns = |t: u64| t as i128;
    // min over ops of (arrived at p - pushed by r), ns.
    let min_gap = |p: usize, r: usize| {
        (0..ops)
            .map(|k| ns(per_rank[p][k].t[3]) - ns(per_rank[r][k].t[2]))
            .min()
            .unwrap_or(0)
    };
    let mut off = vec![0i128; world];
    let mut latency = Vec::new();
    for (r, o) in off.iter_mut().enumerate().skip(1) {
        let (a, b) = (min_gap(r, 0), min_gap(0, r));
        *o = (a - b) / 2;
        latency.push((a + b) as f64 / 2e3);
    }
    let t = |r: &TraceRecord, i: usize| ns(r.t[i]) - off[r.rank as usize];
    let us = |a: i128, b: i128| (b - a) as f64 / 1e3;
    let names = ["skew", "pdl", "push", "arrive", "wait", "tail", "kernel", "span"];
    let mut cols: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for k in 0..ops {
        let op: Vec<&TraceRecord> = per_rank.iter().map(|v| v[k]).collect();
        let first_start = op.iter().map(|r| t(r, 1)).min()?;
        let last_start = op.iter().map(|r| t(r, 1)).max()?;
        let last_exit = op.iter().map(|r| t(r, 4)).max()?;
        cols[0].push(us(first_start, last_start));
        cols[7].push(us(first_start, last_exit));
        for r in &op {
            cols[1].push(us(t(r, 0), t(r, 1)));
            cols[2].push(us(t(r, 1), t(r, 2)));
            cols[3].push(us(last_start, t(r, 3)));
            cols[4].push(us(t(r, 2), t(r, 3)));
            cols[5].push(us(t(r, 3), t(r, 4)));
            cols[6].push(us(t(r, 0), t(r, 4)));
        }
    }
    latency.sort_by(|a, b| a.total_cmp(b));
    let mut kinds: Vec<u8> = records.iter().filter(|r| r.exchanges()).map(|r| r.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    Some(Summary {
        ops,
        kinds,
        latency,
        phases: names
            .iter()
            .zip(cols.iter_mut())
            .map(|(n, c)| (*n, pct(c, 0.5), pct(c, 0.9)))
            .collect(),
    })
}

impl Summary {
    /// One line: `ops N entries generic|world: skew 1.23/4.56 ...` (median / p90, us).
    pub fn line(&self) -> String {
        let entries = self
            .kinds
            .iter()
            .map(|k| if *k == 1 { "generic" } else { "world" })
            .collect::<Vec<_>>()
            .join("+");
        let lat = self
            .latency
            .iter()
            .map(|l| format!("{l:.2}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut s = format!("{} ops, {entries} entry, latency {lat} us; us median/p90:", self.ops);
        for (n, m, p) in &self.phases {
            s += &format!(" {n} {m:.2}/{p:.2}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(rank: u8, t: [u64; 5]) -> TraceRecord {
        TraceRecord {
            kind: 2,
            world: 2,
            rank,
            mode: 0,
            count: 8,
            ws: 0,
            t,
        }
    }

    #[test]
    fn ops_line_up_across_ranks_and_clock_offsets_cancel() {
        // Two ops, 0.5 us one-way: in the first rank 1 starts 1 us after rank 0, in the second
        // rank 0 is the late one; each rank receives 0.5 us after its last peer pushed (or right
        // after its own push when the data was already there). Rank 1's clock runs `shift` ahead.
        let ops = |shift: u64| {
            [
                rec(0, [0, 1000, 1500, 3000, 3200]),
                rec(0, [9000, 10000, 10500, 10500, 10700]),
                rec(1, [500 + shift, 2000 + shift, 2500 + shift, 2500 + shift, 2700 + shift]),
                rec(
                    1,
                    [8000 + shift, 9000 + shift, 9500 + shift, 11000 + shift, 11200 + shift],
                ),
            ]
        };
        for shift in [0, 300_000] {
            let s = summarise(&ops(shift)).unwrap();
            let get = |n: &str| s.phases.iter().find(|p| p.0 == n).unwrap().1;
            assert_eq!(s.ops, 2);
            assert!((s.latency[0] - 0.5).abs() < 1e-9, "latency {:?}", s.latency);
            assert!((get("skew") - 1.0).abs() < 1e-9, "skew {}", get("skew"));
            assert!((get("arrive") - 1.0).abs() < 1e-9, "arrive {}", get("arrive"));
            assert!((get("span") - 2.2).abs() < 1e-9, "span {}", get("span"));
        }
        assert!(summarise(&ops(0)[..2]).is_none(), "a rank without records");
    }
}
