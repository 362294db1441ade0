//! Host-backend specifics beyond the conformance suite: shared mappings
//! among threads, the pad layout seen from outside, wait_signal's retry
//! semantics, fd exhaustion.

use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_core::pad;
use symm_core::{get_allocator, Channel, Device, DeviceType, Error, SymmetricMemory};
use symm_testkit::launch::{is_isolated_child, run_isolated, run_threads, test_path};

const T: Duration = Duration::from_secs(30);

fn word(m: &Arc<dyn SymmetricMemory>, rank: usize, index: usize) -> u32 {
    let mut b = [0u8; 4];
    m.read_signal_pad(m.rank().peer(rank).unwrap(), index * 4, &mut b)
        .unwrap();
    u32::from_ne_bytes(b)
}

#[test]
fn threads_share_one_mapping_and_follow_the_pad_layout() {
    symm_testkit::link();
    run_threads(3, Duration::from_secs(60), |ctx| {
        let g = ctx.group(&ctx.unique("layout"))?;
        let a = get_allocator(DeviceType::Host)?.alloc(100, Device::host(0), &g)?;
        let m = a.rendezvous(T)?;
        // Threads map nothing twice: a peer's buffer is at the peer's own address.
        let ptrs = ctx.all_gather("ptrs", &a.ptr().to_ne_bytes(), T)?;
        for (r, p) in ptrs.iter().enumerate() {
            assert_eq!(m.buffer_ptrs()[r].to_ne_bytes().as_slice(), p.as_slice());
        }
        let (me, w) = (ctx.rank, ctx.world);
        let c = Channel::new(7)?;
        let dst = m.rank().peer((me + 1) % w)?;
        m.put_signal(dst, c, T)?;
        m.put_signal(dst, c, T)?;
        m.barrier(Channel::new(2)?, T)?;
        // put_signal: SIGNAL[7][me] of dst counts 2; sent[7][dst] of mine counts 2.
        assert_eq!(word(&m, dst.get(), pad::signal_slot(7, me)), 2);
        assert_eq!(word(&m, me, pad::sent_slot(7, dst.get())), 2);
        // barrier: BARRIER[2][me] in every peer, barrier_epoch[2] locally.
        assert_eq!(word(&m, me, pad::LOCAL_BARRIER_EPOCH + 2), 1);
        for p in (0..w).filter(|&p| p != me) {
            assert_eq!(word(&m, p, pad::barrier_slot(2, me)), 1);
        }
        m.set_abort(true)?;
        assert_eq!(word(&m, me, pad::ABORT_WORD), 1);
        m.set_abort(false)?;
        assert_eq!(word(&m, me, pad::ABORT_WORD), 0);
        m.barrier(Channel::new(2)?, T)?;
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_timed_out_wait_signal_waits_for_the_same_signal_again() {
    symm_testkit::link();
    run_threads(2, Duration::from_secs(60), |ctx| {
        let g = ctx.group(&ctx.unique("retry"))?;
        let a = get_allocator(DeviceType::Host)?.alloc(8, Device::host(0), &g)?;
        let m = a.rendezvous(T)?;
        let c = Channel::new(1)?;
        let peer = m.rank().peer(1 - ctx.rank)?;
        if ctx.rank == 0 {
            let t = Instant::now();
            assert!(matches!(
                m.wait_signal(peer, c, Duration::from_millis(100)),
                Err(Error::Timeout { .. })
            ));
            assert!(t.elapsed() >= Duration::from_millis(100));
            ctx.barrier("timed-out", T)?;
            m.wait_signal(peer, c, T)?; // the one signal rank 1 sends
            assert_eq!(word(&m, 0, pad::recv_slot(1, 1)), 1);
        } else {
            ctx.barrier("timed-out", T)?;
            m.put_signal(peer, c, T)?;
        }
        m.barrier(Channel::new(0)?, T)?;
        Ok(())
    })
    .unwrap();
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Runs in a process of its own: it lowers RLIMIT_NOFILE.
#[test]
fn fd_exhaustion_is_a_clear_error_and_leaks_nothing() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if !is_isolated_child() {
        let name = test_path(module_path!(), "fd_exhaustion_is_a_clear_error_and_leaks_nothing");
        return run_isolated(&name, Duration::from_secs(120)).unwrap();
    }
    symm_testkit::link();
    run_threads(1, Duration::from_secs(60), |ctx| {
        let g = ctx.group("exhaust")?;
        let alloc = get_allocator(DeviceType::Host)?;
        let keep = alloc.alloc(64, Device::host(0), &g)?; // warm up
        let base = open_fds();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        setrlimit(Resource::RLIMIT_NOFILE, base as u64 + 8, hard)?;
        let mut held = Vec::new();
        let err = loop {
            match alloc.alloc(64, Device::host(0), &g) {
                Ok(a) => held.push(a),
                Err(e) => break e,
            }
            assert!(held.len() < 100, "the fd limit never bit");
        };
        let text = err.to_string();
        assert!(
            text.contains("memfd_create") && text.contains("RLIMIT_NOFILE"),
            "{text}"
        );
        assert!(!held.is_empty());
        drop(held);
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
        assert_eq!(open_fds(), base, "fds leaked");
        drop(keep);
        Ok(())
    })
    .unwrap();
}

#[test]
fn registered_for_host_with_a_fully_connected_shm_matrix() {
    symm_testkit::link();
    let a = get_allocator(DeviceType::Host).unwrap();
    assert_eq!(a.name(), symm_testkit::host::BACKEND_NAME);
    assert_eq!(a.device_type(), DeviceType::Host);
    assert!(!a.has_multicast_support(Device::host(0)));
    let c = symm_core::get_connectivity(DeviceType::Host, "shm").unwrap();
    let devices: Vec<usize> = (0..8).collect();
    assert_eq!(
        symm_core::detect_topology(&c.matrix, &devices),
        symm_core::Topology::FullyConnected
    );
    assert_eq!(c.matrix.len(), pad::MAX_WORLD_SIZE);
    assert!(symm_testkit::gpu_gate(DeviceType::Host, 8).is_none());
}
