//! Every environment variable the symm-testkit library reads, in one table ([`KNOBS`]), read
//! once per process. Nothing else in the library reads the environment, and nothing writes it
//! (a test checks; the launcher sets its children's environment on their command, and `symmrun`
//! under `src/bin` is a program, not library code).

pub use symm_core::knobs::{Knob, Table};

pub const REQUIRE_GPUS: &str = "SYMM_REQUIRE_GPUS";
pub const CHILD: &str = "SYMM_TESTKIT_CHILD";
pub const ISOLATED: &str = "SYMM_TESTKIT_ISOLATED";
pub const LAUNCH_ID: &str = "SYMM_TESTKIT_LAUNCH_ID";
pub const STORE_TIMEOUT_MS: &str = "SYMM_TESTKIT_STORE_TIMEOUT_MS";
pub const RANK: &str = "RANK";
pub const WORLD_SIZE: &str = "WORLD_SIZE";
pub const LOCAL_RANK: &str = "LOCAL_RANK";
pub const MASTER_ADDR: &str = "MASTER_ADDR";
pub const MASTER_PORT: &str = "MASTER_PORT";

/// The table: name, meaning, default, measurement switch or not.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: REQUIRE_GPUS,
        meaning: "how many GPUs the run requires tests to use: a test gated on at most that many fails \
                  instead of skipping",
        default: "0 (every gated test may skip)",
        measurement: false,
    },
    Knob {
        name: CHILD,
        meaning: "set by `run_processes` on its children: the test name they re-run",
        default: "unset (not a child)",
        measurement: false,
    },
    Knob {
        name: ISOLATED,
        meaning: "set by `run_isolated` on its single child: the test name it re-runs",
        default: "unset",
        measurement: false,
    },
    Knob {
        name: LAUNCH_ID,
        meaning: "the launch id of a child (`RankCtx::launch_id`)",
        default: "0",
        measurement: false,
    },
    Knob {
        name: STORE_TIMEOUT_MS,
        meaning: "a child's store timeout, milliseconds",
        default: "60000",
        measurement: false,
    },
    Knob {
        name: RANK,
        meaning: "a child's rank (torchrun's name)",
        default: "none (required in a child)",
        measurement: false,
    },
    Knob {
        name: WORLD_SIZE,
        meaning: "a child's world size",
        default: "none (required in a child)",
        measurement: false,
    },
    Knob {
        name: LOCAL_RANK,
        meaning: "a child's rank on its host (its device)",
        default: "RANK",
        measurement: false,
    },
    Knob {
        name: MASTER_ADDR,
        meaning: "the host of the launcher's TcpStore, for a child",
        default: "none (required in a child)",
        measurement: false,
    },
    Knob {
        name: MASTER_PORT,
        meaning: "the port of the launcher's TcpStore, for a child",
        default: "none (required in a child)",
        measurement: false,
    },
];

// `symmrun` under `src/bin` is left out of the scan (a program, not library code).
symm_store::knob_table!(pub(crate) KNOBS, "../docs/testkit.md", true);
