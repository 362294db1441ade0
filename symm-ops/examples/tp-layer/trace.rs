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

use symm_ops::symm_cuda::trace::TraceRecord;

/// Medians (and 90th percentiles) of the phases, microseconds.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub ops: usize,
    pub kinds: Vec<u8>,
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
    let world = records.first()?.world as usize;
    let mut per_rank: Vec<Vec<&TraceRecord>> = vec![Vec::new(); world];
    for r in records {
        per_rank.get_mut(r.rank as usize)?.push(r);
    }
    let ops = per_rank.iter().map(Vec::len).min()?;
    if ops == 0 || per_rank.iter().any(|v| v.len() != ops) {
        return None;
    }
    let us = |a: u64, b: u64| (b as f64 - a as f64) / 1e3;
    let names = ["skew", "pdl", "push", "arrive", "wait", "tail", "kernel", "span"];
    let mut cols: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for k in 0..ops {
        let op: Vec<&TraceRecord> = per_rank.iter().map(|v| v[k]).collect();
        let first_start = op.iter().map(|r| r.t[1]).min()?;
        let last_start = op.iter().map(|r| r.t[1]).max()?;
        let last_exit = op.iter().map(|r| r.t[4]).max()?;
        cols[0].push(us(first_start, last_start));
        cols[7].push(us(first_start, last_exit));
        for r in &op {
            cols[1].push(us(r.t[0], r.t[1]));
            cols[2].push(us(r.t[1], r.t[2]));
            cols[3].push(us(last_start, r.t[3]));
            cols[4].push(us(r.t[2], r.t[3]));
            cols[5].push(us(r.t[3], r.t[4]));
            cols[6].push(us(r.t[0], r.t[4]));
        }
    }
    let mut kinds: Vec<u8> = records.iter().map(|r| r.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    Some(Summary {
        ops,
        kinds,
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
        let mut s = format!("{} ops, {entries} entry; us median/p90:", self.ops);
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
    fn ops_line_up_across_ranks() {
        // Rank 1 starts 1 us after rank 0; each pushes in 0.5 us, receives 1 us after the last
        // start, exits 0.2 us later.
        let r = [
            rec(0, [0, 1000, 1500, 3000, 3200]),
            rec(1, [500, 2000, 2500, 3000, 3200]),
        ];
        let s = summarise(&r).unwrap();
        let get = |n: &str| s.phases.iter().find(|p| p.0 == n).unwrap().1;
        assert_eq!(s.ops, 1);
        assert!((get("skew") - 1.0).abs() < 1e-9);
        assert!((get("arrive") - 1.0).abs() < 1e-9);
        assert!((get("span") - 2.2).abs() < 1e-9);
        assert!(summarise(&r[..1]).is_none(), "a rank without records");
    }
}
