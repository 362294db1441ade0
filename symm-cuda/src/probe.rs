//! Latency probes: minimal cross-GPU kernels (`kernels/probe.cu`) that isolate the fixed costs
//! the collectives pay per op (a kernel launch, a state update, a remote store, a flag round,
//! a 1 KiB data-as-flag exchange, a gpu-scope release behind remote stores). `symm-bench
//! --probe` times them in eager mode and in CUDA-graph replay next to the collectives; they
//! are diagnostics, not collectives. [`BandwidthProbe`] times plain SM and copy-engine copies
//! to and from a peer (`symm-bench --probe-bw`): the ceiling of the bandwidth-bound paths.
//!
//! NOTE [probe-layout]: the probe buffer (one symmetric allocation of at least
//! [`LatencyProbe::BYTES`]) holds STATE (u32 counters, one per probe, at word 0), FLAGS (u32
//! `[probe][src]` at word 1024) and DATA (`[parity][src][64 x 16 B]` at byte 16384); the `PROBE_*`
//! defines of `kernels/probe.cu` mirror it. Every rank runs the same sequence of probes, so the
//! counters stay equal across ranks; [`LatencyProbe::counters`] reads them back.

// No unsafe code: the copy probes only declare their raw-address contract (NOTE [raw-addresses]).
#![deny(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use symm_core::{Error, Result, SymmetricMemory};

use crate::driver::launch::{launch, launch_with, KernelArg, Launch};
use crate::driver::mem::memset_d32_async;
use crate::kernels;

/// The probes, in the order of their STATE counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Probe {
    /// An empty kernel.
    Empty,
    /// One thread increments a counter in device memory.
    Local,
    /// One remote (peer) store, no wait.
    Put,
    /// Flag ping-pong with one peer: volatile store, volatile poll.
    FlagRelaxed,
    /// Flag ping-pong with one peer: `st.release.sys`, `ld.acquire.sys` poll.
    FlagRelease,
    /// 1 KiB data as flag (64 threads x 16 bytes pushed to the peer, polled locally).
    Data,
    /// [`Probe::Data`] plus a `red.release.gpu` by thread 0 after its remote store.
    DataFence,
}

impl Probe {
    pub const ALL: [Probe; 7] = [
        Probe::Empty,
        Probe::Local,
        Probe::Put,
        Probe::FlagRelaxed,
        Probe::FlagRelease,
        Probe::Data,
        Probe::DataFence,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Probe::Empty => "empty kernel",
            Probe::Local => "local state update",
            Probe::Put => "one remote store",
            Probe::FlagRelaxed => "flag ping-pong (volatile)",
            Probe::FlagRelease => "flag ping-pong (release/acquire sys)",
            Probe::Data => "1 KiB data as flag",
            Probe::DataFence => "1 KiB data as flag + red.release.gpu",
        }
    }

    /// Index of its STATE counter (`kernels/probe.cu`).
    fn counter(self) -> usize {
        self as usize
    }
}

/// Kernel, threads and argument list of one probe (mirrors the signatures in `kernels/probe.cu`).
fn probe_args(
    probe: Probe,
    own: u64,
    peer: u64,
    rank: u32,
    peer_rank: u32,
    timeout_ns: u64,
) -> (&'static str, u32, Vec<KernelArg>) {
    let (own, peer) = (KernelArg::U64(own), KernelArg::U64(peer));
    let (rank, peer_rank) = (KernelArg::U32(rank), KernelArg::U32(peer_rank));
    let timeout = KernelArg::U64(timeout_ns);
    match probe {
        Probe::Empty => ("symm_probe_empty", 32, vec![]),
        Probe::Local => ("symm_probe_local", 32, vec![own]),
        Probe::Put => ("symm_probe_put", 32, vec![own, peer, rank]),
        Probe::FlagRelaxed | Probe::FlagRelease => {
            let release = KernelArg::U32(u32::from(probe == Probe::FlagRelease));
            (
                "symm_probe_flag",
                32,
                vec![own, peer, rank, peer_rank, release, timeout],
            )
        }
        Probe::Data | Probe::DataFence => {
            let fence = KernelArg::U32(u32::from(probe == Probe::DataFence));
            ("symm_probe_data", 64, vec![own, peer, rank, peer_rank, fence, timeout])
        }
    }
}

