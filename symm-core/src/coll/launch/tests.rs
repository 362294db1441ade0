//! The launch plans without a GPU: which entries an op launches, in what order, with what
//! grids and what arguments (the GPU suites of symm-cuda run these same plans).

use std::cell::RefCell;

use super::*;
use crate::coll::args::LAMPORT_MODE_ARG;
use crate::coll::layout::MAX_WORLD;
use crate::kernel_source::COLLECTIVE_ENTRIES;

/// A launcher that records what it was given.
#[derive(Default)]
struct Record(RefCell<Vec<Launch>>);

impl Launcher for Record {
    fn launch(&self, l: &Launch) -> Result<()> {
        self.0.borrow_mut().push(*l);
        Ok(())
    }
}

impl Record {
    fn entries(&self) -> Vec<Entry> {
        self.0.borrow().iter().map(|l| l.entry).collect()
    }
}

/// A rig of `world` ranks with made-up addresses (no GPU), seen from `rank`; also the epilogue
/// plans' tests' (`coll/add_rms/tests.rs`).
pub(crate) fn rig(rank: usize, world: usize) -> Rig {
    let layout = WorkspaceLayout::new(world, 10 << 20, 4 << 20, 64).unwrap();
    let mut direct = Direct::default();
    for r in 0..world {
        direct.ws[r] = 0x1000_0000 * (r as u64 + 1);
        direct.pads[r] = 0x9000_0000 + 0x1_0000 * r as u64;
    }
    Rig {
        rank,
        world,
        layout,
        common: Common {
            bufs_dev: 0x10,
            pads_dev: 0x20,
            rank: rank as u32,
            world: world as u32,
        },
        direct,
        bound: Bound {
            timeout_ns: 1_000_000,
            abort_host: 0,
        },
        grid: GridBudget::new(132, 1, false).unwrap(),
        switches: Switches::default(),
        clusters: false,
    }
}

fn u64_arg(a: &KernelArg) -> u64 {
    match *a {
        KernelArg::U64(v) => v,
        other => panic!("not a u64 argument: {other:?}"),
    }
}

#[test]
fn every_entry_is_in_the_shared_source() {
    let mut all = vec![Entry::Barrier, Entry::Reject];
    for dt in KernelDtype::ALL {
        all.extend([
            Entry::Lamport(dt),
            Entry::Ring(dt),
            Entry::ReducePtrs(dt),
            Entry::Pull(dt),
            Entry::LamportAddRms(dt),
            Entry::AddRms(dt),
        ]);
        for w in LAMPORT_WORLD_MIN..=LAMPORT_WORLD_MAX {
            all.push(Entry::LamportAddRmsWorld(dt, w as u8));
        }
        for mode in [RingMode::AllReduce, RingMode::ReduceScatter, RingMode::AllGather] {
            for op in 0..4 {
                for w in LAMPORT_WORLD_MIN..=LAMPORT_WORLD_MAX {
                    all.push(Entry::LamportWorld(dt, w as u8, mode, op));
                }
                for w in LAMPORT_TWO_SHOT_WORLD_MIN..=LAMPORT_WORLD_MAX {
                    let e = Entry::LamportTwoShotWorld(dt, w as u8, op);
                    // The names the backends load the two-shot tables by, in kernel-op order.
                    assert_eq!(lamport_two_shot_names(w, dt.suffix())[op as usize], e.name());
                    all.push(e);
                }
                all.push(Entry::PullTwoRank(dt, mode, op));
            }
        }
        // The names the backends load the two-rank tables by, at the index the plans use.
        for kind in ["lamport2", "pull2"] {
            let names = mode_op_names(kind, dt.suffix());
            for (mode, op) in [
                (RingMode::AllReduce, 2),
                (RingMode::ReduceScatter, 1),
                (RingMode::AllGather, 3),
            ] {
                let e = if kind == "lamport2" {
                    Entry::LamportWorld(dt, 2, mode, op)
                } else {
                    Entry::PullTwoRank(dt, mode, op)
                };
                assert_eq!(names[mode_op_index(mode, op)], e.name());
            }
        }
    }
    for e in all {
        assert!(
            COLLECTIVE_ENTRIES.contains(&e.name().as_str()),
            "{e:?}: {} not in the source",
            e.name()
        );
    }
}

