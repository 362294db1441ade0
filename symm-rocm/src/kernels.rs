//! HIP kernels: sources embedded from `symm-rocm/kernels/`, compiled with
//! hiprtc for the device's gfx architecture at first use, cached in memory and
//! on disk through `symm_core::kernel_cache` (the one cache of every backend:
//! `$SYMM_KERNEL_CACHE`, else `~/.cache/symm/kernels`), keyed by (source,
//! defines, options, architecture, hiprtc version).
//!
//! Every source is compiled as `pad::c_defines() + common.hip.h + defines +
//! source`, so the kernels and [`symm_core::pad`] cannot drift.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use symm_core::{kernel_cache, pad, Error, Result};

use crate::driver::hiprtc;
use crate::driver::runtime::Module;

/// One kernel source file.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File stem ("sync").
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C" __global__` functions it defines.
    pub kernels: &'static [&'static str],
}

/// `kernels/common.hip.h`.
pub const COMMON: &str = include_str!("../kernels/common.hip.h");

/// The sync kernels (barrier, put_signal, wait_signal).
pub const SYNC: KernelSource = KernelSource {
    name: "sync",
    source: include_str!("../kernels/sync.hip"),
    kernels: &["symm_barrier", "symm_put_signal", "symm_wait_signal"],
};

/// The collective kernels (one-shot all-reduce).
pub const COLLECTIVES: KernelSource = KernelSource {
    name: "collectives",
    source: include_str!("../kernels/collectives.hip"),
    kernels: &[
        "symm_one_shot_all_reduce_f32",
        "symm_one_shot_all_reduce_f16",
        "symm_one_shot_all_reduce_bf16",
        "symm_ops_barrier",
    ],
};

/// Every `.hip` file in `symm-rocm/kernels`.
pub fn sources() -> &'static [KernelSource] {
    static ALL: [KernelSource; 2] = [SYNC, COLLECTIVES];
    &ALL
}

/// `pad::c_defines()` followed by `common.hip.h`.
pub fn common_header() -> String {
    format!("{}\n{COMMON}\n", pad::c_defines())
}

/// The complete text hiprtc compiles for `src` with extra `defines`.
pub fn full_source(src: &KernelSource, defines: &str) -> String {
    format!(
        "{}\n{defines}\n// ---- {}.hip ----\n{}",
        common_header(),
        src.name,
        src.source
    )
}

/// "gfx90a:sramecc+:xnack-" -> "gfx90a".
pub fn base_arch(name: &str) -> &str {
    name.split(':').next().unwrap_or(name).trim()
}

/// Compiler options for `arch`.
pub fn options(arch: &str) -> Vec<String> {
    vec![format!("--offload-arch={arch}"), "-O3".into()]
}

/// Whether hiprtc can be loaded.
pub fn hiprtc_available() -> Result<()> {
    hiprtc::get().map(|_| ())
}

/// The disk cache folder (`symm_core::kernel_cache`, shared with symm-cuda: `$SYMM_KERNEL_CACHE`,
/// else `~/.cache/symm/kernels`; `None` when disabled or no home is known).
pub fn cache_dir() -> Option<PathBuf> {
    kernel_cache::dir()
}

fn validate_arch(arch: &str) -> Result<()> {
    let ok = arch.starts_with("gfx") && arch.len() > 3 && arch[3..].chars().all(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("not a gfx architecture: {arch:?}")))
    }
}

type CodeCache = Mutex<HashMap<u128, Arc<Vec<u8>>>>;

/// Compiles `src` (+ `defines`) for `arch` ("gfx90a"); returns the code object.
pub fn compile(src: &KernelSource, defines: &str, arch: &str) -> Result<Arc<Vec<u8>>> {
    validate_arch(arch)?;
    let rtc = hiprtc::get()?;
    let text = full_source(src, defines);
    let opts = options(arch);
    let (maj, min) = rtc.version();
    let version = format!("{maj}.{min} {}", rtc.library);
    let key = kernel_cache::key(&[
        b"symm-rocm-kernels-v1",
        text.as_bytes(),
        opts.join(" ").as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
    ]);

    static MEM: OnceLock<CodeCache> = OnceLock::new();
    let mem = MEM.get_or_init(Default::default);
    if let Some(c) = mem.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let dir = cache_dir();
    let file = dir.as_ref().map(|d| kernel_cache::path(d, src.name, arch, key, "co"));
    let cached = file.as_ref().and_then(|f| kernel_cache::read(f, key));
    let code = match cached {
        Some(c) => c,
        None => {
            let c = rtc.compile(&format!("{}.hip", src.name), &text, &opts)?;
            if let (Some(d), Some(f)) = (&dir, &file) {
                kernel_cache::write(d, f, key, &c);
            }
            c
        }
    };
    let code = Arc::new(code);
    mem.lock().unwrap_or_else(|e| e.into_inner()).insert(key, code.clone());
    Ok(code)
}

/// Compiles every source for `arch`; returns (source name, code bytes).
pub fn compile_all(arch: &str) -> Result<Vec<(&'static str, usize)>> {
    sources()
        .iter()
        .map(|s| compile(s, "", arch).map(|c| (s.name, c.len())))
        .collect()
}

type ModuleCache = Mutex<HashMap<(u32, u128), Arc<Module>>>;

/// Compiles `src` for `device`'s architecture and loads it there (cached per
/// device). The device must be current on this thread.
pub fn load(device: u32, src: &KernelSource, defines: &str) -> Result<Arc<Module>> {
    static MODS: OnceLock<ModuleCache> = OnceLock::new();
    let key = (
        device,
        kernel_cache::key(&[src.name.as_bytes(), src.source.as_bytes(), defines.as_bytes()]),
    );
    let mods = MODS.get_or_init(Default::default);
    if let Some(m) = mods.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(m.clone());
    }
    let arch = crate::driver::runtime::arch_name(device)?;
    let code = compile(src, defines, &arch)?;
    let m = Arc::new(Module::load(&code)?);
    mods.lock().unwrap_or_else(|e| e.into_inner()).insert(key, m.clone());
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        assert_eq!(base_arch("gfx90a:sramecc+:xnack-"), "gfx90a");
        assert_eq!(base_arch("gfx942"), "gfx942");
        assert!(validate_arch("gfx90a").is_ok());
        assert!(validate_arch("sm_90").is_err());
        assert!(validate_arch("gfx90a --evil").is_err());
        assert!(options("gfx90a").contains(&"--offload-arch=gfx90a".to_string()));
    }
}
