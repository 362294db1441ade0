//! `cargo xtask embed [--update-locks]`: the programs outside the workspace that embed symm-ops
//! as an engine would (#16, #38), each its own workspace with a committed lock, built with
//! `--locked` (CI never resolves afresh):
//!
//! - `xtask/embed-check`: cudarc with CUDA 12.8 bindings beside symm-ops (`default-features =
//!   false, features = ["cuda"]`); run, and run again with `SYMM_FAULT` naming a fault point it
//!   calls: it must exit 0 (a default build reads no `SYMM_FAULT`; with symm-core's
//!   `fault-injection` compiled in it would exit 137);
//! - `xtask/embed-candle`: candle's cudarc line (`dynamic-linking`), built as a library;
//! - `xtask/embed-core`: symm-core and symm-cuda alone (no symm-ops): symmetric memory and a
//!   one-shot all-reduce through symm-cuda's safe typed entries; built and run (without a GPU it
//!   says so and exits 0; on GPUs it checks the sums against float64);
//! - docs/embedding.md itself: its ```toml block (the `[dependencies]`) and its ```rust block
//!   (the whole program) become a fresh crate under `target/embed-doc/crate/` (the page's
//!   `version = "0.1"` symm crates patched to this checkout), locked by
//!   `xtask/embed-doc/Cargo.lock`, and run (without a GPU it takes its host path), so the
//!   page cannot rot out of tree.
//!
//! `--update-locks` first re-resolves the four locks with as few changes as cargo makes (what a
//! build without `--locked` does), for when the workspace's or the page's dependencies changed;
//! commit the result.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::{self, Result};

/// The page whose program is built out of tree.
pub const PAGE: &str = "docs/embedding.md";
/// The fault point embed-check calls, and the `SYMM_FAULT` that names it for rank 0.
const FAULT_POINT: &str = "rendezvous.before_send";
/// What embed-check prints once the fault point returned.
const FAULT_PASSED: &str = "fault point rendezvous.before_send passed";
/// The workspace's crates a page may name with a crates.io version (patched to their folders).
const SYMM_CRATES: &[&str] = &[
    "symm-store",
    "symm-core",
    "symm-cuda",
    "symm-rocm",
    "symm-ops",
    "symm-testkit",
];
/// How to refresh the locks, for the errors that find one stale.
const REFRESH: &str = "refresh the locks with `cargo xtask embed --update-locks` and commit them";

pub fn main(args: &[String]) -> Result<()> {
    let mut update = false;
    for a in args {
        match a.as_str() {
            "--update-locks" => update = true,
            other => {
                return Err(format!(
                    "embed: unknown argument {other:?} (usage: cargo xtask embed [--update-locks])"
                ))
            }
        }
    }
    if update {
        update_locks()?;
    }
    programs()
}

fn check_dir() -> PathBuf {
    util::root().join("xtask").join("embed-check")
}
fn candle_dir() -> PathBuf {
    util::root().join("xtask").join("embed-candle")
}
fn core_dir() -> PathBuf {
    util::root().join("xtask").join("embed-core")
}
/// The committed lock of the page's program.
fn doc_lock() -> PathBuf {
    util::root().join("xtask").join("embed-doc").join("Cargo.lock")
}
/// Where the page's program is generated and built.
fn doc_dir() -> PathBuf {
    util::target_dir().join("embed-doc")
}

/// Every program, as CI's build step runs them.
pub fn programs() -> Result<()> {
    embed_check()?;
    embed_candle()?;
    embed_core()?;
    embed_doc()
}

