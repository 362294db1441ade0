//! Registration, errors without a GPU, and (with AMD GPUs) the backend itself.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use symm_core::{get_allocator, has_allocator, Channel, Device, DeviceType, Error, Group, SymmetricMemory};
use symm_store::HashStore;

#[test]
fn registered_for_rocm_after_link() {
    symm_rocm::link();
    assert!(has_allocator(DeviceType::Rocm));
    let a = get_allocator(DeviceType::Rocm).unwrap();
    assert_eq!(a.name(), "symm-rocm");
    assert_eq!(a.device_type(), DeviceType::Rocm);
    assert!(!a.has_multicast_support(Device::rocm(0)));
    let det: Vec<_> = symm_core::inventory::iter::<symm_core::ConnectivityDetector>
        .into_iter()
        .filter(|d| d.device_type == DeviceType::Rocm)
        .map(|d| d.link_kind)
        .collect();
    assert_eq!(det, ["xgmi"]);
}

#[test]
fn wrong_device_type_and_missing_gpu_are_errors() {
    let store = HashStore::new(Duration::from_secs(5));
    let g = Group::new("rocm-errors", 0, 1, store).unwrap();
    let a = get_allocator(DeviceType::Rocm).unwrap();
    assert!(matches!(
        a.alloc(1024, Device::cuda(0), &g),
        Err(Error::InvalidArgument(_))
    ));
    match symm_rocm::rocm_available() {
        Err(e) => {
            assert!(matches!(e, Error::Unavailable(_)), "{e}");
            assert!(matches!(a.alloc(1024, Device::rocm(0), &g), Err(Error::Unavailable(_))));
            assert!(
                matches!(
                    symm_core::get_connectivity(DeviceType::Rocm, "xgmi"),
                    Err(Error::Unavailable(_))
                ) || symm_core::get_connectivity(DeviceType::Rocm, "xgmi").is_ok()
            );
        }
        Ok(n) => {
            assert!(matches!(
                a.alloc(1024, Device::rocm(n as u32), &g),
                Err(Error::OutOfRange { .. })
            ));
        }
    }
}

/// True when the test must skip (printed; a failure with SYMM_REQUIRE_GPUS=1).
fn gate(gpus: usize) -> bool {
    symm_rocm::link();
    symm_testkit::gpu_gate(DeviceType::Rocm, gpus).is_some()
}

/// Runs `f(rank, memory)` on `world` threads, one GPU each.
fn on_ranks<T: Send + 'static>(
    name: &str,
    world: usize,
    size: usize,
    f: impl Fn(usize, Arc<dyn SymmetricMemory>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let store = HashStore::new(Duration::from_secs(30));
    let f = Arc::new(f);
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let (store, f, name) = (store.clone(), f.clone(), name.to_string());
            thread::spawn(move || {
                let g = Group::new(name, r, world, store).unwrap();
                let a = get_allocator(DeviceType::Rocm).unwrap();
                let alloc = a.alloc(size, Device::rocm(r as u32), &g).unwrap();
                let mem = alloc.rendezvous(Duration::from_secs(30)).unwrap();
                f(r, mem)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn gpu_peer_writes_barrier_and_signals() {
    if gate(2) {
        return;
    }
    let n = symm_rocm::rocm_available().unwrap();
    let world = n.min(8);
    let t = Duration::from_secs(10);
    on_ranks("rocm-peer", world, 1 << 20, move |r, mem| {
        let next = (r + 1) % world;
        let prev = (r + world - 1) % world;
        let payload: Vec<u8> = (0..4096).map(|i| (i * 7 + r) as u8).collect();
        mem.write_bytes(mem.rank().peer(next).unwrap(), 8192, &payload).unwrap();
        mem.barrier(Channel::new(0).unwrap(), t).unwrap();
        let mut got = vec![0u8; 4096];
        mem.read_bytes(mem.rank(), 8192, &mut got).unwrap();
        let want: Vec<u8> = (0..4096).map(|i| (i * 7 + prev) as u8).collect();
        assert_eq!(got, want);
        // two channels at once, no cross-talk
        for c in [3, 4] {
            mem.put_signal(mem.rank().peer(next).unwrap(), Channel::new(c).unwrap(), t)
                .unwrap();
        }
        for c in [4, 3] {
            mem.wait_signal(mem.rank().peer(prev).unwrap(), Channel::new(c).unwrap(), t)
                .unwrap();
        }
        mem.barrier(Channel::new(1).unwrap(), t).unwrap();
    });
}

#[test]
fn gpu_barrier_with_an_absent_peer_times_out() {
    if gate(2) {
        return;
    }
    let res = on_ranks("rocm-timeout", 2, 1 << 20, |r, mem| {
        if r == 0 {
            let start = Instant::now();
            let e = mem.barrier(Channel::new(2).unwrap(), Duration::from_millis(300));
            (e.is_err_and(|e| matches!(e, Error::Timeout { .. })), start.elapsed())
        } else {
            (true, Duration::ZERO)
        }
    });
    assert!(res[0].0, "rank 0 did not time out");
    assert!(res[0].1 < Duration::from_secs(5), "took {:?}", res[0].1);
}
