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
        meaning: "the device wall clock's rate in Hz (`wall_clock64`, `s_memrealtime`), compiled into every \
                  kernel as `SYMM_WALL_CLOCK_KHZ` to turn its ticks into the nanoseconds of the deadlines; \
                  a positive multiple of 1000 whose kHz value divides 1 GHz, else loading the kernels fails",
        default: "unset: 100000000 (100 MHz, CDNA; `kernels/vendor.hip.h`'s default)",
        measurement: false,
    },
];

symm_store::knob_table!(pub(crate) KNOBS, "../docs/user-guide.md", false);