#[test]
fn each_world_takes_its_specialised_lamport_entry() {
    let to = Record::default();
    let t = Tuning::default();
    // One 1000-element bf16 Lamport all-reduce of `op` planned by `r`.
    let lamport = |r: &Rig, op: ReduceOp| {
        r.all_reduce(
            &to,
            AllReduceKernel::Lamport,
            &t,
            DeviceOp {
                input: 0x100,
                output: 0x200,
                count: 1000,
                dtype: DType::BF16,
                op,
            },
        )
        .unwrap()
    };
    let r2 = rig(1, 2);
    lamport(&r2, ReduceOp::Max);
    let generic = Rig {
        switches: Switches {
            generic_entries: true,
            lamport_bits: 0x100,
            ring_flags: 0,
            ..Switches::default()
        },
        ..r2.clone()
    };
    lamport(&generic, ReduceOp::Max);
    lamport(&rig(0, 3), ReduceOp::Max);
    lamport(&rig(7, 8), ReduceOp::Sum);
    let generic4 = Rig {
        switches: Switches {
            generic_entries: true,
            ..Switches::default()
        },
        ..rig(2, 4)
    };
    lamport(&generic4, ReduceOp::Sum);
    // Two ranks: the (mode, op) entry; 3..=8 ranks: the world's entry (NOTE
    // [lamport-world-entries]); the switch: the generic entry at every world.
    assert_eq!(
        to.entries(),
        [
            Entry::LamportWorld(KernelDtype::Bf16, 2, RingMode::AllReduce, 2),
            Entry::Lamport(KernelDtype::Bf16),
            Entry::LamportWorld(KernelDtype::Bf16, 3, RingMode::AllReduce, 2),
            Entry::LamportWorld(KernelDtype::Bf16, 8, RingMode::AllReduce, 0),
            Entry::Lamport(KernelDtype::Bf16),
        ]
    );
    let l = to.0.borrow();
    // The mode argument carries the switches' bits; this rank's pad follows the eight bases.
    assert_eq!(l[0].args[LAMPORT_MODE_ARG], KernelArg::U32(RingMode::AllReduce as u32));
    assert_eq!(l[1].args[LAMPORT_MODE_ARG], KernelArg::U32(0x100));
    assert_eq!(u64_arg(&l[0].args[MAX_WORLD]), r2.direct.pads[1]);
    assert!(l[0].threads >= 64 && l[0].threads <= 512 && l[0].blocks >= 1);
}

#[test]
fn lamport_two_shot_takes_its_world_entry_in_mode_ar2_and_fits_two_shards_a_slot() {
    let to = Record::default();
    let t = Tuning::default();
    let op = |r: &Rig, count: usize, red: ReduceOp| {
        r.all_reduce(
            &to,
            AllReduceKernel::LamportTwoShot,
            &t,
            DeviceOp {
                input: 0x100,
                output: 0x200,
                count,
                dtype: DType::BF16,
                op: red,
            },
        )
    };
    // 3..=8 ranks: the world's entry for the op; two ranks and the switch: the generic entry,
    // whose mode argument says COLL_MODE_AR2.
    op(&rig(1, 4), 1 << 20, ReduceOp::Avg).unwrap();
    op(&rig(0, 3), 1001, ReduceOp::Max).unwrap();
    op(&rig(7, 8), 5, ReduceOp::Sum).unwrap();
    op(&rig(1, 2), 1000, ReduceOp::Sum).unwrap();
    let generic = Rig {
        switches: Switches {
            generic_entries: true,
            lamport_bits: 0x100,
            ..Switches::default()
        },
        ..rig(2, 4)
    };
    op(&generic, 1000, ReduceOp::Min).unwrap();
    assert_eq!(
        to.entries(),
        [
            Entry::LamportTwoShotWorld(KernelDtype::Bf16, 4, 1),
            Entry::LamportTwoShotWorld(KernelDtype::Bf16, 3, 2),
            Entry::LamportTwoShotWorld(KernelDtype::Bf16, 8, 0),
            Entry::Lamport(KernelDtype::Bf16),
            Entry::Lamport(KernelDtype::Bf16),
        ]
    );
    let l = to.0.borrow();
    for (i, bits) in [(0, 0), (3, 0), (4, 0x100)] {
        assert_eq!(l[i].args[LAMPORT_MODE_ARG], KernelArg::U32(args::MODE_AR2 | bits));
    }
    // The count argument is the whole message; the grid is the one-shot's of it.
    assert_eq!(u64_arg(&l[0].args[LAMPORT_MODE_ARG + 4]), 1 << 20);
    let one_shot = lamport_plan(1 << 20, DType::BF16, &rig(1, 4).layout, &t, 132).unwrap();
    assert_eq!((l[0].blocks, l[0].threads), (one_shot.blocks, one_shot.threads));
    drop(l);
    // Two shards must fit a slot (4 MiB here): 4 ranks take up to 8 MiB less the rounding,
    // the one-shot only 4 MiB.
    let r4 = rig(0, 4);
    let slot = r4.layout.lamport_max_bytes();
    let max = crate::coll::geometry::lamport_two_shot_max_bytes(4, slot);
    assert!(max > slot && max <= 2 * slot, "{max} {slot}");
    assert!(op(&r4, max / 2, ReduceOp::Sum).is_ok());
    let p = lamport_two_shot_plan(max / 2, DType::BF16, &r4.layout, &t, 132).unwrap();
    assert!(2 * p.vectors * 16 <= slot);
    let too_big = (slot / 2 / 16 + 1) * 16 * 4 / 2;
    assert!(matches!(op(&r4, too_big, ReduceOp::Sum), Err(Error::OutOfRange { .. })));
}

