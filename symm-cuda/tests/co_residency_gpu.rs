//! Which host calls wait for a kernel that is still running on the same GPU (NOTE [co-residency]
//! in docs/architecture.md). Ranks sharing a GPU share one context: a call that waits for the
//! whole device, made by one rank while a peer's collective kernel spins waiting for that rank's
//! next kernel, deadlocks until the kernel's timeout.
//!
//! `cuda_calls_beside_a_spinning_kernel` (one GPU) launches a kernel that spins for a fixed
//! 1.5 s on one stream, then times host calls made 100 ms later on another stream. A call that
//! takes more than 1 s waited for the kernel. It asserts that the calls a collective op makes
//! (kernel launch, event record and wait, stream-ordered copies, a stream synchronisation) do
//! not wait, and that a context synchronisation does (the method works); it reports the others
//! (allocation, freeing, pinned memory, VMM mapping, module loading) in a `SUMMARY` line.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use symm_core::DeviceType;
use symm_cuda::driver::vmm::{granularity, AddressRange, Mapping, PhysicalAllocation};
use symm_testkit::launch::TestResult;

const SPIN: Duration = Duration::from_millis(1500);
/// A call slower than this waited for the spinning kernel.
const WAITED: Duration = Duration::from_millis(1000);

const SPIN_SRC: &str = r#"
extern "C" __global__ void symm_test_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"#;

fn spin_function(ctx: &Arc<CudaContext>) -> TestResult<CudaFunction> {
    let arch = symm_cuda::kernels::arch_of(ctx)?;
    let ptx = symm_cuda::driver::nvrtc::compile("symm_test_spin", SPIN_SRC, &arch, &[])?.ptx;
    let module = ctx.load_module(Ptx::from_src(ptx))?;
    Ok(symm_cuda::driver::load_function(&module, "symm_test_spin")?)
}

fn launch_spin(stream: &Arc<CudaStream>, f: &CudaFunction, ns: u64) -> TestResult {
    let mut b = stream.launch_builder(f);
    b.arg(&ns);
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { b.launch(LaunchConfig::for_num_elems(1)) }?;
    Ok(())
}

/// How long `call` takes when made 100 ms into a 1.5 s spin on `spin_stream`.
fn beside_spin(
    spin_stream: &Arc<CudaStream>,
    f: &CudaFunction,
    call: &mut dyn FnMut() -> TestResult,
) -> TestResult<Duration> {
    spin_stream.synchronize()?;
    launch_spin(spin_stream, f, SPIN.as_nanos() as u64)?;
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    call()?;
    let took = t0.elapsed();
    spin_stream.synchronize()?;
    Ok(took)
}

fn check(r: sys::CUresult, what: &str) -> TestResult {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}").into())
    }
}

#[test]
fn cuda_calls_beside_a_spinning_kernel() {
    symm_cuda::link();
    if symm_testkit::gpu_gate(DeviceType::Cuda, 1).is_some() {
        return;
    }
    if let Err(e) = probe() {
        panic!("{e}");
    }
}

