//! Every environment variable the symm-ops library reads, in one table ([`KNOBS`]), read once
//! per process. Nothing else in the library reads the environment, and nothing writes it (a
//! test checks; the programs under `src/bin` are not library code).

use std::collections::HashMap;
use std::sync::OnceLock;

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

/// The value of knob `name` (one of [`KNOBS`]) as the process had it at the first call (every
/// knob is read then, once). A name outside the table reads as unset.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
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

    /// Nothing else in the library reads (or writes) the environment.
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
        let bin = format!(
            "{}{}bin{}",
            src.display(),
            std::path::MAIN_SEPARATOR,
            std::path::MAIN_SEPARATOR
        );
        let offenders: Vec<String> = symm_core::knobs::files_reading_env(&src)
            .unwrap()
            .into_iter()
            .filter(|o| !o.starts_with(&bin))
            .collect();
        assert!(offenders.is_empty(), "environment read outside knobs.rs: {offenders:?}");
    }

    /// docs/user-guide.md lists every knob.
    #[test]
    fn the_docs_list_every_knob() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/user-guide.md");
        let Ok(doc) = std::fs::read_to_string(&path) else {
            println!("SKIP the_docs_list_every_knob: no {}", path.display());
            return;
        };
        for k in KNOBS {
            assert!(
                doc.contains(&format!("`{}`", k.name)),
                "docs/user-guide.md does not list {}",
                k.name
            );
        }
    }
}
