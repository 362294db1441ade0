//! The epilogue kernels' layouts and launch plans without a GPU (symm-cuda checks the argument
//! lists against NVRTC's PTX).

use super::*;
use crate::coll::arg::KernelArg;
use crate::coll::args::Bound;
use crate::coll::geometry::{KernelDtype, RingMode, Tuning};
use crate::coll::launch::Switches;
use crate::kernel_source::COLLECTIVE_ENTRIES;
use crate::DType;

/// launch.rs's test rig with a host abort word (so its argument shows in the lists).
fn rig(rank: usize, world: usize) -> Rig {
    Rig {
        bound: Bound {
            timeout_ns: 1_000_000,
            abort_host: 0x7000,
        },
        ..crate::coll::launch::tests::rig(rank, world)
    }
}

/// [`fused_geometry`] with split rows, cluster rows and spread pushes allowed or not (no slot
/// rows).
fn geo(rows: usize, vr: usize, world: usize, blocks: u32, split: bool, cluster: bool, spread: bool) -> FusedGeometry {
    let allow = Layouts {
        slots: 0,
        cluster,
        spread,
        split,
    };
    fused_geometry(rows, vr, world, blocks, allow)
}

/// The epilogue's buffers, far apart.
const X: u64 = 0x1_0000_0000;
const RES: u64 = 0x2_0000_0000;
const RES_OUT: u64 = 0x3_0000_0000;
const WEIGHT: u64 = 0x4_0000_0000;
const NORM_OUT: u64 = 0x5_0000_0000;

/// `rows` bf16 rows of `hidden`, with the norm or without.
#[allow(unsafe_code)]
fn epilogue(rows: usize, hidden: usize, norm: bool) -> Epilogue {
    let r = Rows::new("t", rows * hidden, hidden, DType::BF16).unwrap();
    let n = norm.then_some((WEIGHT, NORM_OUT, 1e-5));
    // SAFETY: nothing dereferences these addresses: the tests only plan launches.
    unsafe { Epilogue::new("t", X, r, RES, RES_OUT, n) }.unwrap()
}

/// The one-kernel plans of `Rig::fused_add_rms` (the handoff switch off): its only launch.
trait OneKernel {
    fn fused(&self, e: &Epilogue) -> Result<Option<Launch>>;
}

impl OneKernel for Rig {
    fn fused(&self, e: &Epilogue) -> Result<Option<Launch>> {
        Ok(self.fused_add_rms(e, &Tuning::default())?.map(|f| {
            assert!(f.then.is_none(), "one kernel expected: {f:?}");
            f.first
        }))
    }
}

fn u32_at(l: &Launch, i: usize) -> u32 {
    match l.args[i] {
        KernelArg::U32(v) => v,
        other => panic!("argument {i} is not a u32: {other:?}"),
    }
}

fn u64_at(l: &Launch, i: usize) -> u64 {
    match l.args[i] {
        KernelArg::U64(v) => v,
        other => panic!("argument {i} is not a u64: {other:?}"),
    }
}

