//! All-reduce epilogues: residual add and RMSNorm over `[rows, hidden]`, as a kernel of its own
//! after any all-reduce ([`Epilogues`]) or fused into the Lamport one-shot
//! ([`CudaCollectives::lamport_epilogue`]). NOTE [fused-epilogue] in symm-core's `kernels/epilogue.cuh`
//! holds the numerics and the aliasing rules; `symm_core::epilogue` the checks.

#![deny(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use symm_core::epilogue::{Buffers, Rows, Span, MAX_ROW_VECTORS};
use symm_core::{Error, OpKind, ReduceOp, Result};

use super::agree::{header, Mechanism};
use super::args::{Bound, Common, Direct, OpHeader};
use super::layout::WorkspaceLayout;
use super::layout::EPI_SPLIT_MAX_ROWS;
use super::plan::PerDtype;
use super::{cfg, kernel_dtype, CudaCollectives};
use crate::driver::launch::{launch_with, KernelArg, Launch};
use crate::driver::{self, bind};
use crate::{kernels, knobs};

/// Most vectors of a row one thread holds (`EPI_MAXV` in epilogue.cuh).
const MAX_VECTORS_PER_THREAD: usize = 8;
/// Most threads of an epilogue block (`COLL_MAX_THREADS`).
const MAX_THREADS: usize = 512;
/// `flags` bit: compute the RMSNorm (`EPI_NORM`).
const EPI_NORM: u32 = 1;
/// `flags` bit: cluster rows (`EPI_CLUSTER`); the launch has clusters of `parts` blocks.
const EPI_CLUSTER: u32 = 2;
/// Most blocks of a cluster (the portable limit).
const MAX_CLUSTER: usize = 8;

const _: () = assert!(MAX_ROW_VECTORS == MAX_THREADS * MAX_VECTORS_PER_THREAD);

/// The block of one row: `(threads, vectors per thread)`, a function of the row's vector count
/// alone, so the fused and the separate kernel reduce a row's squares in the same order.
pub fn epilogue_threads(vectors_per_row: usize) -> (u32, u32) {
    let threads = vectors_per_row.div_ceil(32).max(1) * 32;
    let threads = threads.min(MAX_THREADS);
    (threads as u32, vectors_per_row.div_ceil(threads).max(1) as u32)
}

/// Threads of a block of the fused kernel's split rows (at most: a divisor of the row's block,
/// [`fused_geometry`]).
const SPLIT_THREADS: usize = 128;
/// Most blocks one row is split into.
const MAX_PARTS: usize = 16;

/// How the fused kernel lays out `rows` rows of `vectors_per_row` vectors at `world` ranks with at
/// most `blocks` blocks resident (NOTE [fused-epilogue], "split rows").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedGeometry {
    /// Blocks per row: 1 (a block takes whole rows) or more (each takes a part of one row).
    pub parts: u32,
    /// Threads of a block.
    pub threads: u32,
    /// Blocks of the launch.
    pub blocks: u32,
    /// The row's block (`epilogue_threads`), whose reduction order the split rows keep.
    pub big: u32,
    /// Vectors per thread of that block.
    pub k: u32,
    /// Cluster rows: one cluster of `parts` blocks per row (the launch's cluster size).
    pub cluster: bool,
}

