//! All-reduce epilogues: residual add and RMSNorm over `[rows, hidden]`, as a kernel of its own
//! after any all-reduce ([`Epilogues`]) or fused into the Lamport one-shot
//! ([`CudaCollectives::lamport_epilogue`]). NOTE [fused-epilogue] in symm-core's `kernels/epilogue.cuh`
//! holds the numerics and the aliasing rules; symm-core's `coll::add_rms` plans both launches
//! (and holds [`Epilogue`], the checked buffers), `symm_core::coll::epilogue_check` the checks.

#![deny(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use symm_core::coll::add_rms;
use symm_core::coll::launch::{self, Entry, Launcher};
use symm_core::Result;

use super::geometry::PerDtype;
use super::{launch_planned, not_here, CudaCollectives};
use crate::driver::launch::Launch;
use crate::driver::{self, bind};
use crate::kernels;

pub use symm_core::coll::add_rms::{epilogue_threads, Epilogue};

/// The separate epilogue kernel (`symm_add_rms_{dt}`) of one context: what runs after an
/// all-reduce that is not the fused Lamport one (another symm algorithm, NCCL, the host's copy).
/// Needs no workspace, so an NCCL-only communicator has one too.
pub struct Epilogues {
    /// `symm_add_rms_{dt}`, per element type.
    pub(super) add_rms: PerDtype<CudaFunction>,
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

/// Runs the separate kernel's planned launch ([`add_rms::separate`]) on one stream.
struct EpiOn<'a> {
    e: &'a Epilogues,
    stream: &'a CudaStream,
}

impl Launcher for EpiOn<'_> {
    fn launch(&self, l: &launch::Launch) -> Result<()> {
        match l.entry {
            Entry::AddRms(dt) => launch_planned(self.stream, &self.e.add_rms[dt], l, self.e.how),
            other => Err(not_here(other.name())),
        }
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
    /// residual output, which are read before they are written), on `stream`, as
    /// [`add_rms::separate`] plans it.
    ///
    /// # Safety
    /// `sum` holds `e.rows().count()` elements under [`Epilogue::new`]'s contract.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn launch(&self, stream: &CudaStream, sum: u64, e: &Epilogue) -> Result<()> {
        match add_rms::separate(sum, e, self.blocks)? {
            Some(l) => EpiOn { e: self, stream }.launch(&l),
            None => Ok(()),
        }
    }
}

impl CudaCollectives {
    /// The separate epilogue kernels of this context (see [`Epilogues`]).
    pub fn epilogues(&self) -> &Epilogues {
        &self.epilogues
    }

