//! The one planner (NOTE [one-planner] in docs/architecture.md): which kernel (or NCCL) runs an
//! op, by payload size, world size, topology, engine and the op's buffers. The table is data
//! ([`SelectionThresholds`]), agreed by every rank at setup (ranks that chose
//! differently would deadlock), and printable
//! ([`crate::Communicator::selection_table`]).

use std::fmt;

use symm_core::{AllGatherKernel, AllReduceKernel, DType, ReduceScatterKernel};

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
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Host => "host",
            EngineKind::Cuda => "cuda",
            EngineKind::Nccl => "nccl",
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
/// vocabulary, [`symm_core::kernels`]), or NCCL. The host engine's plans name the kernel its
/// generic path stands for: all-reduce [`AllReduceKernel::OneShot`] or
/// [`AllReduceKernel::TwoShot`], reduce-scatter and all-gather the pull (every rank reads what
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
    /// Input and output do not overlap.
    pub apart: bool,
    pub registered: &'a dyn Fn(Side) -> bool,
}

/// Size thresholds of the selection table, in bytes. All-reduce counts the
/// tensor's bytes; reduce-scatter the whole unreduced input; all-gather the
/// whole gathered output (as nccl-tests counts them). A threshold of 0
/// disables the algorithm below it; `usize::MAX` means "no limit".
///
/// Start from [`SelectionThresholds::defaults`] and set fields (the struct is
/// `#[non_exhaustive]`: fields may be added). There is no `Default`: the
/// thresholds depend on the engine and the world size, and no one table is
/// right for all of them (`CommConfig::selection: None` takes the defaults for
/// the communicator's own engine and world).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct SelectionThresholds {
    /// all_reduce up to this size: Lamport (CUDA).
    pub lamport_max_bytes: usize,
    /// all_reduce up to this size: one-shot.
    pub one_shot_max_bytes: usize,
    /// all_reduce larger than this: NCCL where it is available (else one-shot
    /// up to `one_shot_max_bytes`, two-shot above).
    pub two_shot_max_bytes: usize,
    /// reduce_scatter up to this size: symmetric memory; larger: NCCL.
    pub reduce_scatter_max_bytes: usize,
    /// all_gather up to this size: symmetric memory; larger: NCCL.
    pub all_gather_max_bytes: usize,
    /// all_gather from this size on: copy engine instead of SM copies.
    pub all_gather_copy_engine_min_bytes: usize,
    /// all_gather from this size on (below the copy-engine bound): the zero-copy SM pull
    /// ([`AllGatherAlgo::Pull`]) for inputs in registered symmetric memory; NCCL (else the SM
    /// path) otherwise. CUDA only.
    pub all_gather_pull_min_bytes: usize,
    /// all_gather up to this size (from `all_gather_pull_min_bytes`): the zero-copy pull for
    /// registered inputs; larger: NCCL (a bound against NCCL: without NCCL the pull runs every
    /// size from its minimum). CUDA only.
    pub all_gather_pull_max_bytes: usize,
    /// reduce_scatter from this size on: the zero-copy pull
    /// ([`ReduceScatterAlgo::Pull`]) when the input lies in registered symmetric memory; NCCL
    /// (else the kernels) otherwise. CUDA only.
    pub reduce_scatter_pull_min_bytes: usize,
    /// all_reduce from this size on (above the Lamport bound): the zero-copy pull
    /// ([`AllReduceAlgo::Pull`]) when its buffers qualify (two ranks: the input
    /// in registered symmetric memory, same offset on every rank, apart from
    /// the output; three or more: input and output both registered, in place
    /// allowed); otherwise the size's usual choice (NCCL where it takes over).
    /// CUDA only.
    pub all_reduce_pull_min_bytes: usize,
    /// all_reduce up to this size (from `all_reduce_pull_min_bytes`): the pull; larger: the
    /// size's usual choice (a bound against NCCL: without NCCL the pull runs every size from its
    /// minimum). From three ranks on the pull is the two-shot pull, which needs the output
    /// registered too (in place allowed). CUDA only.
    pub all_reduce_pull_max_bytes: usize,
    /// all_reduce from this size on: the zero-copy copy-engine two-shot
    /// ([`AllReduceAlgo::CopyEngine`]) when input and output both lie in registered symmetric
    /// memory, apart (else the pull when the input does). CUDA, two ranks only.
    pub all_reduce_ce_min_bytes: usize,
    /// reduce_scatter up to this size of the whole unreduced input: the Lamport kernel, when a
    /// rank's segment also fits the engine's Lamport slots; larger: the ring. CUDA only.
    /// 2 x H200 at 16 / 32 MiB: 30.1 / 54.7 us against the pull's 32.6 / 57.9
    /// (bench-notes.md, round 5).
    pub reduce_scatter_lamport_max_bytes: usize,
    /// all_gather up to this size of the gathered output: the Lamport kernel (f32 / f16 / bf16),
    /// when a rank's input also fits the engine's Lamport slots; larger: the ring. CUDA only.
    /// 2 x H200 at 16 / 32 MiB: 28.5 / 53.4 us against the pull's 32.2 / 58.1.
    pub all_gather_lamport_max_bytes: usize,
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

