//! GPU work: `cargo xtask test-multigpu` (build and run the GPU suites here)
//! and `cargo xtask gpu-bundle` (build them for a GPU machine without cargo).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Result};

/// Packages whose test executables make up the GPU suites.
const TEST_PACKAGES: &[&str] = &["symm-cuda", "symm-ops", "symm-testkit"];
/// Binaries the bundle carries, where they exist.
const BUNDLE_BINS: &[&str] = &[
    "symm-bench",
    "symmrun",
    "symm-store-bench",
    "symm-store-interop",
    "symm-store-server",
];
/// The bundle must stay well under the 64 MiB a transfer allows.
const BUNDLE_LIMIT: u64 = 60 << 20;

/// A built test executable.
pub struct TestExe {
    /// `<package>__<target>` (`lib` for unit tests).
    pub name: String,
    pub path: PathBuf,
}

/// Whether a test target of `pkg` belongs to the GPU suites: everything of
/// symm-cuda; symm-ops except its host-only targets (`host*`); of
/// symm-testkit, targets named for CUDA or GPUs.
fn wanted(pkg: &str, target: &str) -> bool {
    match pkg {
        "symm-cuda" => true,
        "symm-ops" => !target.starts_with("host"),
        "symm-testkit" => ["cuda", "gpu"].iter().any(|k| target.contains(k)),
        _ => false,
    }
}

/// `cargo test --no-run --message-format=json` for the GPU packages; returns
/// the test executables.
pub fn build_tests(release: bool, target_dir: Option<&Path>, strip: bool) -> Result<Vec<TestExe>> {
    let mut cmd = util::cargo();
    cmd.args(["test", "--no-run", "--message-format=json"]);
    if release {
        cmd.arg("--release");
    }
    for p in TEST_PACKAGES {
        cmd.args(["-p", p]);
    }
    cmd.args(util::BENCH_FEATURES);
    configure(&mut cmd, target_dir, strip);
    let text = util::output(&mut cmd)?;
    let mut exes = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else { continue };
        let pkg = Path::new(v["manifest_path"].as_str().unwrap_or_default())
            .parent()
            .and_then(|p| p.file_name())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let target = v["target"]["name"].as_str().unwrap_or_default();
        let is_lib = v["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|x| x == "lib" || x == "rlib"));
        if !wanted(&pkg, target) {
            continue;
        }
        let name = format!("{pkg}__{}", if is_lib { "lib" } else { target });
        exes.push(TestExe {
            name,
            path: PathBuf::from(exe),
        });
    }
    exes.sort_by(|a, b| a.name.cmp(&b.name));
    exes.dedup_by(|a, b| a.name == b.name);
    if exes.is_empty() {
        return Err("no GPU test executables were built".into());
    }
    Ok(exes)
}

fn configure(cmd: &mut Command, target_dir: Option<&Path>, strip: bool) {
    if let Some(d) = target_dir {
        cmd.env("CARGO_TARGET_DIR", d);
    }
    if strip {
        cmd.env("CARGO_PROFILE_RELEASE_DEBUG", "0")
            .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
            .env("CARGO_PROFILE_RELEASE_SPLIT_DEBUGINFO", "off");
    }
}

