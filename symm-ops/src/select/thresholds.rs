//! The selection table's data: [`SelectionThresholds`] and its measured defaults.

use super::EngineKind;

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
    /// all_reduce from this size on (up to `lamport_two_shot_max_bytes`), where its two shards
    /// fit a Lamport slot: the Lamport two-shot ([`AllReduceAlgo::LamportTwoShot`], NOTE
    /// [lamport-two-shot]); it takes precedence over the Lamport one-shot and the zero-copy
    /// rows in its range. `usize::MAX`: never. CUDA and ROCm.
    pub lamport_two_shot_min_bytes: usize,
    /// all_reduce up to this size (from `lamport_two_shot_min_bytes`): the Lamport two-shot.
    pub lamport_two_shot_max_bytes: usize,
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
    /// all-reduce epilogues (residual add, RMSNorm) up to this size of `x`: the fused Lamport
    /// kernel, one kernel, where the all-reduce table picks Lamport; larger: the table's
    /// all-reduce then the epilogue kernel. Chosen from the tensor-parallel layer (`tp-layer`)
    /// and symm-bench together (bench-notes round 20). CUDA only.
    pub epilogue_fused_max_bytes: usize,
    /// all-reduce epilogues whose rows the handoff pair takes (NOTE [fused-epilogue] "handoff":
    /// at most two vectors of 16 bytes a thread, within the backend's HANDOFF buffer), where the
    /// all-reduce table picks Lamport: rows of one vector a thread always run as the pair; rows
    /// of two (more than `epilogue_threads`' 512 vectors: hidden above 4096 in bf16) as the pair
    /// up to this many rows, above it the table's all-reduce then the epilogue kernel. Chosen
    /// from the tensor-parallel layer with its modes interleaved (bench-notes round 25). CUDA
    /// only (the backend reports the pair, `CollFacts::handoff_bytes`).
    pub epilogue_handoff_wide_max_rows: usize,
}

impl SelectionThresholds {
    /// These thresholds for Lamport slots of `slot` bytes in a group of `world` ranks (the same
    /// on every rank): the one-shot up to a slot, the two-shot while two shards fit one (NOTE
    /// [lamport-two-shot]).
    pub(crate) fn within_slots(self, world: usize, slot: usize) -> Self {
        SelectionThresholds {
            lamport_max_bytes: self.lamport_max_bytes.min(slot),
            lamport_two_shot_max_bytes: self
                .lamport_two_shot_max_bytes
                .min(symm_core::coll::geometry::lamport_two_shot_max_bytes(world, slot)),
            ..self
        }
    }

    /// These thresholds without their zero-copy rows (pulls, copy engine).
    pub(crate) fn without_zero_copy(self) -> Self {
        SelectionThresholds {
            all_reduce_pull_min_bytes: usize::MAX,
            all_reduce_ce_min_bytes: usize::MAX,
            reduce_scatter_pull_min_bytes: usize::MAX,
            all_gather_pull_min_bytes: usize::MAX,
            all_gather_copy_engine_min_bytes: usize::MAX,
            ..self
        }
    }
}

pub(crate) const KIB: usize = 1024;
pub(crate) const MIB: usize = 1024 * 1024;

