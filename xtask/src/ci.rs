//! `cargo xtask ci`: everything CI checks, in order, with a summary.
//!
//! Steps: rustfmt check; build of every target of the default members; clippy
//! (`-D warnings` on every target; library and binary code also
//! `undocumented_unsafe_blocks`, `unwrap_used`, `expect_used`: [`LIB_LINTS`]);
//! their tests (doc tests of docs/*.md included); NVRTC compile of every CUDA kernel for sm_80 and sm_90;
//! symm-rocm check, clippy (with symm-ops' rocm engine) + tests (symm-ops' unit tests with its
//! rocm feature too) with HIP_PATH=/usr (when HIP headers exist; under
//! CI=true their absence is a failure); the benchmark smoke test on whatever
//! backend the machine has. Every step runs even after a failure; the last line
//! is `N passed, N failed` (with the skipped steps named after it) and the exit
//! status is non-zero on any failure. NVRTC is installed into `.nvrtc/` when
//! missing (see `kernels`); a step that cannot run here is skipped with a loud
//! line outside CI and fails under `CI=true`.

use std::path::Path;
use std::time::Instant;

use crate::util::{self, Result};

enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// The lints library and binary code must pass besides `-D warnings`: every unsafe block says
/// why it is sound, and no `unwrap` / `expect` (errors, not panics).
pub const LIB_LINTS: &[&str] = &[
    "-D",
    "warnings",
    "-D",
    "clippy::undocumented_unsafe_blocks",
    "-D",
    "clippy::unwrap_used",
    "-D",
    "clippy::expect_used",
];

/// `cargo clippy` over `scope` (package selection): every target with `-D warnings`, then the
/// library and binary targets with [`LIB_LINTS`]; `hip`: with HIP_PATH=/usr.
fn clippy(scope: &[&str], hip: bool) -> Result<()> {
    let run = |targets: &[&str], lints: &[&str]| {
        let mut cmd = util::cargo();
        cmd.arg("clippy").args(scope).args(targets).arg("--").args(lints);
        if hip {
            cmd.env("HIP_PATH", "/usr");
        }
        util::run(&mut cmd)
    };
    run(&["--all-targets"], &["-D", "warnings"])?;
    run(&["--lib", "--bins"], LIB_LINTS)
}

/// Where HIP headers are expected (Debian's libamdhip64-dev puts them under /usr).
pub const HIP_HEADER: &str = "/usr/include/hip/hip_runtime_api.h";

fn rocm_step() -> Outcome {
    if !Path::new(HIP_HEADER).is_file() {
        let why = format!(
            "symm-rocm neither built nor tested: HIP headers missing ({HIP_HEADER}); install them with \
             `apt-get install -y libamdhip64-dev`"
        );
        return if util::in_ci() {
            Outcome::Fail(format!("{why} (CI=true: the ROCm check is required)"))
        } else {
            Outcome::Skip(why)
        };
    }
    let r = util::run(
        util::cargo()
            .args(["check", "-p", "symm-rocm", "--all-targets"])
            .env("HIP_PATH", "/usr"),
    )
    // symm-ops' rocm engine too (its `rocm` feature links symm-rocm).
    .and_then(|_| {
        clippy(
            &["-p", "symm-rocm", "-p", "symm-ops", "--features", "symm-ops/rocm"],
            true,
        )
    })
    .and_then(|_| util::run(util::cargo().args(["test", "-p", "symm-rocm"]).env("HIP_PATH", "/usr")))
    // symm-ops' unit tests with the rocm engine compiled in (the planner's rocm rows among them).
    .and_then(|_| {
        util::run(
            util::cargo()
                .args(["test", "-p", "symm-ops", "--features", "rocm", "--lib"])
                .env("HIP_PATH", "/usr"),
        )
    });
    match r {
        Ok(()) => Outcome::Pass,
        Err(e) => Outcome::Fail(e),
    }
}

/// Not yet written pieces are skipped (and said so), never counted as passed.
fn kernels_step() -> Outcome {
    match util::workspace_packages() {
        Ok(p)
            if !p
                .iter()
                .any(|p| p.name == "symm-cuda" && p.examples.iter().any(|e| e == crate::kernels::EXAMPLE)) =>
        {
            Outcome::Skip(format!(
                "symm-cuda has no `{}` example yet: no kernel compiled",
                crate::kernels::EXAMPLE
            ))
        }
        Ok(_) => match crate::kernels::nvrtc_dirs() {
            Ok(_) => to_outcome(crate::kernels::main(&[])),
            Err(e) if util::in_ci() => Outcome::Fail(format!("{e} (CI=true: the kernel compile is required)")),
            Err(e) => Outcome::Skip(format!("no CUDA kernel compiled: {e}")),
        },
        Err(e) => Outcome::Fail(e),
    }
}

