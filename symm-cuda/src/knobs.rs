//! Every environment variable symm-cuda reads, in one table ([`KNOBS`]), each read once per
//! process. Nothing else in the crate reads the environment (a test checks), and nothing in the
//! crate writes it.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

pub use symm_core::knobs::Knob;

pub const HW_QUEUES: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
pub const PDL: &str = "SYMM_PDL";
pub const REQUIRE_NVRTC: &str = "SYMM_REQUIRE_NVRTC";
pub const LAUNCH_MODE: &str = "SYMM_LAUNCH_MODE";
pub const LAUNCH_VIA_CUDARC: &str = "SYMM_LAUNCH_VIA_CUDARC";
pub const LAMPORT_LAG: &str = "SYMM_LAMPORT_LAG";
pub const LAMPORT_ACQREL_ARRIVE: &str = "SYMM_LAMPORT_ACQREL_ARRIVE";
pub const LAMPORT_GENERIC: &str = "SYMM_LAMPORT_GENERIC";
pub const EPI_SPLIT: &str = "SYMM_EPI_SPLIT";
pub const EPI_CLUSTER: &str = "SYMM_EPI_CLUSTER";
pub const EPI_SPREAD: &str = "SYMM_EPI_SPREAD";
pub const EPI_SLOTS: &str = "SYMM_EPI_SLOTS";
pub const EPI_HANDOFF: &str = "SYMM_EPI_HANDOFF";
pub const HOST_ABORT_EVERY_THREAD: &str = "SYMM_HOST_ABORT_EVERY_THREAD";
pub const RING_UNROLL1: &str = "SYMM_RING_UNROLL1";
pub const TRACE: &str = "SYMM_TRACE";

