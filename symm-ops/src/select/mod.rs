//! The one planner (NOTE [one-planner] in docs/architecture.md): which kernel (or NCCL) runs an
//! op, by payload size, world size, topology, engine and the op's buffers. The table is data
//! ([`SelectionThresholds`]), agreed by every rank at setup (ranks that chose
//! differently would deadlock), and printable
//! ([`crate::Communicator::selection_table`]). `thresholds.rs` holds the table's data and
//! defaults, this file the requests and the table's picks by size, `plan.rs` the plans (the
//! request and the buffers to a kernel), `table.rs` the printed table.

use std::fmt;

mod plan;
mod table;
#[cfg(test)]
mod tests;
mod thresholds;

pub(crate) use table::human;
pub use thresholds::SelectionThresholds;

/// The engine that runs a communicator's ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EngineKind {
    /// The generic engine: works over any backend's
    /// [`symm_core::SymmetricMemory`] with `read_bytes` / `write_bytes` and
    /// the pad's barrier and signals (the host backend in symm-testkit; CI).
    Host,
    /// symm-cuda's collective kernels, with NCCL as the fallback where it wins.
    Cuda,
    /// NCCL only (chosen when the group spans hosts or is not fully connected).
    Nccl,
    /// symm-rocm's collective kernels (symm-core's shared source, compiled by hiprtc): the
    /// Lamport one-shot, the ring and the zero-copy pulls; no copy engine, no RCCL. The table's
    /// defaults are the CUDA ones without the copy-engine rows, provisional until measured on
    /// AMD hardware. Not run on AMD hardware yet.
    Rocm,
    /// The collective kernels of a backend registered for another device type
    /// ([`symm_core::DeviceType::Other`], through [`symm_core::coll::Collectives`]): the table's
    /// defaults are the ROCm ones (the CUDA ones without the copy-engine rows), no NCCL.
    Kernels,
}

impl EngineKind {
    /// Whether the engine runs symm's collective kernels (the planner's kernel rows apply).
    pub(crate) fn runs_kernels(self) -> bool {
        matches!(self, EngineKind::Cuda | EngineKind::Rocm | EngineKind::Kernels)
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Host => "host",
            EngineKind::Cuda => "cuda",
            EngineKind::Nccl => "nccl",
            EngineKind::Rocm => "rocm",
            EngineKind::Kernels => "kernels",
        })
    }
}

/// All-reduce algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllReduceAlgo {
    /// Every rank reads every peer's input and reduces all of it.
    OneShot,
    /// Reduce-scatter (each rank reduces 1/world) then all-gather.
    TwoShot,
    /// One-shot with data as flag (push into peers' sentinel-filled slots, no
    /// barrier); CUDA only. The host engine runs it as one-shot.
    Lamport,
    /// Zero-copy SM pull in one kernel (CUDA), between an opening and a
    /// closing barrier. Two ranks: every rank reads the peer's input in place
    /// over NVLink and reduces it; the input must lie in registered symmetric
    /// memory (a tensor from [`crate::Communicator::persistent_buffer`]) apart
    /// from the output. Three or more: the two-shot pull, each rank reducing
    /// its shard from every input and writing it into every output; input and
    /// output both registered, equal (in place) or apart. Other buffers run the
    /// size's usual choice. The host engine runs it as one-shot.
    Pull,
    /// Zero-copy copy-engine two-shot (CUDA, two ranks): a copy engine pulls the peer's input
    /// for this rank's half into the output, the SMs reduce each chunk as it lands, a second
    /// copy engine pushes each reduced chunk into the peer's output. Input and output must both
    /// lie in registered symmetric memory, apart; otherwise [`AllReduceAlgo::Pull`] runs when
    /// the input alone qualifies, else the size's usual choice. The host engine runs it as
    /// one-shot.
    CopyEngine,
    /// Two-shot with data as flag in one kernel (CUDA, ROCm; NOTE [lamport-two-shot]): every
    /// rank pushes each peer's shard into the peer's Lamport slot, reduces its own shard as it
    /// arrives and pushes the sum into every peer's slot. Each rank's links carry 2 (world - 1)
    /// / world of the message where [`AllReduceAlgo::Lamport`] pushes world - 1 copies of it,
    /// for one more exchange's latency. Any buffers; messages whose two shards fit a Lamport
    /// slot (a larger one is refused with `Error::OutOfRange`, as the one-shot's beyond its
    /// slot). The host engine runs it as two-shot.
    LamportTwoShot,
    /// NCCL's all-reduce.
    Nccl,
}