/// The environment GPU runs need: CUDA, NVRTC and NCCL libraries on
/// LD_LIBRARY_PATH; no NVLink multicast; GPU skips become failures for every
/// test that needs at most `gpus` GPUs (`SYMM_REQUIRE_GPUS=<gpus>`).
pub fn gpu_env(cmd: &mut Command, gpus: usize) {
    gpu_libs_env(cmd);
    cmd.env("SYMM_REQUIRE_GPUS", gpus.to_string());
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // Rank threads sharing a GPU need every hardware work queue of the context (NOTE
        // [co-residency]; without it their suites skip, or fail under SYMM_REQUIRE_GPUS).
        cmd.env("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    }
    if std::env::var_os("RUST_TEST_THREADS").is_none() {
        // GPU tests measure device memory baselines and own the GPUs (ranks sharing one GPU
        // size their grids to fill it, NOTE [co-residency]).
        cmd.env("RUST_TEST_THREADS", "1");
    }
}

/// The part of [`gpu_env`] every GPU program needs (the benchmark too): CUDA, NVRTC and NCCL
/// libraries on LD_LIBRARY_PATH, no NVLink multicast.
pub fn gpu_libs_env(cmd: &mut Command) {
    let mut dirs = vec![PathBuf::from("/usr/local/cuda/lib64")];
    // NVRTC where `cargo xtask kernels` finds it (the system's, or its own `.nvrtc/`), NCCL.
    for d in crate::kernels::find_nvrtc()
        .into_iter()
        .chain(util::find_lib_dirs("libnccl"))
    {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    cmd.env("LD_LIBRARY_PATH", util::prepend_path("LD_LIBRARY_PATH", &dirs))
        .env("NCCL_NVLS_ENABLE", "0")
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1");
}

pub fn test_multigpu(args: &[String]) -> Result<()> {
    let n = util::gpu_count();
    if n < 1 {
        return Err(
            "test-multigpu needs an NVIDIA GPU; this machine has none (counted with `nvidia-smi -L` and \
             /proc/driver/nvidia/gpus). Without GPUs, build a bundle with `cargo xtask gpu-bundle` and run \
             `.gpu/run.sh tests` on a GPU machine"
                .into(),
        );
    }
    if n == 1 {
        eprintln!(
            "1 GPU found: the shared-device suites (2, 3, 4 and 8 ranks on GPU 0) must pass; the suites that \
             need distinct GPUs skip and say so"
        );
    } else {
        eprintln!("{n} GPUs found");
    }
    let exes = build_tests(false, None, false)?;
    let (mut passed, mut failed) = (0, 0);
    for t in &exes {
        let mut cmd = Command::new(&t.path);
        cmd.args(args).current_dir(util::root());
        gpu_env(&mut cmd, n);
        match util::run(&mut cmd) {
            Ok(()) => passed += 1,
            Err(e) => {
                eprintln!("FAILED {}: {e}", t.name);
                failed += 1;
            }
        }
    }
    println!("test-multigpu: {} test executables", exes.len());
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        Err(format!("{failed} GPU test executable(s) failed"))
    } else {
        Ok(())
    }
}

/// Copies `from` over `to` (replacing it, not writing through it).
fn copy_file(from: &Path, to: &Path) -> Result<()> {
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to).map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))?;
    Ok(())
}

fn copy_exe(from: &Path, to: &Path) -> Result<()> {
    copy_file(from, to)?;
    set_mode(to, 0o755)
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", p.display()))
}

pub fn gpu_bundle(args: &[String]) -> Result<()> {
    let mut out = util::root().join(".gpu");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a folder")?),
            other => {
                return Err(format!(
                    "gpu-bundle: unknown argument {other:?} (usage: cargo xtask gpu-bundle [--out .gpu])"
                ))
            }
        }
    }
    if out.is_relative() {
        out = util::root().join(out);
    }
    // A target dir of its own: the stripped release profile would otherwise
    // evict the ordinary release artifacts.
    let target_dir = util::target_dir().join("gpu-bundle");
    let exes = build_tests(true, Some(&target_dir), true)?;

    let packages = util::workspace_packages()?;
    let mut bins: Vec<(String, String)> = Vec::new(); // (package, bin)
    for want in BUNDLE_BINS.iter().chain(["xtask"].iter()) {
        if let Some(p) = packages.iter().find(|p| p.bins.iter().any(|b| b == want)) {
            bins.push((p.name.clone(), want.to_string()));
        } else {
            eprintln!("note: no `{want}` binary in the workspace yet; not bundled");
        }
    }
    let mut cmd = util::cargo();
    cmd.args(["build", "--release"]).args(util::BENCH_FEATURES);
    for (p, b) in &bins {
        cmd.args(["-p", p, "--bin", b]);
    }
    let tp_layer = packages
        .iter()
        .any(|p| p.name == crate::bench::TP_PACKAGE && p.examples.iter().any(|e| e == crate::bench::TP_EXAMPLE));
    if tp_layer {
        cmd.args(["-p", crate::bench::TP_PACKAGE, "--example", crate::bench::TP_EXAMPLE]);
    }
    configure(&mut cmd, Some(&target_dir), true);
    util::run(&mut cmd)?;

    for sub in ["tests", "bin"] {
        let d = out.join(sub);
        if d.exists() {
            std::fs::remove_dir_all(&d).map_err(|e| format!("remove {}: {e}", d.display()))?;
        }
        std::fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
    }
    for t in &exes {
        copy_exe(&t.path, &out.join("tests").join(&t.name))?;
    }
    for (_, b) in &bins {
        copy_exe(&target_dir.join("release").join(b), &out.join("bin").join(b))?;
    }
    if tp_layer {
        let exe = target_dir
            .join("release")
            .join("examples")
            .join(crate::bench::TP_EXAMPLE);
        copy_exe(&exe, &out.join("bin").join(crate::bench::TP_EXAMPLE))?;
        bins.push((crate::bench::TP_PACKAGE.into(), crate::bench::TP_EXAMPLE.into()));
    }
    let anchors = util::root()
        .join("..")
        .join("shared")
        .join("bench")
        .join("anchors_torch.py");
    if anchors.is_file() {
        let _ = std::fs::remove_file(out.join("anchors_torch.py"));
        std::fs::copy(&anchors, out.join("anchors_torch.py")).map_err(|e| format!("copy anchors: {e}"))?;
    } else {
        eprintln!("note: {} not found; `run.sh anchors` will fail", anchors.display());
    }
    // The PyTorch side of the store interop check (`run.sh store-interop`).
    let interop = util::root().join("symm-store").join("tests").join("torch_interop.py");
    copy_file(&interop, &out.join("torch_interop.py"))?;
    warm_kernel_cache(&out.join("kernel-cache"), tp_layer);
    let run_sh = out.join("run.sh");
    std::fs::write(&run_sh, RUN_SH).map_err(|e| format!("write {}: {e}", run_sh.display()))?;
    set_mode(&run_sh, 0o755)?;
    let rev = Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(util::root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut manifest = format!("symm GPU bundle, built from {rev}\n");
    for t in &exes {
        manifest.push_str(&format!("tests/{}\n", t.name));
    }
    for (_, b) in &bins {
        manifest.push_str(&format!("bin/{b}\n"));
    }
    std::fs::write(out.join("MANIFEST"), manifest).map_err(|e| format!("write MANIFEST: {e}"))?;

    let size = util::dir_size(&out);
    println!(
        "gpu bundle: {} ({} test executables, {} binaries), {}",
        out.display(),
        exes.len(),
        bins.len(),
        util::human_bytes(size)
    );
    println!(
        "run it on the GPU machine: {}/run.sh all   (or tests | bench | anchors | store-interop)",
        out.display()
    );
    if size > BUNDLE_LIMIT {
        return Err(format!(
            "bundle is {} — over the {} limit",
            util::human_bytes(size),
            util::human_bytes(BUNDLE_LIMIT)
        ));
    }
    Ok(())
}