impl SelectionThresholds {
    /// The defaults for an engine and world size.
    ///
    /// CUDA, two ranks: measured on 2 x H200 (see the comment in the body):
    /// Lamport up to 16 MiB; above, the zero-copy pulls for inputs in
    /// registered symmetric memory (all-gather: the copy engine above 64 MiB)
    /// and NCCL for other inputs. Three and four ranks: measured on 4 x H200
    /// and 4 x H100 (the Lamport one-shot, then the Lamport two-shot while two
    /// shards fit a slot, the two-shot pull for registered buffers, NCCL);
    /// five to eight ranks take the same all-reduce rows, unmeasured. Without
    /// NCCL the kernels run every size.
    pub fn defaults(engine: EngineKind, world_size: usize) -> Self {
        match engine {
            // The same kernels as CUDA's, launched the same way; no copy-engine rows (the ROCm
            // engine has no copy-engine paths) and no NCCL. Provisional: every figure behind
            // the CUDA bounds was measured on H100 / H200, none on AMD hardware.
            EngineKind::Rocm | EngineKind::Kernels => SelectionThresholds {
                all_reduce_ce_min_bytes: usize::MAX,
                all_gather_copy_engine_min_bytes: usize::MAX,
                // The fused kernel is unmeasured on AMD GPUs.
                epilogue_fused_max_bytes: 0,
                epilogue_handoff_wide_max_rows: usize::MAX,
                ..Self::defaults(EngineKind::Cuda, world_size)
            },
            EngineKind::Host => SelectionThresholds {
                lamport_max_bytes: 0,
                lamport_two_shot_min_bytes: usize::MAX,
                lamport_two_shot_max_bytes: 0,
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
                epilogue_fused_max_bytes: 0,
                epilogue_handoff_wide_max_rows: usize::MAX,
            },
            EngineKind::Nccl => SelectionThresholds {
                lamport_max_bytes: 0,
                lamport_two_shot_min_bytes: usize::MAX,
                lamport_two_shot_max_bytes: 0,
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
                epilogue_fused_max_bytes: 0,
                epilogue_handoff_wide_max_rows: usize::MAX,
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
                    // Two ranks: the two-shot moves as many bytes as the one-shot.
                    lamport_two_shot_min_bytes: usize::MAX,
                    lamport_two_shot_max_bytes: 0,
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
                    epilogue_fused_max_bytes: EPILOGUE_FUSED_MAX_TWO_RANKS,
                    epilogue_handoff_wide_max_rows: EPILOGUE_HANDOFF_WIDE_MAX_ROWS_TWO_RANKS,
                }
            }
            EngineKind::Cuda => {
                // - all-reduce (4 x H100, session 25, bench-notes round 26): the Lamport one-shot
                //   below 256 KiB (512 KiB at three ranks), then the Lamport two-shot while two
                //   shards fit a slot (LAMPORT_TWO_SHOT_MIN_MULTI has the figures: 4 MiB 21.7 us
                //   against NCCL's 41.5 and the two-shot pull's 33.2). Beyond that (4 ranks:
                //   10.7 MiB) the rows below, measured on 4 x H200 (NV18 each pair, graph replay,
                //   NCCL 2.28.9 in the same run; session 14, docs/benchmarks.md, bench-notes round
                //   15), apply: the two-shot ring to 4 MiB for other buffers (36.3 against 40.2;
                //   with the default slots the Lamport two-shot now takes those sizes), NCCL above
                //   (16 MiB: 96.6 against 109);
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
                //   two-shot pull above the Lamport rows up to 16 MiB (2 / 4 / 8 / 16 MiB: 18.8 /
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
                    lamport_two_shot_min_bytes: if world_size == 3 {
                        LAMPORT_TWO_SHOT_MIN_THREE_RANKS
                    } else {
                        LAMPORT_TWO_SHOT_MIN_MULTI
                    },
                    lamport_two_shot_max_bytes: usize::MAX,
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
                    // 3 and 4 ranks (4 x H100, round 20): the one fused kernel is level with
                    // Lamport + the epilogue kernel at hidden 4096 and 1-1.5 us slower at 8192
                    // (one SM pushes a row to three peers), in symm-bench and in the 70B TP 4
                    // layer; the handoff pair (round 23) takes the rows it fits from one row on.
                    epilogue_fused_max_bytes: 0,
                    epilogue_handoff_wide_max_rows: usize::MAX,
                }
            }
        }
    }
}