/// The fused kernel's layout: rows are split while one wave of `rows x parts` blocks fits in
/// `blocks` (and rows <= [`EPI_SPLIT_MAX_ROWS`], the STATE counters), into parts of about
/// [`SPLIT_THREADS`] vectors; each split block has a multiple of 32 threads that divides the row's
/// block (`big`), so the last block of a row can run its RMSNorm in `big`'s order. At world 1 (no
/// exchange), with `split` off ([`crate::knobs::epi_split`]) or with too many rows, one block
/// takes whole rows.
///
/// With `cluster` (the device has thread-block clusters, NOTE [fused-epilogue] "cluster rows")
/// and world > 1, a row's block of `big` threads is spread over a cluster of up to
/// [`MAX_CLUSTER`] blocks of `big / parts` threads (a multiple of 32), one cluster per row, while
/// `rows x parts` blocks fit in `blocks`; that layout comes first.
pub fn fused_geometry(
    rows: usize,
    vectors_per_row: usize,
    world: usize,
    blocks: u32,
    split: bool,
    cluster: bool,
) -> FusedGeometry {
    let (big, k) = epilogue_threads(vectors_per_row);
    let whole = FusedGeometry {
        parts: 1,
        threads: big,
        blocks: rows.min(blocks as usize).max(1) as u32,
        big,
        k,
        cluster: false,
    };
    if cluster && world > 1 && rows > 0 {
        let warps = big as usize / 32;
        let fit = (blocks as usize / rows).min(MAX_CLUSTER).min(warps);
        if let Some(c) = (2..=fit).rev().find(|c| warps.is_multiple_of(*c)) {
            return FusedGeometry {
                parts: c as u32,
                threads: big / c as u32,
                blocks: (rows * c) as u32,
                big,
                k,
                cluster: true,
            };
        }
    }
    if !split || world < 2 || rows == 0 || rows > EPI_SPLIT_MAX_ROWS {
        return whole;
    }
    // The largest multiple of 32 that divides `big` and is at most SPLIT_THREADS.
    let warps = big as usize / 32;
    let per = (1..=SPLIT_THREADS / 32)
        .rev()
        .find(|d| warps.is_multiple_of(*d))
        .unwrap_or(1);
    let threads = 32 * per;
    let parts = vectors_per_row
        .div_ceil(threads)
        .min(MAX_PARTS)
        .min(blocks as usize / rows);
    if parts < 2 {
        return whole;
    }
    FusedGeometry {
        parts: parts as u32,
        threads: threads as u32,
        blocks: (rows * parts) as u32,
        big,
        k,
        cluster: false,
    }
}

/// One epilogue op's buffers (device addresses) and parameters, checked once when built
/// ([`Epilogue::new`]: null addresses, eps, then [`Buffers::check`]), so the launches take it as
/// it is.
#[derive(Debug, Clone, Copy)]
pub struct Epilogue {
    /// The op's input: this rank's partial sums.
    x: u64,
    rows: Rows,
    residual: u64,
    residual_out: u64,
    /// `(weight, norm_out, eps)` with the RMSNorm; `None`: the residual add alone.
    norm: Option<(u64, u64, f32)>,
}