impl fmt::Display for AllReduceAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AllReduceAlgo::OneShot => "one-shot",
            AllReduceAlgo::TwoShot => "two-shot",
            AllReduceAlgo::Lamport => "lamport (one-shot, data as flag)",
            AllReduceAlgo::Pull => "zero-copy pull",
            AllReduceAlgo::CopyEngine => "zero-copy copy-engine two-shot",
            AllReduceAlgo::LamportTwoShot => "lamport two-shot (data as flag)",
            AllReduceAlgo::Nccl => "nccl",
        })
    }
}

/// Reduce-scatter algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceScatterAlgo {
    /// The push kernels (CUDA): every rank pushes each peer's segment into the peer's workspace,
    /// through the Lamport slots while a rank's segment fits them and the table's Lamport bound,
    /// else through the ring buffers. Any buffers. The host engine reads every peer's segment.
    Push,
    /// Zero-copy pull (CUDA): every rank reads its shard straight from the peers' inputs, which
    /// must lie in registered symmetric memory; other inputs run what the table runs without
    /// its zero-copy rows.
    Pull,
    Nccl,
}

impl fmt::Display for ReduceScatterAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceScatterAlgo::Push => "push",
            ReduceScatterAlgo::Pull => "zero-copy pull",
            ReduceScatterAlgo::Nccl => "nccl",
        })
    }
}

/// All-gather algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllGatherAlgo {
    /// The push kernels (CUDA): every rank pushes its input into every peer's workspace, through
    /// the Lamport slots (f32 / f16 / bf16) while its input fits them and the table's Lamport
    /// bound, else through the ring buffers. Any buffers. The host engine copies with the CPU.
    Push,
    /// Copy-engine peer copies, zero-copy (CUDA): a push into every peer's output when the
    /// output lies in registered symmetric memory, else a pull from the peers' inputs when the
    /// input does; other buffers run what the table runs without its zero-copy rows. The host
    /// engine copies with the CPU.
    CopyEngine,
    /// Zero-copy SM pull in one kernel (CUDA): every rank copies every peer's input in place over
    /// NVLink, between an opening and a closing barrier; the input must lie in registered
    /// symmetric memory (or the op run in place in a registered output); other buffers run
    /// what the table runs without its zero-copy rows. The host engine copies with the CPU.
    Pull,
    Nccl,
}

impl fmt::Display for AllGatherAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AllGatherAlgo::Push => "push",
            AllGatherAlgo::CopyEngine => "copy engine",
            AllGatherAlgo::Pull => "zero-copy pull",
            AllGatherAlgo::Nccl => "nccl",
        })
    }
}

/// What the planner decided an op runs: one of the engine's explicit kernels (symm-core's
/// vocabulary, [`symm_core::coll`]), or NCCL. The host engine's plans name the kernel its
/// generic path stands for: all-reduce [`symm_core::AllReduceKernel::OneShot`] or
/// [`symm_core::AllReduceKernel::TwoShot`], reduce-scatter and all-gather the pull (every rank reads what
/// it needs from its peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plan<K> {
    Kernel(K),
    Nccl,
}

impl<K: fmt::Display> fmt::Display for Plan<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::Kernel(k) => k.fmt(f),
            Plan::Nccl => f.write_str("nccl"),
        }
    }
}

/// Which of an op's buffers the planner asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Input,
    Output,
}

/// What the planner needs to know of an op's buffers beyond its size: where they lie relative
/// to each other, and (asked only for the zero-copy rows, as a registry search costs a lock)
/// whether each lies in symmetric memory registered with the engine (the same offsets on every
/// rank, so every rank gets the same answer).
pub(crate) struct Bufs<'a> {
    /// Input and output are the same buffer (all-reduce), or the input is this rank's slice of
    /// the output (all-gather).
    pub in_place: bool,
    /// Input and output do not overlap (read by the all-reduce plan only).
    pub apart: bool,
    pub registered: &'a dyn Fn(Side) -> bool,
}

/// Where an op's input and output lie, as far as their addresses are known before the engine
/// resolves them on the op's stream (`None`: a host slice, or a cudarc buffer, which is never
/// registered symmetric memory and never overlaps another buffer of the op): the positional
/// half of [`Bufs`], computed once by the op (`ops.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub in_place: bool,
    pub apart: bool,
}

impl Placement {
    /// An all-reduce's `bytes` from `input` (`None`: in place in the output) into `output`.
    pub fn all_reduce(input: Option<Option<u64>>, output: Option<u64>, bytes: usize) -> Placement {
        let Some(input) = input else {
            return Placement {
                input: output,
                output,
                in_place: true,
                apart: false,
            };
        };
        let (in_place, apart) = match (input, output) {
            (Some(i), Some(o)) => (
                i == o,
                i.saturating_add(bytes as u64) <= o || o.saturating_add(bytes as u64) <= i,
            ),
            _ => (false, true),
        };
        Placement {
            input,
            output,
            in_place,
            apart,
        }
    }

