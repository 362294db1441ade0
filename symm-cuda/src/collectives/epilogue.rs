//! All-reduce epilogues: residual add and RMSNorm over `[rows, hidden]`, as a kernel of its own
//! after any all-reduce ([`Epilogues`]) or fused into the Lamport one-shot
//! ([`CudaCollectives::lamport_epilogue`]). NOTE [fused-epilogue] in `kernels/epilogue.cuh`
//! holds the numerics and the aliasing rules; `symm_core::epilogue` the checks.

#![forbid(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use symm_core::epilogue::{Buffers, Rows, Span, MAX_ROW_VECTORS};
use symm_core::{Error, OpKind, ReduceOp, Result};

use super::agree::{header, Mechanism};
use super::{cfg, kernel_dtype, CudaCollectives};
use crate::driver::launch::{launch_with, KernelArg, Launch};
use crate::driver::{self, bind};
use crate::kernels;

/// Most vectors of a row one thread holds (`EPI_MAXV` in epilogue.cuh).
const MAX_VECTORS_PER_THREAD: usize = 8;
/// Most threads of an epilogue block (`COLL_MAX_THREADS`).
const MAX_THREADS: usize = 512;
/// `flags` bit: compute the RMSNorm (`EPI_NORM`).
const EPI_NORM: u32 = 1;

const _: () = assert!(MAX_ROW_VECTORS == MAX_THREADS * MAX_VECTORS_PER_THREAD);

/// The block of one row: `(threads, vectors per thread)`, a function of the row's vector count
/// alone, so the fused and the separate kernel reduce a row's squares in the same order.
pub fn epilogue_threads(vectors_per_row: usize) -> (u32, u32) {
    let threads = vectors_per_row.div_ceil(32).max(1) * 32;
    let threads = threads.min(MAX_THREADS);
    (threads as u32, vectors_per_row.div_ceil(threads).max(1) as u32)
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
    pub fn new(
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
    fns: [CudaFunction; 3],
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
        let module = kernels::load(ctx, kernels::source("collectives")?, "")?;
        let get = |dt: &str| driver::load_function(&module, &format!("symm_add_rms_{dt}"));
        let sm = driver::attribute(
            ctx.cu_device(),
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        Ok(Epilogues {
            fns: [get("f32")?, get("f16")?, get("bf16")?],
            how: Launch {
                pdl: pdl && driver::supports_pdl(ctx.cu_device())?,
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
    pub fn launch(&self, stream: &CudaStream, sum: u64, e: &Epilogue) -> Result<()> {
        let dt = kernel_dtype(e.rows.dtype(), "all-reduce epilogue")?;
        if sum % 16 != 0 {
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
        launch_with(stream, &self.fns[dt], e.grid(self.blocks), &a, self.how)
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
        if self.world > 1 && bytes > self.layout.lamport_max_bytes() {
            return Err(Error::OutOfRange {
                what: "fused all-reduce epilogue bytes (the Lamport buffers)",
                value: bytes as u64,
                limit: self.layout.lamport_max_bytes() as u64,
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
        let [h0, h1] = hdr.args();
        let [rows, vr, k] = e.geometry();
        let [res, w, ro, no, eps, flags] = e.tail();
        let [w0, w1, w2, w3, w4, w5, w6, w7, pad] = self.direct.lamport_head(self.rank as u32);
        let a = [
            w0,
            w1,
            w2,
            w3,
            w4,
            w5,
            w6,
            w7,
            pad,
            KernelArg::U32(self.rank as u32),
            KernelArg::U32(self.world as u32),
            KernelArg::U64(e.x),
            rows,
            vr,
            k,
            KernelArg::U64(self.layout.lamport_off as u64),
            KernelArg::U64(self.layout.lamport_slot_bytes as u64),
            KernelArg::U64(self.timeout_ns),
            KernelArg::U64(self.abort_host),
            KernelArg::U64(self.layout.lamport_headers_off() as u64),
            h0,
            h1,
            res,
            w,
            ro,
            no,
            eps,
            flags,
        ];
        // One block per row while the grid budget allows (all blocks resident: NOTE
        // [co-residency]).
        self.launch_coll(stream, &self.fns.lamport_epi[dt], e.grid(self.grid.blocks), &a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