#[test]
fn fused_launch_takes_the_world_entry_and_the_layout() {
    let e = epilogue(1, 8192, true);
    let l = rig(1, 2).fused(&e).unwrap().unwrap();
    assert_eq!(l.entry, Entry::LamportAddRmsWorld(KernelDtype::Bf16, 2));
    // Whole rows by default (the split switch is off): one block of the row's 512 threads.
    assert_eq!((l.blocks, l.threads, l.cluster), (1, 512, 0));
    assert_eq!(l.args.len(), 30);
    // ws0..ws7, this rank's pad, rank, world, input, rows, vr, k, parts, big.
    assert_eq!(u64_at(&l, 1), 0x2000_0000);
    assert_eq!(u64_at(&l, 8), 0x9001_0000);
    assert_eq!((u32_at(&l, 9), u32_at(&l, 10)), (1, 2));
    assert_eq!((u64_at(&l, 11), u64_at(&l, 12)), (X, 1));
    assert_eq!(
        (u32_at(&l, 13), u32_at(&l, 14), u32_at(&l, 15), u32_at(&l, 16)),
        (1024, 2, 1, 512)
    );
    // The abort word, then the epilogue's buffers, eps and flags.
    assert_eq!(u64_at(&l, 20), 0x7000);
    assert_eq!(
        (u64_at(&l, 24), u64_at(&l, 25), u64_at(&l, 26), u64_at(&l, 27)),
        (RES, WEIGHT, RES_OUT, NORM_OUT)
    );
    assert_eq!(l.args[28], KernelArg::F32(1e-5));
    assert_eq!(u32_at(&l, 29), EPI_NORM);
    // The header names the fused mechanism, with and without the norm.
    let hdr = |m| header(OpKind::AllReduce, DType::BF16, 8192, Some(ReduceOp::Sum), m).args();
    assert_eq!(l.args[22..24], hdr(Mechanism::LamportResidualNorm));
    let add = rig(1, 2).fused(&epilogue(1, 8192, false)).unwrap().unwrap();
    assert_eq!(add.args[22..24], hdr(Mechanism::LamportResidual));
    assert_eq!(u32_at(&add, 29), 0);
    assert_eq!((u64_at(&add, 25), u64_at(&add, 27)), (0, 0));
    // The world's own entry at 2..=8 ranks; the generic entry at one rank and with the switch.
    for w in [3, 4, 8] {
        let l = rig(0, w).fused(&e).unwrap().unwrap();
        assert_eq!(l.entry, Entry::LamportAddRmsWorld(KernelDtype::Bf16, w as u8));
    }
    let generic = |w| Rig {
        switches: Switches {
            generic_entries: true,
            ..Switches::default()
        },
        ..rig(0, w)
    };
    for r in [rig(0, 1), generic(2), generic(4)] {
        let l = r.fused(&e).unwrap().unwrap();
        assert_eq!(l.entry, Entry::LamportAddRms(KernelDtype::Bf16), "world {}", r.world);
    }
}

#[test]
fn fused_launch_splits_and_clusters_only_as_told() {
    let e = epilogue(1, 8192, true);
    let with = |epi_split, epi_cluster, clusters| Rig {
        switches: Switches {
            epi_split,
            epi_cluster,
            ..Switches::default()
        },
        clusters,
        ..rig(0, 2)
    };
    // Split rows: 8 parts of 128 threads, no cluster attribute.
    let l = with(true, false, true).fused(&e).unwrap().unwrap();
    assert_eq!((l.blocks, l.threads, l.cluster, u32_at(&l, 15)), (8, 128, 0, 8));
    assert_eq!(u32_at(&l, 29), EPI_NORM);
    // Cluster rows: the switch and the device's clusters, both.
    let l = with(false, true, true).fused(&e).unwrap().unwrap();
    assert_eq!((l.blocks, l.threads, l.cluster, u32_at(&l, 15)), (8, 64, 8, 8));
    assert_eq!(u32_at(&l, 29), EPI_NORM | EPI_CLUSTER);
    for (split, cluster, clusters) in [(false, true, false), (false, false, true)] {
        let l = with(split, cluster, clusters).fused(&e).unwrap().unwrap();
        assert_eq!((l.blocks, l.threads, l.cluster), (1, 512, 0));
        assert_eq!(u32_at(&l, 29), EPI_NORM);
    }
}

#[test]
fn fused_launch_checks_the_lamport_buffers_and_skips_empty_rows() {
    let r = rig(0, 2);
    let max = r.layout.lamport_max_bytes();
    let hidden = 4096;
    let rows = max / (hidden * 2) + 1;
    assert!(matches!(
        r.fused(&epilogue(rows, hidden, true)),
        Err(Error::OutOfRange { .. })
    ));
    // World 1 exchanges nothing: no bound.
    assert!(rig(0, 1).fused(&epilogue(rows, hidden, true)).unwrap().is_some());
    assert!(r.fused(&epilogue(0, hidden, true)).unwrap().is_none());
    assert!(r.fused(&epilogue(rows - 1, hidden, true)).unwrap().is_some());
}

