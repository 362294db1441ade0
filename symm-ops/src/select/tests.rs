//! The planner's tests: the table's picks, the plans, the printed table.

use super::thresholds::{KIB, LAMPORT_MAX_MULTI, LAMPORT_MAX_TWO_RANKS, LAMPORT_TWO_SHOT_MIN_MULTI, MIB};
use super::*;
use symm_core::{AllGatherKernel, AllReduceKernel, DType, ReduceScatterKernel};

fn sel(engine: EngineKind, world: usize, nccl: bool) -> Selector {
    // symm-cuda's default Lamport slots: 16 MiB for two ranks, 16 MiB / (world - 1) above.
    let lamport_slot = match engine {
        EngineKind::Cuda | EngineKind::Rocm => (16 * MIB) / world.saturating_sub(1).max(1),
        _ => 0,
    };
    Selector {
        engine,
        // symm-cuda reports the copy engine; symm-rocm does not.
        copy_engine: engine == EngineKind::Cuda,
        // Both GPU backends run the fused epilogue.
        fused_epilogue: matches!(engine, EngineKind::Cuda | EngineKind::Rocm),
        symm: engine != EngineKind::Nccl,
        nccl: nccl && engine != EngineKind::Rocm,
        // As the communicator sets them: within its Lamport slots.
        thresholds: match engine {
            EngineKind::Host => SelectionThresholds::defaults(engine, world),
            _ => SelectionThresholds::defaults(engine, world).within_slots(world, lamport_slot),
        },
        world,
        lamport_slot,
        // The byte rules alone; `handoff_rule_fuses_the_rows_the_pair_takes` sets it.
        handoff_bytes: 0,
    }
}

/// Where the table starts the Lamport two-shot (`usize::MAX`: never).
fn two_shot_from(world: usize) -> usize {
    match world {
        2 => usize::MAX,
        3 => 512 * KIB,
        _ => LAMPORT_TWO_SHOT_MIN_MULTI,
    }
}

/// The handoff rule (NOTE [fused-epilogue] "handoff"): where the backend runs the pair, `Auto`
/// fuses every epilogue whose rows it takes (at most two vectors a thread, the message within
/// HANDOFF) where the table picks Lamport, but at two ranks not rows of two vectors a thread;
/// other rows follow the byte rules.
#[test]
fn handoff_rule_fuses_the_rows_the_pair_takes() {
    use crate::EpilogueAlgo::{Fused, Separate};
    for world in [2, 3, 4, 8] {
        let s = Selector {
            handoff_bytes: 512 * KIB,
            ..sel(EngineKind::Cuda, world, true)
        };
        // bf16 rows of 4096 and 8192 (8 and 16 KiB) at 1, 8 and 32 tokens, 5000 (a partial
        // last pass of the row's block).
        for (rows, row_bytes) in [
            (1, 8 * KIB),
            (8, 8 * KIB),
            (64, 8 * KIB),
            (1, 16 * KIB),
            (8, 16 * KIB),
            (32, 16 * KIB),
            (3, 10_000),
        ] {
            // Where the table picks the Lamport two-shot (from 512 KiB at three ranks, 256 KiB
            // at four and more) the pair, whose all-reduce is the one-shot, does not run: the
            // two-shot, then the kernel.
            let want = if world == 2 && row_bytes > 8 * KIB {
                // Two ranks: not rows of two vectors a thread (above 8 KiB; the TP 2 70B layer,
                // round 25).
                Separate(AllReduceAlgo::Lamport)
            } else if rows * row_bytes >= two_shot_from(world) {
                Separate(AllReduceAlgo::LamportTwoShot)
            } else {
                Fused
            };
            assert_eq!(s.epilogue(rows, row_bytes), want, "{world}: {rows} x {row_bytes}");
        }
        // Three vectors a thread (hidden 12288 in bf16), or beyond HANDOFF: the byte rules.
        for (rows, row_bytes) in [(1, 24 * KIB), (128, 16 * KIB)] {
            let bytes = rows * row_bytes;
            let want = if world == 2 && bytes <= 512 * KIB {
                Fused
            } else {
                Separate(s.all_reduce(bytes))
            };
            assert_eq!(s.epilogue(rows, row_bytes), want, "{world}: {rows} x {row_bytes}");
        }
        let table = s.epilogue_table();
        assert!(table.contains("fused as the handoff pair"), "{table}");
        // The pair's line ends below the two-shot's rows.
        let pair_to = match world {
            2 => "up to 512 KiB".to_string(),
            _ => format!("up to {}", human(two_shot_from(world) - 1)),
        };
        assert!(table.contains(&pair_to), "{world}: {table}");
        assert_eq!(
            table.contains(
                "(not rows of 2 vectors a thread: those run the table's all-reduce, then the epilogue kernel)"
            ),
            world == 2,
            "{table}"
        );
        assert!(!sel(EngineKind::Cuda, world, true).epilogue_table().contains("handoff"));
    }
    // A backend without the pair (rocm: no PDL) never plans it.
    let rocm = sel(EngineKind::Rocm, 4, false);
    assert_eq!(rocm.epilogue(1, 8 * KIB), Separate(rocm.all_reduce(8 * KIB)));
}