/// All-reduce, two ranks: the Lamport kernel up to this size (2 x H200, pipelined Lamport
/// kernel, bench-notes.md round 5: 15.8 us at 4 MiB, 28.4 at 8, 53.1 at 16 against the zero-copy
/// pull's 19.2 / 32.1 / 57.3 and NCCL's 32.5 / 44.9 / 71.9). Capped by the Lamport slots.
pub const LAMPORT_MAX_TWO_RANKS: usize = 16 * MIB;
/// All-reduce, more than two ranks: the Lamport one-shot up to this size (every rank pushes the
/// whole message to every peer; 4 x H200: 13.9 us against NCCL's 17.5 at 1 MiB), where the
/// Lamport two-shot's rows (from [`LAMPORT_TWO_SHOT_MIN_MULTI`]) do not take it first: with
/// the default slots it runs below 256 KiB (three ranks: 512 KiB).
pub const LAMPORT_MAX_MULTI: usize = MIB;
/// All-reduce, four and more ranks: the Lamport two-shot (NOTE [lamport-two-shot]) from this
/// size on, as far as its two shards fit a Lamport slot (4 ranks: 10.7 MiB of 5.3 MiB slots),
/// ahead of the one-shot, the zero-copy pulls and NCCL there. 4 x H100, bf16, graph
/// (bench-notes round 26): 128 KiB 4.99 us against the one-shot's 4.41, 256 KiB 5.24 against
/// 5.39, 512 KiB 5.95 against 7.61, 1 / 2 / 4 / 8 MiB 7.77 / 12.28 / 21.69 / 41.46 against
/// NCCL's 17.57 / 26.71 / 41.53 / 62.60 and the two-shot pull's (registered buffers) 22.75 /
/// 33.15 / 53.13 at 2-8 MiB. Five to eight ranks are unmeasured; the two-shot's advantage
/// grows with the ranks (the one-shot pushes world - 1 copies), so their crossover lies lower.
pub const LAMPORT_TWO_SHOT_MIN_MULTI: usize = 256 * KIB;
/// All-reduce, three ranks: the Lamport two-shot from this size on (the one-shot pushes two
/// copies, the two-shot 4/3 of the message). 4 x H100 with three ranks, bf16, graph (round 26):
/// 256 KiB 4.84 against the one-shot's 4.23, 512 KiB 5.56 against 5.74, 1 / 2 / 4 / 8 MiB 7.23 /
/// 12.45 / 20.30 / 39.98 against NCCL's 16.10 / 25.30 / 44.03 / 62.95.
pub const LAMPORT_TWO_SHOT_MIN_THREE_RANKS: usize = 512 * KIB;
/// All-reduce, more than two ranks: the ring one-shot up to this size, the two-shot above (the
/// PyTorch / vLLM one-shot bound).
pub const ONE_SHOT_MAX_MULTI: usize = 256 * KIB;
/// All-reduce epilogues, two ranks: the fused Lamport kernel up to this size of `x` (4 x H100,
/// bf16, graph replay, bench-notes round 20: 4.07-6.39 us against Lamport + the epilogue kernel's
/// 4.68-6.85 at hidden 4096 / 8192 x 1-32 tokens, 8-512 KiB; in the layer at TP 2 0.88-0.96 of
/// NCCL + norm against 0.91-0.96). Larger messages were not measured with this kernel.
pub const EPILOGUE_FUSED_MAX_TWO_RANKS: usize = 512 * KIB;
/// All-reduce epilogues, two ranks: rows of two vectors a thread (hidden above 4096 in bf16) run
/// as the handoff pair up to this many rows: none (4 x H100, bf16, graph, tp-layer with its modes
/// interleaved, bench-notes round 25). Hidden 8192 (70B) at TP 2, per layer: eight tokens the
/// pair 369.1-370.5 us against Lamport + the epilogue kernel's 363.2-365.1 (four runs, two
/// machines; back to back at 8 rows 5.13 against 4.85 us an op); one token it was 0.7-1.2 us
/// ahead on one machine and 4.9-5.4 behind on another (back to back 4.07 against 4.51 an op),
/// so the kernel boundary it saves does not pay on every machine. Hidden 4096 (8B), one vector
/// a thread: the pair at every row count (one token 138.7-139.3 against 140.4-140.7, eight
/// level). Round 23's rule (Lamport + norm at one row, every hidden size) came from runs where
/// the pair's mode ran after the other and carried tp-layer's order bias. Three and more ranks:
/// the pair at every row count it takes (TP 4 70B level, 8B level or ahead; 8192 x 32 back to
/// back 9.61 against 9.80-9.87).
pub const EPILOGUE_HANDOFF_WIDE_MAX_ROWS_TWO_RANKS: usize = 0;
/// Reduce-scatter / all-gather: the Lamport kernels up to this whole-tensor size (see
/// [`SelectionThresholds::reduce_scatter_lamport_max_bytes`]).
pub const RS_AG_LAMPORT_MAX: usize = 32 * MIB;