#[test]
fn separate_launch_takes_whole_rows_within_the_budget() {
    let e = epilogue(7, 4096, true);
    let l = separate(0x5000_0000, &e, 132).unwrap().unwrap();
    assert_eq!(l.entry, Entry::AddRms(KernelDtype::Bf16));
    assert_eq!((l.blocks, l.threads, l.cluster), (7, 512, 0));
    // sum, res, weight, res_out, norm_out, rows, vr, k, eps, flags.
    let want = [
        KernelArg::U64(0x5000_0000),
        KernelArg::U64(RES),
        KernelArg::U64(WEIGHT),
        KernelArg::U64(RES_OUT),
        KernelArg::U64(NORM_OUT),
        KernelArg::U64(7),
        KernelArg::U32(512),
        KernelArg::U32(1),
        KernelArg::F32(1e-5),
        KernelArg::U32(EPI_NORM),
    ];
    assert_eq!(*l.args, want);
    assert_eq!(separate(0x5000_0000, &e, 4).unwrap().unwrap().blocks, 4);
    assert!(matches!(
        separate(0x5000_0008, &e, 132),
        Err(Error::Misaligned {
            what: "all-reduced sum",
            ..
        })
    ));
    assert!(separate(0x5000_0000, &epilogue(0, 4096, true), 132).unwrap().is_none());
}

#[test]
fn epilogue_entries_are_in_the_shared_source() {
    for dt in KernelDtype::ALL {
        for e in [Entry::LamportAddRms(dt), Entry::AddRms(dt)] {
            assert!(COLLECTIVE_ENTRIES.contains(&e.name().as_str()), "{e:?}");
        }
        for w in 2..=8 {
            let e = Entry::LamportAddRmsWorld(dt, w);
            assert!(COLLECTIVE_ENTRIES.contains(&e.name().as_str()), "{e:?}");
        }
    }
    assert_eq!(
        Entry::LamportAddRmsWorld(KernelDtype::F16, 2).name(),
        "symm_lamport2_add_rms_f16"
    );
}

#[test]
fn split_rows_keep_the_rows_block_order() {
    // hidden 8192 bf16, one token, 132 SMs: 8 parts of 128 vectors, 128 threads each.
    let g = geo(1, 1024, 2, 132, true, false, false);
    assert_eq!((g.parts, g.threads, g.blocks, g.big, g.k), (8, 128, 8, 512, 2));
    // hidden 4096 bf16, 7 tokens: 4 parts a row.
    let g = geo(7, 512, 2, 132, true, false, false);
    assert_eq!((g.parts, g.threads, g.blocks), (4, 128, 28));
    // Too many rows for one wave of split blocks: whole rows, the budget's blocks.
    let g = geo(128, 1024, 2, 132, true, false, false);
    assert_eq!((g.parts, g.threads, g.blocks), (1, 512, 128));
    // World 1 and the switch off: whole rows.
    assert_eq!(geo(1, 1024, 1, 132, true, false, false).parts, 1);
    assert_eq!(geo(1, 1024, 2, 132, false, false, false).parts, 1);
    // A shared GPU's small budget still splits.
    assert_eq!(geo(1, 1024, 8, 14, true, false, false).parts, 8);
    assert_eq!(geo(7, 1024, 8, 14, true, false, false).parts, 2);
    for vr in 1..=MAX_ROW_VECTORS {
        for rows in [1usize, 2, 7, 33] {
            for blocks in [14u32, 64, 132] {
                let g = geo(rows, vr, 2, blocks, true, false, false);
                assert_eq!(g.big % g.threads, 0, "{vr}: {g:?}");
                assert!(g.threads.is_multiple_of(32) && g.threads as usize <= MAX_THREADS);
                assert!(g.blocks <= blocks && g.blocks >= 1, "{vr} {rows} {blocks}: {g:?}");
                if g.parts > 1 {
                    assert_eq!(g.blocks as usize, rows * g.parts as usize);
                    // Every part holds at least one vector.
                    let per = vr.div_ceil(g.parts as usize);
                    assert!(per * (g.parts as usize - 1) < vr, "{vr} {rows}: {g:?}");
                }
            }
        }
    }
}

