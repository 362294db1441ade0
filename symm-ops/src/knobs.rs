//! Every environment variable the symm-ops library reads, in one table ([`KNOBS`]), read once
//! per process. Nothing else in the library reads the environment, and nothing writes it (a
//! test checks; the programs under `src/bin` are not library code).

pub use symm_core::knobs::Knob;

pub const NCCL_NVLS_ENABLE: &str = "NCCL_NVLS_ENABLE";

/// The table: name, meaning, default, measurement switch or not.
pub const KNOBS: &[Knob] = &[Knob {
    name: NCCL_NVLS_ENABLE,
    meaning: "NCCL's own switch; symm-ops reads it, never writes it: the NCCL fallback joins only when it is \
              `0` at start (NVLink multicast is never used), otherwise it is Unavailable and the kernels run \
              without it",
    default: "unset (no NCCL fallback)",
    measurement: false,
}];

// The programs under `src/bin` are left out of the scan (not library code).
symm_store::knob_table!(pub(crate) KNOBS, "../docs/user-guide.md", true);
