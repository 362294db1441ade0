//! The ops on the host backend (symm-testkit), as CI runs them: world sizes
//! 1 to 8 (threads) and 3 (processes); every dtype x op against a float64
//! reference; sizes from one element to 64 MiB with odd sizes and unaligned
//! element offsets; host-slice (staged, in chunks) and symmetric (zero-copy)
//! buffers, and a symmetric input into a host slice (the op matrix, shared with
//! the GPU suite: `common/matrix.rs`); outputs poisoned before each run, guards
//! around them untouched;
//! results bitwise equal across ranks; integer inputs summing exactly; bad
//! input, timeouts and delayed ranks.

mod common;

use std::ops::Range;
use std::time::{Duration, Instant};

use common::matrix::{same_across_processes, same_everywhere, MatrixRig, MemoryRig};
use common::*;
use half::{bf16, f16};
use symm_core::{get_symmetric_memory, DType, Device, Error, ReduceOp, SymmTensor};
use symm_ops::{AllReduceAlgo, Buf, BufMut, CommConfig, Communicator, Element, EngineKind, RawDevicePtr};
use symm_testkit::launch::{child_ctx, run_processes, run_threads, RankCtx, TestResult};

const LIMIT: Duration = Duration::from_secs(280);

fn sym_write<T: Element>(t: &SymmTensor, elem_off: usize, data: &[T]) -> TestResult {
    let mem = get_symmetric_memory(t).ok_or("not rendezvoused")?;
    let es = T::DTYPE.size();
    let mut b = vec![0u8; data.len() * es];
    for (v, o) in data.iter().zip(b.chunks_exact_mut(es)) {
        v.write_le(o);
    }
    mem.write_bytes(mem.rank(), t.storage_offset() + elem_off * es, &b)?;
    Ok(())
}

fn sym_read<T: Element>(t: &SymmTensor, elem_off: usize, n: usize) -> TestResult<Vec<T>> {
    let mem = get_symmetric_memory(t).ok_or("not rendezvoused")?;
    let es = T::DTYPE.size();
    let mut b = vec![0u8; n * es];
    mem.read_bytes(mem.rank(), t.storage_offset() + elem_off * es, &mut b)?;
    Ok(b.chunks_exact(es).map(T::read_le).collect())
}

/// The host engine for the shared matrix (`common/matrix.rs`): plain memory is host slices
/// (staged through the communicator's buffer), its only all-reduce algorithms the one-shot and
/// two-shot forms; a communicator with a tiny staging buffer runs the sizes up to 1000.
struct HostRig {
    comm: Communicator,
    tiny_staging: bool,
}

impl MatrixRig for HostRig {
    fn comm(&self) -> &Communicator {
        &self.comm
    }
    fn label(&self) -> String {
        format!(" tiny={}", self.tiny_staging)
    }
    fn max_count(&self) -> usize {
        if self.tiny_staging {
            1000
        } else {
            usize::MAX
        }
    }
    fn algos(&self) -> Vec<AllReduceAlgo> {
        Vec::new()
    }
    fn allocated(&self) -> TestResult {
        Ok(())
    }
    /// An op on the host engine is over when it returns.
    fn wait(&self) -> TestResult {
        Ok(())
    }
}