/// The architecture the bundle's kernel cache is compiled for (H100 and H200).
const CACHE_ARCH: &str = "sm_90";

/// Fills `dir` with the PTX a first launch on a [`CACHE_ARCH`] GPU would compile (symm-cuda's
/// kernels and the tensor-parallel layer's), through symm-cuda's disk cache with this machine's
/// NVRTC; `run.sh` points `SYMM_KERNEL_CACHE` there. The cache key holds the NVRTC version, so a
/// GPU machine with another NVRTC compiles anew, as without the cache. Best effort: without
/// NVRTC here the bundle has no cache and says so.
fn warm_kernel_cache(dir: &Path, tp_layer: bool) {
    let _ = std::fs::remove_dir_all(dir);
    let nvrtc = crate::kernels::find_nvrtc();
    if nvrtc.is_empty() {
        eprintln!("note: no libnvrtc here; the bundle has no kernel cache (the GPU machine compiles at first use)");
        return;
    }
    for mut cmd in crate::kernels::compile_commands(CACHE_ARCH, Some(dir), &nvrtc, tp_layer) {
        if let Err(e) = util::run(&mut cmd) {
            eprintln!("note: the kernel cache is incomplete ({e}); the GPU machine compiles what is missing");
        }
    }
    drop_ptx_beside_cubin(dir);
}

/// Removes each cached `.ptx` whose `.cubin` is beside it: a module loads the CUBIN (no JIT), so
/// the PTX would only serve a driver that refuses it, and the collectives' PTX alone is over a
/// third of the bundle's size limit. What reads PTX on the GPU machine (the PTX checks of
/// symm-cuda's unit tests) compiles it there.
fn drop_ptx_beside_cubin(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "ptx") && p.with_extension("cubin").exists() {
            let _ = std::fs::remove_file(&p);
        }
    }
}

/// The bundle's run script (runs on a GPU machine with no cargo).
pub const RUN_SH: &str = include_str!("run.sh");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_suites_are_selected_by_package_and_target() {
        assert!(wanted("symm-cuda", "symm_cuda"));
        assert!(wanted("symm-cuda", "conformance"));
        assert!(wanted("symm-ops", "symm_ops"));
        assert!(wanted("symm-ops", "cuda_ops"));
        assert!(!wanted("symm-ops", "host_ops"));
        assert!(wanted("symm-testkit", "cuda_conformance"));
        assert!(!wanted("symm-testkit", "host_conformance"));
        assert!(!wanted("symm-store", "tcp_store"));
    }

    #[test]
    fn run_sh_is_bash_and_knows_every_command() {
        assert!(RUN_SH.starts_with("#!/usr/bin/env bash"));
        for c in [
            "tests)",
            "bench)",
            "anchors)",
            "store-interop)",
            "all)",
            "NCCL_NVLS_ENABLE=0",
            "SYMM_REQUIRE_GPUS=",
        ] {
            assert!(RUN_SH.contains(c), "run.sh lacks {c}");
        }
        let ok = Command::new("bash").arg("-n").arg("-c").arg(RUN_SH).status();
        if let Ok(st) = ok {
            assert!(st.success(), "run.sh has a syntax error");
        }
    }
}
