//! `cargo xtask kernels`: NVRTC-compiles every CUDA kernel for sm_90 (symm-cuda's, then the
//! tensor-parallel layer example's).
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
pub const DEFAULT_ARCH: &str = "sm_90";

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
    let mut arch = DEFAULT_ARCH.to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--arch" => arch = it.next().ok_or("--arch needs a value (e.g. sm_90)")?.clone(),
            other => {
                return Err(format!(
                    "kernels: unknown argument {other:?} (usage: cargo xtask kernels [--arch sm_90])"
                ))
            }
        }
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
    for mut cmd in compile_commands(&arch, None, &dirs, true) {
        util::run(&mut cmd)?;
    }
    Ok(())
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