/// The probe kernels over one symmetric buffer, for the pair (this rank, next rank).
pub struct LatencyProbe {
    mem: Arc<dyn SymmetricMemory>,
    empty: CudaFunction,
    local: CudaFunction,
    put: CudaFunction,
    flag: CudaFunction,
    data: CudaFunction,
    own: u64,
    peer: u64,
    rank: u32,
    peer_rank: u32,
    timeout_ns: u64,
}

impl LatencyProbe {
    /// Bytes of symmetric memory the probes need.
    pub const BYTES: usize = 64 << 10;

    /// Loads the probes and zeroes this rank's probe buffer on `stream` (synchronised). The ranks
    /// must then meet (a barrier) before the first probe. Waits give up after `timeout`.
    pub fn new(
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        mem: Arc<dyn SymmetricMemory>,
        timeout: Duration,
    ) -> Result<Self> {
        if mem.buffer_size() < Self::BYTES {
            return Err(Error::InvalidArgument(format!(
                "the latency probes need {} bytes of symmetric memory, got {}",
                Self::BYTES,
                mem.buffer_size()
            )));
        }
        let module = kernels::load(ctx, kernels::source("probe")?, "")?;
        let get = |name: &str| crate::driver::load_function(&module, name);
        let (rank, world) = (mem.rank().get(), mem.world_size());
        let peer_rank = (rank + 1) % world;
        let own = mem.buffer_ptrs()[rank];
        memset_d32_async(stream, own, 0, Self::BYTES / 4)?;
        crate::driver::stream_synchronize(stream)?;
        Ok(LatencyProbe {
            empty: get("symm_probe_empty")?,
            local: get("symm_probe_local")?,
            put: get("symm_probe_put")?,
            flag: get("symm_probe_flag")?,
            data: get("symm_probe_data")?,
            own,
            peer: mem.buffer_ptrs()[peer_rank],
            rank: rank as u32,
            peer_rank: peer_rank as u32,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            mem,
        })
    }

    /// Launches one probe on `stream` (every rank must launch the same sequence).
    pub fn launch(&self, stream: &CudaStream, probe: Probe) -> Result<()> {
        self.launch_with(stream, probe, Launch::default())
    }

    /// [`Self::launch`], the way `how` says (every probe kernel starts with the PDL prologue,
    /// NOTE [pdl] in symm-core's `kernels/common.cuh`, so `how.pdl` is allowed on compute capability 9.0+).
    pub fn launch_with(&self, stream: &CudaStream, probe: Probe, how: Launch) -> Result<()> {
        let (name, threads, args) = probe_args(probe, self.own, self.peer, self.rank, self.peer_rank, self.timeout_ns);
        let f = match name {
            "symm_probe_empty" => &self.empty,
            "symm_probe_local" => &self.local,
            "symm_probe_put" => &self.put,
            "symm_probe_flag" => &self.flag,
            _ => &self.data,
        };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        launch_with(stream, f, cfg, &args, how)
    }

    /// Every probe's counter (index = [`Probe::ALL`] order), read back synchronously: each
    /// equals the number of times the probe ran when every wait completed.
    pub fn counters(&self, stream: &CudaStream) -> Result<[u32; 7]> {
        crate::driver::stream_synchronize(stream)?;
        let mut words = [0u8; 28];
        self.mem.read_bytes(self.mem.rank(), 0, &mut words)?;
        let mut out = [0u32; 7];
        for (p, o) in Probe::ALL.iter().zip(out.iter_mut()) {
            let i = p.counter() * 4;
            *o = u32::from_le_bytes([words[i], words[i + 1], words[i + 2], words[i + 3]]);
        }
        Ok(out)
    }
}

/// A one-thread kernel that keeps its stream busy for a given time: `symm-bench --skew-us` makes
/// one rank late with it before every op, as a GEMM's skew does in a model layer (NOTE
/// [host-abort-poll]).
pub struct Delay {
    spin: CudaFunction,
}