impl Epilogue {
    /// The epilogue of `rows` of partial sums at `x`: `residual_out = residual + sum`, and with
    /// `norm = Some((weight, norm_out, eps))` the RMSNorm of that into `norm_out`. Errors name
    /// `op`.
    ///
    /// # Safety
    /// NOTE [raw-addresses]: `x`, `residual`, `residual_out` and `norm_out` each hold
    /// `rows.count()` elements of `rows.dtype()` and `weight` one row (`rows.hidden()`), in
    /// device memory of the context the ops run in, allocated and untouched by anything but
    /// those ops until the work of every op launched with this `Epilogue` has completed.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn new(
        op: &'static str,
        x: u64,
        rows: Rows,
        residual: u64,
        residual_out: u64,
        norm: Option<(u64, u64, f32)>,
    ) -> Result<Epilogue> {
        let (w, n) = norm.map_or((None, None), |(w, n, _)| (Some(w), Some(n)));
        for (what, p) in [
            ("x", Some(x)),
            ("residual", Some(residual)),
            ("residual_out", Some(residual_out)),
            ("weight", w),
            ("norm_out", n),
        ] {
            if p == Some(0) {
                return Err(Error::InvalidArgument(format!("{op}: {what} is a null device address")));
            }
        }
        if let Some((_, _, eps)) = norm {
            if !eps.is_finite() || eps < 0.0 {
                return Err(Error::InvalidArgument(format!(
                    "{op}: eps {eps} is not a finite non-negative number"
                )));
            }
        }
        let bytes = rows.bytes();
        let span = |what, addr| Span { what, addr, bytes };
        Buffers {
            x: span("x", x),
            residual: span("residual", residual),
            weight: norm.map(|(w, _, _)| Span {
                what: "weight",
                addr: w,
                bytes: rows.hidden() * rows.dtype().size(),
            }),
            residual_out: span("residual_out", residual_out),
            norm_out: norm.map(|(_, n, _)| span("norm_out", n)),
        }
        .check(op)?;
        Ok(Epilogue {
            x,
            rows,
            residual,
            residual_out,
            norm,
        })
    }

    /// The rows.
    pub fn rows(&self) -> Rows {
        self.rows
    }

    /// The arguments every epilogue kernel ends with: residual, weight, residual_out, norm_out,
    /// eps, flags.
    fn tail(&self) -> [KernelArg; 6] {
        let (weight, norm_out, eps) = self.norm.unwrap_or((0, 0, 0.0));
        [
            KernelArg::U64(self.residual),
            KernelArg::U64(weight),
            KernelArg::U64(self.residual_out),
            KernelArg::U64(norm_out),
            KernelArg::F32(eps),
            KernelArg::U32(if self.norm.is_some() { EPI_NORM } else { 0 }),
        ]
    }

    fn grid(&self, blocks: u32) -> LaunchConfig {
        let (threads, _) = epilogue_threads(self.rows.vectors_per_row());
        cfg((self.rows.rows().min(blocks as usize)) as u32, threads)
    }

    /// `symm_lamport{,2}_add_rms_{dt}(COLL_LAMPORT_EPI_ARGS)` of this op laid out as `g`.
    fn fused_args(
        &self,
        c: &Common,
        d: &Direct,
        g: &FusedGeometry,
        layout: &WorkspaceLayout,
        bound: &Bound,
        hdr: &OpHeader,
    ) -> [KernelArg; 30] {
        let [h0, h1] = hdr.args();
        let [res, w, ro, no, eps, flags] = self.tail();
        let flags = match flags {
            KernelArg::U32(f) if g.cluster => KernelArg::U32(f | EPI_CLUSTER),
            f => f,
        };
        let [w0, w1, w2, w3, w4, w5, w6, w7, pad] = d.lamport_head(c.rank);
        [
            w0,
            w1,
            w2,
            w3,
            w4,
            w5,
            w6,
            w7,
            pad,
            KernelArg::U32(c.rank),
            KernelArg::U32(c.world),
            KernelArg::U64(self.x),
            KernelArg::U64(self.rows.rows() as u64),
            KernelArg::U32(self.rows.vectors_per_row() as u32),
            KernelArg::U32(g.k),
            KernelArg::U32(g.parts),
            KernelArg::U32(g.big),
            KernelArg::U64(layout.lamport_off as u64),
            KernelArg::U64(layout.lamport_slot_bytes as u64),
            KernelArg::U64(bound.timeout_ns),
            KernelArg::U64(bound.abort_host),
            KernelArg::U64(layout.lamport_headers_off() as u64),
            h0,
            h1,
            res,
            w,
            ro,
            no,
            eps,
            flags,
        ]
    }

    fn geometry(&self) -> [KernelArg; 3] {
        let vr = self.rows.vectors_per_row();
        let (_, k) = epilogue_threads(vr);
        [
            KernelArg::U64(self.rows.rows() as u64),
            KernelArg::U32(vr as u32),
            KernelArg::U32(k),
        ]
    }
}

/// The separate epilogue kernel (`symm_add_rms_{dt}`) of one context: what runs after an
/// all-reduce that is not the fused Lamport one (another symm algorithm, NCCL, the host's copy).
/// Needs no workspace, so an NCCL-only communicator has one too.
pub struct Epilogues {
    /// `symm_add_rms_{dt}`, per element type.
    add_rms: PerDtype<CudaFunction>,
    how: Launch,
    /// Most blocks of one launch: the SM count, or the collectives' grid budget on a GPU shared
    /// by ranks (NOTE [co-residency]: with programmatic dependent launch this kernel's blocks may
    /// sit resident behind the all-reduce before it, and must leave the peers' kernels room).
    blocks: u32,
}