    /// An all-gather's `bytes` per rank from `input` into `output` (in place: the input is
    /// `rank`'s slice of the output).
    pub fn all_gather(input: Option<u64>, output: Option<u64>, rank: usize, bytes: usize) -> Placement {
        let in_place = match (input, output) {
            (Some(i), Some(o)) => o.checked_add((rank * bytes) as u64) == Some(i),
            _ => false,
        };
        Placement {
            input,
            output,
            in_place,
            apart: !in_place,
        }
    }
}

/// The selection in force for one communicator.
#[derive(Debug, Clone)]
pub(crate) struct Selector {
    pub engine: EngineKind,
    /// The copy-engine kernels run here (the backend's `CollFacts::copy_engine`); without, the
    /// copy-engine requests run the zero-copy pulls.
    pub copy_engine: bool,
    /// The fused epilogue kernel runs here (the backend's `CollFacts::fused_epilogue`); without,
    /// `Auto` epilogues run `Separate`.
    pub fused_epilogue: bool,
    /// Symmetric-memory algorithms available (false: NCCL only).
    pub symm: bool,
    /// NCCL available as the fallback.
    pub nccl: bool,
    pub thresholds: SelectionThresholds,
    /// Ranks of the group.
    pub world: usize,
    /// Bytes one Lamport slot holds (a rank's part of a Lamport reduce-scatter or all-gather);
    /// 0 without the kernels. The same on every rank.
    pub lamport_slot: usize,
    /// The fused epilogue runs as the handoff pair up to these bytes, for the rows
    /// `symm_core::coll::add_rms::handoff_fits` takes (0: never). The same on every rank.
    pub handoff_bytes: usize,
}

impl Selector {
    pub fn all_reduce(&self, bytes: usize) -> AllReduceAlgo {
        let t = &self.thresholds;
        if !self.symm {
            return AllReduceAlgo::Nccl;
        }
        if !self.engine.runs_kernels() {
            return if bytes <= t.one_shot_max_bytes.max(t.lamport_max_bytes) {
                AllReduceAlgo::OneShot
            } else {
                AllReduceAlgo::TwoShot
            };
        }
        if self.lamport_two_shot_takes(bytes) {
            AllReduceAlgo::LamportTwoShot
        } else if bytes <= t.lamport_max_bytes {
            AllReduceAlgo::Lamport
        } else if bytes >= t.all_reduce_ce_min_bytes {
            // The engine runs the pull (or the size's usual choice) when the buffers do not
            // qualify.
            AllReduceAlgo::CopyEngine
        } else if bytes >= t.all_reduce_pull_min_bytes && (bytes <= t.all_reduce_pull_max_bytes || !self.nccl) {
            // The engine runs the size's usual choice when the input is not registered.
            AllReduceAlgo::Pull
        } else if self.nccl && bytes > t.two_shot_max_bytes {
            AllReduceAlgo::Nccl
        } else if bytes <= t.one_shot_max_bytes {
            AllReduceAlgo::OneShot
        } else {
            AllReduceAlgo::TwoShot
        }
    }

    /// Whether an all-reduce of `bytes` lies in the Lamport two-shot's rows: from
    /// `lamport_two_shot_min_bytes` to `lamport_two_shot_max_bytes` (which the communicator
    /// caps where two shards fill a Lamport slot, `SelectionThresholds::within_slots`; NOTE
    /// [lamport-two-shot]).
    pub fn lamport_two_shot_takes(&self, bytes: usize) -> bool {
        let t = &self.thresholds;
        bytes >= t.lamport_two_shot_min_bytes && bytes <= t.lamport_two_shot_max_bytes
    }

    /// The fused epilogue can run here: symmetric memory, an engine that runs the kernels, and a
    /// backend with the fused entry.
    pub fn fuses(&self) -> bool {
        self.symm && self.engine.runs_kernels() && self.fused_epilogue
    }