impl<T: Element> MemoryRig<T> for HostRig {
    type Plain = Vec<T>;
    type New = Vec<T>;
    fn plain(&self, data: &[T]) -> TestResult<Vec<T>> {
        Ok(data.to_vec())
    }
    fn read(&self, b: &Vec<T>) -> TestResult<Vec<T>> {
        Ok(b.clone())
    }
    fn read_new(&self, r: &Vec<T>) -> TestResult<Vec<T>> {
        Ok(r.clone())
    }
    fn with_in<X>(&self, b: &Vec<T>, r: Range<usize>, f: impl FnOnce(Buf<'_>) -> X) -> X {
        f((&b[r]).into())
    }
    fn with_out<X>(&self, b: &mut Vec<T>, r: Range<usize>, f: impl FnOnce(BufMut<'_>) -> X) -> X {
        f((&mut b[r]).into())
    }
    fn sym_write(&self, t: &SymmTensor, off: usize, data: &[T]) -> TestResult {
        sym_write(t, off, data)
    }
    fn sym_read(&self, t: &SymmTensor, off: usize, n: usize) -> TestResult<Vec<T>> {
        sym_read(t, off, n)
    }
}

/// The matrix on one rank, on the default communicator and on one whose 1000-byte staging
/// buffer makes chunks of 112 f32 / 224 f16 elements (so the mid sizes run through many
/// chunks; reduce-scatter: / world): returns (case label, hash) for the cross-rank check.
fn matrix(ctx: &RankCtx, sizes: &[usize], ops: &[ReduceOp]) -> TestResult<Vec<(String, Option<u64>)>> {
    symm_testkit::link();
    let group = ctx.group(&ctx.unique("ops-matrix"))?;
    let dev = Device::host(ctx.rank as u32);
    let big = Communicator::new(&group, dev, CommConfig::default())?;
    let tiny = Communicator::new(&group, dev, CommConfig::default().with_staging_bytes(1000))?;
    assert_eq!(big.engine_kind(), EngineKind::Host);
    let rigs = [
        HostRig {
            comm: big,
            tiny_staging: false,
        },
        HostRig {
            comm: tiny,
            tiny_staging: true,
        },
    ];
    common::matrix::matrix(&rigs, sizes, ops)
}

fn run_matrix(world: usize, sizes: &'static [usize]) {
    let t = Instant::now();
    let per_rank = run_threads(world, LIMIT, move |ctx| matrix(&ctx, sizes, &ReduceOp::ALL)).unwrap();
    let n = same_everywhere(&per_rank).unwrap();
    println!(
        "SUMMARY host_matrix_w{world} ok {n} cases x {world} ranks, bitwise equal across ranks, {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

const SIZES: &[usize] = &[1, 7, 1000, 4099];
const SIZES_BIG_WORLD: &[usize] = &[1, 7, 1000];

#[test]
fn matrix_w1() {
    run_matrix(1, SIZES);
}
#[test]
fn matrix_w2() {
    run_matrix(2, &[1, 7, 1000, 4099, 33_333]);
}
#[test]
fn matrix_w3() {
    run_matrix(3, SIZES);
}
#[test]
fn matrix_w4() {
    run_matrix(4, SIZES);
}
#[test]
fn matrix_w5() {
    run_matrix(5, SIZES_BIG_WORLD);
}
#[test]
fn matrix_w6() {
    run_matrix(6, SIZES_BIG_WORLD);
}
#[test]
fn matrix_w7() {
    run_matrix(7, SIZES_BIG_WORLD);
}
#[test]
fn matrix_w8() {
    run_matrix(8, SIZES_BIG_WORLD);
}

/// The matrix with one process per rank (TcpStore, memfds over FdChannel).
#[test]
fn matrix_processes_w3() {
    if let Some(ctx) = child_ctx().unwrap() {
        let mine = matrix(&ctx, &[1, 1000, 4099], &[ReduceOp::Sum, ReduceOp::Max]).unwrap();
        same_across_processes(&ctx, "matrix-hashes", &mine, Duration::from_secs(120)).unwrap();
        println!(
            "SUMMARY host_matrix_processes_w3 rank {} ok {} cases",
            ctx.rank,
            mine.len()
        );
        return;
    }
    run_processes("matrix_processes_w3", 3, LIMIT).unwrap();
}

// ---------------------------------------------------------------- 64 MiB

/// 64 MiB payloads (more than the 10 MiB staging buffer: several chunks).
fn large(ctx: &RankCtx) -> TestResult<Vec<u64>> {
    symm_testkit::link();
    let group = ctx.group(&ctx.unique("ops-large"))?;
    let comm = Communicator::new(&group, Device::host(ctx.rank as u32), CommConfig::default())?;
    let (me, w) = (ctx.rank, ctx.world);
    let n = 64 << 18; // 64 MiB of f32
    let mut hashes = Vec::new();
    // all_reduce (auto: two-shot at this size), integer inputs: exact.
    let x: Vec<f32> = input(Values::Integers, 1, me, n);
    let mut out = guarded_output::<f32>(n);
    assert_eq!(comm.select_all_reduce(n * 4), AllReduceAlgo::TwoShot);
    comm.all_reduce_out(&x[..], &mut out[GUARD..GUARD + n], ReduceOp::Sum)?;
    check_guards(&out)?;
    check_all_reduce(Values::Integers, 1, w, ReduceOp::Sum, &out[GUARD..GUARD + n])?;
    hashes.push(hash(&out[GUARD..GUARD + n]));
    // one-shot, bf16 max of random values, 64 MiB of bf16, at an odd offset.
    let nb = 64 << 19;
    let y: Vec<bf16> = input(Values::Random, 2, me, nb + 1);
    let y_expected: Vec<bf16> = input(Values::Random, 2, me, nb + 1);
    let mut out = guarded_output::<bf16>(nb);
    comm.one_shot_all_reduce_out(&y[1..], &mut out[GUARD..GUARD + nb], ReduceOp::Max)?;
    check_guards(&out)?;
    // The input is y[1..]: rank r's element i is input_value(r, i + 1).
    for (i, &g) in out[GUARD..GUARD + nb].iter().enumerate() {
        let want = (0..w)
            .map(|r| input_value::<bf16>(Values::Random, 2, r, i + 1).to_f32())
            .fold(f32::NEG_INFINITY, f32::max);
        if g.to_f32() != want {
            return Err(format!("one-shot max element {i}: {} vs {want}", g.to_f32()).into());
        }
    }
    assert!(y == y_expected, "the input changed");
    hashes.push(hash(&out[GUARD..GUARD + nb]));
    // all_gather of 64 MiB in total.
    let per = n / w;
    let z: Vec<f32> = input(Values::Random, 3, me, per);
    let mut out = guarded_output::<f32>(per * w);
    comm.all_gather_out(&z[..], &mut out[GUARD..GUARD + per * w])?;
    check_guards(&out)?;
    check_all_gather(Values::Random, 3, w, &out[GUARD..GUARD + per * w])?;
    hashes.push(hash(&out[GUARD..GUARD + per * w]));
    Ok(hashes)
}

fn run_large(world: usize) {
    let t = Instant::now();
    let h = run_threads(world, LIMIT, |ctx| large(&ctx)).unwrap();
    assert!(h.iter().all(|x| *x == h[0]), "results differ across ranks");
    println!(
        "SUMMARY host_64mib_w{world} ok all_reduce f32 / one-shot bf16 / all_gather f32, {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn large_64mib_w2() {
    run_large(2);
}
#[test]
fn large_64mib_w3() {
    run_large(3);
}

// ---------------------------------------------------------------- stress

/// Back-to-back ops with a new payload each time; NaN written into the input
/// right after an op returns never reaches any output; one rank delayed.
#[test]
fn back_to_back_and_nan_after_return() {
    let t = Instant::now();
    let iters = 150usize;
    run_threads(3, LIMIT, move |ctx| {
        symm_testkit::link();
        let group = ctx.group(&ctx.unique("ops-b2b"))?;
        let comm = Communicator::new(&group, Device::host(ctx.rank as u32), CommConfig::default())?;
        let n = 777;
        let x = comm.persistent_buffer(1, &[n], DType::F32)?;
        let mut staged = vec![0f32; n];
        let mut out = vec![0f32; n];
        for it in 0..iters {
            let seed = 1000 + it as u64;
            let v: Vec<f32> = input(Values::Integers, seed, ctx.rank, n);
            if ctx.rank == 1 && it % 50 == 7 {
                std::thread::sleep(Duration::from_millis(100));
            }
            out.fill(f32::NAN);
            let algo = [AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot][it % 2];
            if it % 3 == 0 {
                // staged input
                staged.copy_from_slice(&v);
                comm.all_reduce_with(algo, Some((&staged).into()), (&mut out).into(), ReduceOp::Sum)?;
                staged.fill(f32::NAN);
            } else {
                // zero-copy input
                sym_write(&x, 0, &v)?;
                comm.all_reduce_with(algo, Some((&x).into()), (&mut out).into(), ReduceOp::Sum)?;
                sym_write(&x, 0, &vec![f32::NAN; n])?;
            }
            check_all_reduce(Values::Integers, seed, ctx.world, ReduceOp::Sum, &out)
                .map_err(|e| format!("iteration {it}: {e}"))?;
        }
        Ok(())
    })
    .unwrap();
    println!(
        "SUMMARY host_back_to_back ok {iters} ops x 3 ranks, NaN after return never seen, {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------- barrier

#[test]
fn subset_barriers() {
    run_threads(4, LIMIT, |ctx| {
        symm_testkit::link();
        let group = ctx.group(&ctx.unique("ops-barrier"))?;
        let comm = Communicator::new(&group, Device::host(ctx.rank as u32), CommConfig::default())?;
        let store = ctx.store.clone();
        let key = format!("{}/odd-done", group.prefix());
        match ctx.rank {
            // {0, 2}: rank 2 arrives 150 ms after rank 0 and only after {1, 3}
            // finished their own barrier, so a subset barrier that waited for
            // the others would deadlock (and time out).
            0 => {
                let t = Instant::now();
                store.set(&format!("{key}/0"), b"1")?;
                comm.barrier(Some(&[2, 0]))?;
                let waited = t.elapsed();
                if waited < Duration::from_millis(150) {
                    return Err(format!("rank 0 left the barrier after {waited:?}, before rank 2 came").into());
                }
            }
            2 => {
                let keys = [format!("{key}/0"), format!("{key}/1"), format!("{key}/3")];
                let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
                store.wait(&refs, Some(Duration::from_secs(30)))?;
                std::thread::sleep(Duration::from_millis(150));
                comm.barrier(Some(&[0, 2]))?;
            }
            r => {
                comm.barrier(Some(&[1, 3]))?;
                store.set(&format!("{key}/{r}"), b"1")?;
            }
        }
        comm.barrier(None)?;
        comm.barrier(Some(&[0, 1, 2, 3]))?;
        Ok(())
    })
    .unwrap();
    println!("SUMMARY host_subset_barriers ok");
}

// ---------------------------------------------------------------- errors

fn expect_err<T: std::fmt::Debug>(what: &str, r: symm_core::Result<T>, ok: impl Fn(&Error) -> bool) -> TestResult {
    match r {
        Err(e) if ok(&e) => Ok(()),
        Err(e) => Err(format!("{what}: wrong error {e:?}").into()),
        Ok(v) => Err(format!("{what}: no error ({v:?})").into()),
    }
}

#[test]
fn bad_input_is_an_error() {
    run_threads(2, LIMIT, |ctx| {
        symm_testkit::link();
        let group = ctx.group(&ctx.unique("ops-bad"))?;
        let dev = Device::host(ctx.rank as u32);
        expect_err(
            "tiny staging",
            Communicator::new(&group, dev, CommConfig::default().with_staging_bytes(10)),
            |e| matches!(e, Error::OutOfRange { .. }),
        )?;
        let comm = Communicator::new(&group, dev, CommConfig::default())?;
        let a = [1f32; 10];
        let mut b = [0f32; 9];
        let mut h = [f16::ZERO; 10];
        let inv = |e: &Error| matches!(e, Error::InvalidArgument(_));
        expect_err("sizes", comm.all_reduce_out(&a[..], &mut b[..], ReduceOp::Sum), inv)?;
        expect_err(
            "dtypes",
            comm.one_shot_all_reduce_out(&a[..], &mut h[..], ReduceOp::Sum),
            inv,
        )?;
        expect_err(
            "scatter",
            comm.reduce_scatter_out(&a[..9], &mut b[..4], ReduceOp::Sum),
            inv,
        )?;
        expect_err(
            "scatter out",
            comm.reduce_scatter_out(&a[..], &mut b[..4], ReduceOp::Sum),
            inv,
        )?;
        expect_err("gather out", comm.all_gather_out(&a[..5], &mut b[..]), inv)?;
        expect_err(
            "device buffer",
            // SAFETY: the host engine refuses raw device pointers before touching them; this
            // checks that refusal (the address is never dereferenced).
            comm.all_reduce(unsafe { RawDevicePtr::new(4096, 4, DType::F32) }, ReduceOp::Sum),
            inv,
        )?;
        expect_err(
            "result type",
            comm.one_shot_all_reduce::<Vec<bf16>>(&a[..], ReduceOp::Sum),
            inv,
        )?;
        let ints = comm.persistent_buffer(1, &[8], DType::I32)?;
        expect_err("i32", comm.all_reduce(&ints, ReduceOp::Sum), |e| {
            matches!(e, Error::UnsupportedDType { .. })
        })?;
        let raw = symm_core::empty_p2p(&[8], DType::F32, dev, &group, None)?;
        expect_err("not rendezvoused", comm.all_reduce(&raw, ReduceOp::Sum), |e| {
            matches!(e, Error::NotRendezvoused)
        })?;
        let other_group = ctx.group(&ctx.unique("ops-bad-other"))?;
        let other = symm_core::empty_p2p(&[8], DType::F32, dev, &other_group, None)?;
        other.rendezvous(Duration::from_secs(30))?;
        let mut o8 = [0f32; 8];
        expect_err(
            "other group",
            comm.all_reduce_out(&other, &mut o8[..], ReduceOp::Sum),
            inv,
        )?;
        expect_err(
            "two-shot wrong group",
            comm.two_shot_all_reduce(&other, ReduceOp::Sum),
            inv,
        )?;
        expect_err(
            "non-contiguous",
            {
                let t = symm_core::empty_strided_p2p(&[2, 2], &[1, 2], DType::F32, dev, &group, Some(9))?;
                t.rendezvous(Duration::from_secs(30))?;
                comm.all_reduce(&t, ReduceOp::Sum)
            },
            inv,
        )?;
        expect_err("barrier rank", comm.barrier(Some(&[0, 5])), |e| {
            matches!(e, Error::OutOfRange { .. })
        })?;
        expect_err("barrier twice", comm.barrier(Some(&[0, 1, 1])), inv)?;
        let other_rank = 1 - ctx.rank;
        expect_err("barrier without me", comm.barrier(Some(&[other_rank])), inv)?;
        // None of that hurt the communicator.
        let mut x = vec![ctx.rank as f32 + 1.0; 10];
        comm.all_reduce(&mut x[..], ReduceOp::Sum)?;
        if x != vec![3.0; 10] {
            return Err(format!("after the errors: {x:?}").into());
        }
        // Ranks passing different configurations are told so at setup.
        let mismatched = CommConfig::default().with_staging_bytes(4096 * (1 + ctx.rank));
        expect_err("config mismatch", Communicator::new(&group, dev, mismatched), |e| {
            matches!(e, Error::Mismatch { .. })
        })?;
        Ok(())
    })
    .unwrap();
    println!("SUMMARY host_bad_input ok");
}

/// A rank that never arrives gives a timeout (not a hang) and the
/// communicator refuses further ops; a rank 100 ms late is fine.
#[test]
fn timeouts_and_late_ranks() {
    run_threads(2, LIMIT, |ctx| {
        symm_testkit::link();
        let group = ctx.group(&ctx.unique("ops-timeout"))?;
        let cfg = CommConfig::default().with_timeout(Duration::from_secs(2));
        let comm = Communicator::new(&group, Device::host(ctx.rank as u32), cfg)?;
        // Late rank: 100 ms < 2 s timeout.
        if ctx.rank == 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut x = vec![1f32; 100];
        comm.all_reduce(&mut x[..], ReduceOp::Sum)?;
        if x != vec![2.0; 100] {
            return Err("late rank: wrong result".into());
        }
        let done = format!("{}/timeout-checked", group.prefix());
        if ctx.rank == 0 {
            let t = Instant::now();
            let r = comm.all_reduce(&mut x[..], ReduceOp::Sum);
            let took = t.elapsed();
            expect_err("missing peer", r, |e| matches!(e, Error::Timeout { .. }))?;
            if took < Duration::from_secs(2) || took > Duration::from_secs(20) {
                return Err(format!("timeout took {took:?}").into());
            }
            expect_err("after a timeout", comm.all_reduce(&mut x[..], ReduceOp::Sum), |e| {
                matches!(e, Error::Aborted(_))
            })?;
            println!("SUMMARY host_timeout ok missing peer -> Timeout after {took:?}, then Aborted");
            ctx.store.set(&done, b"1")?;
        } else {
            ctx.store.wait(&[&done], Some(Duration::from_secs(60)))?;
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn persistent_buffers_keep_their_address() {
    run_threads(2, LIMIT, |ctx| {
        symm_testkit::link();
        let group = ctx.group(&ctx.unique("ops-persist"))?;
        let comm = Communicator::new(&group, Device::host(ctx.rank as u32), CommConfig::default())?;
        let t = comm.persistent_buffer(42, &[64], DType::BF16)?;
        let p = t.ptr();
        expect_err("id in use", comm.persistent_buffer(42, &[64], DType::BF16), |e| {
            matches!(e, Error::AllocIdInUse { .. })
        })?;
        drop(t);
        let t = comm.persistent_buffer(42, &[64], DType::BF16)?;
        if t.ptr() != p {
            return Err("a persistent buffer moved".into());
        }
        sym_write(&t, 0, &[bf16::from_f32(ctx.rank as f32 + 0.5); 64])?;
        comm.all_reduce(&t, ReduceOp::Max)?;
        let got = sym_read::<bf16>(&t, 0, 64)?;
        if got != vec![bf16::from_f32(1.5); 64] {
            return Err(format!("{got:?}").into());
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn selection_table_is_printable() {
    let tables = run_threads(2, LIMIT, |ctx| {
        symm_testkit::link();
        let group = ctx.group(&ctx.unique("ops-table"))?;
        let comm = Communicator::new(&group, Device::host(ctx.rank as u32), CommConfig::default())?;
        Ok(comm.selection_table())
    })
    .unwrap();
    let t = &tables[0];
    println!("{t}");
    assert!(t.contains("engine host"), "{t}");
    assert!(t.contains("one-shot") && t.contains("two-shot"), "{t}");
    assert!(
        t.contains("all_reduce_residual[_rms_norm]") && t.contains("one-shot, then the epilogue"),
        "{t}"
    );
    // Equal on every rank but for the device named in the header.
    let body = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&tables[0]), body(&tables[1]));
}

// ---------------------------------------------------------------- example

/// `examples/allreduce.rs` (built by `cargo test`) runs as one rank and as
/// two processes set up the torchrun way (rank 0 hosting the TcpStore).
#[test]
fn example_allreduce_runs() {
    let exe = std::env::current_exe().unwrap();
    let Some(example) = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join("allreduce"))
        .filter(|p| p.exists())
    else {
        println!("SUMMARY example_allreduce skipped: the example is not built (run `cargo test -p symm-ops`)");
        return;
    };
    let run = |rank: usize, world: usize, port: u16| {
        let mut cmd = std::process::Command::new(&example);
        cmd.env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env_remove("TORCHELASTIC_USE_AGENT_STORE")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if world > 1 {
            cmd.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", port.to_string());
        } else {
            cmd.env_remove("MASTER_ADDR").env_remove("MASTER_PORT");
        }
        cmd.spawn().unwrap()
    };
    let out = run(0, 1, 0).wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("elements = 1"), "{text}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let children: Vec<_> = (0..2).map(|r| run(r, 2, port)).collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("elements = 3"), "{text}");
    }
    println!("SUMMARY example_allreduce ok one rank, and two processes over a TcpStore");
}

// ---------------------------------------------------------------- setup liveness

/// NOTE [setup-liveness]: a rank process that dies after joining its group but before building
/// its communicator costs the others well under a second (not the 30 s store timeout), and
/// their error names it.
#[test]
fn setup_notices_a_dead_rank_processes_w3() {
    use symm_core::symm_store::StoreError;
    use symm_testkit::fault::{Fault, KILLED_STATUS};
    use symm_testkit::launch::{run_processes_outcomes, ChildStatus, ProcessOptions};
    const VICTIM: usize = 1;
    const POINT: &str = "test.before_communicator";
    if let Some(ctx) = child_ctx().unwrap() {
        let group = ctx.group(&ctx.unique("dead-at-setup")).unwrap();
        symm_core::fault::fault_point(POINT).unwrap();
        let start = Instant::now();
        let r = Communicator::new(&group, Device::host(ctx.rank as u32), CommConfig::default());
        let took = start.elapsed();
        let Err(e) = r else {
            panic!("rank {}: communicator setup succeeded without the dead rank", ctx.rank)
        };
        let named = matches!(&e, Error::PeerLost { rank, .. } | Error::Store(StoreError::PeerLost { rank, .. })
            if *rank == VICTIM);
        assert!(named, "rank {}: not PeerLost naming rank {VICTIM}: {e}", ctx.rank);
        assert!(
            took < symm_testkit::conformance::SETUP_LIVENESS,
            "rank {}: noticed after {took:?}: {e}",
            ctx.rank
        );
        println!("rank {}: setup failed after {took:?}: {e}", ctx.rank);
        return;
    }
    let mut opts = ProcessOptions::new("setup_notices_a_dead_rank_processes_w3", 3, LIMIT);
    opts.fault = Some(Fault::kill(VICTIM, POINT));
    opts.store_timeout = Duration::from_secs(30);
    for o in run_processes_outcomes(&opts).unwrap() {
        if o.rank == VICTIM {
            assert!(
                matches!(o.status, ChildStatus::Exited(KILLED_STATUS)),
                "the victim: {:?}",
                o.status
            );
        } else {
            assert!(o.status.success(), "rank {}: {:?}\n{}", o.rank, o.status, o.output);
            assert!(o.output.contains("setup failed after"), "rank {}: {}", o.rank, o.output);
        }
    }
}