fn bench_step() -> Outcome {
    match crate::bench::bench_package() {
        Ok(None) => Outcome::Skip(format!("the `{}` binary does not exist yet", crate::bench::BIN)),
        Ok(Some(_)) => {
            to_outcome(crate::bench::main(&["--quick".to_string()]).and_then(|_| crate::bench::tp_layer_without_gpu()))
        }
        Err(e) => Outcome::Fail(e),
    }
}

fn to_outcome(r: Result<()>) -> Outcome {
    match r {
        Ok(()) => Outcome::Pass,
        Err(e) => Outcome::Fail(e),
    }
}

/// What an engine embedding symm-ops gets (#16, layering):
/// - with default features off and `cuda` on, symm-ops' normal dependencies hold neither the test
///   kit nor its host backend, and symm-core's fault injection is compiled out;
/// - a program whose cudarc has another CUDA-version feature (xtask/embed-check: 12.8) builds
///   with symm-ops (`default-features = false, features = ["cuda"]`) and runs;
/// - an engine with candle's cudarc line (`dynamic-linking`, the CUDA version from the build
///   system; xtask/embed-candle) builds with symm-ops (#38): a library, so nothing links, and a
///   stub `nvcc` answers cudarc's build script where the toolkit is missing;
/// - xtask/embed-check ignores `SYMM_FAULT` naming a fault point it calls (exits 0, not 137);
/// - docs/embedding.md's program (its ```toml and ```rust blocks) builds out of tree against this
///   checkout and runs (crate::embed).
fn embedding_layers() -> Result<()> {
    // symm-ops' defaults (#38: the test kit is not one of them) and an engine's explicit choice.
    for features in [
        &["-p", "symm-ops"][..],
        &[
            "-p",
            "symm-ops",
            "--no-default-features",
            "--features",
            "cuda,cuda-13000",
        ],
    ] {
        lean_library(features)?;
    }
    crate::embed::programs()
}

/// symm-ops built with `features` holds neither the test kit nor symm-core's fault injection,
/// so nothing in it reads `SYMM_FAULT`.
fn lean_library(features: &[&str]) -> Result<()> {
    util::run(util::cargo().arg("build").args(features))?;
    let tree = util::output(
        util::cargo()
            .args(["tree", "-e", "normal", "--prefix", "none", "--format", "{p} {f}"])
            .args(features),
    )?;
    if let Some(l) = tree
        .lines()
        .find(|l| l.starts_with("symm-core") && l.contains("fault-injection"))
    {
        return Err(format!(
            "symm-ops ({}) builds symm-core with fault injection ({l}): only the test kit may turn it on",
            features.join(" ")
        ));
    }
    if let Some(l) = tree.lines().find(|l| l.starts_with("symm-testkit")) {
        return Err(format!(
            "symm-ops ({}) still depends on {l}: the host backend must stay behind the `host-backend` \
             feature",
            features.join(" ")
        ));
    }
    Ok(())
}

/// A `rust-version` as comparable numbers (`"1.88"` and `"1.88.0"` are equal).
fn rust_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut it = v.trim().split('.').map(|x| x.parse::<u64>().ok());
    Some((
        it.next()??,
        it.next().flatten().unwrap_or(0),
        it.next().flatten().unwrap_or(0),
    ))
}

/// The workspace's declared MSRV holds for what it locks (#38): CI cannot install a second
/// toolchain, so it checks that no locked dependency declares a newer `rust-version` than the
/// workspace's crates do (the lowest of them).
fn msrv_holds() -> Result<()> {
    let text = util::output(util::cargo().args(["metadata", "--format-version", "1", "--locked"]))?;
    let m: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("cargo metadata: {e}"))?;
    let members: Vec<&str> = m["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    let packages = m["packages"].as_array().ok_or("cargo metadata: no packages")?;
    let declared = |p: &serde_json::Value| p["rust_version"].as_str().and_then(rust_version);
    let ours = packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
        .filter_map(declared)
        .min()
        .ok_or("no workspace crate declares a rust-version")?;
    let newer: Vec<String> = packages
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| !members.contains(&id)))
        .filter(|p| declared(p).is_some_and(|v| v > ours))
        .map(|p| format!("{} {} ({})", p["name"], p["version"], p["rust_version"]))
        .collect();
    if newer.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the workspace declares rust-version {}.{}.{} but the lock holds crates that need more: {}",
            ours.0,
            ours.1,
            ours.2,
            newer.join(", ")
        ))
    }
}