impl std::fmt::Debug for Epilogues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epilogues")
            .field("pdl", &self.how.pdl)
            .finish_non_exhaustive()
    }
}

impl Epilogues {
    /// Loads the kernels (the collectives module: NVRTC, cached) into `ctx`; `pdl` as
    /// `CollectivesConfig::pdl` (used where the device supports it).
    pub fn load(ctx: &Arc<CudaContext>, pdl: bool) -> Result<Epilogues> {
        bind(ctx)?;
        let collectives_src = kernels::source("collectives")?;
        let module = kernels::load(ctx, collectives_src, kernels::defines_for(collectives_src))?;
        let get = |dt: &str| driver::load_function(&module, &format!("symm_add_rms_{dt}"));
        let sm = driver::attribute(
            ctx.cu_device(),
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        Ok(Epilogues {
            add_rms: PerDtype::try_new(|d| get(d.suffix()))?,
            how: Launch {
                pdl: pdl && driver::supports_pdl(ctx.cu_device())?,
                cluster: 0,
            },
            blocks: u32::try_from(sm).unwrap_or(1).max(1),
        })
    }

    /// The same kernels held to `blocks` blocks per launch (a shared GPU's grid budget).
    pub fn with_max_blocks(mut self, blocks: u32) -> Epilogues {
        self.blocks = blocks.clamp(1, self.blocks);
        self
    }

    /// The epilogue over `sum` (the all-reduced rows; may be `x`, the norm output or the
    /// residual output, which are read before they are written), on `stream`.
    ///
    /// # Safety
    /// `sum` holds `e.rows().count()` elements under [`Epilogue::new`]'s contract.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn launch(&self, stream: &CudaStream, sum: u64, e: &Epilogue) -> Result<()> {
        let dt = kernel_dtype(e.rows.dtype(), "all-reduce epilogue")?;
        if !sum.is_multiple_of(16) {
            return Err(Error::Misaligned {
                what: "all-reduced sum",
                value: sum,
                align: 16,
            });
        }
        if e.rows.rows() == 0 {
            return Ok(());
        }
        let [rows, vr, k] = e.geometry();
        let [res, w, ro, no, eps, flags] = e.tail();
        let a = [KernelArg::U64(sum), res, w, ro, no, rows, vr, k, eps, flags];
        launch_with(stream, &self.add_rms[dt], e.grid(self.blocks), &a, self.how)
    }
}

impl CudaCollectives {
    /// The separate epilogue kernels of this context (see [`Epilogues`]).
    pub fn epilogues(&self) -> &Epilogues {
        &self.epilogues
    }

