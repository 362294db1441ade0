//! Every environment variable symm-core reads, in one table ([`KNOBS`]), read once per process.
//! Nothing else in the crate reads the environment, and nothing writes it (a test checks).
//! [`Knob`] and [`files_reading_env`] come from symm-store, the lowest crate.

#![forbid(unsafe_code)]

pub use symm_store::knobs::{check_table, files_reading_env, Knob, Table};

pub const ALLOW_OVERLAPPING_DEVICES: &str = "SYMM_ALLOW_OVERLAPPING_DEVICES";
pub const JOB_ID: &str = "SYMM_JOB_ID";
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
pub const LAUNCH_ID: &str = "SYMM_LAUNCH_ID";
pub const FAULT: &str = "SYMM_FAULT";
pub const RANK: &str = "RANK";
pub const KERNEL_CACHE: &str = "SYMM_KERNEL_CACHE";
pub const HOME: &str = "HOME";

/// The table: name, meaning, default, measurement switch or not.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: ALLOW_OVERLAPPING_DEVICES,
        meaning: "`1`: groups default to `GroupOptions::shared_devices` (ranks may share a GPU, NOTE [shared-device])",
        default: "off",
        measurement: false,
    },
    Knob {
        name: JOB_ID,
        meaning: "the job's identity, kept in rendezvous records so two jobs on one store do not meet",
        default: "TORCHELASTIC_RUN_ID, else none",
        measurement: false,
    },
    Knob {
        name: TORCHELASTIC_RUN_ID,
        meaning: "torchrun's run id, the job's identity when SYMM_JOB_ID is unset",
        default: "none",
        measurement: false,
    },
    Knob {
        name: LAUNCH_ID,
        meaning: "which launch a rank process belongs to (symmrun sets a fresh one per launch): ranks of \
                  one group generation from different launches fail with Mismatch instead of pairing up",
        default: "none",
        measurement: false,
    },
    Knob {
        name: FAULT,
        meaning: "`kill:<rank>:<point>[,...]`: the process of that RANK exits with status 137 at that fault \
                  point (only with the `fault-injection` feature, which symm-testkit turns on)",
        default: "none",
        measurement: true,
    },
    Knob {
        name: RANK,
        meaning: "this process's rank, as torchrun sets it (which `SYMM_FAULT` entries apply)",
        default: "none",
        measurement: false,
    },
    Knob {
        name: KERNEL_CACHE,
        meaning: "folder of the compiled-kernel disk cache of every backend (`kernel_cache`); `off`, `0` or \
                  empty disables it",
        default: "`$HOME/.cache/symm/kernels`",
        measurement: false,
    },
    Knob {
        name: HOME,
        meaning: "the user's home, where the kernel cache goes by default",
        default: "none (no disk cache)",
        measurement: false,
    },
];

symm_store::knob_table!(pub(crate) KNOBS, "../docs/architecture.md", false);