    /// How an all-reduce epilogue of `rows` rows of `row_bytes` runs (NOTE [fused-epilogue]):
    /// the fused path at world 1 on the GPU engines (CUDA, rocm: nothing is exchanged, one
    /// kernel); where the table picks Lamport, the handoff pair for rows it takes
    /// (`handoff_fits`: CUDA with PDL, up to `handoff_bytes`, at most two vectors a thread; rows
    /// of two vectors a thread only up to `epilogue_handoff_wide_max_rows`, above it the table's
    /// all-reduce then the epilogue kernel), and for rows the pair cannot take the one fused
    /// kernel up to
    /// `epilogue_fused_max_bytes` (CUDA, two ranks); otherwise the table's all-reduce then the
    /// epilogue kernel.
    pub fn epilogue(&self, rows: usize, row_bytes: usize) -> crate::EpilogueAlgo {
        let bytes = rows.saturating_mul(row_bytes);
        let kernels = self.fuses();
        let vectors = row_bytes.div_ceil(symm_core::coll::geometry::VEC_BYTES);
        let handoff = symm_core::coll::add_rms::handoff_fits(rows, vectors, self.handoff_bytes);
        // Where the pair takes the rows, `Fused` runs the pair (the backend plans it so), so the
        // pair's own bound decides; elsewhere the one fused kernel's.
        let fuse = if handoff {
            let (_, per_thread) = symm_core::coll::add_rms::epilogue_threads(vectors);
            per_thread <= 1 || rows <= self.thresholds.epilogue_handoff_wide_max_rows
        } else {
            bytes <= self.thresholds.epilogue_fused_max_bytes
        };
        match self.all_reduce(bytes) {
            _ if kernels && self.world == 1 => crate::EpilogueAlgo::Fused,
            AllReduceAlgo::Lamport if kernels && bytes <= self.lamport_slot && fuse => crate::EpilogueAlgo::Fused,
            a => crate::EpilogueAlgo::Separate(a),
        }
    }

    /// What runs instead of [`AllReduceAlgo::Pull`] / [`AllReduceAlgo::CopyEngine`] when the
    /// buffers do not qualify (not registered, or overlapping): the table without its zero-copy
    /// rows.
    pub fn fallback_all_reduce(&self, bytes: usize) -> AllReduceAlgo {
        self.without_zero_copy().all_reduce(bytes)
    }

    /// The table without its zero-copy rows (pulls, copy engine): what an op runs when its
    /// buffers do not qualify for the zero-copy pick (not registered, or overlapping).
    fn without_zero_copy(&self) -> Selector {
        Selector {
            thresholds: self.thresholds.without_zero_copy(),
            ..self.clone()
        }
    }

    /// What runs instead of [`ReduceScatterAlgo::Pull`] when the input is not registered.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn fallback_reduce_scatter(&self, bytes: usize) -> ReduceScatterAlgo {
        self.without_zero_copy().reduce_scatter(bytes)
    }

    /// What runs instead of [`AllGatherAlgo::Pull`] / [`AllGatherAlgo::CopyEngine`] when neither
    /// buffer qualifies.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn fallback_all_gather(&self, bytes: usize) -> AllGatherAlgo {
        self.without_zero_copy().all_gather(bytes)
    }

    /// Symmetric memory up to `reduce_scatter_max_bytes`, NCCL above; the zero-copy pull from
    /// its bound on (CUDA; the engine runs NCCL, else the kernels, for unregistered inputs).
    pub fn reduce_scatter(&self, bytes: usize) -> ReduceScatterAlgo {
        if self.symm && self.engine.runs_kernels() && bytes >= self.thresholds.reduce_scatter_pull_min_bytes {
            ReduceScatterAlgo::Pull
        } else if !self.symm || (self.nccl && bytes > self.thresholds.reduce_scatter_max_bytes) {
            ReduceScatterAlgo::Nccl
        } else {
            ReduceScatterAlgo::Push
        }
    }

    /// SM copies up to `all_gather_max_bytes`, NCCL above; the copy engine from its bound on
    /// (CUDA), also above the NCCL bound when its bound is the larger (the engine then runs NCCL,
    /// where available, for inputs outside registered symmetric memory).
    pub fn all_gather(&self, bytes: usize) -> AllGatherAlgo {
        let t = &self.thresholds;
        let kernels = self.engine.runs_kernels();
        let ce = kernels && bytes >= t.all_gather_copy_engine_min_bytes;
        // The pulls' upper bounds hand sizes to NCCL; without it the pull beats the kernels.
        let pull = kernels
            && !ce
            && bytes >= t.all_gather_pull_min_bytes
            && (bytes <= t.all_gather_pull_max_bytes || !self.nccl);
        // A zero-copy bound above the NCCL bound takes the sizes from it back from NCCL.
        let zero_copy_over_nccl = (ce && t.all_gather_copy_engine_min_bytes > t.all_gather_max_bytes) || pull;
        if !self.symm || (self.nccl && bytes > t.all_gather_max_bytes && !zero_copy_over_nccl) {
            AllGatherAlgo::Nccl
        } else if ce {
            AllGatherAlgo::CopyEngine
        } else if pull {
            AllGatherAlgo::Pull
        } else {
            AllGatherAlgo::Push
        }
    }
}