impl SelectionThresholds {
    /// The defaults for an engine and world size.
    ///
    /// CUDA, two ranks: measured on 2 x H200 (see the comment in the body):
    /// Lamport up to 4 MiB; above, the zero-copy pulls for inputs in
    /// registered symmetric memory (all-gather: the copy engine above 64 MiB)
    /// and NCCL for other inputs. More ranks: symm-cuda's Lamport and
    /// one-shot bounds, NCCL from provisional sizes (after PyTorch's
    /// IntraNodeComm and vLLM) until 4- and 8-GPU measurements exist. Without
    /// NCCL the kernels run every size.
    pub fn defaults(engine: EngineKind, world_size: usize) -> Self {
        match engine {
            EngineKind::Host => SelectionThresholds {
                lamport_max_bytes: 0,
                one_shot_max_bytes: 256 * KIB,
                two_shot_max_bytes: usize::MAX,
                reduce_scatter_max_bytes: usize::MAX,
                all_gather_max_bytes: usize::MAX,
                all_gather_copy_engine_min_bytes: usize::MAX,
                all_gather_pull_min_bytes: usize::MAX,
                all_gather_pull_max_bytes: usize::MAX,
                all_reduce_pull_min_bytes: usize::MAX,
                all_reduce_pull_max_bytes: usize::MAX,
                all_reduce_ce_min_bytes: usize::MAX,
                reduce_scatter_pull_min_bytes: usize::MAX,
                reduce_scatter_lamport_max_bytes: 0,
                all_gather_lamport_max_bytes: 0,
            },
            EngineKind::Nccl => SelectionThresholds {
                lamport_max_bytes: 0,
                one_shot_max_bytes: 0,
                two_shot_max_bytes: 0,
                reduce_scatter_max_bytes: 0,
                all_gather_max_bytes: 0,
                all_gather_copy_engine_min_bytes: usize::MAX,
                all_gather_pull_min_bytes: usize::MAX,
                all_gather_pull_max_bytes: usize::MAX,
                all_reduce_pull_min_bytes: usize::MAX,
                all_reduce_pull_max_bytes: usize::MAX,
                all_reduce_ce_min_bytes: usize::MAX,
                reduce_scatter_pull_min_bytes: usize::MAX,
                reduce_scatter_lamport_max_bytes: 0,
                all_gather_lamport_max_bytes: 0,
            },
            EngineKind::Cuda if world_size <= 2 => {
                // Measured on 2 x H200 (NV18), graph replay, NCCL 2.28.9 in the same run
                // (symm-ops/bench-notes.md, rounds 4-5; docs/benchmarks.md): the pipelined Lamport
                // kernels up to 16 MiB all-reduce (53.1 us at 16 MiB against the pull's 57.3 and
                // NCCL's 71.9; 2.2-2.4 against 5.8 at 1 KiB) and 32 MiB reduce-scatter /
                // all-gather (54.7 / 53.4 against the pulls' 57.9 / 58.1 and NCCL's 92 / 73).
                // Above, for inputs in registered symmetric memory, the fused zero-copy pulls
                // (all-reduce 107 / 208 / 406 at 32 / 64 / 128 MiB against NCCL's 129 / 232 /
                // 445; reduce-scatter 109 / 409 at 64 / 256 MiB against 165 / 588; all-gather
                // 109 at 64 MiB against 123), the all-gather copy engine above 64 MiB (a push
                // into registered outputs: 369 against pull 414 and NCCL 434 at 256 MiB), and
                // the all-reduce copy-engine two-shot above 128 MiB when the output is registered
                // too (778 against the pull's 806 and NCCL's 850 at 256 MiB; at 128 MiB the pull
                // wins, 406 against 416). Unregistered inputs above the Lamport bounds go to NCCL.
                let lamport = LAMPORT_MAX_TWO_RANKS;
                SelectionThresholds {
                    lamport_max_bytes: lamport,
                    one_shot_max_bytes: usize::MAX,
                    two_shot_max_bytes: lamport,
                    reduce_scatter_max_bytes: 32 * MIB,
                    all_gather_max_bytes: 32 * MIB,
                    all_gather_copy_engine_min_bytes: 64 * MIB + 1,
                    all_gather_pull_min_bytes: 32 * MIB + 1,
                    all_gather_pull_max_bytes: usize::MAX,
                    all_reduce_pull_min_bytes: lamport + 1,
                    all_reduce_pull_max_bytes: usize::MAX,
                    all_reduce_ce_min_bytes: 128 * MIB + 1,
                    reduce_scatter_pull_min_bytes: 32 * MIB + 1,
                    reduce_scatter_lamport_max_bytes: RS_AG_LAMPORT_MAX,
                    all_gather_lamport_max_bytes: RS_AG_LAMPORT_MAX,
                }
            }
            EngineKind::Cuda => {
                // Measured on 4 x H200 (NV18 each pair, graph replay, NCCL 2.28.9 in the same
                // run; session 14, docs/benchmarks.md, bench-notes round 15):
                // - all-reduce: Lamport up to 1 MiB (13.9 us against NCCL's 17.5), the two-shot
                //   ring at 4 MiB (36.3 against 40.2), NCCL above (8 MiB: 60.4 against the
                //   two-shot's best, 70.4; 16 MiB: 96.6 against 109);
                // - reduce-scatter: Lamport up to 16 MiB (50.4 against 58.8), then the ring (64
                //   blocks, symm-cuda's RING_WIDE_BLOCKS) up to 64 MiB (99.5 / 182 against 101.5
                //   / 188 at 32 / 64 MiB; 128 MiB: 350 against 347), NCCL above; for registered
                //   inputs the zero-copy pull above 16 MiB (87 / 166 / 320 / 623 against 101.5 /
                //   188 / 347 / 668 at 32-256 MiB);
                // - all-gather: Lamport up to 16 MiB (44.8 against 58.2), the ring (64 blocks) up
                //   to 32 MiB (93.3 against 97.0; 64 MiB 171 against 169.5), NCCL above; for
                //   registered inputs the pull up to 64 MiB (85.3 / 161 against 97.0 / 169.5 at
                //   32 / 64 MiB; 128 / 256 MiB 314 / 622 against 310 / 605 in graph replay).
                // - all-reduce of registered buffers (input and output, in place allowed): the
                //   two-shot pull above the Lamport bound up to 16 MiB (2 / 4 / 8 / 16 MiB: 18.8 /
                //   28.0 / 48.2 / 89.2 against NCCL's 26.2 / 40.0 / 61.0 / 98.2; 32 MiB 170.3
                //   against 170.2, 256 MiB 1272 against 1179).
                // Five to eight ranks are unmeasured: the same all-reduce bounds, half the
                // reduce-scatter / all-gather ones, and no pulls.
                let (lamport, one_shot) = (LAMPORT_MAX_MULTI, ONE_SHOT_MAX_MULTI);
                let measured = world_size <= 4;
                let (rs, ag) = if measured {
                    (64 * MIB, 32 * MIB)
                } else {
                    (8 * MIB, 8 * MIB)
                };
                SelectionThresholds {
                    lamport_max_bytes: lamport,
                    one_shot_max_bytes: one_shot,
                    two_shot_max_bytes: 4 * MIB,
                    reduce_scatter_max_bytes: rs,
                    all_gather_max_bytes: ag,
                    all_gather_copy_engine_min_bytes: usize::MAX,
                    all_gather_pull_min_bytes: if measured { 16 * MIB + 1 } else { usize::MAX },
                    all_gather_pull_max_bytes: if measured { 64 * MIB } else { usize::MAX },
                    all_reduce_pull_min_bytes: if measured { lamport + 1 } else { usize::MAX },
                    all_reduce_pull_max_bytes: if measured { 16 * MIB } else { usize::MAX },
                    all_reduce_ce_min_bytes: usize::MAX,
                    reduce_scatter_pull_min_bytes: if measured { 16 * MIB + 1 } else { usize::MAX },
                    reduce_scatter_lamport_max_bytes: RS_AG_LAMPORT_MAX,
                    all_gather_lamport_max_bytes: RS_AG_LAMPORT_MAX,
                }
            }
        }
    }
}