/// The table: name, meaning, default, measurement switch or not.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: HW_QUEUES,
        meaning: "hardware work queues per context, as the CUDA driver reads it at start (read, never set: \
                  ranks sharing a GPU need 32, NOTE [co-residency])",
        default: "8 (the driver's)",
        measurement: false,
    },
    Knob {
        name: PDL,
        meaning: "`0`: the collective kernels do not use programmatic dependent launch by default \
                  (CollectivesConfig::pdl; on since the 2 x H200 measurements of bench-notes round 14)",
        default: "on",
        measurement: false,
    },
    Knob {
        name: REQUIRE_NVRTC,
        meaning: "`1`: the NVRTC tests fail instead of skipping when libnvrtc is missing",
        default: "skip",
        measurement: false,
    },
    Knob {
        name: LAUNCH_MODE,
        meaning: "how kernels are launched: `packed` (one argument buffer), `params` (one parameter per \
                  argument) or `cudarc` (cudarc's launch builder)",
        default: "packed",
        measurement: true,
    },
    Knob {
        name: LAUNCH_VIA_CUDARC,
        meaning: "`1`: the older spelling of SYMM_LAUNCH_MODE=cudarc",
        default: "off",
        measurement: true,
    },
    Knob {
        name: LAMPORT_LAG,
        meaning: "the Lamport kernel's software-pipeline lag in vectors per thread, 1-255 (255: receive \
                  only after every push)",
        default: "the kernel's COLL_LAM_LAG (2)",
        measurement: true,
    },
    Knob {
        name: LAMPORT_ACQREL_ARRIVE,
        meaning: "`1`: the Lamport kernel counts its blocks with atom.acq_rel.gpu instead of a relaxed atomic",
        default: "off",
        measurement: true,
    },
    Knob {
        name: TRACE,
        meaning: "`1`: the collectives are compiled with NOTE [device-trace]: every Lamport and epilogue launch \
                  stamps its phases into a per-context buffer that `symm_cuda::trace::take` reads (a diagnostic \
                  build)",
        default: "off",
        measurement: true,
    },
    Knob {
        name: LAMPORT_GENERIC,
        meaning: "`1`: the generic Lamport, pull and fused-epilogue entries run at every world size instead of the \
                  ones specialised for two ranks (Lamport, pull, fused epilogue) and for 3-8 ranks (Lamport, fused \
                  epilogue)",
        default: "off",
        measurement: true,
    },
    Knob {
        name: EPI_SPLIT,
        meaning: "`1`: the fused all-reduce epilogue kernel splits few rows across blocks instead of taking \
                  whole rows per block (NOTE [fused-epilogue], \"split rows\"; slower on 2 x H200, bench-notes \
                  round 14)",
        default: "off",
        measurement: true,
    },
    Knob {
        name: EPI_CLUSTER,
        meaning: "`1`: the fused all-reduce epilogue kernel runs cluster rows where they fit (a row's block \
                  spread over a thread-block cluster, NOTE [fused-epilogue]; sm_90 and newer)",
        default: "off",
        measurement: true,
    },
    Knob {
        name: EPI_SPREAD,
        meaning: "`1`: the fused all-reduce epilogue kernel pushes each row from several blocks, the first \
                  of them receiving it whole (NOTE [fused-epilogue], \"spread pushes\")",
        default: "off",
        measurement: true,
    },
    Knob {
        name: EPI_SLOTS,
        meaning: "`1` (or a block size: a multiple of 32 up to 512): the fused all-reduce epilogue kernel runs \
                  slot rows where they fit (a row's block cut into blocks of about 128 threads, or the size \
                  given, that exchange their warps' sums through tagged STATE slots; NOTE [fused-epilogue])",
        default: "off",
        measurement: true,
    },
    Knob {
        name: EPI_HANDOFF,
        meaning: "`0`: the fused all-reduce epilogue never runs as the handoff pair (the Lamport all-reduce \
                  into a local buffer, then the epilogue kernel overlapping it through PDL and taking the sums \
                  as Lamport data; NOTE [fused-epilogue], \"handoff\"), and `Auto` fuses only where the one \
                  fused kernel is chosen (two ranks); on by default where PDL is (bench-notes round 23)",
        default: "on (with PDL)",
        measurement: false,
    },
    Knob {
        name: HOST_ABORT_EVERY_THREAD,
        meaning: "`1`: every polling thread of the Lamport kernel reads the pinned host abort word every 1024 \
                  polls from the start of a wait, the order before NOTE [host-abort-poll] (one lane per warp, \
                  after 8192 polls)",
        default: "off",
        measurement: true,
    },
    Knob {
        name: RING_UNROLL1,
        meaning: "`1`: the ring kernel's copies keep one vector in flight per thread instead of four, the \
                  order before NOTE [ring-unroll]",
        default: "off",
        measurement: true,
    },
];

// The knobs' values, read once, together (symm-store's `Table`, as every crate's knobs).
symm_store::knob_table!(KNOBS, "../docs/cuda.md", false);

fn var(name: &str) -> Option<String> {
    get(name).map(str::to_string)
}

fn flag(name: &str) -> bool {
    var(name).is_some_and(|v| v == "1")
}

/// A setting that is on unless the variable says `0`.
fn on_unless_0(name: &str) -> bool {
    var(name).is_none_or(|v| v.trim() != "0")
}

/// [`HW_QUEUES`]: the hardware work queues this process's contexts have, as the driver reads
/// the variable when CUDA starts (unset or unreadable: its default, 8; clamped to 1-32 as the
/// driver does). Ranks sharing a GPU need [`symm_core::connectivity::SHARED_DEVICE_QUEUES`]
/// (NOTE [co-residency]).
pub fn hw_queues() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        var(HW_QUEUES)
            .and_then(|v| v.trim().parse::<u32>().ok())
            .map_or(8, |q| q.clamp(1, 32))
    })
}

/// [`PDL`]: on unless set to `0`.
pub fn pdl() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| on_unless_0(PDL))
}

/// [`REQUIRE_NVRTC`].
pub fn require_nvrtc() -> bool {
    flag(REQUIRE_NVRTC)
}