    /// The Lamport one-shot all-reduce (sum) of `e`'s input with the epilogue applied to each
    /// row as it completes, in one kernel (NOTE [fused-epilogue]). Every rank passes the same
    /// geometry and the same mechanism in the same op order (NOTE [op-agreement]: the header
    /// carries the op, a fused op against another op latches a mismatch).
    pub fn lamport_epilogue(&self, stream: &CudaStream, e: &Epilogue) -> Result<()> {
        self.check_stream(stream)?;
        let dt = kernel_dtype(e.rows.dtype(), "all_reduce_residual_rms_norm")?;
        let bytes = e.rows.bytes();
        if self.rig.world > 1 && bytes > self.rig.layout.lamport_max_bytes() {
            return Err(Error::OutOfRange {
                what: "fused all-reduce epilogue bytes (the Lamport buffers)",
                value: bytes as u64,
                limit: self.rig.layout.lamport_max_bytes() as u64,
            });
        }
        if e.rows.rows() == 0 {
            return Ok(());
        }
        let mech = if e.norm.is_some() {
            Mechanism::LamportResidualNorm
        } else {
            Mechanism::LamportResidual
        };
        let hdr = header(
            OpKind::AllReduce,
            e.rows.dtype(),
            e.rows.count(),
            Some(ReduceOp::Sum),
            mech,
        );
        let g = fused_geometry(
            e.rows.rows(),
            e.rows.vectors_per_row(),
            self.rig.world,
            self.rig.grid.blocks,
            knobs::epi_split(),
            self.clusters,
        );
        let a = e.fused_args(
            &self.rig.common,
            &self.rig.direct,
            &g,
            &self.rig.layout,
            &self.rig.bound,
            &hdr,
        );
        // At most the grid budget's blocks (all blocks resident: NOTE [co-residency]).
        let f = if self.rig.world == 2 && !knobs::lamport_generic() {
            &self.kernels.lamport_epilogue_two_rank[dt]
        } else {
            &self.kernels.lamport_epilogue[dt]
        };
        let how = Launch {
            cluster: if g.cluster { g.parts } else { 0 },
            ..self.how
        };
        launch_with(stream, f, cfg(g.blocks, g.threads), &a, how)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused kernel's argument list has the arity and sizes of its parameters in the PTX
    /// NVRTC produces, for the generic and the two-rank entries (when NVRTC is present).
    #[test]
    #[allow(unsafe_code)]
    fn fused_arguments_match_the_kernels() {
        use crate::kernels::ptx_param_sizes;
        use symm_core::coll::arg::arg_bytes;
        if let Err(e) = kernels::nvrtc_available() {
            println!("SKIP fused_arguments_match_the_kernels: {e}");
            return;
        }
        let src = kernels::source("collectives").unwrap();
        let ptx = kernels::compile(src, "", "sm_90").unwrap();
        let rows = Rows::new("t", 4 * 4096, 4096, symm_core::DType::BF16).unwrap();
        // SAFETY: nothing dereferences these addresses: the test only builds the argument list.
        let e = unsafe {
            Epilogue::new(
                "t",
                0x1000,
                rows,
                0x10_0000,
                0x20_0000,
                Some((0x30_0000, 0x40_0000, 1e-5)),
            )
        }
        .unwrap();
        let layout = WorkspaceLayout::new(2, 10 << 20, 4 << 20, 64).unwrap();
        let c = Common {
            bufs_dev: 1,
            pads_dev: 2,
            rank: 0,
            world: 2,
        };
        let bound = Bound {
            timeout_ns: 1,
            abort_host: 0,
        };
        let g = fused_geometry(4, 512, 2, 132, true, false);
        let a = e.fused_args(&c, &Direct::default(), &g, &layout, &bound, &OpHeader::default());
        let got: Vec<usize> = a.iter().map(arg_bytes).collect();
        for dt in ["f32", "f16", "bf16"] {
            for k in ["symm_lamport_add_rms", "symm_lamport2_add_rms"] {
                let name = format!("{k}_{dt}");
                let want = ptx_param_sizes(&ptx, &name).unwrap_or_else(|| panic!("{name} not in the PTX"));
                assert_eq!(got, want, "{name}: host arguments vs kernel parameters");
            }
        }
    }

    #[test]
    fn split_rows_keep_the_rows_block_order() {
        // hidden 8192 bf16, one token, 132 SMs: 8 parts of 128 vectors, 128 threads each.
        let g = fused_geometry(1, 1024, 2, 132, true, false);
        assert_eq!((g.parts, g.threads, g.blocks, g.big, g.k), (8, 128, 8, 512, 2));
        // hidden 4096 bf16, 7 tokens: 4 parts a row.
        let g = fused_geometry(7, 512, 2, 132, true, false);
        assert_eq!((g.parts, g.threads, g.blocks), (4, 128, 28));
        // Too many rows for one wave of split blocks: whole rows, the budget's blocks.
        let g = fused_geometry(128, 1024, 2, 132, true, false);
        assert_eq!((g.parts, g.threads, g.blocks), (1, 512, 128));
        // World 1 and the switch off: whole rows.
        assert_eq!(fused_geometry(1, 1024, 1, 132, true, false).parts, 1);
        assert_eq!(fused_geometry(1, 1024, 2, 132, false, false).parts, 1);
        // A shared GPU's small budget still splits.
        assert_eq!(fused_geometry(1, 1024, 8, 14, true, false).parts, 8);
        assert_eq!(fused_geometry(7, 1024, 8, 14, true, false).parts, 2);
        for vr in 1..=MAX_ROW_VECTORS {
            for rows in [1usize, 2, 7, 33] {
                for blocks in [14u32, 64, 132] {
                    let g = fused_geometry(rows, vr, 2, blocks, true, false);
                    assert_eq!(g.big % g.threads, 0, "{vr}: {g:?}");
                    assert!(g.threads.is_multiple_of(32) && g.threads as usize <= MAX_THREADS);
                    assert!(g.blocks <= blocks && g.blocks >= 1, "{vr} {rows} {blocks}: {g:?}");
                    if g.parts > 1 {
                        assert_eq!(g.blocks as usize, rows * g.parts as usize);
                        // Every part holds at least one vector.
                        let per = vr.div_ceil(g.parts as usize);
                        assert!(per * (g.parts as usize - 1) < vr, "{vr} {rows}: {g:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn cluster_rows_spread_the_rows_block_over_a_cluster() {
        // hidden 8192 bf16, one token: the 512-thread block as 8 blocks of 64 (two vectors each).
        let g = fused_geometry(1, 1024, 2, 132, false, true);
        assert_eq!(
            (g.parts, g.threads, g.blocks, g.big, g.k, g.cluster),
            (8, 64, 8, 512, 2, true)
        );
        // 32 tokens on 132 blocks: clusters of 4.
        let g = fused_geometry(32, 1024, 4, 132, false, true);
        assert_eq!((g.parts, g.threads, g.blocks, g.cluster), (4, 128, 128, true));
        // Too many rows for two blocks a row: the other layouts.
        assert!(!fused_geometry(128, 1024, 2, 132, true, true).cluster);
        // World 1: whole rows.
        assert!(!fused_geometry(1, 1024, 1, 132, true, true).cluster);
        for vr in 1..=MAX_ROW_VECTORS {
            for rows in [1usize, 2, 7, 33] {
                for blocks in [14u32, 64, 132] {
                    let g = fused_geometry(rows, vr, 4, blocks, false, true);
                    if g.cluster {
                        // The row's block, cut into whole warps, at most 8 blocks, one wave.
                        assert_eq!(g.threads * g.parts, g.big, "{vr}: {g:?}");
                        assert!(g.threads.is_multiple_of(32));
                        assert!(g.parts >= 2 && g.parts as usize <= MAX_CLUSTER);
                        assert_eq!(g.blocks as usize, rows * g.parts as usize);
                        assert!(g.blocks <= blocks);
                    }
                }
            }
        }
    }

    #[test]
    fn block_of_a_row() {
        // hidden 4096 bf16: 512 vectors, one per thread; 8192: two; 128: one warp.
        assert_eq!(epilogue_threads(512), (512, 1));
        assert_eq!(epilogue_threads(1024), (512, 2));
        assert_eq!(epilogue_threads(16), (32, 1));
        assert_eq!(epilogue_threads(1), (32, 1));
        assert_eq!(epilogue_threads(MAX_ROW_VECTORS), (512, 8));
        assert_eq!(epilogue_threads(100), (128, 1));
        for vr in 1..=MAX_ROW_VECTORS {
            let (t, k) = epilogue_threads(vr);
            assert!(t % 32 == 0 && t as usize <= MAX_THREADS);
            assert!((t * k) as usize >= vr && k as usize <= MAX_VECTORS_PER_THREAD, "{vr}");
        }
    }
}
