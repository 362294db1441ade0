//! Every environment variable symm-store reads, in one table ([`KNOBS`]), read once per process.
//! Nothing else in the crate reads the environment, and nothing writes it (a test checks).
//! [`Knob`] is the table row every crate's knobs module uses (symm-store is the lowest crate);
//! [`files_reading_env`] is the scan their tests share.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One environment switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knob {
    pub name: &'static str,
    pub meaning: &'static str,
    pub default: &'static str,
    /// Only for measurements and comparisons (not for production use).
    pub measurement: bool,
}

pub const MASTER_ADDR: &str = "MASTER_ADDR";
pub const MASTER_PORT: &str = "MASTER_PORT";
pub const RANK: &str = "RANK";
pub const WORLD_SIZE: &str = "WORLD_SIZE";
pub const AGENT_STORE: &str = "TORCHELASTIC_USE_AGENT_STORE";
pub const BIND: &str = "SYMM_STORE_BIND";
pub const DEBUG: &str = "SYMM_STORE_DEBUG";
pub const BENCH_PYTHON: &str = "SYMM_STORE_PYTHON";
pub const BENCH_TORCH_SCRIPT: &str = "SYMM_STORE_TORCH_BENCH";

/// The table: name, meaning, default, measurement switch or not.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: MASTER_ADDR,
        meaning: "`TcpStore::from_env`: the store server's host (torchrun's env:// convention)",
        default: "none (from_env fails)",
        measurement: false,
    },
    Knob {
        name: MASTER_PORT,
        meaning: "`TcpStore::from_env`: the store server's port",
        default: "none (from_env fails)",
        measurement: false,
    },
    Knob {
        name: RANK,
        meaning: "`TcpStore::from_env`: this process's rank (rank 0 hosts the server)",
        default: "none (from_env fails)",
        measurement: false,
    },
    Knob {
        name: WORLD_SIZE,
        meaning: "`TcpStore::from_env`: the number of ranks",
        default: "none (from_env fails)",
        measurement: false,
    },
    Knob {
        name: AGENT_STORE,
        meaning: "`True`: torchrun's agent hosts the store, so rank 0 connects instead of serving",
        default: "off",
        measurement: false,
    },
    Knob {
        name: BIND,
        meaning: "`TcpStore::from_env`: the address (or IP, with MASTER_PORT) rank 0's server binds",
        default: "MASTER_ADDR's address",
        measurement: false,
    },
    Knob {
        name: DEBUG,
        meaning: "set: the server logs every dropped client and why to stderr",
        default: "off",
        measurement: true,
    },
    Knob {
        name: BENCH_PYTHON,
        meaning: "symm-store-bench: the Python that runs PyTorch's side",
        default: "python3",
        measurement: true,
    },
    Knob {
        name: BENCH_TORCH_SCRIPT,
        meaning: "symm-store-bench: the PyTorch benchmark script",
        default: "symm-store/bench/torch_store_bench.py",
        measurement: true,
    },
];

/// The value of knob `name` (one of [`KNOBS`]) as the process started with it: every knob is
/// read once, together, at the first call. A name outside the table reads as unset.
pub fn get(name: &str) -> Option<&'static str> {
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

/// The `.rs` files under `src` (recursively) other than `knobs.rs` whose code reads or writes
/// the environment (`env::var`, `env::set_var`, `env::remove_var`; comments ignored), as
/// `path:line`. The knobs modules' tests use it to keep the environment in one place per crate.
#[doc(hidden)]
pub fn files_reading_env(src: &Path) -> std::io::Result<Vec<String>> {
    let mut stack: Vec<PathBuf> = vec![src.to_path_buf()];
    let mut offenders = Vec::new();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("knobs.rs") {
                let text = std::fs::read_to_string(&p)?;
                for (n, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or("");
                    if ["env::var", "env::set_var", "env::remove_var"]
                        .iter()
                        .any(|w| code.contains(w))
                    {
                        offenders.push(format!("{}:{}", p.display(), n + 1));
                    }
                }
            }
        }
    }
    Ok(offenders)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_described() {
        for (i, k) in KNOBS.iter().enumerate() {
            assert!(KNOBS[..i].iter().all(|o| o.name != k.name), "{} twice", k.name);
            assert!(!k.meaning.is_empty() && !k.default.is_empty(), "{}", k.name);
        }
    }

    /// Nothing outside this module reads (or writes) the environment (the binaries read their
    /// command lines with `env::args`, which the scan does not count).
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

    /// docs/store.md lists every knob.
    #[test]
    fn the_docs_list_every_knob() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/store.md");
        let Ok(doc) = std::fs::read_to_string(&path) else {
            println!("SKIP the_docs_list_every_knob: no {}", path.display());
            return;
        };
        for k in KNOBS {
            assert!(
                doc.contains(&format!("`{}`", k.name)),
                "docs/store.md does not list {}",
                k.name
            );
        }
    }
}
