//! A backend added from outside symm-ops (issue #40): a device type of its own
//! (`DeviceType::Other("mock")`), its allocator and its collectives, registered with `inventory`
//! the way symm-cuda and symm-rocm register theirs, and a communicator op run on it through
//! symm-ops' kernel engine, with no edit inside symm-ops.
//!
//! The mock's "device memory" is host memory: its allocator hands out the test kit's host
//! allocations under the mock's device, and its collectives run each kernel the planner names by
//! reading the peers' inputs through the registered symmetric memory (`read_bytes`) and writing
//! the reduced output (`write_bytes`), between two barriers. The results are checked against the
//! sums, and the kernels the mock ran against the communicator's own plan.

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::coll::add_rms::Epilogue;
use symm_core::coll::launch::DeviceOp;
use symm_core::coll::{CollFacts, Collectives, CollectivesRegistration, CollectivesSetup, Queue};
use symm_core::{
    get_allocator, get_symmetric_memory, AllGatherKernel, AllReduceKernel, Allocation, BackendRegistration, Channel,
    DType, Device, DeviceType, Error, Group, OpKind, Rank, ReduceOp, ReduceScatterKernel, Result, SymmTensor,
    SymmetricAllocator, SymmetricMemory,
};
use symm_ops::{AllReduceAlgo, CommConfig, Communicator, EngineKind, Plan};
use symm_testkit::launch::{run_threads, TestResult};

const MOCK: DeviceType = DeviceType::Other("mock");
const LIMIT: Duration = Duration::from_secs(120);

// ---- the allocator: the test kit's host memory, under the mock's device ----------------------

struct MockAllocator;

/// A host allocation that reports the mock device.
struct MockAllocation {
    inner: Arc<dyn Allocation>,
    device: Device,
}

