//! `cargo xtask kernels`: NVRTC-compiles every CUDA kernel (symm-cuda's, then the
//! tensor-parallel layer example's) for every architecture the Requirements claim: sm_80 and
//! sm_90 ([`DEFAULT_ARCHS`]; `--arch` picks others). The architectures' symm-cuda compiles run
//! side by side (NVRTC takes about two minutes and 0.8 GB per architecture on one core).
//!
//! The compile itself is symm-cuda's `kernels::compile_all(arch)`, called from
//! the `nvrtc_compile_all` example of symm-cuda so xtask stays free of CUDA
//! dependencies. This module finds libnvrtc (LD_LIBRARY_PATH, pip's
//! `site-packages/nvidia/cu13/lib`, the repo's git-ignored `.nvrtc/` folder,
//! /usr/local/cuda/lib64) and hands its folder to the child through
//! LD_LIBRARY_PATH. When none has it, it installs NVRTC from PyPI into
//! `.nvrtc/` (`pip install --target`, nothing outside the repo changes).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Result};

pub const EXAMPLE: &str = "nvrtc_compile_all";
/// What CI compiles for: Ampere (A100) and Hopper (H100, H200), the README's Requirements. The
/// GPU suites run on Hopper only; `gpu-bundle` ships sm_90's cache alone.
pub const DEFAULT_ARCHS: &[&str] = &["sm_80", "sm_90"];

/// The NVRTC wheel: 13.0, the GPU machines' version.
pub const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc==13.0.*";

/// The repo folder NVRTC is installed into on demand (git-ignored).
pub fn local_nvrtc() -> PathBuf {
    util::root().join(".nvrtc")
}

/// Folders holding libnvrtc: those [`util::find_lib_dirs`] knows, then
/// `.nvrtc/nvidia/*/lib`.
pub(crate) fn find_nvrtc() -> Vec<PathBuf> {
    let mut dirs = util::find_lib_dirs("libnvrtc");
    for d in util::nvidia_lib_dirs(&local_nvrtc().join("nvidia")) {
        if util::dir_has_lib(&d, "libnvrtc") && !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Folders holding libnvrtc; when there are none, NVRTC is installed into
/// `.nvrtc/` with pip first. An error says what was tried and how to get it.
pub fn nvrtc_dirs() -> Result<Vec<PathBuf>> {
    let dirs = find_nvrtc();
    if !dirs.is_empty() {
        return Ok(dirs);
    }
    let target = local_nvrtc();
    eprintln!(
        "libnvrtc not found: installing {NVRTC_WHEEL} into {} (python3 -m pip install --target)",
        target.display()
    );
    let installed = util::run(
        std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&target)
            .arg(NVRTC_WHEEL)
            // The child's environment only: `--target` writes nowhere else, so the
            // system python's PEP 668 marker does not apply.
            .env("PIP_BREAK_SYSTEM_PACKAGES", "1")
            .env("PIP_ROOT_USER_ACTION", "ignore"),
    );
    let dirs = find_nvrtc();
    if dirs.is_empty() {
        let why = match installed {
            Err(e) => format!("the install failed: {e}"),
            Ok(()) => format!("the install left no libnvrtc under {}", target.display()),
        };
        return Err(format!(
            "libnvrtc not found (looked in LD_LIBRARY_PATH, python's site-packages/nvidia/*/lib, {} and \
             /usr/local/cuda/lib64) and {why}; install it with `python3 -m pip install \"{NVRTC_WHEEL}\"` \
             or put its folder on LD_LIBRARY_PATH",
            target.display()
        ));
    }
    Ok(dirs)
}

pub fn main(args: &[String]) -> Result<()> {
    let mut archs: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--arch" => {
                let v = it.next().ok_or("--arch needs a value (e.g. sm_90, or sm_80,sm_90)")?;
                archs.extend(v.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from));
            }
            other => {
                return Err(format!(
                    "kernels: unknown argument {other:?} (usage: cargo xtask kernels [--arch sm_80,sm_90]...)"
                ))
            }
        }
    }
    if archs.is_empty() {
        archs = DEFAULT_ARCHS.iter().map(|a| a.to_string()).collect();
    }
    let dirs = nvrtc_dirs()?;
    eprintln!("libnvrtc found in {}", dirs[0].display());
    let has_example = util::workspace_packages()?
        .iter()
        .any(|p| p.name == "symm-cuda" && p.examples.iter().any(|e| e == EXAMPLE));
    if !has_example {
        return Err(format!(
            "symm-cuda has no `{EXAMPLE}` example yet (symm-cuda/examples/{EXAMPLE}.rs calling \
             symm_cuda::kernels::compile_all); no kernel was compiled"
        ));
    }
    // Each architecture's commands: symm-cuda's (minutes of NVRTC), then the layer's (seconds).
    let mut per_arch: Vec<Vec<Command>> = archs.iter().map(|a| compile_commands(a, None, &dirs, true)).collect();
    // Build once, so the side-by-side runs below do not wait on cargo's lock in turn.
    util::run(util::cargo().args(["build", "--quiet", "-p", "symm-cuda", "--example", EXAMPLE]))?;
    let firsts: Vec<Command> = per_arch.iter_mut().map(|c| c.remove(0)).collect();
    run_side_by_side(firsts)?;
    for mut cmd in per_arch.into_iter().flatten() {
        util::run(&mut cmd)?;
    }
    eprintln!("kernels: every kernel compiled for {}", archs.join(", "));
    Ok(())
}