#[test]
fn cluster_rows_spread_the_rows_block_over_a_cluster() {
    // hidden 8192 bf16, one token: the 512-thread block as 8 blocks of 64 (two vectors each).
    let g = geo(1, 1024, 2, 132, false, true, false);
    assert_eq!(
        (g.parts, g.threads, g.blocks, g.big, g.k, g.cluster),
        (8, 64, 8, 512, 2, true)
    );
    // 32 tokens on 132 blocks: clusters of 4.
    let g = geo(32, 1024, 4, 132, false, true, false);
    assert_eq!((g.parts, g.threads, g.blocks, g.cluster), (4, 128, 128, true));
    // Too many rows for two blocks a row: the other layouts.
    assert!(!geo(128, 1024, 2, 132, true, true, false).cluster);
    // World 1: whole rows.
    assert!(!geo(1, 1024, 1, 132, true, true, false).cluster);
    for vr in 1..=MAX_ROW_VECTORS {
        for rows in [1usize, 2, 7, 33] {
            for blocks in [14u32, 64, 132] {
                let g = geo(rows, vr, 4, blocks, false, true, false);
                if g.cluster {
                    // The row's block, cut into whole warps, at most 8 blocks, one wave.
                    assert_eq!(g.threads * g.parts, g.big, "{vr}: {g:?}");
                    assert!(g.threads.is_multiple_of(32));
                    assert!(g.parts >= 2 && g.parts as usize <= MAX_CLUSTER);
                    assert_eq!(g.blocks as usize, rows * g.parts as usize);
                    assert!(g.blocks <= blocks);
                }
            }
        }
    }
}

#[test]
fn block_of_a_row() {
    // hidden 4096 bf16: 512 vectors, one per thread; 8192: two; 128: one warp.
    assert_eq!(epilogue_threads(512), (512, 1));
    assert_eq!(epilogue_threads(1024), (512, 2));
    assert_eq!(epilogue_threads(16), (32, 1));
    assert_eq!(epilogue_threads(1), (32, 1));
    assert_eq!(epilogue_threads(MAX_ROW_VECTORS), (512, 8));
    assert_eq!(epilogue_threads(100), (128, 1));
    for vr in 1..=MAX_ROW_VECTORS {
        let (t, k) = epilogue_threads(vr);
        assert!(t % 32 == 0 && t as usize <= MAX_THREADS);
        assert!((t * k) as usize >= vr && k as usize <= MAX_VECTORS_PER_THREAD, "{vr}");
    }
}

