//! Activations in symmetric memory (`Communicator::alloc`, #18) on the host backend, in a
//! single-process group (worlds 1, 2, 3 and 8, one thread per rank, communicators built by
//! `for_devices` and moved in): buffers used as op inputs and outputs go zero-copy and give the
//! float64 reference's result; a dropped buffer's block is handed out again without a
//! rendezvous (the pool does not grow); sizes and dtypes get blocks of their own class; bad
//! host copies are errors; every rank ends with the same block counts.

use std::thread;

use half::bf16;
use symm_ops::prelude::*;
use symm_ops::{SymmBuffer, MIN_BLOCK_BYTES};

fn val(rank: usize, i: usize, salt: usize) -> f32 {
    (((i * 5 + rank * 11 + salt * 3) % 13) as f32 - 6.0) * 0.25
}

fn fill(comm: &Communicator, b: &SymmBuffer<f32>, salt: usize) -> Result<()> {
    let r = comm.rank().get();
    let h: Vec<f32> = (0..b.len()).map(|i| val(r, i, salt)).collect();
    b.copy_from_host(&h)
}

fn reference(world: usize, len: usize, salt: usize) -> Vec<f64> {
    (0..len)
        .map(|i| (0..world).map(|r| val(r, i, salt) as f64).sum())
        .collect()
}

fn check(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}: element {i}: {g}, want {w}"
        );
    }
}

/// One rank's worker.
fn worker(comm: Communicator) -> Result<(usize, usize)> {
    let world = comm.world_size();
    let r = comm.rank().get();
    // In place, every algorithm.
    let len = 4099;
    let mut x = comm.alloc::<f32>(len)?;
    assert_eq!(x.len(), len);
    for (salt, algo) in [AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot, AllReduceAlgo::Lamport]
        .into_iter()
        .enumerate()
    {
        fill(&comm, &x, salt)?;
        comm.all_reduce_with(algo, None, (&mut x).into(), ReduceOp::Sum)?;
        check(&format!("rank {r} {algo}"), &x.to_host()?, &reference(world, len, salt));
    }
    // Out of place, activation to activation; the auto pick.
    let mut y = comm.alloc::<f32>(len)?;
    y.copy_from_host(&vec![f32::NAN; len])?;
    fill(&comm, &x, 9)?;
    comm.all_reduce_out(&x, &mut y, ReduceOp::Sum)?;
    check(
        &format!("rank {r} out of place"),
        &y.to_host()?,
        &reference(world, len, 9),
    );
    // Reduce-scatter and all-gather between activations.
    let shard = 37;
    let full = comm.alloc::<f32>(shard * world)?;
    fill(&comm, &full, 4)?;
    let mut part = comm.alloc::<f32>(shard)?;
    comm.reduce_scatter_out(&full, &mut part, ReduceOp::Sum)?;
    let want = reference(world, shard * world, 4);
    check(
        &format!("rank {r} reduce_scatter"),
        &part.to_host()?,
        &want[r * shard..(r + 1) * shard],
    );
    let mut gathered = comm.alloc::<f32>(shard * world)?;
    comm.all_gather_out(&part, &mut gathered)?;
    check(&format!("rank {r} all_gather"), &gathered.to_host()?, &want);

    // The pool: x, y, full, part, gathered are live; dropping x hands its block to the next
    // buffer of its class without growing the pool.
    let (blocks, used) = comm.pool_blocks();
    assert_eq!(used, 5);
    let x_addr = x.address();
    drop(x);
    let again = comm.alloc::<f32>(len - 1)?;
    assert_eq!(again.address(), x_addr, "rank {r}: the freed block is reused");
    assert_eq!(comm.pool_blocks(), (blocks, 5));
    // Another dtype, or a larger class, gets a block of its own (a collective step here).
    let h = comm.alloc::<bf16>(len)?;
    let big = comm.alloc::<f32>(MIN_BLOCK_BYTES)?;
    assert_eq!(comm.pool_blocks(), (blocks + 2, 7));
    assert_ne!(h.address(), again.address());
    drop((h, big, again));
    assert_eq!(comm.pool_blocks().1, 4);

    // Bad host copies are errors.
    assert!(matches!(part.copy_from_host(&[1.0; 3]), Err(Error::InvalidArgument(_))));
    // Zero elements: a buffer of its own; an empty op on it agrees like any other.
    let mut e = comm.alloc::<f32>(0)?;
    assert!(e.is_empty());
    comm.all_reduce(&mut e, ReduceOp::Sum)?;
    // A host buffer has no cudarc view.
    assert!(matches!(part.view(), Err(Error::InvalidArgument(_))));
    Ok(comm.pool_blocks())
}

fn run(world: usize) {
    symm_testkit::link();
    let devices = vec![Device::host(0); world];
    let comms = Communicator::for_devices(&devices, CommConfig::default()).expect("for_devices");
    let handles: Vec<_> = comms.into_iter().map(|c| thread::spawn(move || worker(c))).collect();
    let pools: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(r, h)| {
            h.join()
                .expect("worker")
                .unwrap_or_else(|e| panic!("world {world} rank {r}: {e}"))
        })
        .collect();
    // Every rank made the same pool decisions.
    assert!(pools.windows(2).all(|p| p[0] == p[1]), "{pools:?}");
}

#[test]
fn activations_world_1() {
    run(1);
}
#[test]
fn activations_world_2() {
    run(2);
}
#[test]
fn activations_world_3() {
    run(3);
}
#[test]
fn activations_world_8() {
    run(8);
}
