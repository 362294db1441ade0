//! `cargo xtask bench [--quick] [--out DIR] [symm-bench args...]`: the
//! project's main job.
//!
//! Builds symm-bench in release, runs it (it picks the GPUs when there are
//! any, the host backend otherwise) with `--json DIR/bench.json` (default
//! `target/bench/`), then plots `DIR/bench.svg` (ours against NCCL) and
//! `DIR/bench-detail.svg` (every algorithm) from that JSON. Every other
//! argument goes to symm-bench unchanged.

use std::path::PathBuf;
use std::process::Command;

use crate::util::{self, Result};

pub const BIN: &str = "symm-bench";
/// The tensor-parallel decoder layer benchmark (`--tp-layer`), an example of symm-ops.
pub const TP_EXAMPLE: &str = "tp-layer";
pub const TP_PACKAGE: &str = "symm-ops";

/// The package that holds symm-bench, if it exists yet.
pub fn bench_package() -> Result<Option<String>> {
    Ok(util::workspace_packages()?
        .into_iter()
        .find(|p| p.bins.iter().any(|b| b == BIN))
        .map(|p| p.name))
}

pub fn main(args: &[String]) -> Result<()> {
    let mut out_dir = util::target_dir().join("bench");
    let mut pass: Vec<String> = Vec::new();
    let mut tp_layer = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out_dir = PathBuf::from(it.next().ok_or("--out needs a folder")?),
            "--json" => return Err("bench: xtask sets --json itself; use --out DIR".into()),
            "--tp-layer" => tp_layer = true,
            // `cargo xtask bench -- ARGS` (docs/benchmarks.md): what follows goes to the binary.
            "--" => {}
            _ => pass.push(a.clone()),
        }
    }
    if out_dir.is_relative() {
        out_dir = util::root().join(out_dir);
    }
    if tp_layer {
        return tp_layer_bench(&out_dir, &pass);
    }
    let pkg = bench_package()?
        .ok_or_else(|| format!("the `{BIN}` binary does not exist yet (expected in symm-ops/src/bin/{BIN}.rs)"))?;
    util::run(
        util::cargo()
            .args(["build", "--release", "-p", &pkg, "--bin", BIN])
            .args(util::BENCH_FEATURES),
    )?;
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("create {}: {e}", out_dir.display()))?;
    let json = out_dir.join("bench.json");
    let svg = out_dir.join("bench.svg");
    let _ = std::fs::remove_file(&json);
    let exe = util::target_dir().join("release").join(BIN);
    let mut cmd = Command::new(&exe);
    cmd.current_dir(util::root()).args(&pass).arg("--json").arg(&json);
    let gpus = util::gpu_count();
    if gpus > 0 {
        // Libraries only: the benchmark times ranks on distinct GPUs with the driver's default
        // queues, and the test-only settings of `gpu_env` do not apply.
        crate::gpu::gpu_libs_env(&mut cmd);
        eprintln!("{gpus} GPUs found: benchmarking on them");
    } else {
        eprintln!("no GPU found: symm-bench runs on the host backend");
    }
    util::run(&mut cmd)?;
    if !json.is_file() {
        return Err(format!("{BIN} did not write {}", json.display()));
    }
    let plotted = crate::plot::plot_file(&json, None, &svg)?;
    println!("bench: results in {}", json.display());
    println!("{}", crate::plot::summary(&plotted));
    Ok(())
}

/// `cargo xtask bench --tp-layer [args]`: builds and runs the tensor-parallel layer example
/// (symm-ops/examples/tp-layer), JSON and plot into `out_dir/tp-layer.{json,svg}`. Without a
/// GPU the example says so and exits 2, which is an error here.
fn tp_layer_bench(out_dir: &std::path::Path, pass: &[String]) -> Result<()> {
    util::run(util::cargo().args(["build", "--release", "-p", TP_PACKAGE, "--example", TP_EXAMPLE]))?;
    std::fs::create_dir_all(out_dir).map_err(|e| format!("create {}: {e}", out_dir.display()))?;
    let json = out_dir.join("tp-layer.json");
    let _ = std::fs::remove_file(&json);
    let exe = util::target_dir().join("release").join("examples").join(TP_EXAMPLE);
    let mut cmd = Command::new(&exe);
    cmd.current_dir(util::root()).args(pass).arg("--json").arg(&json);
    crate::gpu::gpu_libs_env(&mut cmd);
    util::run(&mut cmd)?;
    let plotted = crate::plot::plot_file(&json, None, &out_dir.join("tp-layer.svg"))?;
    println!("bench: results in {}", json.display());
    println!("{}", crate::plot::summary(&plotted));
    Ok(())
}

/// CI's check of the layer example on a machine without a GPU: it must build, say plainly that
/// it needs a GPU, and exit 2 (nothing measured) rather than fail or pretend.
pub fn tp_layer_without_gpu() -> Result<()> {
    if util::gpu_count() > 0 {
        return Ok(());
    }
    util::run(util::cargo().args(["build", "--release", "-p", TP_PACKAGE, "--example", TP_EXAMPLE]))?;
    let exe = util::target_dir().join("release").join("examples").join(TP_EXAMPLE);
    let out = Command::new(&exe)
        .arg("--quick")
        .output()
        .map_err(|e| format!("run {}: {e}", exe.display()))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !err.contains("no CUDA GPU") {
        return Err(format!(
            "{TP_EXAMPLE} without a GPU: exit {:?}, stderr {err:?} (want exit 2 and \"no CUDA GPU\")",
            out.status.code()
        ));
    }
    println!("bench: {TP_EXAMPLE} without a GPU: {}", err.trim());
    Ok(())
}
