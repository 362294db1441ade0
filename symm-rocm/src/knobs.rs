//! Every environment variable symm-rocm reads, in one table ([`KNOBS`]), read once per process.
//! Nothing else in the crate reads the environment, and nothing writes it (a test checks).

pub use symm_core::knobs::{Knob, Table};

pub const ROCM_PATH: &str = "ROCM_PATH";
pub const WALL_CLOCK_HZ: &str = "SYMM_ROCM_WALL_CLOCK_HZ";

/// The table: name, meaning, default, measurement switch or not.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: ROCM_PATH,
        meaning: "the ROCm install whose `lib/` holds libhiprtc, libamdhip64 and librocm_smi64 (tried before \
                  the loader's own search)",
        default: "unset (the loader's search path)",
        measurement: false,
    },
    Knob {
        name: WALL_CLOCK_HZ,
        meaning: "the device wall clock's rate the kernels' deadlines count in (`s_memrealtime`)",
        default: "100000000 (100 MHz, CDNA)",
        measurement: false,
    },
];

static TABLE: Table = Table::new(KNOBS);

/// The value of knob `name` (one of [`KNOBS`]) as the process had it at the first call, read once.
pub(crate) fn get(name: &str) -> Option<&'static str> {
    TABLE.get(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names unique and described, nothing else in the crate reads the environment,
    /// docs/user-guide.md lists all.
    #[test]
    fn the_table_is_the_only_reader_and_is_documented() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        symm_core::knobs::check_table(KNOBS, dir, "../docs/user-guide.md", false).unwrap();
    }
}
