//! The selection table as text: what each op runs at each size, on registered and on other
//! buffers.

use symm_core::{AllGatherKernel, AllReduceKernel, DType, ReduceScatterKernel};

use super::thresholds::{KIB, MIB};
use super::{Bufs, EngineKind, Plan, Selector};

impl Selector {
    /// The sizes at which the all-reduce table may change its pick (the last byte of each
    /// range; `usize::MAX`-like values for thresholds that are off).
    fn all_reduce_bounds(&self) -> [usize; 8] {
        let t = &self.thresholds;
        [
            t.lamport_max_bytes,
            t.lamport_two_shot_min_bytes.saturating_sub(1),
            t.lamport_two_shot_max_bytes,
            t.one_shot_max_bytes,
            t.two_shot_max_bytes,
            t.all_reduce_pull_min_bytes.saturating_sub(1),
            t.all_reduce_pull_max_bytes,
            t.all_reduce_ce_min_bytes.saturating_sub(1),
        ]
    }

    /// The all-reduce epilogues' lines of [`Self::table`] (NOTE [fused-epilogue]): the
    /// all-reduce rows' pick then the epilogue kernel, or the fused kernel ([`Self::epilogue`]).
    pub fn epilogue_table(&self) -> String {
        let mut s = String::new();
        let mut edges = self.all_reduce_bounds().to_vec();
        edges.push(self.thresholds.epilogue_fused_max_bytes.min(self.lamport_slot));
        // By bytes, for rows the handoff pair does not take (its rule follows the block).
        let bytes_only = Selector {
            handoff_bytes: 0,
            ..self.clone()
        };
        block(
            &mut s,
            "all_reduce_residual[_rms_norm] (bytes of x)",
            &bounds(&edges),
            |bytes| match bytes_only.epilogue(1, bytes) {
                crate::EpilogueAlgo::Fused => "fused (lamport one-shot + epilogue, one kernel)".to_string(),
                crate::EpilogueAlgo::Separate(_) => {
                    let row = |reg| format!("{}, then the epilogue", self.all_reduce_row(bytes, reg));
                    Self::cell(row(true), row(false))
                }
                crate::EpilogueAlgo::Auto => "auto".to_string(),
            },
        );
        // The pair runs where the table picks the Lamport one-shot: below the two-shot's rows.
        let t = &self.thresholds;
        let below_two_shot = if t.lamport_two_shot_max_bytes >= t.lamport_two_shot_min_bytes {
            t.lamport_two_shot_min_bytes.saturating_sub(1)
        } else {
            usize::MAX
        };
        let h = self
            .handoff_bytes
            .min(self.lamport_slot)
            .min(self.thresholds.lamport_max_bytes)
            .min(below_two_shot);
        if h > 0 && self.fuses() && self.world > 1 {
            let wide = match self.thresholds.epilogue_handoff_wide_max_rows {
                usize::MAX => String::new(),
                0 => format!(
                    " (not rows of {} vectors a thread: those run the table's all-reduce, then the \
                     epilogue kernel)",
                    symm_core::coll::add_rms::PRELOADED_VECTORS
                ),
                n => format!(
                    " (rows of {} vectors a thread only up to {n} of them; more: the table's \
                     all-reduce, then the epilogue kernel)",
                    symm_core::coll::add_rms::PRELOADED_VECTORS
                ),
            };
            s.push_str(&format!(
                "  and up to {}, rows of at most {} vectors of 16 bytes a thread (a row of at most {} bytes){wide}: \
                 fused as the handoff pair (the lamport all-reduce, then the epilogue overlapping it)\n",
                human(h),
                symm_core::coll::add_rms::PRELOADED_VECTORS,
                human(symm_core::coll::add_rms::handoff_max_row_bytes()),
            ));
        }
        s
    }

    /// The all-reduce plan of `bytes` picked by the table, for buffers in registered symmetric
    /// memory (input and output, apart) or for any other buffers, described for the table.
    fn all_reduce_row(&self, bytes: usize, registered: bool) -> String {
        let b = Bufs {
            in_place: false,
            apart: true,
            registered: &|_| registered,
        };
        self.describe_all_reduce(self.plan_all_reduce(self.all_reduce(bytes), bytes, &b))
    }

    /// A table cell: the plan for registered buffers, and for other buffers where it differs.
    fn cell(reg: String, other: String) -> String {
        if reg == other {
            reg
        } else {
            format!("{reg} | other buffers: {other}")
        }
    }

    /// An all-reduce plan as the table says it.
    fn describe_all_reduce(&self, p: Plan<AllReduceKernel>) -> String {
        let host = if self.engine == EngineKind::Host { "host " } else { "" };
        let k = match p {
            Plan::Nccl => return "nccl".into(),
            Plan::Kernel(k) => k,
        };
        let what = match k {
            AllReduceKernel::Lamport => "lamport (one-shot, data as flag)",
            AllReduceKernel::OneShot => "one-shot",
            AllReduceKernel::TwoShot => "two-shot",
            AllReduceKernel::Pull => "zero-copy pull",
            AllReduceKernel::PullTwoShot => "zero-copy two-shot pull",
            AllReduceKernel::CopyEnginePull => "zero-copy pull with the copy engine",
            AllReduceKernel::CopyEngineTwoShot => "zero-copy copy-engine two-shot",
            AllReduceKernel::LamportTwoShot => "lamport two-shot (data as flag)",
            _ => k.name(),
        };
        format!("{host}{what}")
    }

