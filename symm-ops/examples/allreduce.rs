//! All-reduce with symm-ops, set up the torchrun way.
//!
//! ```text
//! # one process per GPU (symmrun hosts the store, as torchrun does):
//! cargo build --example allreduce
//! symmrun --nproc-per-node 2 -- target/debug/examples/allreduce
//! torchrun --nproc-per-node 2 --no-python target/debug/examples/allreduce
//! # a single rank, no store server needed:
//! WORLD_SIZE=1 cargo run --example allreduce
//! ```
//!
//! Each rank reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT,
//! joins the group through a TcpStore, builds a `Communicator` on its GPU,
//! all-reduces a cudarc slice eagerly, then captures the all-reduce in a CUDA
//! graph and replays it. Without a GPU it runs the same ops on the host
//! backend (symm-testkit), which is what CI exercises.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use symm_ops::half::bf16;
use symm_ops::symm_core::symm_store::{HashStore, Store, TcpStore};
use symm_ops::symm_core::{set_group_info, Device, Group, ReduceOp};
use symm_ops::{CommConfig, Communicator};

type Res<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

fn env_usize(name: &str, default: usize) -> Res<usize> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse().map_err(|_| format!("{name}={v:?} is not a number"))?),
        Err(_) => Ok(default),
    }
}

fn main() -> Res {
    // Link the backends so they register themselves: symm-cuda (through
    // symm-ops' `cuda` feature) and the host backend for GPU-less machines.
    symm_ops::link();
    symm_testkit::link();

    let rank = env_usize("RANK", 0)?;
    let world = env_usize("WORLD_SIZE", 1)?;
    let local_rank = env_usize("LOCAL_RANK", rank)?;
    let timeout = Duration::from_secs(60);
    let store: Arc<dyn Store> = if std::env::var_os("MASTER_ADDR").is_some() {
        // torchrun's env:// rendezvous: rank 0 hosts the server unless the
        // launcher does (TORCHELASTIC_USE_AGENT_STORE=True).
        TcpStore::from_env(timeout)?
    } else if world == 1 {
        HashStore::new(timeout)
    } else {
        return Err("more than one rank needs MASTER_ADDR and MASTER_PORT (run under symmrun or torchrun)".into());
    };
    let group = set_group_info("world", rank, world, store)?;

    #[cfg(feature = "cuda")]
    match symm_ops::symm_cuda::cuda_available() {
        Ok(n) if n > local_rank => return on_gpu(&group, local_rank),
        Ok(n) => println!("rank {rank}: {n} GPU(s), none for local rank {local_rank}: using the host backend"),
        Err(why) => println!("rank {rank}: {why}: using the host backend"),
    }
    #[cfg(not(feature = "cuda"))]
    let _ = local_rank;
    on_host(&group)
}

fn expect(rank: usize, what: &str, got: &[bf16], want: f32) -> Res {
    match got.iter().position(|v| v.to_f32() != want) {
        None => {
            println!("rank {rank}: {what}: all {} elements = {want}", got.len());
            Ok(())
        }
        Some(i) => Err(format!("{what}: element {i} is {}, expected {want}", got[i]).into()),
    }
}

#[cfg(feature = "cuda")]
fn on_gpu(group: &Arc<Group>, local_rank: usize) -> Res {
    use symm_ops::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use symm_ops::cudarc::driver::CudaContext;

    let (rank, world) = (group.rank().get(), group.world_size());
    let ctx = CudaContext::new(local_rank)?;
    // SAFETY: this program uses every cudarc buffer on one stream only, so it
    // needs none of cudarc's cross-stream events; switching them off is what
    // lets a stream capture the ops (a capturing stream may not wait on an
    // event recorded outside the capture).
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream()?;
    // Collective: every rank builds its communicator (staging buffer,
    // kernels, NCCL fallback) once; ops then run on `stream`.
    let comm = Communicator::with_stream(group, stream.clone(), CommConfig::default())?;
    if rank == 0 {
        println!("{}", comm.selection_table());
    }

    // Eager: a plain cudarc slice, staged through the symmetric buffer.
    let n = 1 << 20;
    let mut x = stream.clone_htod(&vec![bf16::from_f32(rank as f32 + 1.0); n])?;
    comm.all_reduce(&mut x, ReduceOp::Sum)?; // algorithm from the selection table
    stream.synchronize()?;
    comm.check_error()?; // timeouts of device waits are reported here
    let sum = (world * (world + 1) / 2) as f32;
    expect(rank, "eager all_reduce", &stream.clone_dtoh(&x)?, sum)?;

    // Captured: the same op recorded once in a CUDA graph, replayed 10 times.
    // (avg of equal values leaves them equal, so every replay can be checked.)
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = comm.all_reduce(&mut x, ReduceOp::Avg);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured?;
    let graph = graph.ok_or("the capture recorded nothing")?;
    for _ in 0..10 {
        graph.launch()?;
    }
    stream.synchronize()?;
    comm.check_error()?;
    expect(rank, "graph replays", &stream.clone_dtoh(&x)?, sum)
}

fn on_host(group: &Arc<Group>) -> Res {
    let (rank, world) = (group.rank().get(), group.world_size());
    let comm = Communicator::new(group, Device::host(rank as u32), CommConfig::default())?;
    if rank == 0 {
        println!("{}", comm.selection_table());
    }
    let mut x = vec![bf16::from_f32(rank as f32 + 1.0); 1 << 20];
    comm.all_reduce(&mut x[..], ReduceOp::Sum)?;
    let sum = (world * (world + 1) / 2) as f32;
    expect(rank, "host all_reduce", &x, sum)?;
    // Out of place into a new Vec, explicitly one-shot.
    let y: Vec<bf16> = comm.one_shot_all_reduce(&x[..], ReduceOp::Max)?;
    expect(rank, "host one_shot_all_reduce", &y, sum)
}
