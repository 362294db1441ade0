//! All-reduce epilogues (#19) on the host engine, in a single-process group (worlds 1, 2, 3 and
//! 8, one thread per rank): the shared suite (`common/epilogue.rs`: float64 reference, every
//! algorithm and form bitwise alike, bitwise the same on every rank), then the errors a caller
//! can act on: hidden sizes that are not whole 16-byte rows, partial rows, wrong lengths and
//! dtypes, misaligned buffers, a residual that aliases the input, outputs that overlap, a bad eps.

mod common;

use std::thread;

use common::epilogue::{suite, Plan, EPS};
use half::bf16;
use symm_ops::prelude::*;
use symm_ops::{EpilogueAlgo, RmsNorm};

fn plan() -> Plan {
    Plan {
        hiddens: vec![8, 128, 1032],
        tokens: vec![1, 7, 33],
        algos: vec![
            EpilogueAlgo::Fused,
            EpilogueAlgo::Separate(AllReduceAlgo::OneShot),
            EpilogueAlgo::Separate(AllReduceAlgo::TwoShot),
        ],
        fused_max_bytes: usize::MAX,
        ref_rows: 64,
        max_buffer_bytes: usize::MAX,
    }
}

fn is_arg_error(r: &Result<()>) -> bool {
    matches!(
        r,
        Err(Error::InvalidArgument(_)) | Err(Error::Misaligned { .. }) | Err(Error::OutOfRange { .. })
    )
}