/// The epilogue rule: fused at world 1 and, on CUDA at two ranks, up to the fused bound
/// (512 KiB, where the table picks Lamport and the slot holds it); otherwise the table's
/// all-reduce then the kernel at every size (Lamport up to the table's bound, from 1 KiB to 16
/// MiB at two ranks); the table shows both.
#[test]
fn epilogues_fuse_at_world_1_and_follow_the_all_reduce_table() {
    use crate::EpilogueAlgo::{Fused, Separate};
    for world in [2, 4, 8] {
        for nccl in [true, false] {
            let s = sel(EngineKind::Cuda, world, nccl);
            let fused_max = if world == 2 { 512 * KIB } else { 0 };
            assert_eq!(s.thresholds.epilogue_fused_max_bytes, fused_max);
            for bytes in [
                8 * KIB,
                512 * KIB,
                512 * KIB + 2,
                s.thresholds.lamport_max_bytes,
                64 * MIB,
            ] {
                let want = if bytes <= fused_max {
                    Fused
                } else {
                    Separate(s.all_reduce(bytes))
                };
                assert_eq!(s.epilogue(1, bytes), want, "{world} {bytes}");
            }
            let above = if world >= 3 && 512 * KIB + 2 >= LAMPORT_TWO_SHOT_MIN_MULTI {
                AllReduceAlgo::LamportTwoShot
            } else {
                AllReduceAlgo::Lamport
            };
            assert_eq!(s.epilogue(1, 512 * KIB + 2), Separate(above), "{world}");
            let table = s.epilogue_table();
            assert!(
                table.contains("lamport (one-shot, data as flag), then the epilogue"),
                "{table}"
            );
            assert_eq!(table.contains("fused"), world == 2, "{table}");
            // A Lamport slot too small for the message: the separate path.
            let small = Selector {
                lamport_slot: 4 * KIB,
                ..s.clone()
            };
            assert_eq!(
                small.epilogue(1, 8 * KIB),
                Separate(small.all_reduce(8 * KIB)),
                "{world}"
            );
        }
    }
    let one = sel(EngineKind::Cuda, 1, true);
    assert_eq!(one.epilogue(1, 8 * KIB), Fused);
    // The rocm engine runs both mechanisms too: the same rule.
    assert_eq!(sel(EngineKind::Rocm, 1, false).epilogue(1, 8 * KIB), Fused);
    for world in [2, 4] {
        let rocm = sel(EngineKind::Rocm, world, false);
        assert_eq!(rocm.epilogue(1, 8 * KIB), Separate(rocm.all_reduce(8 * KIB)));
    }
    assert_eq!(
        sel(EngineKind::Host, 1, false).epilogue(1, 8 * KIB),
        Separate(AllReduceAlgo::OneShot)
    );
    let host = sel(EngineKind::Host, 2, false);
    assert!(matches!(host.epilogue(1, 8 * MIB), Separate(_)));
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
    s.thresholds.lamport_two_shot_min_bytes = 512 * KIB;
    assert_eq!(s.all_reduce(32 * KIB), AllReduceAlgo::Lamport);
    assert_eq!(s.all_reduce(128 * KIB), AllReduceAlgo::OneShot);
    assert_eq!(s.all_reduce(384 * KIB), AllReduceAlgo::TwoShot);
    // The Lamport two-shot while two shards fit the 16/7 MiB slots (9.1 MiB), then the ring
    // two-shot to 4 MiB (none here) and NCCL.
    assert_eq!(s.all_reduce(MIB), AllReduceAlgo::LamportTwoShot);
    assert_eq!(s.all_reduce(9 * MIB), AllReduceAlgo::LamportTwoShot);
    assert_eq!(s.all_reduce(10 * MIB), AllReduceAlgo::Nccl);
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
    let two_shot_min = LAMPORT_TWO_SHOT_MIN_MULTI;
    assert_eq!(s.all_reduce(two_shot_min - 2), AllReduceAlgo::Lamport);
    // The Lamport two-shot from its bound while two shards fit the 16/3 MiB slots (10.7 MiB),
    // on any buffers (it is not a zero-copy row).
    let two_shot_max = symm_core::coll::geometry::lamport_two_shot_max_bytes(4, s.lamport_slot);
    assert!(two_shot_max > 10 * MIB && two_shot_max < 11 * MIB, "{two_shot_max}");
    for b in [two_shot_min, lamport_multi, 4 * MIB, two_shot_max] {
        assert_eq!(s.all_reduce(b), AllReduceAlgo::LamportTwoShot, "{b}");
        assert_eq!(s.fallback_all_reduce(b), AllReduceAlgo::LamportTwoShot, "{b}");
    }
    // Other buffers above it: NCCL (the two-shot ring's bound, 4 MiB, lies below).
    assert_eq!(s.fallback_all_reduce(two_shot_max + 2), AllReduceAlgo::Nccl);
    assert_eq!(s.fallback_all_reduce(64 * MIB), AllReduceAlgo::Nccl);
    // All-reduce of registered buffers: the two-shot pull from there to 16 MiB.
    assert_eq!(s.all_reduce(two_shot_max + 2), AllReduceAlgo::Pull);
    assert_eq!(s.all_reduce(16 * MIB), AllReduceAlgo::Pull);
    assert_eq!(s.all_reduce(16 * MIB + 2), AllReduceAlgo::Nccl);
    // Three ranks: the one-shot to 512 KiB (it pushes two copies, not three).
    let three = sel(EngineKind::Cuda, 3, true);
    assert_eq!(three.all_reduce(256 * KIB), AllReduceAlgo::Lamport);
    assert_eq!(three.all_reduce(512 * KIB), AllReduceAlgo::LamportTwoShot);
    assert_eq!(three.all_reduce(12 * MIB - 64), AllReduceAlgo::LamportTwoShot);
    // Two ranks: never (it moves as many bytes as the one-shot).
    let two = sel(EngineKind::Cuda, 2, true);
    assert!((0..=30).all(|p| two.all_reduce(1 << p) != AllReduceAlgo::LamportTwoShot));
    // Without the two-shot row: the ring two-shot to 4 MiB for other buffers, as before.
    let mut old = s.clone();
    old.thresholds.lamport_two_shot_min_bytes = usize::MAX;
    assert_eq!(old.all_reduce(lamport_multi), AllReduceAlgo::Lamport);
    assert_eq!(old.fallback_all_reduce(2 * MIB), AllReduceAlgo::TwoShot);
    assert_eq!(old.fallback_all_reduce(4 * MIB + 2), AllReduceAlgo::Nccl);
    assert_eq!(old.all_reduce(lamport_multi + 2), AllReduceAlgo::Pull);
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
    // Unregistered output at 2 MiB: the table without its zero-copy rows, the Lamport two-shot.
    assert_eq!(
        four.plan_all_reduce(AllReduceAlgo::Pull, 2 * MIB, &bufs(true, false, inp)),
        Plan::Kernel(AllReduceKernel::LamportTwoShot)
    );
    assert_eq!(
        four.plan_all_reduce(AllReduceAlgo::LamportTwoShot, 2 * MIB, &bufs(true, false, no)),
        Plan::Kernel(AllReduceKernel::LamportTwoShot)
    );
    assert_eq!(
        four.plan_all_reduce(AllReduceAlgo::Pull, 8 * MIB, &bufs(true, false, inp)),
        Plan::Kernel(AllReduceKernel::LamportTwoShot)
    );
    assert_eq!(
        four.plan_all_reduce(AllReduceAlgo::Pull, 12 * MIB, &bufs(true, false, inp)),
        Plan::Nccl
    );
    let alone = sel(EngineKind::Cuda, 4, false);
    assert_eq!(
        alone.plan_all_reduce(AllReduceAlgo::Pull, 12 * MIB, &bufs(true, false, inp)),
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
    s.thresholds.lamport_two_shot_min_bytes = usize::MAX;
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
    // Four ranks: the Lamport two-shot's row, up to where two shards fill a slot.
    assert!(t4.contains("lamport two-shot (data as flag)"), "{t4}");
    assert!(
        t4.contains(&format!("< {} lamport (one-shot", human(LAMPORT_TWO_SHOT_MIN_MULTI))),
        "{t4}"
    );
    let h = norm(&sel(EngineKind::Host, 2, false).table("h"));
    assert!(h.contains("any size host (read every peer's segment, reduce)"), "{h}");
    assert!(h.contains("host one-shot") && h.contains("host two-shot"), "{h}");
    assert_eq!(human(1000), "1000 B");
}

/// The rocm engine: CUDA's kernel and pull rows, no copy-engine rows and no NCCL, so every size
/// runs one of the kernels ROCm launches (Lamport, ring one-shot / two-shot / reduce-scatter /
/// all-gather, the pulls for registered buffers), whatever the request and the buffers.
#[test]
fn rocm_plans_only_the_kernels_rocm_launches() {
    for world in [2, 3, 4, 8] {
        let s = sel(EngineKind::Rocm, world, true);
        let cuda = SelectionThresholds::defaults(EngineKind::Cuda, world);
        let t = s.thresholds;
        assert_eq!(
            (t.lamport_max_bytes, t.one_shot_max_bytes, t.two_shot_max_bytes),
            (cuda.lamport_max_bytes, cuda.one_shot_max_bytes, cuda.two_shot_max_bytes)
        );
        assert_eq!(t.all_reduce_pull_min_bytes, cuda.all_reduce_pull_min_bytes);
        assert_eq!(
            (t.all_reduce_ce_min_bytes, t.all_gather_copy_engine_min_bytes),
            (usize::MAX, usize::MAX)
        );
        for registered in [false, true] {
            let reg = move |_: Side| registered;
            for (in_place, apart) in [(false, true), (true, false)] {
                let b = Bufs {
                    in_place,
                    apart,
                    registered: &reg,
                };
                for bytes in [1, 4 * KIB, 256 * KIB, MIB, 16 * MIB, 256 * MIB] {
                    assert_ne!(s.all_reduce(bytes), AllReduceAlgo::Nccl);
                    for req in [
                        s.all_reduce(bytes),
                        AllReduceAlgo::Lamport,
                        AllReduceAlgo::LamportTwoShot,
                        AllReduceAlgo::OneShot,
                        AllReduceAlgo::TwoShot,
                        AllReduceAlgo::Pull,
                        AllReduceAlgo::CopyEngine,
                    ] {
                        match s.plan_all_reduce(req, bytes, &b) {
                            Plan::Kernel(
                                AllReduceKernel::Lamport
                                | AllReduceKernel::LamportTwoShot
                                | AllReduceKernel::OneShot
                                | AllReduceKernel::TwoShot,
                            ) => {}
                            Plan::Kernel(AllReduceKernel::Pull | AllReduceKernel::PullTwoShot) if registered => {}
                            other => panic!("world {world}, {bytes} B, {req:?}, registered {registered}: {other:?}"),
                        }
                    }
                    for req in [
                        ReduceScatterAlgo::Push,
                        ReduceScatterAlgo::Pull,
                        s.reduce_scatter(bytes),
                    ] {
                        match s.plan_reduce_scatter(req, bytes, &|| registered) {
                            Plan::Kernel(ReduceScatterKernel::Lamport | ReduceScatterKernel::Ring) => {}
                            Plan::Kernel(ReduceScatterKernel::Pull) if registered => {}
                            other => panic!("world {world}, {bytes} B, {req:?}, registered {registered}: {other:?}"),
                        }
                    }
                    for req in [
                        AllGatherAlgo::Push,
                        AllGatherAlgo::Pull,
                        AllGatherAlgo::CopyEngine,
                        s.all_gather(bytes),
                    ] {
                        match s.plan_all_gather(req, bytes, DType::BF16, &b) {
                            Plan::Kernel(AllGatherKernel::Lamport | AllGatherKernel::Ring) => {}
                            Plan::Kernel(AllGatherKernel::Pull) if registered => {}
                            other => panic!("world {world}, {bytes} B, {req:?}, registered {registered}: {other:?}"),
                        }
                    }
                }
            }
        }
        // Small all-reduces take Lamport, as on CUDA; a copy-engine request with registered
        // buffers runs the pull.
        assert_eq!(s.all_reduce(4 * KIB), AllReduceAlgo::Lamport);
        let reg = Bufs {
            in_place: false,
            apart: true,
            registered: &|_| true,
        };
        let want = if world >= 3 {
            AllReduceKernel::PullTwoShot
        } else {
            AllReduceKernel::Pull
        };
        assert_eq!(
            s.plan_all_reduce(AllReduceAlgo::CopyEngine, 64 * MIB, &reg),
            Plan::Kernel(want)
        );
        assert_eq!(
            s.plan_all_gather(AllGatherAlgo::CopyEngine, 64 * MIB, DType::BF16, &reg),
            Plan::Kernel(AllGatherKernel::Pull)
        );
    }
}