impl Delay {
    /// Loads the spin kernel for `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let module = kernels::load(ctx, kernels::source("probe")?, "")?;
        Ok(Delay {
            spin: crate::driver::load_function(&module, "symm_probe_spin")?,
        })
    }

    /// Enqueues a kernel on `stream` that runs for `d` (one thread polling the global timer).
    pub fn launch(&self, stream: &CudaStream, d: Duration) -> Result<()> {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(stream, &self.spin, cfg, &[KernelArg::U64(ns)])
    }
}

/// Bandwidth probe: a plain 16-byte-vector copy kernel (`symm_probe_copy`, 4 vectors per thread
/// in flight, one block per SM) whose source or destination is a peer's memory, and the copy
/// engine (`cuMemcpyDtoDAsync`) for comparison. `symm-bench --probe-bw` times them with one or
/// both ranks copying at once, which is what bounds the bandwidth-bound collectives.
pub struct BandwidthProbe {
    copy: CudaFunction,
    blocks: u32,
}

impl BandwidthProbe {
    /// Threads per block of the copy kernel.
    pub const THREADS: u32 = 512;

    /// Loads the copy kernel for `ctx`; `blocks` is the grid (normally the SM count).
    pub fn new(ctx: &Arc<CudaContext>, blocks: u32) -> Result<Self> {
        let module = kernels::load(ctx, kernels::source("probe")?, "")?;
        let copy = crate::driver::load_function(&module, "symm_probe_copy")?;
        Ok(BandwidthProbe {
            copy,
            blocks: blocks.max(1),
        })
    }

    /// Enqueues an SM copy of `bytes` (a multiple of 16) from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// NOTE [raw-addresses]: both ranges of `bytes` are mapped on this device (own or a peer's
    /// symmetric memory) and stay mapped, `dst` unused by others, until the copy has run.
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn sm_copy(&self, stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if !bytes.is_multiple_of(16) || !dst.is_multiple_of(16) || !src.is_multiple_of(16) {
            return Err(Error::InvalidArgument(format!(
                "the copy probe moves 16-byte vectors: dst {dst:#x}, src {src:#x}, {bytes} bytes"
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (Self::THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = copy_args(dst, src, bytes);
        launch(stream, &self.copy, cfg, &args)
    }

    /// Enqueues a copy-engine copy of `bytes` from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// As [`Self::sm_copy`].
    #[allow(unsafe_code)] // the contract is declared here; the body is safe code
    pub unsafe fn ce_copy(&self, stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
        crate::driver::mem::dtod_async(stream, dst, src, bytes)
    }
}

/// The copy kernel's arguments (mirrors `symm_probe_copy`).
fn copy_args(dst: u64, src: u64, bytes: usize) -> [KernelArg; 3] {
    [
        KernelArg::U64(dst),
        KernelArg::U64(src),
        KernelArg::U64((bytes / 16) as u64),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ptx_param_sizes;
    use symm_core::coll::arg::arg_bytes;

    #[test]
    fn probe_arguments_match_the_kernels() {
        if let Err(e) = kernels::nvrtc_available() {
            println!("SKIP probe_arguments_match_the_kernels: {e}");
            return;
        }
        let ptx = kernels::compile(kernels::source("probe").unwrap(), "", "sm_90").unwrap();
        for p in Probe::ALL {
            let (name, _, args) = probe_args(p, 1, 2, 0, 1, 3);
            let want = ptx_param_sizes(&ptx, name).unwrap_or_else(|| panic!("{name} not in the PTX"));
            let got: Vec<usize> = args.iter().map(arg_bytes).collect();
            assert_eq!(got, want, "{name}");
        }
        let want = ptx_param_sizes(&ptx, "symm_probe_copy").expect("symm_probe_copy not in the PTX");
        let got: Vec<usize> = copy_args(16, 32, 64).iter().map(arg_bytes).collect();
        assert_eq!(got, want, "symm_probe_copy");
        let names: std::collections::HashSet<_> = Probe::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), Probe::ALL.len());
    }
}
