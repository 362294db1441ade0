//! `cargo xtask kernels`: NVRTC-compiles every CUDA kernel for sm_90.
//!
//! The compile itself is symm-cuda's `kernels::compile_all(arch)`, called from
//! the `nvrtc_compile_all` example of symm-cuda so xtask stays free of CUDA
//! dependencies. This module finds libnvrtc (LD_LIBRARY_PATH, pip's
//! `site-packages/nvidia/cu13/lib`, /usr/local/cuda/lib64) and hands its folder
//! to the child through LD_LIBRARY_PATH.

use std::path::PathBuf;

use crate::util::{self, Result};

pub const EXAMPLE: &str = "nvrtc_compile_all";
pub const DEFAULT_ARCH: &str = "sm_90";

/// Folders holding libnvrtc, or a clear error saying how to get it.
pub fn nvrtc_dirs() -> Result<Vec<PathBuf>> {
    let dirs = util::find_lib_dirs("libnvrtc");
    if dirs.is_empty() {
        return Err(
            "libnvrtc not found (looked in LD_LIBRARY_PATH, python's site-packages/nvidia/*/lib and \
             /usr/local/cuda/lib64); install it with `python3 -m pip install \"nvidia-cuda-nvrtc==13.0.*\"` \
             or put its folder on LD_LIBRARY_PATH"
                .into(),
        );
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
    util::run(
        util::cargo()
            .args(["run", "--quiet", "-p", "symm-cuda", "--example", EXAMPLE, "--", &arch])
            .env("LD_LIBRARY_PATH", util::prepend_path("LD_LIBRARY_PATH", &dirs)),
    )
}
