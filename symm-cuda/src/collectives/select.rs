//! The `Auto` choices: which algorithm an all-reduce, reduce-scatter or all-gather runs, by
//! message size, world size and the workspace's Lamport buffers ([`Selection`]'s thresholds).
//! Pure functions of collectively agreed values, so every rank picks the same; the launch
//! geometry of what they pick is in [`super::plan`].

#![forbid(unsafe_code)]

use symm_core::DType;

use super::layout::WorkspaceLayout;
use super::CudaCollectives;

/// All-reduce algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllReduceAlgo {
    /// Picked by size and world size ([`Selection`]); never the copy-engine path.
    Auto,
    /// One-shot push, data as flag (no barrier); messages up to the Lamport buffer size.
    Lamport,
    /// One-shot push through the ring: every rank pushes its input to every peer, a release flag
    /// per chunk, and reduces what it received; any size (chunked with flow control).
    OneShot,
    /// Reduce-scatter then all-gather through the ring (in place works).
    TwoShot,
    /// Zero-copy pull: the input must lie in symmetric memory registered with the object, at the
    /// same offset on every rank; the copy engine copies the peers' inputs (a fraction of them,
    /// [`super::Tuning::ce_fraction`]) while the reduction kernel reads the rest directly. Barriers
    /// before and after. With a fraction of 0 (the default) it is [`AllReduceAlgo::Pull`].
    CopyEngine,
    /// Zero-copy SM pull in one kernel (opening barrier, work, closing barrier). Every rank reads
    /// every peer's input over NVLink and reduces it (the input in registered symmetric memory,
    /// at the same offset on every rank, out of place); from three ranks on, when the output is
    /// registered too, the two-shot pull: each rank reduces its shard from every input and
    /// writes it into every output (in place allowed).
    Pull,
}

impl AllReduceAlgo {
    pub const ALL: [AllReduceAlgo; 6] = [
        AllReduceAlgo::Auto,
        AllReduceAlgo::Lamport,
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::CopyEngine,
        AllReduceAlgo::Pull,
    ];
    pub fn name(self) -> &'static str {
        match self {
            AllReduceAlgo::Auto => "auto",
            AllReduceAlgo::Lamport => "lamport",
            AllReduceAlgo::OneShot => "one_shot",
            AllReduceAlgo::TwoShot => "two_shot",
            AllReduceAlgo::CopyEngine => "copy_engine",
            AllReduceAlgo::Pull => "pull",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// All-gather data paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllGatherPath {
    /// [`Selection`]: Lamport for small messages, else the SM ring.
    Auto,
    /// Data as flag through the Lamport buffers (f32 / f16 / bf16 only; an input lane holding the
    /// all-ones NaN arrives as another NaN).
    Lamport,
    /// Push through the ring by SMs.
    Sm,
    /// Copy engine (`cuMemcpyDtoDAsync` on a side stream), barriers around: a zero-copy push
    /// into every peer's output when the output lies in registered symmetric memory (in place
    /// or not; the same offset on every rank), else a zero-copy pull from the peers' inputs when
    /// the input does, else staged through the workspace in rounds.
    CopyEngine,
    /// Zero-copy SM pull in one kernel (opening barrier, every rank copies every peer's input
    /// over NVLink, closing barrier): the input must lie in registered symmetric memory, at the
    /// same offset on every rank.
    Pull,
}

impl AllGatherPath {
    pub const ALL: [AllGatherPath; 5] = [
        AllGatherPath::Auto,
        AllGatherPath::Lamport,
        AllGatherPath::Sm,
        AllGatherPath::CopyEngine,
        AllGatherPath::Pull,
    ];
    pub fn name(self) -> &'static str {
        match self {
            AllGatherPath::Auto => "auto",
            AllGatherPath::Lamport => "lamport",
            AllGatherPath::Sm => "sm",
            AllGatherPath::CopyEngine => "copy_engine",
            AllGatherPath::Pull => "pull",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// Reduce-scatter algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceScatterAlgo {
    /// [`Selection`]: Lamport for small messages, else the ring.
    Auto,
    /// Data as flag through the Lamport buffers.
    Lamport,
    /// Chunked push through the ring.
    Ring,
}

impl ReduceScatterAlgo {
    pub const ALL: [ReduceScatterAlgo; 3] = [
        ReduceScatterAlgo::Auto,
        ReduceScatterAlgo::Lamport,
        ReduceScatterAlgo::Ring,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ReduceScatterAlgo::Auto => "auto",
            ReduceScatterAlgo::Lamport => "lamport",
            ReduceScatterAlgo::Ring => "ring",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// Size thresholds of the `Auto` choices (bytes).
///
/// Start from [`Selection::default`] and set fields (the struct is `#[non_exhaustive]`: fields
/// may be added).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Selection {
    /// All-reduce, two ranks: Lamport up to this message size (capped by the Lamport buffers).
    /// 2 x H200, pipelined Lamport kernel (bench-notes.md, round 5): 15.8 us at 4 MiB, 28.4 at 8,
    /// 53.1 at 16 against the zero-copy pull's 19.2 / 32.1 / 57.3 and NCCL's 32.5 / 44.9 / 71.9.
    pub lamport_max: usize,
    /// All-reduce, more than two ranks: Lamport up to this size (every rank pushes the whole
    /// message to every peer; unmeasured, kept at the PyTorch / vLLM one-shot bound).
    pub lamport_max_multi: usize,
    /// All-reduce, more than two ranks: one-shot up to this size, two-shot above.
    pub one_shot_max: usize,
    /// Reduce-scatter / all-gather: Lamport up to this size of the whole tensor (the unreduced
    /// input / the gathered output, as nccl-tests counts), if one rank's part fits a Lamport slot.
    /// 2 x H200 at 16 / 32 MiB: Lamport RS 30.1 / 54.7 us, AG 28.5 / 53.4, against the pulls'
    /// 32.6 / 57.9 and 32.2 / 58.1 (bench-notes.md, round 5).
    pub rs_ag_lamport_max: usize,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            lamport_max: 16 << 20,
            lamport_max_multi: 1 << 20,
            one_shot_max: 256 << 10,
            rs_ag_lamport_max: 32 << 20,
        }
    }
}

/// Whether `Auto` runs a reduce-scatter / all-gather through the Lamport buffers: `part` bytes
/// per rank, `world` ranks.
pub fn rs_ag_use_lamport(part: usize, world: usize, layout: &WorkspaceLayout, sel: &Selection) -> bool {
    world > 1 && part <= layout.lamport_max_bytes() && part.saturating_mul(world) <= sel.rs_ag_lamport_max
}

/// The algorithm `Auto` runs. With two ranks one-shot and two-shot move the same bytes over
/// NVLink and one-shot has one phase less, so two-shot is only chosen for more ranks.
pub fn select_all_reduce(bytes: usize, world: usize, layout: &WorkspaceLayout, sel: &Selection) -> AllReduceAlgo {
    if world == 1 {
        return AllReduceAlgo::OneShot;
    }
    let lamport_max = if world == 2 {
        sel.lamport_max
    } else {
        sel.lamport_max_multi
    };
    if bytes <= lamport_max.min(layout.lamport_max_bytes()) {
        AllReduceAlgo::Lamport
    } else if world == 2 || bytes <= sel.one_shot_max {
        AllReduceAlgo::OneShot
    } else {
        AllReduceAlgo::TwoShot
    }
}

impl CudaCollectives {
    /// The algorithm [`AllReduceAlgo::Auto`] runs for `count` elements of `dtype`.
    pub fn select_all_reduce(&self, count: usize, dtype: DType) -> AllReduceAlgo {
        select_all_reduce(
            count.saturating_mul(dtype.size()),
            self.world,
            &self.layout,
            &self.config.selection,
        )
    }