#[test]
fn two_shot_is_a_ring_reduce_scatter_then_all_gather_into_this_ranks_shard() {
    let to = Record::default();
    let (rank, world, count) = (2, 4, 1001);
    let r = rig(rank, world);
    r.all_reduce(
        &to,
        AllReduceKernel::TwoShot,
        &Tuning::default(),
        DeviceOp {
            input: 0x1_0000,
            output: 0x8_0000,
            count,
            dtype: DType::F32,
            op: ReduceOp::Sum,
        },
    )
    .unwrap();
    let l = to.0.borrow();
    assert_eq!(l.len(), 2);
    assert_eq!(l[0].entry, Entry::Ring(KernelDtype::F32));
    assert_eq!(l[1].entry, Entry::Ring(KernelDtype::F32));
    let q = two_shot_shard(count, world, DType::F32);
    let my_out = 0x8_0000 + (rank * q * 4) as u64;
    // ring(bufs, pads, rank, world, mode, op, input, output, total, shard, ...)
    assert_eq!(l[0].args[4], KernelArg::U32(RingMode::ReduceScatter as u32));
    assert_eq!((u64_arg(&l[0].args[6]), u64_arg(&l[0].args[7])), (0x1_0000, my_out));
    assert_eq!(l[1].args[4], KernelArg::U32(RingMode::AllGather as u32));
    assert_eq!((u64_arg(&l[1].args[6]), u64_arg(&l[1].args[7])), (my_out, 0x8_0000));
    assert_eq!(
        (u64_arg(&l[1].args[8]), u64_arg(&l[1].args[9])),
        (count as u64, q as u64)
    );
    // Both halves carry the same header (the op's agreement, NOTE [op-agreement]).
    assert_eq!(l[0].args[22..24], l[1].args[22..24]);
}

