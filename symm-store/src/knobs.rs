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

/// A crate's knob table with its values, read from the environment once, together, at the first
/// lookup: each crate's `knobs.rs` holds one in a `static`.
#[derive(Debug)]
pub struct Table {
    knobs: &'static [Knob],
    values: OnceLock<HashMap<&'static str, String>>,
}

impl Table {
    pub const fn new(knobs: &'static [Knob]) -> Table {
        Table {
            knobs,
            values: OnceLock::new(),
        }
    }

    /// The value of knob `name` as the process had it at the first lookup; a name outside the
    /// table reads as unset.
    pub fn get(&'static self, name: &str) -> Option<&'static str> {
        self.values
            .get_or_init(|| {
                self.knobs
                    .iter()
                    .filter_map(|k| std::env::var(k.name).ok().map(|v| (k.name, v)))
                    .collect()
            })
            .get(name)
            .map(String::as_str)
    }
}

/// A crate's knobs module, written once: from the crate's `KNOBS` (a `&[Knob]` const in the
/// calling module) it makes the module's `TABLE` (read once, together), `get(name)`, and the test
/// that checks the table (names unique and described, no other file of the crate reads the
/// environment, `doc` lists every name; `skip_bin`: leave `src/bin` out of the scan).
///
/// ```text
/// pub const KNOBS: &[Knob] = &[...];
/// symm_store::knob_table!(pub(crate) KNOBS, "../docs/store.md", false); // `get`'s visibility first
/// ```
#[macro_export]
macro_rules! knob_table {
    ($vis:vis $knobs:ident, $doc:literal, $skip_bin:literal) => {
        static TABLE: $crate::knobs::Table = $crate::knobs::Table::new($knobs);

        /// The value of knob `name` (one of the module's `KNOBS`) as the process had it at the
        /// first lookup, read once.
        #[allow(dead_code)]
        $vis fn get(name: &str) -> Option<&'static str> {
            TABLE.get(name)
        }

        #[cfg(test)]
        mod knob_table_check {
            /// Names unique and described, no other file of the crate reads the environment, the
            /// doc page lists all.
            #[test]
            fn the_table_is_the_only_reader_and_is_documented() {
                let dir = ::std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
                $crate::knobs::check_table(super::$knobs, dir, $doc, $skip_bin).unwrap();
            }
        }
    };
}

crate::knob_table!(pub KNOBS, "../docs/store.md", false);

/// The checks every crate's knobs module runs in its tests: names unique and described; no `.rs`
/// file under `crate_dir/src` but `knobs.rs` reads or writes the environment (with `skip_bin`,
/// the programs under `src/bin` are left out); `doc` (relative to `crate_dir`) lists every name
/// in backquotes. Missing sources or doc (a test binary moved to a GPU machine) skip those checks
/// and say so on stdout.
#[doc(hidden)]
pub fn check_table(knobs: &[Knob], crate_dir: &Path, doc: &str, skip_bin: bool) -> Result<(), String> {
    for (i, k) in knobs.iter().enumerate() {
        if knobs[..i].iter().any(|o| o.name == k.name) {
            return Err(format!("{} twice", k.name));
        }
        if k.meaning.is_empty() || k.default.is_empty() {
            return Err(format!("{}: no meaning or default", k.name));
        }
    }
    let src = crate_dir.join("src");
    if src.is_dir() {
        let bin = src.join("bin");
        let offenders: Vec<String> = files_reading_env(&src)
            .map_err(|e| format!("scanning {}: {e}", src.display()))?
            .into_iter()
            .filter(|o| !(skip_bin && Path::new(o.rsplit_once(':').map_or(o.as_str(), |(p, _)| p)).starts_with(&bin)))
            .collect();
        if !offenders.is_empty() {
            return Err(format!("environment read outside knobs.rs: {offenders:?}"));
        }
    } else {
        println!("SKIP the environment scan: no sources at {}", src.display());
    }
    let doc_path = crate_dir.join(doc);
    match std::fs::read_to_string(&doc_path) {
        Ok(text) => {
            if let Some(k) = knobs.iter().find(|k| !text.contains(&format!("`{}`", k.name))) {
                return Err(format!("{} does not list {}", doc_path.display(), k.name));
            }
        }
        Err(_) => println!("SKIP the docs check: no {}", doc_path.display()),
    }
    Ok(())
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

// The table's own check: `knob_table!` above (the binaries read their command lines with
// `env::args`, which the scan does not count).