/// All-reduce, two ranks: the Lamport kernel up to this size (2 x H200, pipelined Lamport
/// kernel, bench-notes.md round 5: 15.8 us at 4 MiB, 28.4 at 8, 53.1 at 16 against the zero-copy
/// pull's 19.2 / 32.1 / 57.3 and NCCL's 32.5 / 44.9 / 71.9). Capped by the Lamport slots.
pub const LAMPORT_MAX_TWO_RANKS: usize = 16 * MIB;
/// All-reduce, more than two ranks: Lamport up to this size (every rank pushes the whole message
/// to every peer; 4 x H200: 13.9 us against NCCL's 17.5 at 1 MiB).
pub const LAMPORT_MAX_MULTI: usize = MIB;
/// All-reduce, more than two ranks: the ring one-shot up to this size, the two-shot above (the
/// PyTorch / vLLM one-shot bound).
pub const ONE_SHOT_MAX_MULTI: usize = 256 * KIB;
/// Reduce-scatter / all-gather: the Lamport kernels up to this whole-tensor size (see
/// [`SelectionThresholds::reduce_scatter_lamport_max_bytes`]).
pub const RS_AG_LAMPORT_MAX: usize = 32 * MIB;

/// The selection in force for one communicator.
#[derive(Debug, Clone)]
pub(crate) struct Selector {
    pub engine: EngineKind,
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
}