    /// The Lamport one-shot all-reduce (sum) of `e`'s input with the epilogue applied to each
    /// row as it completes (NOTE [fused-epilogue]: one kernel, or the handoff pair where
    /// `SYMM_EPI_HANDOFF` allows it), as symm-core's `Rig::fused_add_rms` plans it. Every rank passes the same geometry and the same mechanism
    /// in the same op order (NOTE [op-agreement]: the header carries the op, a fused op against
    /// another op latches a mismatch).
    pub fn lamport_epilogue(&self, stream: &CudaStream, e: &Epilogue) -> Result<()> {
        self.check_stream(stream)?;
        match self.rig.fused_add_rms(e, &self.config.tuning)? {
            Some(f) => f.run(&self.on(stream)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::coll::arg::arg_bytes;
    use symm_core::coll::args::{Bound, Common, Direct};
    use symm_core::coll::epilogue_check::Rows;
    use symm_core::coll::geometry::GridBudget;
    use symm_core::coll::launch::{Rig, Switches};
    use symm_core::coll::layout::WorkspaceLayout;

    use crate::kernels::ptx_param_sizes;

    /// A bf16 epilogue of 4 rows of 4096 with the norm.
    #[allow(unsafe_code)]
    fn epilogue() -> Epilogue {
        let rows = Rows::new("t", 4 * 4096, 4096, symm_core::DType::BF16).unwrap();
        // SAFETY: nothing dereferences these addresses: the tests only build argument lists.
        unsafe {
            Epilogue::new(
                "t",
                0x1000,
                rows,
                0x10_0000,
                0x20_0000,
                Some((0x30_0000, 0x40_0000, 1e-5)),
            )
        }
        .unwrap()
    }

    /// A two-rank rig with split rows on, so the planned arguments cover the split layout.
    fn rig() -> Rig {
        Rig {
            rank: 0,
            world: 2,
            layout: WorkspaceLayout::new(2, 10 << 20, 4 << 20, 64).unwrap(),
            common: Common {
                bufs_dev: 1,
                pads_dev: 2,
                rank: 0,
                world: 2,
            },
            direct: Direct::default(),
            bound: Bound {
                timeout_ns: 1,
                abort_host: 0,
            },
            grid: GridBudget::new(132, 1, false).unwrap(),
            switches: Switches {
                epi_split: true,
                ..Switches::default()
            },
            clusters: false,
        }
    }

    /// The collectives' PTX for sm_90, or `None` without NVRTC (said so).
    fn ptx() -> Option<String> {
        if let Err(e) = kernels::nvrtc_available() {
            println!("SKIP (the PTX half): {e}");
            return None;
        }
        let src = kernels::source("collectives").unwrap();
        Some(kernels::compile(src, "", "sm_90").unwrap())
    }

    /// The fused kernel's planned argument list has the arity and sizes of its parameters in the
    /// PTX NVRTC produces, for the generic and some world entries (when NVRTC is present).
    #[test]
    fn fused_arguments_match_the_kernels() {
        let tuning = symm_core::coll::geometry::Tuning::default();
        let f = rig().fused_add_rms(&epilogue(), &tuning).unwrap().unwrap();
        assert!(f.then.is_none());
        let l = f.first;
        assert_eq!(l.entry.name(), "symm_lamport2_add_rms_bf16");
        let got: Vec<usize> = l.args.iter().map(arg_bytes).collect();
        // The handoff pair: the Lamport world entry, then the fused entry's epilogue half.
        let mut r = rig();
        r.switches.epi_handoff = true;
        let pair = r.fused_add_rms(&epilogue(), &tuning).unwrap().unwrap();
        let then = pair.then.expect("the handoff pair");
        assert_eq!(pair.first.entry.name(), "symm_lamport2_ar_sum_bf16");
        assert_eq!(then.entry.name(), "symm_lamport2_add_rms_bf16");
        assert_eq!(then.args.iter().map(arg_bytes).collect::<Vec<_>>(), got);
        let first: Vec<usize> = pair.first.args.iter().map(arg_bytes).collect();
        let Some(ptx) = ptx() else { return };
        let want = ptx_param_sizes(&ptx, "symm_lamport2_ar_sum_bf16").expect("the Lamport world entry");
        assert_eq!(
            first, want,
            "the handoff pair's all-reduce: host arguments vs kernel parameters"
        );
        for dt in ["f32", "f16", "bf16"] {
            for k in [
                "symm_lamport_add_rms",
                "symm_lamport2_add_rms",
                "symm_lamport4_add_rms",
                "symm_lamport8_add_rms",
            ] {
                let name = format!("{k}_{dt}");
                let want = ptx_param_sizes(&ptx, &name).unwrap_or_else(|| panic!("{name} not in the PTX"));
                assert_eq!(got, want, "{name}: host arguments vs kernel parameters");
            }
        }
    }

    /// The separate kernel's planned argument list against its parameters in the PTX.
    #[test]
    fn separate_arguments_match_the_kernel() {
        let l = add_rms::separate(0x50_0000, &epilogue(), 132).unwrap().unwrap();
        assert_eq!(l.entry.name(), "symm_add_rms_bf16");
        let got: Vec<usize> = l.args.iter().map(arg_bytes).collect();
        let Some(ptx) = ptx() else { return };
        for dt in ["f32", "f16", "bf16"] {
            let name = format!("symm_add_rms_{dt}");
            let want = ptx_param_sizes(&ptx, &name).unwrap_or_else(|| panic!("{name} not in the PTX"));
            assert_eq!(got, want, "{name}: host arguments vs kernel parameters");
        }
    }
}