#[test]
fn one_shot_in_place_sets_the_ring_flag_and_kernels_not_planned_here_are_refused() {
    let to = Record::default();
    let t = Tuning::default();
    let r = rig(0, 2);
    r.all_reduce(
        &to,
        AllReduceKernel::OneShot,
        &t,
        DeviceOp {
            input: 0x100,
            output: 0x100,
            count: 64,
            dtype: DType::F16,
            op: ReduceOp::Sum,
        },
    )
    .unwrap();
    r.all_reduce(
        &to,
        AllReduceKernel::OneShot,
        &t,
        DeviceOp {
            input: 0x100,
            output: 0x900,
            count: 64,
            dtype: DType::F16,
            op: ReduceOp::Sum,
        },
    )
    .unwrap();
    let l = to.0.borrow();
    assert_eq!(l[0].args[20], KernelArg::U32(1));
    assert_eq!(l[1].args[20], KernelArg::U32(0));
    drop(l);
    for k in [AllReduceKernel::Pull, AllReduceKernel::CopyEngineTwoShot] {
        let e = r.all_reduce(
            &to,
            k,
            &t,
            DeviceOp {
                input: 0x100,
                output: 0x900,
                count: 64,
                dtype: DType::F16,
                op: ReduceOp::Sum,
            },
        );
        assert!(matches!(e, Err(Error::Unavailable(_))), "{k:?}: {e:?}");
    }
    assert!(r
        .reduce_scatter(
            &to,
            ReduceScatterKernel::Pull,
            &t,
            DeviceOp {
                input: 0x100,
                output: 0x900,
                count: 64,
                dtype: DType::F16,
                op: ReduceOp::Sum
            }
        )
        .is_err());
    assert!(r
        .all_gather(
            &to,
            AllGatherKernel::CopyEnginePush,
            &t,
            KernelDtype::F16,
            DeviceOp::gather(0x100, 0x900, 64, DType::F16)
        )
        .is_err());
    assert_eq!(to.0.borrow().len(), 2, "a refused kernel launches nothing");
}

#[test]
fn reduce_scatter_and_all_gather_shapes() {
    let to = Record::default();
    let t = Tuning::default();
    let r = rig(1, 3);
    r.reduce_scatter(
        &to,
        ReduceScatterKernel::Ring,
        &t,
        DeviceOp {
            input: 0x1000,
            output: 0x9000,
            count: 100,
            dtype: DType::BF16,
            op: ReduceOp::Avg,
        },
    )
    .unwrap();
    r.all_gather(
        &to,
        AllGatherKernel::Ring,
        &t,
        KernelDtype::F16,
        DeviceOp::gather(0x1000, 0x9000, 100, DType::BF16),
    )
    .unwrap();
    r.all_gather(
        &to,
        AllGatherKernel::Lamport,
        &t,
        KernelDtype::F16,
        DeviceOp::gather(0x1000, 0x9000, 100, DType::BF16),
    )
    .unwrap();
    let l = to.0.borrow();
    assert_eq!(
        l.iter().map(|l| l.entry).collect::<Vec<_>>(),
        [
            Entry::Ring(KernelDtype::Bf16),
            Entry::Ring(KernelDtype::F16),
            // The Lamport all-gather runs the op's own dtype, in the entry of its world.
            Entry::LamportWorld(KernelDtype::Bf16, 3, RingMode::AllGather, 0),
        ]
    );
    // total = count * world, shard = count.
    assert_eq!((u64_arg(&l[0].args[8]), u64_arg(&l[0].args[9])), (300, 100));
    assert_eq!((u64_arg(&l[1].args[8]), u64_arg(&l[1].args[9])), (300, 100));
}

#[test]
fn the_empty_op_is_a_checked_barrier_then_a_plain_one() {
    let to = Record::default();
    rig(0, 1)
        .agree_empty(&to, OpKind::AllReduce, DType::F32, Some(ReduceOp::Sum))
        .unwrap();
    assert!(to.entries().is_empty(), "nothing at one rank");
    let r = rig(2, 3);
    r.agree_empty(&to, OpKind::AllGather, DType::F32, None).unwrap();
    let l = to.0.borrow();
    assert_eq!(to.entries(), [Entry::Barrier, Entry::Barrier]);
    // barrier(bufs, pads, rank, world, mask, state_off, timeout, abort, check)
    assert_eq!(u64_arg(&l[0].args[4]), 0b111);
    assert_ne!(l[0].args[8], KernelArg::U32(0));
    assert_eq!(l[1].args[8], KernelArg::U32(0));
}

#[test]
fn what_runs_at_one_rank() {
    assert_eq!(all_reduce_at(AllReduceKernel::Lamport, 1), AllReduceKernel::OneShot);
    assert_eq!(all_reduce_at(AllReduceKernel::PullTwoShot, 1), AllReduceKernel::OneShot);
    assert_eq!(
        all_reduce_at(AllReduceKernel::CopyEngineTwoShot, 1),
        AllReduceKernel::CopyEngineTwoShot
    );
    assert_eq!(all_reduce_at(AllReduceKernel::Lamport, 2), AllReduceKernel::Lamport);
    assert_eq!(
        reduce_scatter_at(ReduceScatterKernel::Lamport, 1),
        ReduceScatterKernel::Ring
    );
    assert_eq!(
        reduce_scatter_at(ReduceScatterKernel::Pull, 1),
        ReduceScatterKernel::Pull
    );
    assert_eq!(all_gather_at(AllGatherKernel::Pull, 1), AllGatherKernel::Ring);
}