impl Selector {
    pub fn all_reduce(&self, bytes: usize) -> AllReduceAlgo {
        let t = &self.thresholds;
        if !self.symm {
            return AllReduceAlgo::Nccl;
        }
        if self.engine != EngineKind::Cuda {
            return if bytes <= t.one_shot_max_bytes.max(t.lamport_max_bytes) {
                AllReduceAlgo::OneShot
            } else {
                AllReduceAlgo::TwoShot
            };
        }
        if bytes <= t.lamport_max_bytes {
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

    /// How an all-reduce epilogue of `bytes` runs (NOTE [fused-epilogue]): the table's
    /// all-reduce then the epilogue kernel, except at world 1, where nothing is exchanged (the
    /// fused kernel, one kernel).
    pub fn epilogue(&self, bytes: usize, world: usize) -> crate::EpilogueAlgo {
        match self.all_reduce(bytes) {
            _ if self.symm && self.engine == EngineKind::Cuda && world == 1 => crate::EpilogueAlgo::Fused,
            a => crate::EpilogueAlgo::Separate(a),
        }
    }

    /// The sizes at which the all-reduce table may change its pick (the last byte of each
    /// range; `usize::MAX`-like values for thresholds that are off).
    fn all_reduce_bounds(&self) -> [usize; 6] {
        let t = &self.thresholds;
        [
            t.lamport_max_bytes,
            t.one_shot_max_bytes,
            t.two_shot_max_bytes,
            t.all_reduce_pull_min_bytes.saturating_sub(1),
            t.all_reduce_pull_max_bytes,
            t.all_reduce_ce_min_bytes.saturating_sub(1),
        ]
    }

    /// The all-reduce epilogues' lines of [`Self::table`] (NOTE [fused-epilogue]): the
    /// all-reduce rows' pick then the epilogue kernel, or the fused kernel ([`Self::epilogue`]).
    pub fn epilogue_table(&self, world: usize) -> String {
        let mut s = String::new();
        let edges = self.all_reduce_bounds();
        block(
            &mut s,
            "all_reduce_residual[_rms_norm] (bytes of x)",
            &bounds(&edges),
            |bytes| match self.epilogue(bytes, world) {
                crate::EpilogueAlgo::Fused => "fused (lamport one-shot + epilogue, one kernel)".to_string(),
                crate::EpilogueAlgo::Separate(_) => {
                    let row = |reg| format!("{}, then the epilogue", self.all_reduce_row(bytes, reg));
                    Self::cell(row(true), row(false))
                }
                crate::EpilogueAlgo::Auto => "auto".to_string(),
            },
        );
        s
    }

    /// What runs instead of [`AllReduceAlgo::Pull`] when the input cannot be read in
    /// place (not registered, or the output overlaps it): the table without the copy engine.
    pub fn fallback_all_reduce(&self, bytes: usize) -> AllReduceAlgo {
        self.without_zero_copy().all_reduce(bytes)
    }

    /// The table without its zero-copy rows (pulls, copy engine): what an op runs when its
    /// buffers do not qualify for the zero-copy pick (not registered, or overlapping).
    fn without_zero_copy(&self) -> Selector {
        Selector {
            thresholds: SelectionThresholds {
                all_reduce_pull_min_bytes: usize::MAX,
                all_reduce_ce_min_bytes: usize::MAX,
                reduce_scatter_pull_min_bytes: usize::MAX,
                all_gather_pull_min_bytes: usize::MAX,
                all_gather_copy_engine_min_bytes: usize::MAX,
                ..self.thresholds
            },
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
        if self.symm && self.engine == EngineKind::Cuda && bytes >= self.thresholds.reduce_scatter_pull_min_bytes {
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
        let cuda = self.engine == EngineKind::Cuda;
        let ce = cuda && bytes >= t.all_gather_copy_engine_min_bytes;
        // The pulls' upper bounds hand sizes to NCCL; without it the pull beats the kernels.
        let pull =
            cuda && !ce && bytes >= t.all_gather_pull_min_bytes && (bytes <= t.all_gather_pull_max_bytes || !self.nccl);
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

    // ---- plans: the request and the buffers to the kernel that runs -------------------------

    /// What an all-reduce of `bytes` requested as `req` runs on buffers `b`. The zero-copy
    /// requests need their buffers in registered symmetric memory ([`AllReduceAlgo::Pull`]: two
    /// ranks the input, apart from the output; three or more, the two-shot pull, input and
    /// output, in place allowed; [`AllReduceAlgo::CopyEngine`]: two ranks, both, apart); others
    /// run the table's pick without its zero-copy rows.
    pub(crate) fn plan_all_reduce(&self, req: AllReduceAlgo, bytes: usize, b: &Bufs<'_>) -> Plan<AllReduceKernel> {
        if self.engine == EngineKind::Host {
            return Plan::Kernel(match req {
                AllReduceAlgo::TwoShot => AllReduceKernel::TwoShot,
                _ => AllReduceKernel::OneShot,
            });
        }
        let zero_copy = |ce: bool| {
            if self.world >= 3 {
                let ok = (b.apart || b.in_place) && (b.registered)(Side::Input) && (b.registered)(Side::Output);
                return ok.then_some(AllReduceKernel::PullTwoShot);
            }
            if !(b.apart && (b.registered)(Side::Input)) {
                return None;
            }
            Some(if ce && self.world == 2 && (b.registered)(Side::Output) {
                AllReduceKernel::CopyEngineTwoShot
            } else {
                AllReduceKernel::Pull
            })
        };
        let k = match req {
            AllReduceAlgo::Nccl => return Plan::Nccl,
            AllReduceAlgo::Lamport => AllReduceKernel::Lamport,
            AllReduceAlgo::OneShot => AllReduceKernel::OneShot,
            AllReduceAlgo::TwoShot => AllReduceKernel::TwoShot,
            AllReduceAlgo::Pull | AllReduceAlgo::CopyEngine => match zero_copy(req == AllReduceAlgo::CopyEngine) {
                Some(k) => k,
                None => return self.plan_all_reduce(self.fallback_all_reduce(bytes), bytes, b),
            },
        };
        Plan::Kernel(k)
    }

    /// Whether a reduce-scatter / all-gather of `whole` bytes (`whole / world` per rank) takes
    /// the Lamport kernel under the bound `max`.
    fn rs_ag_lamport(&self, whole: usize, max: usize) -> bool {
        self.world > 1 && whole / self.world <= self.lamport_slot && whole <= max
    }

    /// What a reduce-scatter of `whole` input bytes requested as `req` runs; `input_registered`
    /// is asked only for the pull.
    pub(crate) fn plan_reduce_scatter(
        &self,
        req: ReduceScatterAlgo,
        whole: usize,
        input_registered: &dyn Fn() -> bool,
    ) -> Plan<ReduceScatterKernel> {
        if self.engine == EngineKind::Host {
            return Plan::Kernel(ReduceScatterKernel::Pull);
        }
        match req {
            ReduceScatterAlgo::Nccl => Plan::Nccl,
            ReduceScatterAlgo::Pull if input_registered() => Plan::Kernel(ReduceScatterKernel::Pull),
            ReduceScatterAlgo::Pull => match self.fallback_reduce_scatter(whole) {
                // Without NCCL the kernels run every size.
                ReduceScatterAlgo::Nccl if !self.nccl => {
                    self.plan_reduce_scatter(ReduceScatterAlgo::Push, whole, &|| false)
                }
                a => self.plan_reduce_scatter(a, whole, &|| false),
            },
            ReduceScatterAlgo::Push => Plan::Kernel(
                if self.rs_ag_lamport(whole, self.thresholds.reduce_scatter_lamport_max_bytes) {
                    ReduceScatterKernel::Lamport
                } else {
                    ReduceScatterKernel::Ring
                },
            ),
        }
    }

    /// What an all-gather of `whole` output bytes of `dtype` requested as `req` runs on buffers
    /// `b` (in place: the input is this rank's slice of the output).
    pub(crate) fn plan_all_gather(
        &self,
        req: AllGatherAlgo,
        whole: usize,
        dtype: DType,
        b: &Bufs<'_>,
    ) -> Plan<AllGatherKernel> {
        if self.engine == EngineKind::Host {
            return Plan::Kernel(AllGatherKernel::Pull);
        }
        let zero_copy = match req {
            AllGatherAlgo::Nccl => return Plan::Nccl,
            AllGatherAlgo::CopyEngine if (b.registered)(Side::Output) => Some(AllGatherKernel::CopyEnginePush),
            AllGatherAlgo::CopyEngine if (b.registered)(Side::Input) => Some(AllGatherKernel::CopyEnginePull),
            AllGatherAlgo::Pull if (b.in_place && (b.registered)(Side::Output)) || (b.registered)(Side::Input) => {
                Some(AllGatherKernel::Pull)
            }
            AllGatherAlgo::CopyEngine | AllGatherAlgo::Pull => None,
            AllGatherAlgo::Push => {
                let lamport = dtype.is_reducible_float()
                    && self.rs_ag_lamport(whole, self.thresholds.all_gather_lamport_max_bytes);
                Some(if lamport {
                    AllGatherKernel::Lamport
                } else {
                    AllGatherKernel::Ring
                })
            }
        };
        match zero_copy {
            Some(k) => Plan::Kernel(k),
            None => {
                let no = Bufs {
                    in_place: b.in_place,
                    apart: b.apart,
                    registered: &|_| false,
                };
                match self.fallback_all_gather(whole) {
                    // Without NCCL the kernels run every size.
                    AllGatherAlgo::Nccl if !self.nccl => self.plan_all_gather(AllGatherAlgo::Push, whole, dtype, &no),
                    a => self.plan_all_gather(a, whole, dtype, &no),
                }
            }
        }
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
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

/// One block of the table: rows `bytes <= bound` over the sorted upper
/// bounds, then "larger"; adjacent rows with the same algorithm merge.
/// The ranges' upper bounds of a table block, sorted and deduplicated; `usize::MAX` (and
/// `MAX - 1` from "min" thresholds) mean "no limit" and are left out.
fn bounds(extra: &[usize]) -> Vec<usize> {
    let mut b: Vec<usize> = extra.iter().copied().filter(|&x| x < usize::MAX / 2).collect();
    b.sort_unstable();
    b.dedup();
    b
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(engine: EngineKind, world: usize, nccl: bool) -> Selector {
        // symm-cuda's default Lamport slots: 16 MiB for two ranks, 16 MiB / (world - 1) above.
        let lamport_slot = match engine {
            EngineKind::Cuda => (16 * MIB) / world.saturating_sub(1).max(1),
            _ => 0,
        };
        Selector {
            engine,
            symm: engine != EngineKind::Nccl,
            nccl,
            thresholds: SelectionThresholds::defaults(engine, world),
            world,
            lamport_slot,
        }
    }

    /// The epilogue rule: the table's all-reduce then the kernel at every size (Lamport up to
    /// the table's bound, from 1 KiB to 16 MiB at two ranks), fused at world 1; the table shows
    /// the all-reduce rows' picks.
    #[test]
    fn epilogues_fuse_at_world_1_and_follow_the_all_reduce_table() {
        use crate::EpilogueAlgo::{Fused, Separate};
        for world in [2, 4, 8] {
            for nccl in [true, false] {
                let s = sel(EngineKind::Cuda, world, nccl);
                for bytes in [8 * KIB, 512 * KIB, s.thresholds.lamport_max_bytes, 64 * MIB] {
                    assert_eq!(
                        s.epilogue(bytes, world),
                        Separate(s.all_reduce(bytes)),
                        "{world} {bytes}"
                    );
                }
                assert_eq!(
                    s.epilogue(512 * KIB, world),
                    Separate(AllReduceAlgo::Lamport),
                    "{world}"
                );
                let table = s.epilogue_table(world);
                assert!(
                    table.contains("lamport (one-shot, data as flag), then the epilogue"),
                    "{table}"
                );
                assert!(!table.contains("fused"), "{table}");
            }
        }
        let one = sel(EngineKind::Cuda, 1, true);
        assert_eq!(one.epilogue(8 * KIB, 1), Fused);
        let host = sel(EngineKind::Host, 2, false);
        assert!(matches!(host.epilogue(8 * MIB, 2), Separate(_)));
    }

    #[test]
    fn cuda_world2_hands_large_to_nccl_only_if_present() {
        let s = sel(EngineKind::Cuda, 2, true);
        let lamport = LAMPORT_MAX_TWO_RANKS;
        assert_eq!(lamport, 16 * MIB);
        assert_eq!(s.all_reduce(1024), AllReduceAlgo::Lamport);
        assert_eq!(s.all_reduce(lamport), AllReduceAlgo::Lamport);
        // Above the Lamport bound: the zero-copy pull (registered inputs; NCCL for others), the
        // copy-engine two-shot above 128 MiB (registered inputs and outputs).
        assert_eq!(s.all_reduce(lamport + 2), AllReduceAlgo::Pull);
        assert_eq!(s.all_reduce(128 * MIB), AllReduceAlgo::Pull);
        assert_eq!(s.all_reduce(256 * MIB), AllReduceAlgo::CopyEngine);
        assert_eq!(s.all_reduce(1 << 40), AllReduceAlgo::CopyEngine);
        assert_eq!(s.fallback_all_reduce(lamport + 2), AllReduceAlgo::Nccl);
        assert_eq!(s.fallback_all_reduce(1 << 40), AllReduceAlgo::Nccl);
        assert_eq!(s.reduce_scatter(32 * MIB), ReduceScatterAlgo::Push);
        // Above the symmetric bound: the zero-copy pull (registered inputs; NCCL for others).
        assert_eq!(s.reduce_scatter(32 * MIB + 2), ReduceScatterAlgo::Pull);
        assert_eq!(s.reduce_scatter(256 * MIB), ReduceScatterAlgo::Pull);
        let mut no_pull = s.clone();
        no_pull.thresholds.reduce_scatter_pull_min_bytes = usize::MAX;
        assert_eq!(no_pull.reduce_scatter(64 * MIB), ReduceScatterAlgo::Nccl);
        assert_eq!(s.all_gather(4 * MIB), AllGatherAlgo::Push);
        assert_eq!(s.all_gather(32 * MIB), AllGatherAlgo::Push);
        assert_eq!(s.all_gather(48 * MIB), AllGatherAlgo::Pull);
        assert_eq!(s.all_gather(64 * MIB), AllGatherAlgo::Pull);
        assert_eq!(s.all_gather(256 * MIB), AllGatherAlgo::CopyEngine);
        let mut no_pull = s.clone();
        no_pull.thresholds.all_reduce_pull_min_bytes = usize::MAX;
        no_pull.thresholds.all_reduce_ce_min_bytes = usize::MAX;
        no_pull.thresholds.all_gather_pull_min_bytes = usize::MAX;
        assert_eq!(no_pull.all_reduce(lamport + 2), AllReduceAlgo::Nccl);
        assert_eq!(no_pull.all_gather(48 * MIB), AllGatherAlgo::Nccl);
        let s = sel(EngineKind::Cuda, 2, false);
        assert_eq!(s.all_reduce(lamport + 2), AllReduceAlgo::Pull);
        assert_eq!(s.fallback_all_reduce(lamport + 2), AllReduceAlgo::OneShot);
        assert_eq!(s.fallback_all_reduce(1 << 40), AllReduceAlgo::OneShot);
        assert_eq!(s.all_gather(48 * MIB), AllGatherAlgo::Pull);
        assert_eq!(s.reduce_scatter(4 * MIB), ReduceScatterAlgo::Push);
        assert_eq!(s.reduce_scatter(1 << 40), ReduceScatterAlgo::Pull);
        assert_eq!(s.all_gather(64 * KIB), AllGatherAlgo::Push);
    }

    #[test]
    fn cuda_world8_hands_large_to_nccl_only_if_present() {
        let mut s = sel(EngineKind::Cuda, 8, true);
        s.thresholds.lamport_max_bytes = 64 * KIB;
        s.thresholds.one_shot_max_bytes = 256 * KIB;
        assert_eq!(s.all_reduce(32 * KIB), AllReduceAlgo::Lamport);
        assert_eq!(s.all_reduce(128 * KIB), AllReduceAlgo::OneShot);
        assert_eq!(s.all_reduce(MIB), AllReduceAlgo::TwoShot);
        assert_eq!(s.all_reduce(64 * MIB), AllReduceAlgo::Nccl);
        assert_eq!(s.reduce_scatter(64 * MIB), ReduceScatterAlgo::Nccl);
        let s = sel(EngineKind::Cuda, 8, false);
        assert_eq!(s.all_reduce(64 * MIB), AllReduceAlgo::TwoShot);
        assert_eq!(s.reduce_scatter(64 * MIB), ReduceScatterAlgo::Push);
    }

    #[test]
    fn cuda_world4_from_the_4_gpu_measurements() {
        let s = sel(EngineKind::Cuda, 4, true);
        let lamport_multi = LAMPORT_MAX_MULTI;
        assert_eq!(s.all_reduce(lamport_multi), AllReduceAlgo::Lamport);
        // Other buffers: the two-shot ring to 4 MiB, NCCL above.
        assert_eq!(s.fallback_all_reduce(4 * MIB), AllReduceAlgo::TwoShot);
        assert_eq!(s.fallback_all_reduce(4 * MIB + 2), AllReduceAlgo::Nccl);
        assert_eq!(s.fallback_all_reduce(64 * MIB), AllReduceAlgo::Nccl);
        // All-reduce of registered buffers: the two-shot pull from the Lamport bound to 16 MiB.
        assert_eq!(s.all_reduce(lamport_multi + 2), AllReduceAlgo::Pull);
        assert_eq!(s.all_reduce(16 * MIB), AllReduceAlgo::Pull);
        assert_eq!(s.all_reduce(16 * MIB + 2), AllReduceAlgo::Nccl);
        assert_eq!(s.fallback_all_reduce(2 * MIB), AllReduceAlgo::TwoShot);
        // Reduce-scatter: the pull (registered inputs) above 16 MiB at every size, the kernels up
        // to 64 MiB for other inputs (the fallback), NCCL above.
        assert_eq!(s.reduce_scatter(16 * MIB), ReduceScatterAlgo::Push);
        assert_eq!(s.reduce_scatter(256 * MIB), ReduceScatterAlgo::Pull);
        assert_eq!(s.fallback_reduce_scatter(64 * MIB), ReduceScatterAlgo::Push);
        assert_eq!(s.fallback_reduce_scatter(128 * MIB), ReduceScatterAlgo::Nccl);
        // All-gather: the pull from 16 MiB to 64 MiB, the kernels up to 32 MiB, NCCL above.
        assert_eq!(s.all_gather(16 * MIB), AllGatherAlgo::Push);
        assert_eq!(s.all_gather(32 * MIB), AllGatherAlgo::Pull);
        assert_eq!(s.all_gather(64 * MIB), AllGatherAlgo::Pull);
        assert_eq!(s.all_gather(128 * MIB), AllGatherAlgo::Nccl);
        assert_eq!(s.fallback_all_gather(32 * MIB), AllGatherAlgo::Push);
        assert_eq!(s.fallback_all_gather(64 * MIB), AllGatherAlgo::Nccl);
        let table = s.table("t");
        assert!(table.contains("<= 64 MiB      zero-copy pull"), "{table}");
        // Without NCCL the pulls' upper bounds (set against NCCL) do not apply, and the kernels
        // take every other size.
        let alone = sel(EngineKind::Cuda, 4, false);
        assert_eq!(alone.all_gather(256 * MIB), AllGatherAlgo::Pull);
        assert_eq!(alone.fallback_all_gather(256 * MIB), AllGatherAlgo::Push);
        assert_eq!(alone.all_reduce(256 * MIB), AllReduceAlgo::Pull);
        assert_eq!(alone.fallback_all_reduce(256 * MIB), AllReduceAlgo::TwoShot);
        // Eight ranks (unmeasured): no pull.
        let eight = sel(EngineKind::Cuda, 8, true);
        assert_eq!(eight.reduce_scatter(64 * MIB), ReduceScatterAlgo::Nccl);
        assert_eq!(eight.all_gather(32 * MIB), AllGatherAlgo::Nccl);
    }

    #[test]
    fn nccl_only_and_host() {
        let s = sel(EngineKind::Nccl, 4, true);
        assert_eq!(s.all_reduce(4), AllReduceAlgo::Nccl);
        assert_eq!(s.all_gather(4), AllGatherAlgo::Nccl);
        let h = sel(EngineKind::Host, 3, false);
        assert_eq!(h.all_reduce(4), AllReduceAlgo::OneShot);
        assert_eq!(h.all_reduce(MIB), AllReduceAlgo::TwoShot);
        assert_eq!(h.all_gather(1 << 30), AllGatherAlgo::Push);
    }

    /// The plans: zero-copy requests run their kernel only on buffers that qualify, else the
    /// table's pick without its zero-copy rows; the push kernels' Lamport rule (a rank's part in
    /// one slot, the whole under the bound; the all-gather's only for float lanes), which
    /// symm-cuda's own `Auto` applied before the planner took it over.
    #[test]
    fn plans_follow_the_buffers() {
        let reg = |i: bool, o: bool| move |side: Side| if side == Side::Input { i } else { o };
        let (yes, no, inp, out) = (reg(true, true), reg(false, false), reg(true, false), reg(false, true));
        fn bufs(apart: bool, in_place: bool, r: &dyn Fn(Side) -> bool) -> Bufs<'_> {
            Bufs {
                in_place,
                apart,
                registered: r,
            }
        }
        type Reg<'a> = &'a dyn Fn(Side) -> bool;
        let (yes, no, inp, out): (Reg<'_>, Reg<'_>, Reg<'_>, Reg<'_>) = (&yes, &no, &inp, &out);
        let two = sel(EngineKind::Cuda, 2, true);
        let big = 32 * MIB;
        assert_eq!(
            two.plan_all_reduce(AllReduceAlgo::Pull, big, &bufs(true, false, inp)),
            Plan::Kernel(AllReduceKernel::Pull)
        );
        assert_eq!(
            two.plan_all_reduce(AllReduceAlgo::Pull, big, &bufs(true, false, no)),
            Plan::Nccl
        );
        // In place, the one-shot pull does not qualify at two ranks.
        assert_eq!(
            two.plan_all_reduce(AllReduceAlgo::Pull, big, &bufs(false, true, yes)),
            Plan::Nccl
        );
        assert_eq!(
            two.plan_all_reduce(AllReduceAlgo::CopyEngine, big, &bufs(true, false, yes)),
            Plan::Kernel(AllReduceKernel::CopyEngineTwoShot)
        );
        assert_eq!(
            two.plan_all_reduce(AllReduceAlgo::CopyEngine, big, &bufs(true, false, inp)),
            Plan::Kernel(AllReduceKernel::Pull)
        );
        assert_eq!(
            two.plan_all_reduce(AllReduceAlgo::Pull, 4 * KIB, &bufs(true, false, no)),
            Plan::Kernel(AllReduceKernel::Lamport)
        );
        let four = sel(EngineKind::Cuda, 4, true);
        assert_eq!(
            four.plan_all_reduce(AllReduceAlgo::Pull, 8 * MIB, &bufs(false, true, yes)),
            Plan::Kernel(AllReduceKernel::PullTwoShot)
        );
        assert_eq!(
            four.plan_all_reduce(AllReduceAlgo::Pull, 2 * MIB, &bufs(true, false, inp)),
            Plan::Kernel(AllReduceKernel::TwoShot)
        );
        assert_eq!(
            four.plan_all_reduce(AllReduceAlgo::Pull, 8 * MIB, &bufs(true, false, inp)),
            Plan::Nccl
        );
        let alone = sel(EngineKind::Cuda, 4, false);
        assert_eq!(
            alone.plan_all_reduce(AllReduceAlgo::Pull, 8 * MIB, &bufs(true, false, inp)),
            Plan::Kernel(AllReduceKernel::TwoShot)
        );
        // Reduce-scatter: 16 MiB slots at two ranks, so up to the 32 MiB bound.
        assert_eq!(
            two.plan_reduce_scatter(ReduceScatterAlgo::Push, big, &|| false),
            Plan::Kernel(ReduceScatterKernel::Lamport)
        );
        assert_eq!(
            two.plan_reduce_scatter(ReduceScatterAlgo::Push, big + 2, &|| false),
            Plan::Kernel(ReduceScatterKernel::Ring)
        );
        assert_eq!(
            two.plan_reduce_scatter(ReduceScatterAlgo::Pull, 64 * MIB, &|| true),
            Plan::Kernel(ReduceScatterKernel::Pull)
        );
        assert_eq!(
            two.plan_reduce_scatter(ReduceScatterAlgo::Pull, 64 * MIB, &|| false),
            Plan::Nccl
        );
        let two_alone = sel(EngineKind::Cuda, 2, false);
        assert_eq!(
            two_alone.plan_reduce_scatter(ReduceScatterAlgo::Pull, 64 * MIB, &|| false),
            Plan::Kernel(ReduceScatterKernel::Ring)
        );
        // Smaller slots bound the part: 4 MiB slots take 8 MiB of whole tensor at two ranks.
        let mut small = sel(EngineKind::Cuda, 2, true);
        small.lamport_slot = 4 * MIB;
        assert_eq!(
            small.plan_reduce_scatter(ReduceScatterAlgo::Push, 8 * MIB, &|| false),
            Plan::Kernel(ReduceScatterKernel::Lamport)
        );
        assert_eq!(
            small.plan_reduce_scatter(ReduceScatterAlgo::Push, 8 * MIB + 4, &|| false),
            Plan::Kernel(ReduceScatterKernel::Ring)
        );
        // All-gather: Lamport for float lanes only; the zero-copy kernels by which buffer is registered.
        let ag = |a, whole, d, b: &Bufs<'_>| two.plan_all_gather(a, whole, d, b);
        assert_eq!(
            ag(AllGatherAlgo::Push, MIB, DType::BF16, &bufs(true, false, no)),
            Plan::Kernel(AllGatherKernel::Lamport)
        );
        assert_eq!(
            ag(AllGatherAlgo::Push, MIB, DType::I32, &bufs(true, false, no)),
            Plan::Kernel(AllGatherKernel::Ring)
        );
        assert_eq!(
            ag(AllGatherAlgo::CopyEngine, big, DType::F32, &bufs(true, false, yes)),
            Plan::Kernel(AllGatherKernel::CopyEnginePush)
        );
        assert_eq!(
            ag(AllGatherAlgo::CopyEngine, big, DType::F32, &bufs(true, false, inp)),
            Plan::Kernel(AllGatherKernel::CopyEnginePull)
        );
        assert_eq!(
            ag(AllGatherAlgo::CopyEngine, big, DType::F32, &bufs(true, false, no)),
            Plan::Kernel(AllGatherKernel::Lamport)
        );
        assert_eq!(
            ag(AllGatherAlgo::Pull, 48 * MIB, DType::F32, &bufs(false, true, out)),
            Plan::Kernel(AllGatherKernel::Pull)
        );
        assert_eq!(
            ag(AllGatherAlgo::Pull, 48 * MIB, DType::F32, &bufs(true, false, out)),
            Plan::Nccl
        );
        // One rank: no Lamport reduce-scatter / all-gather (nothing to exchange).
        assert!(!sel(EngineKind::Cuda, 1, true).rs_ag_lamport(2048, usize::MAX));
        // The host engine's plans name its generic paths.
        let host = sel(EngineKind::Host, 3, false);
        assert_eq!(
            host.plan_all_reduce(AllReduceAlgo::Lamport, 64, &bufs(true, false, no)),
            Plan::Kernel(AllReduceKernel::OneShot)
        );
        assert_eq!(
            host.plan_all_reduce(AllReduceAlgo::TwoShot, 64, &bufs(true, false, no)),
            Plan::Kernel(AllReduceKernel::TwoShot)
        );
    }

    #[test]
    fn table_lists_every_boundary() {
        let norm = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut s = sel(EngineKind::Cuda, 8, true);
        s.thresholds.lamport_max_bytes = 64 * KIB;
        s.thresholds.one_shot_max_bytes = 256 * KIB;
        s.thresholds.all_gather_copy_engine_min_bytes = 4 * MIB;
        let raw = s.table("hdr");
        assert!(raw.starts_with("hdr\n"), "{raw}");
        let t = norm(&raw);
        assert!(t.contains("<= 64 KiB lamport"), "{raw}");
        assert!(t.contains("<= 256 KiB one-shot"), "{raw}");
        assert!(t.contains("<= 4 MiB two-shot"), "{raw}");
        assert!(t.contains("larger nccl"), "{raw}");
        // The all-gather's push kernels are Lamport below the copy-engine bound (the planner's
        // choice, shown as such), the copy-engine push for registered outputs above it.
        assert!(t.contains("< 4 MiB lamport (data as flag"), "{raw}");
        assert!(
            t.contains("<= 8 MiB copy-engine push | other buffers: lamport"),
            "{raw}"
        );
        let raw2 = sel(EngineKind::Cuda, 2, true).table("two");
        println!("{raw2}");
        let t2 = norm(&raw2);
        assert!(t2.contains("<= 16 MiB lamport"), "{t2}");
        assert!(t2.contains("zero-copy copy-engine two-shot"), "{t2}");
        // Registered and other buffers side by side where they differ.
        assert!(t2.contains("zero-copy pull | other buffers: nccl"), "{t2}");
        // Four ranks: the reduce-scatter's ring (above the Lamport bound, below NCCL's).
        let t4 = norm(&sel(EngineKind::Cuda, 4, true).table("four"));
        assert!(t4.contains("<= 64 MiB zero-copy pull | other buffers: ring"), "{t4}");
        let h = norm(&sel(EngineKind::Host, 2, false).table("h"));
        assert!(h.contains("any size host (read every peer's segment, reduce)"), "{h}");
        assert!(h.contains("host one-shot") && h.contains("host two-shot"), "{h}");
        assert_eq!(human(1000), "1000 B");
    }
}