/// Every refusal, on host slices (the same rules as on the device: symm_core::coll::epilogue_check).
fn errors(comm: &Communicator) -> Result<()> {
    let h = 16;
    let n = 3 * h;
    // 17 elements so that an offset view can be misaligned while keeping n elements.
    let x = vec![bf16::from_f32(1.0); n + 8];
    let res = vec![bf16::from_f32(0.5); n + 8];
    let w = vec![bf16::from_f32(1.0); h + 8];
    let mut no = vec![bf16::ZERO; n + 8];
    let mut ro = vec![bf16::ZERO; n + 8];
    let ops = comm.ops();
    // A hidden size that is not whole 16-byte vectors (12 bf16 = 24 bytes).
    let r = ops.all_reduce_residual_rms_norm(
        &x[..36],
        &res[..36],
        RmsNorm::new(&w[..12], EPS),
        &mut no[..36],
        &mut ro[..36],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("hidden size 12")),
        "{r:?}"
    );
    // A partial row.
    let r = ops.all_reduce_residual_rms_norm(
        &x[..n - 8],
        &res[..n - 8],
        RmsNorm::new(&w[..h], EPS),
        &mut no[..n - 8],
        &mut ro[..n - 8],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("whole rows")),
        "{r:?}"
    );
    // Wrong lengths.
    let r = ops.all_reduce_residual_rms_norm(
        &x[..n],
        &res[..n - h],
        RmsNorm::new(&w[..h], EPS),
        &mut no[..n],
        &mut ro[..n],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("residual has")),
        "{r:?}"
    );
    let r = ops.all_reduce_residual_rms_norm(
        &x[..n],
        &res[..n],
        RmsNorm::new(&w[..h], EPS),
        &mut no[..n],
        &mut ro[..n + 8],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("residual_out has")),
        "{r:?}"
    );
    // Another dtype.
    let wf = vec![1.0f32; h];
    let r = ops.all_reduce_residual_rms_norm(
        &x[..n],
        &res[..n],
        RmsNorm::new(&wf[..], EPS),
        &mut no[..n],
        &mut ro[..n],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("weight is f32")),
        "{r:?}"
    );
    // Misaligned: one element (2 bytes) into each buffer.
    let (x1, r1) = (&x[1..n + 1], &res[1..n + 1]);
    let r = ops.all_reduce_residual_rms_norm(x1, r1, RmsNorm::new(&w[..h], EPS), &mut no[..n], &mut ro[..n]);
    assert!(matches!(&r, Err(Error::Misaligned { what: "x", .. })), "{r:?}");
    // The residual aliasing the input (a symmetric tensor both ways would be the device case;
    // host slices alias through the same Vec).
    let r = ops.all_reduce_residual_rms_norm(
        &x[..n],
        &x[8..n + 8],
        RmsNorm::new(&w[..h], EPS),
        &mut no[..n],
        &mut ro[..n],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("x overlaps residual")),
        "{r:?}"
    );
    // The weight may overlap an input (both are only read).
    let r = ops.all_reduce_residual_rms_norm(
        &x[..n],
        &res[..n],
        RmsNorm::new(&res[..h], EPS),
        &mut no[..n],
        &mut ro[..n],
    );
    assert!(r.is_ok(), "the weight may overlap an input: {r:?}");
    // Outputs over inputs or over each other: symmetric buffers given twice (the way device
    // buffers alias), in the out-of-place forms.
    let (xs, rs, ws) = (comm.alloc::<bf16>(n)?, comm.alloc::<bf16>(n)?, comm.alloc::<bf16>(h)?);
    let (nos, ros) = (comm.alloc::<bf16>(n)?, comm.alloc::<bf16>(n)?);
    // (An output over the weight: symm_core::coll::epilogue_check's unit tests.)
    let (xt, rt, wt, nt, rot) = (xs.tensor(), rs.tensor(), ws.tensor(), nos.tensor(), ros.tensor());
    for (what, residual_out, norm_out) in [
        ("residual_out overlaps x", xt, nt),
        ("norm_out overlaps residual ", rot, rt),
        ("norm_out overlaps residual_out", rot, rot),
    ] {
        let r = ops.all_reduce_residual_rms_norm(xt, rt, RmsNorm::new(wt, EPS), norm_out, residual_out);
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains(what)),
            "{what}: {r:?}"
        );
    }
    // The exact in-place pairs through the out-of-place form are fine for the norm op...
    ops.all_reduce_residual_rms_norm(xt, rt, RmsNorm::new(wt, EPS), xt, rt)?;
    // ...but the residual add alone would all-reduce into the residual before reading it.
    let r = ops.all_reduce_residual(xt, rt, rt, h);
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("all_reduce_residual_in_place")),
        "{r:?}"
    );
    // Zero rows: an empty op that agrees with the peers; only the shape and eps are checked.
    ops.all_reduce_residual_rms_norm(
        &x[..0],
        &res[..0],
        RmsNorm::new(&w[..h], EPS),
        &mut no[..0],
        &mut ro[..0],
    )?;
    let r = ops.all_reduce_residual_rms_norm(
        &x[..0],
        &res[..0],
        RmsNorm::new(&w[..h], -1.0),
        &mut no[..0],
        &mut ro[..0],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("eps")),
        "{r:?}"
    );
    // A bad eps.
    let r = ops.all_reduce_residual_rms_norm(
        &x[..n],
        &res[..n],
        RmsNorm::new(&w[..h], f32::NAN),
        &mut no[..n],
        &mut ro[..n],
    );
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("eps")),
        "{r:?}"
    );
    // The residual add with a hidden size of 0.
    let r = ops.all_reduce_residual(&x[..n], &res[..n], &mut ro[..n], 0);
    assert!(is_arg_error(&r), "{r:?}");
    // Still in step: a good op after the refusals gives the right answer.
    ops.all_reduce_residual(&x[..n], &res[..n], &mut ro[..n], h)?;
    let want = comm.world_size() as f32 + 0.5;
    assert!(ro[..n].iter().all(|v| v.to_f32() == want), "{:?}", &ro[..4]);
    Ok(())
}

fn run(world: usize) {
    symm_testkit::link();
    let devices = vec![Device::host(0); world];
    let comms = Communicator::for_devices(&devices, CommConfig::default()).expect("for_devices");
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            thread::spawn(move || -> std::result::Result<Vec<u64>, String> {
                let hashes = suite(&c, &plan())?;
                errors(&c).map_err(|e| format!("errors: {e}"))?;
                Ok(hashes)
            })
        })
        .collect();
    let hashes: Vec<Vec<u64>> = handles
        .into_iter()
        .enumerate()
        .map(|(r, h)| {
            h.join()
                .expect("worker")
                .unwrap_or_else(|e| panic!("world {world} rank {r}: {e}"))
        })
        .collect();
    assert!(!hashes[0].is_empty());
    assert!(hashes.windows(2).all(|p| p[0] == p[1]), "ranks differ: {hashes:?}");
}

#[test]
fn epilogue_world_1() {
    run(1);
}
#[test]
fn epilogue_world_2() {
    run(2);
}
#[test]
fn epilogue_world_3() {
    run(3);
}
#[test]
fn epilogue_world_8() {
    run(8);
}
