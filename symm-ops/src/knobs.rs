//! Every environment variable the symm-ops library reads, in one table ([`KNOBS`]), read once
//! per process. Nothing else in the library reads the environment, and nothing writes it (a
//! test checks; the programs under `src/bin` are not library code).

pub use symm_core::knobs::{Knob, Table};

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

static TABLE: Table = Table::new(KNOBS);

/// The value of knob `name` (one of [`KNOBS`]) as the process had it at the first call, read once.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn get(name: &str) -> Option<&'static str> {
    TABLE.get(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names unique and described, nothing else in the library reads the environment (the
    /// programs under `src/bin` are left out), docs/user-guide.md lists all.
    #[test]
    fn the_table_is_the_only_reader_and_is_documented() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        symm_core::knobs::check_table(KNOBS, dir, "../docs/user-guide.md", true).unwrap();
    }
}
