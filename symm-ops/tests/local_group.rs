//! Single-process groups built by `Communicator::for_devices` / `for_streams` (no store to set
//! up), each communicator moved into the thread that uses it. Host devices in CI; CUDA streams
//! at every world of `symm_testkit::GPU_WORLDS` (ranks sharing GPU 0, or one GPU each).

use std::thread;

use symm_ops::prelude::*;

/// Every rank all-reduces `[rank + i % 7]` in a thread of its own; each checks the sum.
fn all_reduce_in_threads(comms: Vec<Communicator>) -> Vec<f32> {
    let world = comms.len();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            thread::spawn(move || {
                let r = c.rank().get();
                let mut x: Vec<f32> = (0..1000).map(|i| (r + i % 7) as f32).collect();
                c.all_reduce(&mut x[..], ReduceOp::Sum).expect("all_reduce");
                for (i, v) in x.iter().enumerate() {
                    let want = (0..world).map(|q| (q + i % 7) as f32).sum::<f32>();
                    assert_eq!(*v, want, "rank {r} element {i}");
                }
                x[0]
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

#[test]
fn host_devices_one_group_threads_of_their_own() {
    symm_testkit::link();
    for world in [1, 2, 3, 8] {
        let devices: Vec<Device> = (0..world as u32).map(Device::host).collect();
        let comms = Communicator::for_devices(&devices, CommConfig::default()).unwrap();
        assert_eq!(comms.len(), world);
        for (r, c) in comms.iter().enumerate() {
            assert_eq!((c.rank().get(), c.world_size()), (r, world));
        }
        let firsts = all_reduce_in_threads(comms);
        assert_eq!(firsts, vec![(0..world).sum::<usize>() as f32; world]);
    }
}

#[test]
fn two_groups_of_one_process_do_not_meet() {
    symm_testkit::link();
    let devices: Vec<Device> = (0..2).map(Device::host).collect();
    let a = Communicator::for_devices(&devices, CommConfig::default()).unwrap();
    let b = Communicator::for_devices(&devices, CommConfig::default()).unwrap();
    assert_ne!(a[0].group().name(), b[0].group().name());
    all_reduce_in_threads(b);
    all_reduce_in_threads(a);
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use symm_ops::cudarc::driver::CudaContext;
    use symm_ops::symm_cuda::streams::HostCopies;
    use symm_testkit::GpuWorld;

    fn for_streams(w: GpuWorld) {
        symm_ops::link();
        if let Some(reason) = w.gate(DeviceType::Cuda) {
            println!("SUMMARY local_group_for_streams {} skipped {reason}", w.label());
            return;
        }
        let streams = (0..w.world)
            .map(|r| {
                let ctx = CudaContext::new(if w.is_shared() { 0 } else { r }).unwrap();
                ctx.new_stream().unwrap()
            })
            .collect::<Vec<_>>();
        let config = CommConfig::default().with_nccl(false);
        let comms = Communicator::for_streams(&streams, config).unwrap();
        let world = w.world;
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                thread::spawn(move || {
                    let r = c.rank().get();
                    let s = c.stream().expect("a CUDA communicator has a stream").clone();
                    let host: Vec<f32> = (0..1000).map(|i| (r + i % 7) as f32).collect();
                    let mut x = s.synced_clone_htod(&host).unwrap();
                    c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    s.synchronize().unwrap();
                    c.check_error().unwrap();
                    let got = s.synced_clone_dtoh(&x).unwrap();
                    for (i, v) in got.iter().enumerate() {
                        let want = (0..world).map(|q| (q + i % 7) as f32).sum::<f32>();
                        assert_eq!(*v, want, "rank {r} element {i}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
        println!(
            "SUMMARY local_group_for_streams {} ok: communicators built together, moved into threads, all-reduce exact",
            w.label()
        );
    }
    symm_testkit::gpu_world_tests!(for_streams, for_streams);
}