impl Allocation for MockAllocation {
    fn ptr(&self) -> u64 {
        self.inner.ptr()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn device(&self) -> Device {
        self.device
    }
    fn group(&self) -> &Arc<Group> {
        self.inner.group()
    }
    fn rendezvous(&self, timeout: Duration) -> Result<Arc<dyn SymmetricMemory>> {
        self.inner.rendezvous(timeout)
    }
    fn symmetric_memory(&self) -> Option<Arc<dyn SymmetricMemory>> {
        self.inner.symmetric_memory()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl SymmetricAllocator for MockAllocator {
    fn device_type(&self) -> DeviceType {
        MOCK
    }
    fn name(&self) -> &'static str {
        "mock"
    }
    fn alloc(&self, size: usize, device: Device, group: &Arc<Group>) -> Result<Arc<dyn Allocation>> {
        let inner = get_allocator(DeviceType::Host)?.alloc(size, Device::host(device.index), group)?;
        Ok(Arc::new(MockAllocation { inner, device }))
    }
}

fn make_allocator() -> Result<Arc<dyn SymmetricAllocator>> {
    Ok(Arc::new(MockAllocator))
}

symm_core::inventory::submit! {
    BackendRegistration {
        device_type: MOCK,
        name: "mock",
        make: make_allocator,
    }
}

// ---- the collectives -------------------------------------------------------------------------

/// The kernels the mock ran, per group name: what the test compares with the planner's plan.
static RAN: Mutex<Vec<(String, usize, AllReduceKernel)>> = Mutex::new(Vec::new());

struct MockCollectives {
    group: Arc<Group>,
    timeout: Duration,
    /// A symmetric allocation of the mock's own, for barriers.
    ws: Arc<dyn SymmetricMemory>,
    registered: Mutex<Vec<Arc<dyn SymmetricMemory>>>,
}

impl MockCollectives {
    fn me(&self) -> Rank {
        self.group.rank()
    }

    /// The registered allocation holding `bytes` at `ptr`, and `ptr`'s offset in it.
    fn find(&self, ptr: u64, bytes: usize) -> Option<(Arc<dyn SymmetricMemory>, usize)> {
        let me = self.me().get();
        let regs = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        regs.iter().find_map(|m| {
            let base = m.buffer_ptrs()[me];
            let end = base + m.buffer_size() as u64;
            (ptr >= base && ptr + bytes as u64 <= end).then(|| (m.clone(), (ptr - base) as usize))
        })
    }

    fn sync(&self) -> Result<()> {
        self.ws.barrier(Channel::new(0)?, self.timeout)
    }
}

fn own(q: Queue<'_>) -> Result<()> {
    if q.is_own() {
        Ok(())
    } else {
        Err(Error::InvalidArgument("the mock runs on its own queue".into()))
    }
}

fn unavailable<T>(what: &str) -> Result<T> {
    Err(Error::Unavailable(format!("{what} on the mock backend")))
}

impl MockCollectives {
    /// What the mock reports: its name, nothing else (no Lamport slots, no copy engine, no fused
    /// epilogue, synchronous ops).
    const FACTS: CollFacts = CollFacts {
        backend: "mock",
        lamport_slot: 0,
        copy_engine: false,
        fused_epilogue: false,
        handoff_bytes: 0,
        pdl: false,
        stream_ordered: false,
        host_abort: false,
    };
}

impl Collectives for MockCollectives {
    fn facts(&self) -> CollFacts {
        Self::FACTS
    }

    /// Every kernel alike: sum the peers' f32 inputs (read from registered symmetric memory)
    /// into this rank's output.
    unsafe fn all_reduce(&self, q: Queue<'_>, kernel: AllReduceKernel, d: DeviceOp) -> Result<()> {
        own(q)?;
        if d.dtype != DType::F32 || d.op != ReduceOp::Sum {
            return unavailable("anything but an f32 sum");
        }
        let bytes = d.count * 4;
        let not_registered = || Error::InvalidArgument("the mock reduces registered symmetric memory only".into());
        let (inp, in_off) = self.find(d.input, bytes).ok_or_else(not_registered)?;
        let (out, out_off) = self.find(d.output, bytes).ok_or_else(not_registered)?;
        self.sync()?;
        let mut sum = vec![0f32; d.count];
        let mut raw = vec![0u8; bytes];
        for r in 0..self.group.world_size() {
            inp.read_bytes(self.me().peer(r)?, in_off, &mut raw)?;
            for (s, b) in sum.iter_mut().zip(raw.chunks_exact(4)) {
                *s += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        // Every rank has read every input before any output (an in-place op's input) changes.
        self.sync()?;
        let bytes_out: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
        out.write_bytes(self.me(), out_off, &bytes_out)?;
        RAN.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.group.name().to_string(), self.me().get(), kernel));
        Ok(())
    }

    unsafe fn reduce_scatter(&self, _q: Queue<'_>, _k: ReduceScatterKernel, _d: DeviceOp) -> Result<()> {
        unavailable("reduce_scatter")
    }

    unsafe fn all_gather(&self, _q: Queue<'_>, _k: AllGatherKernel, _d: DeviceOp) -> Result<()> {
        unavailable("all_gather")
    }

    fn lamport_epilogue(&self, _q: Queue<'_>, _e: &Epilogue) -> Result<()> {
        unavailable("the fused epilogue")
    }

    unsafe fn epilogue(&self, _q: Queue<'_>, _sum: u64, _e: &Epilogue) -> Result<()> {
        unavailable("the epilogue")
    }

    fn barrier(&self, q: Queue<'_>, _ranks: &[Rank]) -> Result<()> {
        own(q)?;
        self.sync()
    }

    fn agree_empty(&self, q: Queue<'_>, _kind: OpKind, _dtype: DType, _reduce: Option<ReduceOp>) -> Result<()> {
        own(q)?;
        self.sync()
    }

    fn reject(&self, _q: Queue<'_>) -> Result<()> {
        Ok(())
    }

    fn register_symmetric(&self, mem: Arc<dyn SymmetricMemory>) -> Result<()> {
        self.registered.lock().unwrap_or_else(|p| p.into_inner()).push(mem);
        Ok(())
    }

    fn unregister_symmetric(&self, base: u64) -> bool {
        let me = self.me().get();
        let mut regs = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        let n = regs.len();
        regs.retain(|m| m.buffer_ptrs()[me] != base);
        regs.len() != n
    }

    fn is_registered(&self, ptr: u64, bytes: usize) -> bool {
        self.find(ptr, bytes).is_some()
    }

    fn set_abort(&self, abort: bool) -> Result<()> {
        self.ws.set_abort(abort)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn make_collectives(s: &CollectivesSetup<'_>) -> Result<Arc<dyn Collectives>> {
    let ws = get_allocator(MOCK)?
        .alloc(64, s.device, s.group)?
        .rendezvous(s.timeout)?;
    Ok(Arc::new(MockCollectives {
        group: s.group.clone(),
        timeout: s.timeout,
        ws,
        registered: Mutex::new(Vec::new()),
    }))
}

symm_core::inventory::submit! {
    CollectivesRegistration {
        device_type: MOCK,
        name: "mock",
        make: make_collectives,
    }
}

// ---- the test ---------------------------------------------------------------------------------

fn write_f32(t: &SymmTensor, data: &[f32]) -> TestResult {
    let mem = get_symmetric_memory(t).ok_or("not rendezvoused")?;
    let b: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    mem.write_bytes(mem.rank(), t.storage_offset(), &b)?;
    Ok(())
}

fn read_f32(t: &SymmTensor, n: usize) -> TestResult<Vec<f32>> {
    let mem = get_symmetric_memory(t).ok_or("not rendezvoused")?;
    let mut b = vec![0u8; n * 4];
    mem.read_bytes(mem.rank(), t.storage_offset(), &mut b)?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn kernels_ran(group: &str, rank: usize) -> Vec<AllReduceKernel> {
    RAN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(g, r, _)| g == group && *r == rank)
        .map(|(_, _, k)| *k)
        .collect()
}

#[test]
fn a_mock_backend_runs_communicator_ops() {
    symm_testkit::link();
    const N: usize = 1000;
    let world = 2;
    run_threads(world, LIMIT, move |ctx| {
        let group = ctx.group(&format!("mock-{}", ctx.launch_id))?;
        let device = Device::new(MOCK, ctx.rank as u32);
        let comm = Communicator::new(&group, device, CommConfig::default())?;
        // The kernel engine over the mock's registered collectives, not the host engine.
        assert_eq!(comm.engine_kind(), EngineKind::Kernels);
        assert!(!comm.has_nccl());
        // The facts the mock reported reach the communicator as they were given.
        let facts = comm.collective_facts().ok_or("the kernel engine reported no facts")?;
        assert_eq!(facts, MockCollectives::FACTS);
        // No fused epilogue here: an `Auto` epilogue plans the separate one.
        assert!(matches!(
            comm.select_epilogue(1, 4096, DType::F32),
            symm_ops::EpilogueAlgo::Separate(_)
        ));

        let input = comm.persistent_buffer(1, &[N], DType::F32)?;
        let output = comm.persistent_buffer(2, &[N], DType::F32)?;
        let mine: Vec<f32> = (0..N).map(|i| ((ctx.rank + 1) * (i % 97)) as f32).collect();
        write_f32(&input, &mine)?;
        write_f32(&output, &vec![-1.0; N])?;
        let want: Vec<f32> = (0..N)
            .map(|i| (1..=world).map(|r| (r * (i % 97)) as f32).sum())
            .collect();

        // The table's pick for the size, then the zero-copy pull on registered buffers, then in
        // place: each the plan the communicator reports, each result the sum.
        comm.all_reduce_out(&input, &output, ReduceOp::Sum)?;
        assert_eq!(read_f32(&output, N)?, want, "rank {}: all_reduce_out", ctx.rank);
        comm.all_reduce_with(
            AllReduceAlgo::Pull,
            Some((&input).into()),
            (&output).into(),
            ReduceOp::Sum,
        )?;
        assert_eq!(read_f32(&output, N)?, want, "rank {}: pull", ctx.rank);
        comm.all_reduce(&input, ReduceOp::Sum)?;
        assert_eq!(read_f32(&input, N)?, want, "rank {}: in place", ctx.rank);

        let table = match comm.plan_all_reduce(N * 4, true) {
            Plan::Kernel(k) => k,
            Plan::Nccl => return Err("the mock's plan names NCCL".into()),
        };
        let ran = kernels_ran(group.name(), ctx.rank);
        assert_eq!(ran.len(), 3, "rank {}: {ran:?}", ctx.rank);
        assert_eq!(ran[0], table);
        assert_eq!(ran[1], AllReduceKernel::Pull);

        // A barrier through the mock, and a refused host slice named as such.
        comm.barrier(None)?;
        let mut host = vec![0f32; N];
        match comm.all_reduce(&mut host, ReduceOp::Sum) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("host slices need the host engine"), "{m}"),
            r => return Err(format!("a host slice on the mock: {r:?}").into()),
        }
        Ok(())
    })
    .unwrap();
}