pub fn main(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        return Err(format!("ci: unknown argument {a:?} (usage: cargo xtask ci)"));
    }
    type Step = (&'static str, Box<dyn Fn() -> Outcome>);
    let steps: Vec<Step> = vec![
        (
            "fmt",
            Box::new(|| to_outcome(util::run(util::cargo().args(["fmt", "--all", "--", "--check"])))),
        ),
        (
            "build",
            Box::new(|| {
                to_outcome(
                    util::run(
                        util::cargo()
                            .args(["build", "--workspace", "--exclude", "symm-rocm", "--all-targets"])
                            .args(util::BENCH_FEATURES),
                    )
                    .and_then(|()| embedding_layers()),
                )
            }),
        ),
        (
            "clippy",
            Box::new(|| {
                to_outcome(clippy(
                    &[
                        "--workspace",
                        "--exclude",
                        "symm-rocm",
                        util::BENCH_FEATURES[0],
                        util::BENCH_FEATURES[1],
                    ],
                    false,
                ))
            }),
        ),
        (
            "test",
            Box::new(|| {
                to_outcome(util::run(
                    util::cargo()
                        .args(["test", "--workspace", "--exclude", "symm-rocm"])
                        .args(util::BENCH_FEATURES),
                ))
            }),
        ),
        ("msrv", Box::new(|| to_outcome(msrv_holds()))),
        (
            "package",
            // Every publishable crate packages (#38): versions on the path dependencies, the
            // metadata crates.io needs; the crates resolve against each other locally.
            Box::new(|| {
                to_outcome(util::run(util::cargo().args([
                    "package",
                    "--workspace",
                    "--no-verify",
                    "--allow-dirty",
                ])))
            }),
        ),
        ("kernels", Box::new(kernels_step)),
        ("rocm", Box::new(rocm_step)),
        ("bench --quick", Box::new(bench_step)),
    ];
    let mut results = Vec::new();
    for (name, f) in &steps {
        eprintln!("\n==> ci step: {name}");
        let t = Instant::now();
        let o = f();
        let secs = t.elapsed().as_secs_f64();
        match &o {
            Outcome::Pass => eprintln!("==> {name}: passed ({secs:.0} s)"),
            Outcome::Fail(e) => eprintln!("==> {name}: FAILED ({secs:.0} s): {e}"),
            Outcome::Skip(e) => eprintln!("==> {name}: SKIPPED, NOT CHECKED: {e}"),
        }
        results.push((*name, o, secs));
    }
    println!("\nci summary:");
    let (mut passed, mut failed, mut skipped) = (0, 0, Vec::new());
    for (name, o, secs) in &results {
        match o {
            Outcome::Pass => {
                passed += 1;
                println!("  passed   {name} ({secs:.0} s)");
            }
            Outcome::Fail(e) => {
                failed += 1;
                println!("  FAILED   {name} ({secs:.0} s): {e}");
            }
            Outcome::Skip(e) => {
                skipped.push(*name);
                println!("  SKIPPED  {name}: not checked: {e}");
            }
        }
    }
    if skipped.is_empty() {
        println!("{passed} passed, {failed} failed");
    } else {
        println!(
            "{passed} passed, {failed} failed ({} skipped, NOT CHECKED here: {})",
            skipped.len(),
            skipped.join(", ")
        );
    }
    if failed > 0 {
        Err(format!("{failed} ci step(s) failed"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::rust_version;

    #[test]
    fn rust_versions_compare_as_numbers() {
        assert_eq!(rust_version("1.88"), rust_version("1.88.0"));
        assert!(rust_version("1.88").unwrap() > rust_version("1.85.1").unwrap());
        assert!(rust_version("1.100").unwrap() > rust_version("1.99.9").unwrap());
        assert_eq!(rust_version("x.1"), None);
    }
}
