//! An embedder of symm-core and symm-cuda alone (no symm-ops): ranks as threads of this process
//! (one GPU each, or sharing GPU 0), symmetric memory from the registered CUDA allocator,
//! rendezvoused and registered with the collectives, then a one-shot all-reduce into a cudarc
//! slice and a Lamport all-reduce in place in the symmetric buffer, through the safe typed entries
//! (`CudaCollectives::all_reduce_into`, `all_reduce_in_place`); the results are checked against a
//! float64 reference. No `unsafe` anywhere. Without a GPU it says why and exits 0 (building is
//! the check there). With one GPU both ranks share it: start the process with
//! `CUDA_DEVICE_MAX_CONNECTIONS=32` (NOTE [shared-device]; the error says so otherwise).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use symm_core::symm_store::{HashStore, Store, StoreExchange};
use symm_core::{get_allocator, AllReduceKernel, Device, DeviceType, Group, GroupOptions, ReduceOp};
use symm_cuda::collectives::CudaCollectives;
use symm_cuda::cudarc::driver::CudaContext;

type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const WORLD: usize = 2;
/// Elements: an odd count, small integers so every sum is exact.
const N: usize = 10_007;
const TIMEOUT: Duration = Duration::from_secs(60);

fn val(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 23) as f32 - 11.0
}

fn rank(r: usize, gpus: usize, store: Arc<dyn Store>) -> Res<String> {
    let shared = gpus < WORLD;
    let options = GroupOptions {
        shared_devices: shared,
        ..GroupOptions::default()
    };
    let group = Group::with_options("embed-core", r, WORLD, store.clone(), options)?;
    let gpu = if shared { 0 } else { r };
    let ctx = CudaContext::new(gpu)?;
    let stream = ctx.new_stream()?;
    let coll = CudaCollectives::new(&group, &ctx, 1 << 20, TIMEOUT)?;
    // Symmetric memory: N f32 per rank, mapped by every rank.
    let mem = get_allocator(DeviceType::Cuda)?
        .alloc(N * 4, Device::cuda(gpu as u32), &group)?
        .rendezvous(TIMEOUT)?;
    coll.register_symmetric(mem.clone())?;
    let cuda = symm_cuda::as_cuda(mem.as_ref()).ok_or("not CUDA memory")?;
    let mut buf = cuda.view::<f32>(r, 0, N, &stream)?;
    let x: Vec<f32> = (0..N).map(|i| val(r, i)).collect();
    stream.memcpy_htod(&x, &mut buf)?;
    let mut out = stream.alloc_zeros::<f32>(N)?;
    // Ranks sharing a GPU: every rank's setup (allocations, module loads) done before any kernel
    // spins on its peers (NOTE [co-residency]).
    stream.synchronize()?;
    StoreExchange::new(store, "embed-core/ready").barrier(r, WORLD, TIMEOUT)?;
    coll.all_reduce_into(&stream, AllReduceKernel::OneShot, &buf, &mut out, ReduceOp::Sum)?;
    coll.all_reduce_in_place(&stream, AllReduceKernel::Lamport, &mut buf, ReduceOp::Sum)?;
    let one_shot = stream.clone_dtoh(&out)?;
    let lamport = stream.clone_dtoh(&buf)?;
    stream.synchronize()?;
    coll.check_error()?;
    for i in 0..N {
        let want: f64 = (0..WORLD).map(|q| f64::from(val(q, i))).sum();
        if f64::from(one_shot[i]) != want || f64::from(lamport[i]) != want {
            return Err(format!(
                "rank {r} element {i}: one-shot {} and Lamport {}, want {want}",
                one_shot[i], lamport[i]
            )
            .into());
        }
    }
    Ok(format!("rank {r} on cuda:{gpu}: {N} elements exact"))
}

fn main() -> ExitCode {
    symm_cuda::link();
    let gpus = match symm_cuda::cuda_available() {
        Ok(n) => n,
        Err(e) => {
            println!("symm-embed-core: symm-core + symm-cuda alone build; not run here: {e}");
            return ExitCode::SUCCESS;
        }
    };
    let store: Arc<dyn Store> = HashStore::new(TIMEOUT);
    let handles: Vec<_> = (0..WORLD)
        .map(|r| {
            let store = store.clone();
            std::thread::spawn(move || rank(r, gpus, store))
        })
        .collect();
    let mut ok = true;
    for h in handles {
        match h.join() {
            Ok(Ok(line)) => println!("symm-embed-core: {line}"),
            Ok(Err(e)) => {
                println!("symm-embed-core: FAILED: {e}");
                ok = false;
            }
            Err(_) => {
                println!("symm-embed-core: FAILED: a rank panicked");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
