//! Every environment variable symm-core reads, in one table ([`KNOBS`]), read once per process.
//! Nothing else in the crate reads the environment, and nothing writes it (a test checks).
//! [`Knob`] and [`files_reading_env`] come from symm-store, the lowest crate.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::OnceLock;

pub use symm_store::knobs::{files_reading_env, Knob};

pub const ALLOW_OVERLAPPING_DEVICES: &str = "SYMM_ALLOW_OVERLAPPING_DEVICES";
pub const JOB_ID: &str = "SYMM_JOB_ID";
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
pub const FAULT: &str = "SYMM_FAULT";
pub const RANK: &str = "RANK";

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
];

/// The value of knob `name` (one of [`KNOBS`]) as the process started with it: every knob is
/// read once, together, at the first call. A name outside the table reads as unset.
pub(crate) fn get(name: &str) -> Option<&'static str> {
    static VALUES: OnceLock<HashMap<&'static str, String>> = OnceLock::new();
    VALUES
        .get_or_init(|| {
            KNOBS
                .iter()
                .filter_map(|k| std::env::var(k.name).ok().map(|v| (k.name, v)))
                .collect()
        })
        .get(name)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn names_are_unique_and_described() {
        for (i, k) in KNOBS.iter().enumerate() {
            assert!(KNOBS[..i].iter().all(|o| o.name != k.name), "{} twice", k.name);
            assert!(!k.meaning.is_empty() && !k.default.is_empty(), "{}", k.name);
        }
    }

    /// Nothing outside this module reads (or writes) the environment.
    #[test]
    fn only_this_module_touches_the_environment() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        if !src.is_dir() {
            println!(
                "SKIP only_this_module_touches_the_environment: no sources at {}",
                src.display()
            );
            return;
        }
        let offenders = files_reading_env(&src).unwrap();
        assert!(offenders.is_empty(), "environment read outside knobs.rs: {offenders:?}");
    }

    /// docs/architecture.md lists every knob of symm-core.
    #[test]
    fn the_docs_list_every_knob() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
        let Ok(doc) = std::fs::read_to_string(&path) else {
            println!("SKIP the_docs_list_every_knob: no {}", path.display());
            return;
        };
        for k in KNOBS {
            assert!(
                doc.contains(&format!("`{}`", k.name)),
                "docs/architecture.md does not list {}",
                k.name
            );
        }
    }
}