/// Runs `cmds` at once, each one's output printed whole when it ends; an error names every
/// command that failed.
fn run_side_by_side(cmds: Vec<Command>) -> Result<()> {
    let t = std::time::Instant::now();
    let results: Vec<(String, std::io::Result<std::process::Output>)> = std::thread::scope(|s| {
        let handles: Vec<_> = cmds
            .into_iter()
            .map(|mut cmd| {
                let shown = util::show(&cmd);
                eprintln!("$ {shown}");
                s.spawn(move || (shown, cmd.output()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (String::from("?"), Err(std::io::Error::other("panicked"))))
            })
            .collect()
    });
    let mut failed = Vec::new();
    for (shown, r) in results {
        match r {
            Ok(out) => {
                print!("{}", String::from_utf8_lossy(&out.stdout));
                eprint!("{}", String::from_utf8_lossy(&out.stderr));
                if !out.status.success() {
                    failed.push(format!("`{shown}` failed: {}", out.status));
                }
            }
            Err(e) => failed.push(format!("cannot start `{shown}`: {e}")),
        }
    }
    if failed.is_empty() {
        eprintln!("  ok ({:.1} s)", t.elapsed().as_secs_f64());
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// The commands that NVRTC-compile every kernel for `arch`: symm-cuda's (its `nvrtc_compile_all`
/// example) and, with `tp_layer`, the tensor-parallel layer's (symm-ops/examples/tp-layer). With
/// `cache`, through symm-cuda's disk cache in that folder (what `gpu-bundle` ships); without,
/// uncached (what CI checks). `nvrtc`: libnvrtc's folders.
pub fn compile_commands(arch: &str, cache: Option<&Path>, nvrtc: &[PathBuf], tp_layer: bool) -> Vec<Command> {
    let lib_path = util::prepend_path("LD_LIBRARY_PATH", nvrtc);
    let mut symm = util::cargo();
    symm.args(["run", "--quiet", "-p", "symm-cuda", "--example", EXAMPLE, "--", arch]);
    let mut cmds = vec![symm];
    if tp_layer {
        let mut tp = util::cargo();
        tp.args([
            "run",
            "--quiet",
            "-p",
            crate::bench::TP_PACKAGE,
            "--example",
            crate::bench::TP_EXAMPLE,
        ])
        .args(["--", "--compile-only", "--arch", arch]);
        cmds.push(tp);
    }
    for c in &mut cmds {
        c.env("LD_LIBRARY_PATH", &lib_path);
        match cache {
            Some(dir) => {
                c.env("SYMM_KERNEL_CACHE", dir);
            }
            None => {
                c.env("SYMM_KERNEL_CACHE", "off");
            }
        }
    }
    if cache.is_some() {
        cmds[0].arg("--cache");
    }
    cmds
}
