//! The op matrix, written once and run by the host engine (`host_ops`) and the CUDA engine
//! (`gpu_ops`): every dtype x reduce op x size x op variant (`all_reduce`, `all_reduce_out`,
//! `one_shot_all_reduce[_out]`, `two_shot_all_reduce[_out]`, `all_reduce_with` each explicit
//! algorithm the engine has, `reduce_scatter[_out]`, `all_gather[_out]`) x memory (the engine's
//! plain memory, symmetric tensors, a symmetric input into a plain output) against the float64
//! references of `common/mod.rs`: inputs from a seed at an element offset, outputs poisoned
//! before each run with guards around them, guards untouched, an output an op was not given
//! untouched, and a hash of every result (but reduce-scatter's, which differ by rank) for the
//! caller to compare across ranks ([`same_everywhere`], [`same_across_processes`]).
//!
//! An engine comes in as a [`MatrixRig`] (its communicator and what it lacks) that is a
//! [`MemoryRig`] for each dtype (its plain memory: host `Vec<T>` or a CUDA device buffer).

use std::ops::Range;
use std::time::Duration;

use half::{bf16, f16};
use symm_core::{DType, ReduceOp, SymmTensor};
use symm_ops::{AllReduceAlgo, Buf, BufMut, Communicator, Element, NewOutput};
use symm_testkit::launch::{RankCtx, TestResult};

use super::*;

/// One engine's communicator and what the matrix runs on it.
pub trait MatrixRig {
    fn comm(&self) -> &Communicator;
    /// Appended to each case's label (e.g. which of several communicators ran it).
    fn label(&self) -> String {
        String::new()
    }
    /// The largest size (elements per rank unit) this communicator runs.
    fn max_count(&self) -> usize {
        usize::MAX
    }
    /// The explicit algorithms `all_reduce_with` runs besides the one-shot and two-shot forms
    /// (none where the engine has no others).
    fn algos(&self) -> Vec<AllReduceAlgo>;
    /// Called once the matrix's symmetric buffers are allocated, before the first op.
    fn allocated(&self) -> TestResult;
    /// Waits for the ops issued so far and reports their errors.
    fn wait(&self) -> TestResult;
}