/// xtask/embed-core: symm-core + symm-cuda alone, built and run.
fn embed_core() -> Result<()> {
    let manifest = core_dir().join("Cargo.toml");
    lock_fits(&manifest, &core_dir().join("Cargo.lock"), &[])?;
    util::run(
        util::cargo()
            .args(["run", "--locked", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", util::target_dir().join("embed-core")),
    )
}

/// Fails, saying how to refresh it, when `manifest`'s lock (`lock`, for the message) does not
/// fit its dependencies any more: `cargo metadata --locked`, whose error we recognise.
fn lock_fits(manifest: &Path, lock: &Path, env: &[(&str, std::ffi::OsString)]) -> Result<()> {
    let mut cmd = util::cargo();
    cmd.args(["metadata", "--locked", "--format-version", "1", "--manifest-path"])
        .arg(manifest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    eprintln!("$ {}", util::show(&cmd));
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start `{}`: {e}", util::show(&cmd)))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let lock = lock.strip_prefix(util::root()).unwrap_or(lock);
    if err.contains("--locked") {
        Err(format!(
            "{} no longer fits the dependencies of {} (cargo: {}); {REFRESH}",
            lock.display(),
            manifest.display(),
            err.trim().lines().next().unwrap_or_default()
        ))
    } else {
        Err(format!("`{}` failed: {}\n{}", util::show(&cmd), out.status, err.trim()))
    }
}

/// xtask/embed-check: built, run, and run with `SYMM_FAULT=kill:0:<FAULT_POINT> RANK=0`, which
/// must not kill it.
fn embed_check() -> Result<()> {
    let dir = check_dir();
    let manifest = dir.join("Cargo.toml");
    let target = util::target_dir().join("embed-check");
    lock_fits(&manifest, &dir.join("Cargo.lock"), &[])?;
    util::run(
        util::cargo()
            .args(["build", "--locked", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", &target),
    )?;
    let exe = target.join("debug").join("symm-embed-check");
    let fault = format!("kill:0:{FAULT_POINT}");
    for armed in [false, true] {
        let mut cmd = Command::new(&exe);
        cmd.env_remove("SYMM_FAULT").env_remove("RANK");
        if armed {
            cmd.env("SYMM_FAULT", &fault).env("RANK", "0");
        }
        eprintln!("$ {}", util::show(&cmd));
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        match out.status.code() {
            Some(0) if stdout.contains(FAULT_PASSED) => {}
            Some(0) => {
                return Err(format!(
                    "xtask/embed-check exited 0 without printing {FAULT_PASSED:?}: it no longer calls the fault \
                     point, so CI does not check that SYMM_FAULT is ignored"
                ))
            }
            Some(137) if armed => {
                return Err(format!(
                    "xtask/embed-check exited with status 137 at fault point {FAULT_POINT} under \
                     SYMM_FAULT={fault} RANK=0: symm-ops built with `default-features = false, features = \
                     [\"cuda\"]` has symm-core's `fault-injection` compiled in, so SYMM_FAULT can kill an \
                     engine's process (only symm-testkit may turn that feature on)"
                ))
            }
            _ => return Err(format!("{} failed: {}", util::show(&cmd), out.status)),
        }
    }
    eprintln!("  ok: SYMM_FAULT={fault} RANK=0 did not stop it");
    Ok(())
}

/// xtask/embed-candle: a library, built with a stub `nvcc` first on PATH.
fn embed_candle() -> Result<()> {
    let dir = candle_dir();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![dir.join("nvcc-stub")];
    dirs.extend(std::env::split_paths(&path));
    let path = std::env::join_paths(dirs).map_err(|e| format!("PATH for embed-candle: {e}"))?;
    let manifest = dir.join("Cargo.toml");
    lock_fits(&manifest, &dir.join("Cargo.lock"), &[("PATH", path.clone())])?;
    util::run(
        util::cargo()
            .args(["build", "--locked", "--manifest-path"])
            .arg(&manifest)
            .env("PATH", path)
            .env("CARGO_TARGET_DIR", util::target_dir().join("embed-candle")),
    )
}

/// A fenced code block of a Markdown page: its info string's first word and its lines.
#[derive(Debug)]
struct Block {
    lang: String,
    line: usize,
    text: String,
}

/// The top-level fenced code blocks (```) of `page`.
fn blocks(page: &str) -> Result<Vec<Block>> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, l) in page.lines().enumerate() {
        match (&mut open, l.strip_prefix("```")) {
            (None, Some(info)) => {
                let lang = info.split([',', ' ']).next().unwrap_or_default().trim().to_string();
                open = Some(Block {
                    lang,
                    line: i + 1,
                    text: String::new(),
                });
            }
            (Some(_), Some(rest)) if rest.trim().is_empty() => out.extend(open.take()),
            (Some(b), _) => {
                b.text.push_str(l);
                b.text.push('\n');
            }
            (None, None) => {}
        }
    }
    if let Some(b) = open {
        return Err(format!("{PAGE}:{}: a ``` block that is never closed", b.line));
    }
    Ok(out)
}

/// The one block of `page` whose language is `lang` (`what` names it for the errors).
fn one_block<'a>(all: &'a [Block], langs: &[&str], what: &str) -> Result<&'a Block> {
    let found: Vec<&Block> = all.iter().filter(|b| langs.contains(&b.lang.as_str())).collect();
    match found[..] {
        [b] => Ok(b),
        [] => Err(format!(
            "{PAGE} has no ```{} block ({what}): CI builds the page's program out of tree from it",
            langs[0]
        )),
        _ => Err(format!(
            "{PAGE} has {} ```{} blocks (at lines {}); the out-of-tree check expects one ({what})",
            found.len(),
            langs[0],
            found.iter().map(|b| b.line.to_string()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// A rustdoc block as the program it tests: hidden lines (`# ...`) shown, `##` unescaped.
fn rustdoc_source(block: &str) -> String {
    let mut s = String::new();
    for l in block.lines() {
        let t = l.trim_start();
        let indent = &l[..l.len() - t.len()];
        if t == "#" {
            s.push_str(indent);
        } else if let Some(rest) = t.strip_prefix("##") {
            s.push_str(indent);
            s.push('#');
            s.push_str(rest);
        } else if let Some(rest) = t.strip_prefix("# ") {
            s.push_str(indent);
            s.push_str(rest);
        } else {
            s.push_str(l);
        }
        s.push('\n');
    }
    s
}

/// The names the `[dependencies]` table of `toml` declares.
fn dependency_names(toml: &str) -> Result<Vec<String>> {
    let mut in_deps = false;
    let mut seen_table = false;
    let mut names = Vec::new();
    for l in toml.lines().map(str::trim) {
        if l.starts_with('[') && !l.starts_with("[[") && l.ends_with(']') && !l.contains('=') {
            in_deps = l == "[dependencies]";
            seen_table |= in_deps;
        } else if in_deps && !l.starts_with('#') {
            if let Some((k, _)) = l.split_once('=') {
                let k = k.trim().trim_matches('"');
                if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                    names.push(k.to_string());
                }
            }
        }
    }
    if !seen_table {
        return Err(format!(
            "{PAGE}'s ```toml block has no [dependencies] table (the program's dependencies, which CI builds it with)"
        ));
    }
    Ok(names)
}

/// Writes the page's program as a crate of its own under `target/embed-doc/crate/` (the page's
/// dependencies verbatim, the symm crates patched to this checkout, the committed lock when there
/// is one) and returns its manifest.
fn write_doc_crate() -> Result<PathBuf> {
    let root = util::root();
    let page = std::fs::read_to_string(root.join(PAGE)).map_err(|e| format!("{PAGE}: {e}"))?;
    let all = blocks(&page)?;
    let toml = one_block(&all, &["toml"], "the program's Cargo [dependencies]")?;
    let rust = one_block(&all, &["rust", ""], "the whole program")?;
    let source = rustdoc_source(&rust.text);
    if !source.contains("fn main(") {
        return Err(format!(
            "{PAGE}:{}: the ```rust block has no `fn main`: CI runs it as the whole program",
            rust.line
        ));
    }
    let names = dependency_names(&toml.text)?;
    let mut patch = String::new();
    for n in names.iter().filter(|n| SYMM_CRATES.contains(&n.as_str())) {
        let dir = root.join(n);
        patch.push_str(&format!("{n} = {{ path = {:?} }}\n", dir.display().to_string()));
    }
    let manifest = format!(
        "# Generated by `cargo xtask embed` from {PAGE} (its ```toml block, verbatim); rewritten on every run.\n\
         [package]\nname = \"symm-embed-doc\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         # Its own workspace, as an engine's crate is.\n[workspace]\n\n{}\n\
         # The page's symm crates from this checkout (the page asks crates.io for them).\n\
         [patch.crates-io]\n{patch}",
        toml.text
    );
    let dir = doc_dir().join("crate");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let write = |p: PathBuf, s: &str| std::fs::write(&p, s).map_err(|e| format!("{}: {e}", p.display()));
    write(dir.join("Cargo.toml"), &manifest)?;
    write(src.join("main.rs"), &source)?;
    let lock = dir.join("Cargo.lock");
    if doc_lock().is_file() {
        std::fs::copy(doc_lock(), &lock).map_err(|e| format!("{}: {e}", doc_lock().display()))?;
    } else if lock.exists() {
        std::fs::remove_file(&lock).map_err(|e| format!("{}: {e}", lock.display()))?;
    }
    Ok(dir.join("Cargo.toml"))
}

/// The page's program: generated, its lock checked, built and run with `--locked`.
fn embed_doc() -> Result<()> {
    let manifest = write_doc_crate()?;
    if !doc_lock().is_file() {
        return Err(format!("{} is missing; {REFRESH}", doc_lock().display()));
    }
    lock_fits(&manifest, &doc_lock(), &[])?;
    util::run(
        util::cargo()
            .args(["run", "--locked", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", doc_dir().join("target")),
    )
    .map_err(|e| format!("{PAGE}'s program, built out of tree ({}): {e}", manifest.display()))
}

/// Re-resolves the four locks with cargo's smallest changes (a resolve without `--locked`
/// keeps every locked version that still fits) and copies the page's back to xtask/embed-doc/.
fn update_locks() -> Result<()> {
    let metadata = |manifest: &Path| {
        util::run(
            util::cargo()
                .args(["metadata", "--format-version", "1", "--manifest-path"])
                .arg(manifest)
                .stdout(Stdio::null()),
        )
    };
    metadata(&check_dir().join("Cargo.toml"))?;
    metadata(&candle_dir().join("Cargo.toml"))?;
    metadata(&core_dir().join("Cargo.toml"))?;
    let manifest = write_doc_crate()?;
    let lock = manifest.with_file_name("Cargo.lock");
    if !doc_lock().is_file() {
        // A first lock starts from the workspace's versions (cargo drops what the program lacks).
        let ws = util::root().join("Cargo.lock");
        std::fs::copy(&ws, &lock).map_err(|e| format!("{}: {e}", ws.display()))?;
    }
    metadata(&manifest)?;
    if let Some(d) = doc_lock().parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::copy(&lock, doc_lock()).map_err(|e| format!("{} -> {}: {e}", lock.display(), doc_lock().display()))?;
    eprintln!(
        "locks refreshed: xtask/embed-check/Cargo.lock, xtask/embed-candle/Cargo.lock, xtask/embed-core/Cargo.lock, \
         xtask/embed-doc/Cargo.lock (commit them)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE_TEXT: &str = "# t\n\n```toml\n[dependencies]\nsymm-ops = { version = \"0.1\" }\n# a note\ncudarc = \"0.19\"\n```\n\ntext\n\n```rust\nfn main() {\n# let hidden = 1;\n    ## not hidden\n}\n```\n\n```text\nx\n```\n";

    #[test]
    fn finds_the_blocks() {
        let all = blocks(PAGE_TEXT).unwrap();
        assert_eq!(all.len(), 3);
        let toml = one_block(&all, &["toml"], "deps").unwrap();
        assert_eq!(dependency_names(&toml.text).unwrap(), ["symm-ops", "cudarc"]);
        let rust = one_block(&all, &["rust", ""], "program").unwrap();
        assert_eq!(
            rustdoc_source(&rust.text),
            "fn main() {\nlet hidden = 1;\n    # not hidden\n}\n"
        );
        assert!(one_block(&all, &["sh"], "x").unwrap_err().contains("no ```sh block"));
        assert!(blocks("```rust\nfn main() {}\n").unwrap_err().contains("never closed"));
        assert!(dependency_names("[package]\nx = 1\n")
            .unwrap_err()
            .contains("no [dependencies]"));
    }
}