    /// The path [`AllGatherPath::Auto`] takes for `count` input elements per rank.
    pub fn select_all_gather(&self, count: usize, dtype: DType) -> AllGatherPath {
        let part = count.saturating_mul(dtype.size());
        if dtype.is_reducible_float() && rs_ag_use_lamport(part, self.world, &self.layout, &self.config.selection) {
            AllGatherPath::Lamport
        } else {
            AllGatherPath::Sm
        }
    }

    /// The algorithm [`ReduceScatterAlgo::Auto`] runs for `count` output elements per rank.
    pub fn select_reduce_scatter(&self, count: usize, dtype: DType) -> ReduceScatterAlgo {
        let part = count.saturating_mul(dtype.size());
        if rs_ag_use_lamport(part, self.world, &self.layout, &self.config.selection) {
            ReduceScatterAlgo::Lamport
        } else {
            ReduceScatterAlgo::Ring
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout2() -> WorkspaceLayout {
        WorkspaceLayout::new(2, 10 << 20, 4 << 20, 64).unwrap()
    }

    #[test]
    fn auto_selection() {
        let l = layout2();
        let s = Selection::default();
        assert_eq!(select_all_reduce(1024, 2, &l, &s), AllReduceAlgo::Lamport);
        assert_eq!(select_all_reduce(1 << 20, 2, &l, &s), AllReduceAlgo::Lamport);
        assert_eq!(select_all_reduce(4 << 20, 2, &l, &s), AllReduceAlgo::Lamport);
        assert_eq!(select_all_reduce((4 << 20) + 2, 2, &l, &s), AllReduceAlgo::OneShot);
        assert_eq!(select_all_reduce(256 << 20, 2, &l, &s), AllReduceAlgo::OneShot);
        let l4 = WorkspaceLayout::new(4, 10 << 20, 256 << 10, 64).unwrap();
        assert_eq!(select_all_reduce(512 << 10, 4, &l4, &s), AllReduceAlgo::TwoShot);
        assert_eq!(select_all_reduce(200 << 10, 4, &l4, &s), AllReduceAlgo::Lamport);
        assert_eq!(select_all_reduce(1024, 1, &l4, &s), AllReduceAlgo::OneShot);
        for a in AllReduceAlgo::ALL {
            assert_eq!(AllReduceAlgo::from_name(a.name()), Some(a));
        }
        for a in AllGatherPath::ALL {
            assert_eq!(AllGatherPath::from_name(a.name()), Some(a));
        }
        for a in ReduceScatterAlgo::ALL {
            assert_eq!(ReduceScatterAlgo::from_name(a.name()), Some(a));
        }
        assert!(rs_ag_use_lamport(2048, 2, &l, &s));
        // 4 MiB Lamport buffers: a rank's part up to 4 MiB.
        assert!(rs_ag_use_lamport(4 << 20, 2, &l, &s));
        assert!(!rs_ag_use_lamport((4 << 20) + 2, 2, &l, &s));
        // The default 16 MiB buffers: up to 32 MiB of whole tensor (the selection bound).
        let l16 = WorkspaceLayout::new(2, 10 << 20, 16 << 20, 64).unwrap();
        assert!(rs_ag_use_lamport(16 << 20, 2, &l16, &s));
        assert!(!rs_ag_use_lamport((16 << 20) + 2, 2, &l16, &s));
        assert_eq!(select_all_reduce(16 << 20, 2, &l16, &s), AllReduceAlgo::Lamport);
        assert_eq!(select_all_reduce((16 << 20) + 2, 2, &l16, &s), AllReduceAlgo::OneShot);
        assert!(!rs_ag_use_lamport(2048, 1, &l, &s));
    }
}