/// The engine's plain memory for elements of type `T`.
pub trait MemoryRig<T: Element>: MatrixRig {
    /// A buffer of plain memory (host `Vec<T>`, CUDA `CudaSlice<T>`).
    type Plain;
    /// What an out-of-place op returns (`Vec<T>`, `CudaSlice<T>`).
    type New: NewOutput;
    /// A buffer holding `data`.
    fn plain(&self, data: &[T]) -> TestResult<Self::Plain>;
    /// The whole of a buffer.
    fn read(&self, b: &Self::Plain) -> TestResult<Vec<T>>;
    /// An out-of-place op's result.
    fn read_new(&self, r: &Self::New) -> TestResult<Vec<T>>;
    /// `f` on elements `r` of `b`, as an op's input.
    fn with_in<X>(&self, b: &Self::Plain, r: Range<usize>, f: impl FnOnce(Buf<'_>) -> X) -> X;
    /// `f` on elements `r` of `b`, as an op's output.
    fn with_out<X>(&self, b: &mut Self::Plain, r: Range<usize>, f: impl FnOnce(BufMut<'_>) -> X) -> X;
    /// Writes `data` at element `off` of this rank's part of `t`.
    fn sym_write(&self, t: &SymmTensor, off: usize, data: &[T]) -> TestResult;
    /// Reads `n` elements at element `off` of this rank's part of `t`.
    fn sym_read(&self, t: &SymmTensor, off: usize, n: usize) -> TestResult<Vec<T>>;
}

/// A rig of every dtype the matrix runs.
pub trait AnyDtype: MemoryRig<f32> + MemoryRig<f16> + MemoryRig<bf16> {}
impl<R: MemoryRig<f32> + MemoryRig<f16> + MemoryRig<bf16>> AnyDtype for R {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce,
    AllReduceOut,
    OneShotOut,
    OneShotNew,
    TwoShot,
    TwoShotOut,
    /// `all_reduce_with` an explicit algorithm ([`MatrixRig::algos`]).
    Algo(AllReduceAlgo),
    ReduceScatterOut,
    ReduceScatterNew,
    AllGatherOut,
    AllGatherNew,
}

impl Kind {
    fn is_gather(self) -> bool {
        matches!(self, Kind::AllGatherOut | Kind::AllGatherNew)
    }
    fn is_scatter(self) -> bool {
        matches!(self, Kind::ReduceScatterOut | Kind::ReduceScatterNew)
    }
    fn in_place(self) -> bool {
        matches!(self, Kind::AllReduce | Kind::TwoShot)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mem {
    /// The engine's plain memory: host slices (the host engine stages them through the
    /// communicator's buffer), cudarc buffers (views at an element offset).
    Plain,
    /// Symmetric tensors from the communicator's persistent pool: zero-copy.
    Symm,
    /// A symmetric input into a plain output (one kind: the two-shot's out-of-place form).
    SymmIntoPlain,
}

const MEMS: [Mem; 3] = [Mem::Plain, Mem::Symm, Mem::SymmIntoPlain];

/// One case of the matrix.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub kind: Kind,
    pub mem: Mem,
    pub op: ReduceOp,
    pub values: Values,
    /// Elements per rank unit: all-reduce count, reduce-scatter output, all-gather input.
    pub n: usize,
    /// Element offset of the input (and output) inside its buffer.
    pub off: usize,
    pub seed: u64,
}

/// A rank's symmetric scratch tensors for one dtype (input and output).
struct SymPair {
    input: SymmTensor,
    output: SymmTensor,
}

/// Issues the case's op on `x` (input) and `o` (output; the buffer for an in-place op); returns
/// an out-of-place op's new result.
fn issue<N: NewOutput>(comm: &Communicator, c: &Case, x: Buf<'_>, o: BufMut<'_>) -> TestResult<Option<N>> {
    match c.kind {
        Kind::AllReduce => comm.all_reduce(o, c.op)?,
        Kind::AllReduceOut => comm.all_reduce_out(x, o, c.op)?,
        Kind::OneShotOut => comm.one_shot_all_reduce_out(x, o, c.op)?,
        Kind::OneShotNew => return Ok(Some(comm.one_shot_all_reduce(x, c.op)?)),
        Kind::TwoShot => comm.two_shot_all_reduce(o, c.op)?,
        Kind::TwoShotOut => comm.two_shot_all_reduce_out(x, o, c.op)?,
        Kind::Algo(a) => comm.all_reduce_with(a, Some(x), o, c.op)?,
        Kind::ReduceScatterOut => comm.reduce_scatter_out(x, o, c.op)?,
        Kind::ReduceScatterNew => return Ok(Some(comm.reduce_scatter(x, c.op)?)),
        Kind::AllGatherOut => comm.all_gather_out(x, o)?,
        Kind::AllGatherNew => return Ok(Some(comm.all_gather(x)?)),
    }
    Ok(None)
}

/// Runs one case on this rank; returns the output's hash (None where ranks
/// legitimately differ: reduce-scatter).
fn run_case<T: Element, R: MemoryRig<T>>(rig: &R, sym: &SymPair, c: &Case) -> TestResult<Option<u64>> {
    let comm = rig.comm();
    let (me, w) = (comm.rank().get(), comm.world_size());
    let n_in = if c.kind.is_scatter() { c.n * w } else { c.n };
    let n_out = if c.kind.is_gather() { c.n * w } else { c.n };
    let inp: Vec<T> = input(c.values, c.seed, me, n_in);
    // The output buffer as written before the op: GUARD + n_out poisoned (or, in place, the
    // input) + GUARD elements; the op is given the middle.
    let mut init = guarded_output::<T>(n_out);
    if c.kind.in_place() {
        init[GUARD..GUARD + n_out].copy_from_slice(&inp);
    }
    let mid = GUARD..GUARD + n_out;
    // Symmetric memory: the input at `off`, the guarded output at `off` (its middle at
    // `off + GUARD`); written for every memory kind, so that where the symmetric output is not
    // the op's it is checked untouched.
    if c.mem != Mem::Plain {
        rig.sym_write(&sym.input, c.off, &inp)?;
        rig.sym_write(&sym.output, c.off, &init)?;
    }
    let sx = sym.input.narrow(c.off, n_in)?;
    let so = sym.output.narrow(c.off + GUARD, n_out)?;
    let (full, new): (Vec<T>, Option<R::New>) = match c.mem {
        Mem::Plain => {
            // The input at `off`, guard elements ahead of it.
            let mut host_in = vec![guard_value::<T>(); c.off + n_in];
            host_in[c.off..].copy_from_slice(&inp);
            let x = rig.plain(&host_in)?;
            let mut o = rig.plain(&init)?;
            let new = rig.with_in(&x, c.off..c.off + n_in, |x| {
                rig.with_out(&mut o, mid.clone(), |o| issue(comm, c, x, o))
            })?;
            rig.wait()?;
            (rig.read(&o)?, new)
        }
        Mem::Symm => {
            let new = issue(comm, c, (&sx).into(), (&so).into())?;
            rig.wait()?;
            (rig.sym_read(&sym.output, c.off, n_out + 2 * GUARD)?, new)
        }
        Mem::SymmIntoPlain => {
            let mut o = rig.plain(&init)?;
            let new = rig.with_out(&mut o, mid.clone(), |o| issue(comm, c, (&sx).into(), o))?;
            rig.wait()?;
            // The symmetric output was not the destination: it must be untouched.
            let s = rig.sym_read(&sym.output, c.off, n_out + 2 * GUARD)?;
            if s.iter().map(|&v| to_bits(v)).ne(init.iter().map(|&v| to_bits(v))) {
                return Err("a symmetric output that was not the destination changed".into());
            }
            (rig.read(&o)?, new)
        }
    };
    let mut full = full;
    if let Some(r) = new {
        // The output buffer was not the destination: it must be untouched.
        if full.iter().map(|&v| to_bits(v)).ne(init.iter().map(|&v| to_bits(v))) {
            return Err(format!("a {:?} output that was not the destination changed", c.mem).into());
        }
        let r = rig.read_new(&r)?;
        if r.len() != n_out {
            return Err(format!("the new result has {} elements, not {n_out}", r.len()).into());
        }
        full[mid].copy_from_slice(&r);
    }
    check_guards(&full).map_err(|e| format!("{c:?} {}: {e}", T::DTYPE))?;
    let out = &full[GUARD..GUARD + n_out];
    let acc = Accum::of(c.kind == Kind::Algo(AllReduceAlgo::Nccl));
    let r = if c.kind.is_gather() {
        check_all_gather(c.values, c.seed, w, out)
    } else if c.kind.is_scatter() {
        check_reduce_scatter(c.values, c.seed, w, me, c.op, out)
    } else {
        check_all_reduce_acc(c.values, c.seed, w, c.op, out, acc)
    };
    r.map_err(|e| format!("rank {me}/{w} {c:?} {}: {e}", T::DTYPE))?;
    Ok(if c.kind.is_scatter() { None } else { Some(hash(out)) })
}

fn dispatch<R: AnyDtype>(dtype: DType, rig: &R, sym: &SymPair, c: &Case) -> TestResult<Option<u64>> {
    match dtype {
        DType::F32 => run_case::<f32, R>(rig, sym, c),
        DType::F16 => run_case::<f16, R>(rig, sym, c),
        _ => run_case::<bf16, R>(rig, sym, c),
    }
}

pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The matrix on one rank, each case on each of `rigs` (communicators of one group) that runs
/// its size: every dtype x `ops` (all-gather, which has none, once: with `ops[0]`) x `sizes`
/// (integer inputs at even indices, random ones at odd) x kind x memory; the input offset
/// cycles 0..4. Returns (case label, hash) for the cross-rank check.
pub fn matrix<R: AnyDtype>(rigs: &[R], sizes: &[usize], ops: &[ReduceOp]) -> TestResult<Vec<(String, Option<u64>)>> {
    let first = rigs.first().ok_or("no communicator")?.comm();
    if first.rank().get() == 0 {
        println!("{}", first.selection_table());
    }
    let w = first.world_size();
    let cap = sizes.iter().max().copied().unwrap_or(1) * w + 2 * GUARD + 8;
    // syms[ri][k]: rig ri's pair for DTYPES[k].
    let mut syms = Vec::new();
    for (ri, rig) in rigs.iter().enumerate() {
        let mut pairs = Vec::new();
        for (k, &d) in DTYPES.iter().enumerate() {
            let id = 100 + 2 * (3 * ri + k) as u64;
            pairs.push(SymPair {
                input: rig.comm().persistent_buffer(id, &[cap], d)?,
                output: rig.comm().persistent_buffer(id + 1, &[cap], d)?,
            });
        }
        syms.push(pairs);
    }
    for rig in rigs {
        rig.allocated()?;
    }
    let mut kinds = vec![
        Kind::AllReduce,
        Kind::AllReduceOut,
        Kind::OneShotOut,
        Kind::OneShotNew,
        Kind::TwoShot,
        Kind::TwoShotOut,
    ];
    for rig in rigs {
        for a in rig.algos() {
            if !kinds.contains(&Kind::Algo(a)) {
                kinds.push(Kind::Algo(a));
            }
        }
    }
    kinds.extend([
        Kind::ReduceScatterOut,
        Kind::ReduceScatterNew,
        Kind::AllGatherOut,
        Kind::AllGatherNew,
    ]);
    let mut hashes = Vec::new();
    let mut id = 0u64;
    for (k, &dtype) in DTYPES.iter().enumerate() {
        for &op in ops {
            for (si, &n) in sizes.iter().enumerate() {
                for &kind in &kinds {
                    // all_gather has no reduce op: run it once per dtype/size.
                    if kind.is_gather() && op != ops[0] {
                        continue;
                    }
                    for mem in MEMS {
                        if mem == Mem::SymmIntoPlain && kind != Kind::TwoShotOut {
                            continue;
                        }
                        // The copy-engine pull reads peers' inputs in place.
                        if kind == Kind::Algo(AllReduceAlgo::Pull) && mem != Mem::Symm {
                            continue;
                        }
                        for (ri, rig) in rigs.iter().enumerate() {
                            if n > rig.max_count() {
                                continue;
                            }
                            if let Kind::Algo(a) = kind {
                                if !rig.algos().contains(&a) {
                                    continue;
                                }
                                if a == AllReduceAlgo::Lamport
                                    && n * dtype.size() > rig.comm().thresholds().lamport_max_bytes
                                {
                                    continue;
                                }
                                // Two shards a Lamport slot (NOTE [lamport-two-shot]).
                                if a == AllReduceAlgo::LamportTwoShot
                                    && n * dtype.size() > rig.comm().lamport_two_shot_max_bytes()
                                {
                                    continue;
                                }
                            }
                            id += 1;
                            let c = Case {
                                kind,
                                mem,
                                op,
                                values: if si % 2 == 0 { Values::Integers } else { Values::Random },
                                n,
                                off: (id % 4) as usize,
                                seed: id * 7919 + k as u64,
                            };
                            let label = format!("{dtype} {c:?}{}", rig.label());
                            let h = dispatch(dtype, rig, &syms[ri][k], &c).map_err(|e| format!("{label}: {e}"))?;
                            hashes.push((label, h));
                        }
                    }
                }
            }
        }
    }
    Ok(hashes)
}

/// Checks every case's hash is equal on every rank (ranks as threads); returns the case count.
pub fn same_everywhere(per_rank: &[Vec<(String, Option<u64>)>]) -> Result<usize, String> {
    let first = &per_rank[0];
    for (r, v) in per_rank.iter().enumerate() {
        if v.len() != first.len() {
            return Err(format!("rank {r} ran {} cases, rank 0 {}", v.len(), first.len()));
        }
        for ((la, ha), (lb, hb)) in first.iter().zip(v) {
            if la != lb || ha != hb {
                return Err(format!("rank {r} differs from rank 0 on {la}: {ha:?} vs {hb:?}"));
            }
        }
    }
    Ok(first.len())
}

/// [`same_everywhere`] for ranks as processes: every rank's (label, hash) list through the
/// store, under `key`, equal to this rank's.
pub fn same_across_processes(
    ctx: &RankCtx,
    key: &str,
    mine: &[(String, Option<u64>)],
    timeout: Duration,
) -> TestResult {
    let text: String = mine.iter().map(|(l, h)| format!("{l}={h:?}\n")).collect();
    let all = ctx.all_gather(key, text.as_bytes(), timeout)?;
    for (r, t) in all.iter().enumerate() {
        if t != text.as_bytes() {
            return Err(format!("rank {r} results differ from rank {}", ctx.rank).into());
        }
    }
    Ok(())
}