    /// The table as text, one block per op: what each op runs at each size, on buffers in
    /// registered symmetric memory and (where it differs) on any other buffers.
    pub fn table(&self, header: &str) -> String {
        let t = &self.thresholds;
        let host = self.engine == EngineKind::Host;
        let mut s = String::new();
        s.push_str(header);
        s.push('\n');
        let ar = bounds(&self.all_reduce_bounds());
        block(&mut s, "all_reduce (bytes of the tensor)", &ar, |b| {
            Self::cell(self.all_reduce_row(b, true), self.all_reduce_row(b, false))
        });
        // A rank's part fills the Lamport slots at `lamport_slot * world` bytes of whole tensor.
        let slots = self.lamport_slot.saturating_mul(self.world);
        let rs = bounds(&[
            t.reduce_scatter_max_bytes,
            t.reduce_scatter_pull_min_bytes.saturating_sub(1),
            t.reduce_scatter_lamport_max_bytes,
            slots,
        ]);
        let rs_row = |b: usize, reg: bool| {
            let p = self.plan_reduce_scatter(self.reduce_scatter(b), b, &|| reg);
            match p {
                Plan::Kernel(_) if host => "host (read every peer's segment, reduce)".to_string(),
                Plan::Kernel(ReduceScatterKernel::Lamport) => "lamport (data as flag)".to_string(),
                Plan::Kernel(ReduceScatterKernel::Pull) => "zero-copy pull".to_string(),
                p => p.to_string(),
            }
        };
        block(&mut s, "reduce_scatter (bytes of the unreduced input)", &rs, |b| {
            Self::cell(rs_row(b, true), rs_row(b, false))
        });
        let ag = bounds(&[
            t.all_gather_max_bytes,
            t.all_gather_pull_min_bytes.saturating_sub(1),
            t.all_gather_pull_max_bytes,
            t.all_gather_copy_engine_min_bytes.saturating_sub(1),
            t.all_gather_lamport_max_bytes,
            slots,
        ]);
        let ag_row = |b: usize, reg: bool| {
            let bufs = Bufs {
                in_place: false,
                apart: true,
                registered: &|_| reg,
            };
            match self.plan_all_gather(self.all_gather(b), b, DType::F32, &bufs) {
                Plan::Kernel(_) if host => "host (read every peer's input)".to_string(),
                Plan::Kernel(AllGatherKernel::Lamport) => {
                    "lamport (data as flag; f32 / f16 / bf16, else ring)".to_string()
                }
                Plan::Kernel(AllGatherKernel::Pull) => "zero-copy pull".to_string(),
                Plan::Kernel(AllGatherKernel::CopyEnginePush) => "copy-engine push".to_string(),
                p => p.to_string(),
            }
        };
        block(&mut s, "all_gather (bytes of the gathered output)", &ag, |b| {
            Self::cell(ag_row(b, true), ag_row(b, false))
        });
        s
    }
}

/// Human size: "512 KiB", "8 MiB", "1000 B".
pub(crate) fn human(bytes: usize) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

/// The ranges' upper bounds of a table block, sorted and deduplicated; `usize::MAX` (and
/// `MAX - 1` from "min" thresholds) mean "no limit" and are left out.
fn bounds(extra: &[usize]) -> Vec<usize> {
    let mut b: Vec<usize> = extra.iter().copied().filter(|&x| x < usize::MAX / 2).collect();
    b.sort_unstable();
    b.dedup();
    b
}

/// One block of the table: rows `bytes <= bound` over the sorted upper
/// bounds, then "larger"; adjacent rows with the same algorithm merge.
fn block(s: &mut String, title: &str, bounds: &[usize], pick: impl Fn(usize) -> String) {
    s.push_str("  ");
    s.push_str(title);
    s.push('\n');
    // (upper bound inclusive or None for unbounded, algorithm); the probe
    // for a range is its upper end (or one past the last bound).
    let mut rows: Vec<(Option<usize>, String)> = Vec::new();
    let mut lo = 1usize;
    for &b in bounds {
        if b < lo {
            continue;
        }
        rows.push((Some(b), pick(b)));
        lo = b.saturating_add(1);
    }
    rows.push((None, pick(lo)));
    let mut merged: Vec<(Option<usize>, String)> = Vec::new();
    for (b, a) in rows {
        match merged.last_mut() {
            Some(last) if last.1 == a => last.0 = b,
            _ => merged.push((b, a)),
        }
    }
    let n = merged.len();
    for (b, a) in merged {
        let range = match b {
            Some(b) if b % KIB != 0 && (b + 1) % KIB == 0 => format!("< {}", human(b + 1)),
            Some(b) => format!("<= {}", human(b)),
            None if n == 1 => "any size".to_string(),
            None => "larger".to_string(),
        };
        s.push_str(&format!("    {range:<14} {a}\n"));
    }
}