#[test]
fn spread_pushes_keep_whole_rows_and_add_pushing_blocks() {
    // hidden 8192 bf16, one token, 132 SMs: four blocks of the row's 512 threads push it.
    let g = geo(1, 1024, 2, 132, false, false, true);
    assert_eq!(
        (g.parts, g.threads, g.blocks, g.big, g.k, g.cluster, g.spread),
        (4, 512, 4, 512, 2, false, true)
    );
    // hidden 4096: two; 32 rows of 8192 on 132 blocks: four a row; 128 rows: whole rows.
    assert_eq!(geo(1, 512, 4, 132, false, false, true).parts, 2);
    assert_eq!(geo(32, 1024, 4, 132, false, false, true).blocks, 128);
    assert!(!geo(128, 1024, 4, 132, false, false, true).spread);
    // World 1 and rows of one part: whole rows. Cluster rows come first.
    assert!(!geo(1, 1024, 1, 132, false, false, true).spread);
    assert!(!geo(1, 200, 2, 132, false, false, true).spread);
    assert!(geo(1, 1024, 2, 132, false, true, true).cluster);
    // The switch reaches the launch: the blocks, `parts` and the kernel's flag.
    let r = Rig {
        switches: Switches {
            epi_spread: true,
            ..Switches::default()
        },
        ..rig(0, 2)
    };
    let l = r.fused(&epilogue(1, 8192, true)).unwrap().unwrap();
    assert_eq!((l.blocks, l.threads, l.cluster), (4, 512, 0));
    assert_eq!(u32_at(&l, 15), 4);
    assert_eq!(u32_at(&l, 29), EPI_NORM | EPI_SPREAD);
    for blocks in [14u32, 64, 132] {
        for rows in [1usize, 2, 7, 33] {
            for vr in [1usize, 255, 256, 257, 512, 1024, 4096] {
                let g = geo(rows, vr, 4, blocks, false, false, true);
                assert!(
                    g.blocks <= blocks.max(1) && g.threads == g.big,
                    "{rows} {vr} {blocks}: {g:?}"
                );
                if g.spread {
                    assert_eq!(g.blocks as usize, rows * g.parts as usize);
                    // Every pushing block has a vector.
                    assert!(vr.div_ceil(g.parts as usize) * (g.parts as usize - 1) < vr, "{g:?}");
                }
            }
        }
    }
}

#[test]
fn slot_rows_cut_the_rows_block_into_blocks_of_the_asked_size() {
    let slots = |threads: u32| Layouts {
        slots: threads,
        cluster: true,
        spread: true,
        split: true,
    };
    // hidden 8192 bf16, one token: the 512-thread block as 4 blocks of 128 (two vectors each),
    // or 8 of 64; slot rows come before every other layout.
    let g = fused_geometry(1, 1024, 2, 132, slots(128));
    assert_eq!(
        (g.parts, g.threads, g.blocks, g.big, g.k, g.slots, g.cluster, g.spread),
        (4, 128, 4, 512, 2, true, false, false)
    );
    assert_eq!(fused_geometry(1, 1024, 4, 132, slots(64)).parts, 8);
    // hidden 4096, 8 tokens: 4 blocks a row (8 rows x 16 warps = 128 slots).
    let g = fused_geometry(8, 512, 4, 132, slots(128));
    assert_eq!((g.parts, g.threads, g.blocks, g.slots), (4, 128, 32, true));
    // More warps than the STATE slots hold (17 rows x 16 warps > 256): another layout.
    assert!(!fused_geometry(17, 1024, 4, 132, slots(128)).slots);
    // World 1, or slot rows off: never.
    assert!(!fused_geometry(1, 1024, 1, 132, slots(128)).slots);
    assert!(!fused_geometry(1, 1024, 2, 132, Layouts::default()).slots);
    for vr in 1..=MAX_ROW_VECTORS {
        for rows in [1usize, 2, 7, 33] {
            for blocks in [14u32, 64, 132] {
                for threads in [32u32, 64, 128, 512] {
                    let g = fused_geometry(rows, vr, 4, blocks, slots(threads));
                    if g.slots {
                        assert_eq!(g.threads * g.parts, g.big, "{vr}: {g:?}");
                        assert!(g.threads.is_multiple_of(32) && g.parts >= 2);
                        assert_eq!(g.blocks as usize, rows * g.parts as usize);
                        assert!(g.blocks <= blocks && rows * g.big as usize / 32 <= EPI_SLOTS_MAX);
                    }
                }
            }
        }
    }
    // The switch reaches the launch: the blocks, `parts` and the kernel's flag, no cluster.
    let r = Rig {
        switches: Switches {
            epi_slots: 128,
            ..Switches::default()
        },
        ..rig(0, 4)
    };
    let l = r.fused(&epilogue(1, 8192, true)).unwrap().unwrap();
    assert_eq!((l.blocks, l.threads, l.cluster), (4, 128, 0));
    assert_eq!(u32_at(&l, 15), 4);
    assert_eq!(u32_at(&l, 29), EPI_NORM | EPI_SLOTS);
}