fn probe() -> TestResult {
    let ctx = symm_cuda::driver::context(0)?;
    let f = spin_function(&ctx)?;
    let spin_stream = ctx.new_stream()?;
    let other = ctx.new_stream()?;
    let big = 256usize << 20;
    let gran = granularity(0)?;
    let vmm_bytes = (64usize << 20).div_ceil(gran) * gran;
    let src = other.alloc_zeros::<u8>(16 << 20)?;
    let dst = std::cell::RefCell::new(other.alloc_zeros::<u8>(16 << 20)?);
    let host = vec![1u8; 16 << 20];
    let fresh_module = SPIN_SRC.replace("symm_test_spin", "symm_test_spin_fresh");
    let arch = symm_cuda::kernels::arch_of(&ctx)?;
    let fresh_ptx = symm_cuda::driver::nvrtc::compile("symm_test_spin_fresh", &fresh_module, &arch, &[])?.ptx;
    let vmm: std::cell::RefCell<Option<(Arc<AddressRange>, Mapping)>> = Default::default();
    other.synchronize()?;

    // (name, must not wait, call)
    type Call<'a> = (&'a str, Option<bool>, Box<dyn FnMut() -> TestResult + 'a>);
    let mut calls: Vec<Call> = vec![
        (
            "kernel launch on another stream + its sync",
            Some(false),
            Box::new(|| {
                launch_spin(&other, &f, 0)?;
                other.synchronize()?;
                Ok(())
            }),
        ),
        (
            "event record + stream wait",
            Some(false),
            Box::new(|| {
                let e = other.record_event(None)?;
                other.wait(&e)?;
                Ok(())
            }),
        ),
        (
            "device-to-device copy on another stream + its sync",
            Some(false),
            Box::new(|| {
                other.memcpy_dtod(&src, &mut *dst.borrow_mut())?;
                other.synchronize()?;
                Ok(())
            }),
        ),
        (
            "pageable host-to-device copy (16 MiB)",
            None,
            Box::new(|| {
                other.memcpy_htod(&host, &mut *dst.borrow_mut())?;
                other.synchronize()?;
                Ok(())
            }),
        ),
        (
            "pageable device-to-host copy (16 MiB)",
            None,
            Box::new(|| {
                let _ = other.clone_dtoh(&*dst.borrow())?;
                Ok(())
            }),
        ),
        (
            "stream-ordered alloc + free 256 MiB + sync",
            None,
            Box::new(|| {
                let a = other.alloc_zeros::<u8>(big)?;
                drop(a);
                other.synchronize()?;
                Ok(())
            }),
        ),
        (
            "cuMemAlloc 256 MiB",
            None,
            Box::new(|| {
                let mut p: sys::CUdeviceptr = 0;
                // SAFETY: writes the new device address; freed by the next call.
                check(unsafe { sys::cuMemAlloc_v2(&mut p, big) }, "cuMemAlloc")?;
                LAST.with(|l| l.set(p));
                Ok(())
            }),
        ),
        (
            "cuMemFree 256 MiB",
            None,
            Box::new(|| {
                let p = LAST.with(|l| l.get());
                // SAFETY: `p` came from cuMemAlloc above and nothing uses it.
                check(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree")
            }),
        ),
        (
            "cuMemHostAlloc + cuMemFreeHost 16 MiB",
            None,
            Box::new(|| {
                let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
                // SAFETY: writes the new host pointer, freed at once.
                check(unsafe { sys::cuMemHostAlloc(&mut p, 16 << 20, 0) }, "cuMemHostAlloc")?;
                // SAFETY: `p` came from cuMemHostAlloc.
                check(unsafe { sys::cuMemFreeHost(p) }, "cuMemFreeHost")
            }),
        ),
        (
            "VMM create + reserve + map + set access 64 MiB",
            None,
            Box::new(|| {
                let phys = Arc::new(PhysicalAllocation::create(0, vmm_bytes)?);
                let range = Arc::new(AddressRange::reserve(vmm_bytes, gran)?);
                let m = Mapping::map(range.clone(), phys, &[0])?;
                *vmm.borrow_mut() = Some((range, m));
                Ok(())
            }),
        ),
        (
            "VMM unmap + release + address free",
            None,
            Box::new(|| {
                drop(vmm.borrow_mut().take());
                Ok(())
            }),
        ),
        (
            "module load (cuModuleLoadData + cuFuncLoad)",
            None,
            Box::new(|| {
                let m = ctx.load_module(Ptx::from_src(fresh_ptx.clone()))?;
                let _ = symm_cuda::driver::load_function(&m, "symm_test_spin_fresh")?;
                Ok(())
            }),
        ),
        (
            "stream create + destroy",
            None,
            Box::new(|| {
                let s = ctx.new_stream()?;
                drop(s);
                Ok(())
            }),
        ),
        (
            "context synchronise",
            Some(true),
            Box::new(|| {
                symm_cuda::driver::ctx_synchronize(&ctx)?;
                Ok(())
            }),
        ),
    ];
    let mut rows = Vec::new();
    let mut wrong = Vec::new();
    for (name, expect_wait, call) in calls.iter_mut() {
        let took = beside_spin(&spin_stream, &f, call.as_mut())?;
        let waited = took >= WAITED;
        rows.push(format!(
            "{name}: {:.1} ms{}",
            took.as_secs_f64() * 1e3,
            if waited { " (WAITS)" } else { "" }
        ));
        if let Some(e) = expect_wait {
            if *e != waited {
                wrong.push(format!(
                    "{name} took {:.1} ms: expected it {}to wait for the running kernel",
                    took.as_secs_f64() * 1e3,
                    if *e { "" } else { "not " }
                ));
            }
        }
    }
    drop(calls);
    let _ = writeln!(
        std::io::stderr(),
        "SUMMARY cuda_calls_beside_a_spinning_kernel: {}",
        rows.join("; ")
    );
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; ").into())
    }
}

thread_local! {
    static LAST: std::cell::Cell<sys::CUdeviceptr> = const { std::cell::Cell::new(0) };
}