/// How kernels are launched ([`LAUNCH_MODE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchMode {
    /// One packed argument buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER`), the default.
    Packed,
    /// One kernel parameter per argument.
    Params,
    /// cudarc's launch builder.
    Cudarc,
}

/// [`LAUNCH_MODE`] / [`LAUNCH_VIA_CUDARC`] (the older switch, still selects `cudarc`).
pub fn launch_mode() -> LaunchMode {
    static V: OnceLock<LaunchMode> = OnceLock::new();
    *V.get_or_init(|| {
        if flag(LAUNCH_VIA_CUDARC) {
            return LaunchMode::Cudarc;
        }
        match var(LAUNCH_MODE).as_deref() {
            Some("params") => LaunchMode::Params,
            Some("cudarc") => LaunchMode::Cudarc,
            _ => LaunchMode::Packed,
        }
    })
}

/// [`LAMPORT_LAG`]: 1-255, or 0 for the kernel's default.
pub fn lamport_lag() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        var(LAMPORT_LAG)
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&v| (1..=255).contains(&v))
            .unwrap_or(0)
    })
}

/// [`LAMPORT_ACQREL_ARRIVE`].
pub fn lamport_acq_rel_arrive() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(LAMPORT_ACQREL_ARRIVE))
}

/// [`LAMPORT_GENERIC`].
pub fn lamport_generic() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(LAMPORT_GENERIC))
}

/// [`TRACE`].
pub fn trace() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(TRACE))
}

/// [`HOST_ABORT_EVERY_THREAD`].
pub fn host_abort_every_thread() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(HOST_ABORT_EVERY_THREAD))
}

/// [`RING_UNROLL1`].
pub fn ring_unroll1() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(RING_UNROLL1))
}

/// The kernels' diagnostic switches as symm-core's launch plans take them
/// ([`LAMPORT_ACQREL_ARRIVE`], [`HOST_ABORT_EVERY_THREAD`], [`LAMPORT_LAG`], [`RING_UNROLL1`],
/// [`LAMPORT_GENERIC`], [`EPI_SPLIT`], [`EPI_CLUSTER`], [`EPI_SPREAD`], [`EPI_SLOTS`], [`EPI_HANDOFF`]).
pub fn switches() -> symm_core::coll::launch::Switches {
    use symm_core::coll::args::{LAMPORT_ACQREL_ARRIVE as ACQREL, LAMPORT_HOST_EVERY_THREAD, LAMPORT_LAG_SHIFT};
    let mut lamport_bits = lamport_lag() << LAMPORT_LAG_SHIFT;
    if lamport_acq_rel_arrive() {
        lamport_bits |= ACQREL;
    }
    if host_abort_every_thread() {
        lamport_bits |= LAMPORT_HOST_EVERY_THREAD;
    }
    symm_core::coll::launch::Switches {
        lamport_bits,
        ring_flags: if ring_unroll1() {
            symm_core::coll::args::RING_UNROLL1
        } else {
            0
        },
        generic_entries: lamport_generic(),
        epi_split: epi_split(),
        epi_cluster: epi_cluster(),
        epi_spread: epi_spread(),
        epi_slots: epi_slots(),
        epi_handoff: epi_handoff(),
    }
}

/// [`EPI_HANDOFF`]: on unless `0`.
pub fn epi_handoff() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| on_unless_0(EPI_HANDOFF))
}

/// [`EPI_SLOTS`]: the threads a slot-rows block asks for, 0 off (`1`: 128).
pub fn epi_slots() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| match var(EPI_SLOTS).and_then(|v| v.trim().parse::<u32>().ok()) {
        Some(1) => 128,
        Some(t) if t % 32 == 0 && (32..=512).contains(&t) => t,
        _ => 0,
    })
}

/// [`EPI_SPREAD`].
pub fn epi_spread() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(EPI_SPREAD))
}

/// [`EPI_CLUSTER`].
pub fn epi_cluster() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(EPI_CLUSTER))
}

/// [`EPI_SPLIT`].
pub fn epi_split() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flag(EPI_SPLIT))
}