/// The handoff pair (NOTE [fused-epilogue] "handoff"): the Lamport all-reduce as `Rig::lamport`
/// plans it into this rank's HANDOFF buffer under the fused op's header, then the fused entry's
/// epilogue half over whole rows with `input` = HANDOFF; rows of more than two vectors a thread,
/// messages beyond HANDOFF and one rank keep the one kernel.
#[test]
fn handoff_pair_plans_the_lamport_all_reduce_then_the_epilogue_half() {
    let tuning = Tuning::default();
    for (rank, world) in [(1, 2), (2, 4), (0, 8)] {
        let mut r = rig(rank, world);
        r.switches.epi_handoff = true;
        let hand = r.direct.ws[rank] + r.layout.handoff_off() as u64;
        for (rows, hidden) in [(1, 4096), (8, 8192), (32, 8192), (3, 2048)] {
            let e = epilogue(rows, hidden, true);
            let f = r.fused_add_rms(&e, &tuning).unwrap().unwrap();
            let then = f.then.expect("the handoff pair");
            let sum = DeviceOp {
                input: X,
                output: hand,
                count: rows * hidden,
                dtype: DType::BF16,
                op: ReduceOp::Sum,
            };
            let mech = Mechanism::LamportResidualNorm;
            let h = header(OpKind::AllReduce, DType::BF16, rows * hidden, Some(ReduceOp::Sum), mech);
            let want = r
                .lamport(KernelDtype::Bf16, RingMode::AllReduce, sum, &tuning, &h)
                .unwrap();
            assert_eq!(f.first.entry, want.entry);
            assert_eq!((f.first.blocks, f.first.threads), (want.blocks, want.threads));
            assert_eq!(format!("{:?}", f.first.args), format!("{:?}", want.args));
            assert_eq!(then.entry, Entry::LamportAddRmsWorld(KernelDtype::Bf16, world as u8));
            let (big, _) = epilogue_threads(hidden / 8);
            assert_eq!((then.blocks, then.threads, then.cluster), (rows as u32, big, 0));
            assert_eq!(u64_at(&then, 11), hand, "the epilogue half's input is HANDOFF");
            assert_eq!(u32_at(&then, 15), 1);
            assert_eq!(u32_at(&then, 29), EPI_NORM | EPI_HANDOFF);
            assert_eq!(then.args[22..24], f.first.args[22..24], "one header for both halves");
        }
        // Three vectors a thread (hidden 12288 in bf16: 1536 vectors over 512 threads), a
        // message beyond HANDOFF: the one kernel.
        for e in [epilogue(1, 12288, true), epilogue(128, 8192, true)] {
            assert!(r.layout.handoff_bytes < 128 * 8192 * 2 || e.rows().rows() == 1);
            let f = r.fused_add_rms(&e, &tuning).unwrap().unwrap();
            assert!(f.then.is_none(), "{f:?}");
            assert_eq!(u32_at(&f.first, 29) & EPI_HANDOFF, 0);
        }
    }
    let mut one = rig(0, 1);
    one.switches.epi_handoff = true;
    assert!(one
        .fused_add_rms(&epilogue(1, 4096, true), &tuning)
        .unwrap()
        .unwrap()
        .then
        .is_none());
}

/// The longest row the pair takes, as the selection table prints it, is `handoff_fits`' own
/// bound: the pair takes a row of that many bytes and not one vector more.
#[test]
fn handoff_max_row_bytes_is_the_rule_s_bound() {
    let v = handoff_max_row_bytes() / crate::coll::geometry::VEC_BYTES;
    assert!(handoff_fits(1, v, usize::MAX));
    assert!(!handoff_fits(1, v + 1, usize::MAX));
}
