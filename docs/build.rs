//! Generates the page list: one module per `docs/*.md`, its text included as
//! the module's documentation (so `cargo test -p symm-docs` doc-tests every
//! Rust code block of every page). A new page needs no change here.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    pages.retain(|p| p.extension().is_some_and(|e| e == "md") && p.is_file());
    pages.sort();
    let mut out = String::new();
    let mut names = Vec::new();
    for p in &pages {
        let stem = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let module: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        if module.is_empty() || module.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        println!("cargo:rerun-if-changed={}", p.display());
        let _ = writeln!(
            out,
            "#[doc = include_str!({:?})]\npub mod {module} {{}}\n",
            p.display().to_string()
        );
        names.push(format!("{:?}", format!("{stem}.md")));
    }
    let _ = writeln!(
        out,
        "/// The pages included, by file name.\npub const PAGES: &[&str] = &[{}];",
        names.join(", ")
    );
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into()));
    if let Err(e) = std::fs::write(out_dir.join("pages.rs"), out) {
        panic!("symm-docs build script: cannot write pages.rs: {e}");
    }
}