#[test]
fn barrier_masks_check_their_ranks() {
    let r = rig(1, 4);
    let ranks = |v: &[usize], world: usize| v.iter().map(|&i| Rank::new(i, world).unwrap()).collect::<Vec<_>>();
    assert_eq!(r.barrier_mask(&ranks(&[0, 1, 3], 4)).unwrap(), Some(0b1011));
    assert_eq!(
        r.barrier_mask(&ranks(&[1], 4)).unwrap(),
        None,
        "this rank alone waits for nobody"
    );
    assert!(matches!(
        r.barrier_mask(&ranks(&[0, 2], 4)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        r.barrier_mask(&ranks(&[1, 2], 3)),
        Err(Error::OutOfRange { .. })
    ));
}

/// Addresses only: a registered allocation for the pull plans (nothing is read or written).
struct FakeMem {
    group: Arc<crate::Group>,
    bufs: Vec<u64>,
    size: usize,
}

impl crate::SymmetricMemory for FakeMem {
    fn group(&self) -> &Arc<crate::Group> {
        &self.group
    }
    fn device(&self) -> crate::Device {
        crate::Device::new(crate::DeviceType::Rocm, 0)
    }
    fn buffer_size(&self) -> usize {
        self.size
    }
    fn signal_pad_size(&self) -> usize {
        0
    }
    fn buffer_ptrs(&self) -> &[u64] {
        &self.bufs
    }
    fn signal_pad_ptrs(&self) -> &[u64] {
        &self.bufs
    }
    fn buffer_ptrs_dev(&self) -> u64 {
        0
    }
    fn signal_pad_ptrs_dev(&self) -> u64 {
        0
    }
    fn barrier(&self, _: crate::Channel, _: std::time::Duration) -> Result<()> {
        Ok(())
    }
    fn put_signal(&self, _: Rank, _: crate::Channel, _: std::time::Duration) -> Result<()> {
        Ok(())
    }
    fn wait_signal(&self, _: Rank, _: crate::Channel, _: std::time::Duration) -> Result<()> {
        Ok(())
    }
    fn read_bytes(&self, _: Rank, _: usize, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn write_bytes(&self, _: Rank, _: usize, _: &[u8]) -> Result<()> {
        Ok(())
    }
    fn read_signal_pad(&self, _: Rank, _: usize, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn set_abort(&self, _: bool) -> Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

use std::sync::Arc;

/// Rank 1 of 3 with an allocation of 1 MiB at `0x1000_0000 * (r + 1)` on every rank, registered.
fn registered_rig() -> (Rig, crate::coll::registry::Registry) {
    let r = rig(1, 3);
    let store: Arc<dyn symm_store::Store> = symm_store::HashStore::new(std::time::Duration::from_secs(5));
    let group = crate::Group::new("pull-plans", 1, 3, store).unwrap();
    let mem = FakeMem {
        group,
        bufs: (0..3).map(|r| 0x1000_0000 * (r as u64 + 1)).collect(),
        size: 1 << 20,
    };
    let reg = crate::coll::registry::Registry::default();
    reg.register(Arc::new(mem), (1, 3), crate::Device::new(crate::DeviceType::Rocm, 0))
        .unwrap();
    (r, reg)
}

// The fused pull's arguments: 0-7 pads, 8-15 sources, 16-23 destinations, then state, rank,
// world, mode, op, out, n, check.
const SRCS: usize = 8;
const DSTS: usize = 16;
const OUT: usize = 29;
const N_ARG: usize = 30;

#[test]
fn pulls_read_every_rank_at_the_same_offset_and_refuse_what_they_cannot() {
    let (r, reg) = registered_rig();
    let t = Tuning::default();
    let to = Record::default();
    let base = 0x2000_0000u64; // rank 1's allocation
    let (input, output) = (base + 0x100, 0x9000_0000u64);
    r.all_reduce_pull(
        &to,
        &reg,
        &t,
        DeviceOp {
            input,
            output,
            count: 64,
            dtype: DType::F32,
            op: ReduceOp::Sum,
        },
    )
    .unwrap();
    {
        let l = to.0.borrow();
        assert_eq!(l[0].entry, Entry::Pull(KernelDtype::F32));
        let srcs: Vec<u64> = (0..3).map(|i| u64_arg(&l[0].args[SRCS + i])).collect();
        assert_eq!(srcs, [0x1000_0100, input, 0x3000_0100]);
        assert_eq!(u64_arg(&l[0].args[OUT]), output);
    }
    // In place, or an input outside registered memory: refused, nothing launched.
    assert!(r
        .all_reduce_pull(
            &to,
            &reg,
            &t,
            DeviceOp {
                input,
                output: input,
                count: 64,
                dtype: DType::F32,
                op: ReduceOp::Sum
            }
        )
        .is_err());
    assert!(matches!(
        r.all_reduce_pull(
            &to,
            &reg,
            &t,
            DeviceOp {
                input: 0x5000,
                output,
                count: 64,
                dtype: DType::F32,
                op: ReduceOp::Sum
            }
        ),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(to.0.borrow().len(), 1);

    // Two-shot pull: rank 1 reduces its shard and writes it into every rank's output.
    let count = 1000;
    let out = base + 0x8_0000;
    r.all_reduce_pull_two_shot(
        &to,
        &reg,
        &t,
        DeviceOp {
            input,
            output: out,
            count,
            dtype: DType::F32,
            op: ReduceOp::Sum,
        },
    )
    .unwrap();
    let q = two_shot_shard(count, 3, DType::F32);
    let off = (q * 4) as u64;
    {
        let l = to.0.borrow();
        let dsts: Vec<u64> = (0..3).map(|i| u64_arg(&l[1].args[DSTS + i])).collect();
        assert_eq!(dsts, [0x1008_0000 + off, out + off, 0x3008_0000 + off]);
        assert_eq!(u64_arg(&l[1].args[N_ARG]), q.min(count - q) as u64);
    }

    // Reduce-scatter pull: every rank's shard 1 of its input.
    let g = crate::coll::check::reduce_scatter(input, output, 16, DType::F32, (1, 3))
        .unwrap()
        .unwrap()
        .1;
    r.reduce_scatter_pull(
        &to,
        &reg,
        &t,
        &g,
        DeviceOp {
            input,
            output,
            count: 16,
            dtype: DType::F32,
            op: ReduceOp::Sum,
        },
    )
    .unwrap();
    // All-gather in place in a registered output: rank s's input is slice s of its output.
    let out = base + 0x1000;
    r.all_gather_pull(
        &to,
        &reg,
        &t,
        KernelDtype::F32,
        DeviceOp::gather(out + 64, out, 16, DType::F32),
    )
    .unwrap();
    let l = to.0.borrow();
    let rs: Vec<u64> = (0..3).map(|i| u64_arg(&l[2].args[SRCS + i])).collect();
    assert_eq!(rs, [0x1000_0140, input + 64, 0x3000_0140]);
    let ag: Vec<u64> = (0..3).map(|i| u64_arg(&l[3].args[SRCS + i])).collect();
    assert_eq!(ag, [0x1000_1000, 0x2000_1040, 0x3000_1080]);
    // Three ranks: the generic entry (the two-rank ones are for two ranks only).
    assert!(l.iter().all(|l| matches!(l.entry, Entry::Pull(_))));
}

#[test]
fn backends_load_the_world_entries_the_plans_name() {
    assert_eq!(lamport_world_kind(1), None);
    assert_eq!(lamport_world_kind(9), None);
    for world in LAMPORT_WORLD_MIN..=LAMPORT_WORLD_MAX {
        let (w, kind) = lamport_world_kind(world).unwrap();
        assert_eq!(w as usize, world);
        // Where a backend finds the entry a plan of this world names.
        let e = Entry::LamportWorld(KernelDtype::F16, w, RingMode::ReduceScatter, 3);
        assert_eq!(
            mode_op_names(&kind, "f16")[mode_op_index(RingMode::ReduceScatter, 3)],
            e.name()
        );
    }
}
