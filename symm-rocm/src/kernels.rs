//! HIP kernels, compiled with hiprtc for the device's gfx architecture at first use, cached in
//! memory and on disk through `symm_core::kernel_cache` (the one cache of every backend:
//! `$SYMM_KERNEL_CACHE`, else `~/.cache/symm/kernels`), keyed by (source, defines, options,
//! architecture, hiprtc version).
//!
//! Every source is symm-core's, shared with symm-cuda (`symm_core::kernel_source`): the pad sync
//! kernels ([`SYNC`]: barrier, put_signal, wait_signal) and the collectives ([`COLLECTIVES`]).
//! Each is compiled as `pad::c_defines() + defines + kernels/vendor.hip.h + symm-core's
//! common.cuh + source` with its `#include`s expanded ([`full_source`]), as symm-cuda compiles
//! it with NVRTC and its own vendor header, except that the caller's defines come before the
//! vendor header, so they can set its `#ifndef` defaults (the wall clock's rate,
//! [`clock_defines`]). `kernels/vendor.hip.h` is the only kernel text of this crate: the AMD
//! definitions of the primitives the shared text uses. The pad layout comes from
//! [`symm_core::pad`], so the kernels cannot drift from it.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use symm_core::{kernel_cache, kernel_source, pad, Error, Result};

use crate::driver::hiprtc;
use crate::driver::runtime::Module;

/// One kernel source file (symm-core's text).
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File stem ("sync"): the text is `symm-core/kernels/<name>.cu`.
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C" __global__` functions it defines.
    pub kernels: &'static [&'static str],
}

/// `kernels/vendor.hip.h`: the AMD definitions of the primitives the shared kernel text uses.
pub const VENDOR: &str = include_str!("../kernels/vendor.hip.h");

/// The sync kernels (barrier, put_signal, wait_signal): symm-core's shared source, the entries
/// `symm_core::kernel_source::SYNC_ENTRIES`.
pub const SYNC: KernelSource = KernelSource {
    name: "sync",
    source: kernel_source::SYNC,
    kernels: kernel_source::SYNC_ENTRIES,
};

/// The collective kernels: symm-core's shared source (Lamport one-shot, ring, reduction from
/// pointers, fused pull, subset barrier, fused epilogues), the entries
/// `symm_core::kernel_source::COLLECTIVE_ENTRIES`.
pub const COLLECTIVES: KernelSource = KernelSource {
    name: "collectives",
    source: kernel_source::COLLECTIVES,
    kernels: kernel_source::COLLECTIVE_ENTRIES,
};

/// Every kernel source symm-rocm compiles (all of them symm-core's).
pub fn sources() -> &'static [KernelSource] {
    static ALL: [KernelSource; 2] = [SYNC, COLLECTIVES];
    &ALL
}

/// `pad::c_defines()`, `defines`, `vendor.hip.h`, then symm-core's `common.cuh`.
fn prelude(defines: &str) -> String {
    format!(
        "{}#line 1 \"<defines>\"\n{defines}\n#line 1 \"vendor.hip.h\"\n{VENDOR}\n#line 1 \"common.cuh\"\n{}\n",
        pad::c_defines(),
        kernel_source::COMMON
    )
}

/// The prelude of every source without extra defines: `pad::c_defines()`, `vendor.hip.h`, then
/// symm-core's `common.cuh` (as symm-cuda's `common_header` with its own vendor header).
pub fn shared_header() -> String {
    prelude("")
}

/// The complete text hiprtc compiles for `src` with extra `defines`: `pad::c_defines()`, the
/// defines (before `vendor.hip.h`, whose `#ifndef` defaults such as `SYMM_WALL_CLOCK_KHZ` they
/// may set; a define after it could no longer change the functions it defines), `vendor.hip.h`,
/// `common.cuh`, then the source with its `#include`s expanded.
pub fn full_source(src: &KernelSource, defines: &str) -> String {
    let file = format!("{}.cu", src.name);
    format!(
        "{}\n#line 1 \"{file}\"\n{}",
        prelude(defines),
        kernel_source::expand_includes(&file, src.source)
    )
}

/// The rate `vendor.hip.h` assumes for `wall_clock64()` when no define says otherwise, in Hz
/// (its `SYMM_WALL_CLOCK_KHZ` default: 100 MHz on MI100, MI200 and MI300).
pub const DEFAULT_WALL_CLOCK_HZ: u64 = 100_000_000;

/// The defines that set the device wall clock's rate from `SYMM_ROCM_WALL_CLOCK_HZ`
/// ([`wall_clock_defines`]); pass them to [`load`] for every source.
pub fn clock_defines() -> Result<String> {
    wall_clock_defines(crate::knobs::get(crate::knobs::WALL_CLOCK_HZ))
}

/// `""` for `None` (`vendor.hip.h`'s default rate, [`DEFAULT_WALL_CLOCK_HZ`]), else
/// `#define SYMM_WALL_CLOCK_KHZ <kHz>ull`: the kernels turn `wall_clock64()` ticks into the
/// nanoseconds of their deadlines with it. The rate must be a positive multiple of 1000 Hz whose
/// kHz value divides 1 GHz (`vendor.hip.h` static_asserts the latter), else
/// `Error::InvalidArgument`.
pub fn wall_clock_defines(hz: Option<&str>) -> Result<String> {
    let Some(text) = hz else {
        return Ok(String::new());
    };
    let bad = |why: &str| {
        Error::InvalidArgument(format!(
            "{}={text:?}: {why} (the device wall clock's rate in Hz, e.g. {DEFAULT_WALL_CLOCK_HZ})",
            crate::knobs::WALL_CLOCK_HZ
        ))
    };
    let hz: u64 = text.trim().parse().map_err(|_| bad("not an integer"))?;
    if hz == 0 || !hz.is_multiple_of(1000) {
        return Err(bad("not a positive multiple of 1000 Hz"));
    }
    let khz = hz / 1000;
    if 1_000_000 % khz != 0 {
        return Err(bad("its kHz value does not divide 1 GHz (whole nanoseconds per tick)"));
    }
    Ok(format!("#define SYMM_WALL_CLOCK_KHZ {khz}ull\n"))
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

/// The oldest ROCm whose hiprtc compiles for `arch`, where older ones do not: MI300
/// (gfx940-gfx942) came with ROCm 6.0. Older hiprtcs (Debian bookworm's ROCm 5.2, whose comgr
/// is LLVM 15) do not return an error for it: they crash the process, hence this check.
pub fn min_hiprtc_for(arch: &str) -> Option<(i32, i32)> {
    arch.starts_with("gfx94").then_some((6, 0))
}

/// (major, minor) of the HIP runtime (`hipRuntimeGetVersion`; hiprtc's own `hiprtcVersion`
/// does not tell: ROCm 5.2's says 9.0). (0, 0) when it cannot be read.
pub fn rocm_version() -> (i32, i32) {
    crate::driver::runtime::runtime_version().map_or((0, 0), |v| (v / 10_000_000, (v / 100_000) % 100))
}

fn check_hiprtc_knows(arch: &str, rocm: (i32, i32)) -> Result<()> {
    match min_hiprtc_for(arch) {
        Some(need) if rocm < need => Err(Error::Unavailable(format!(
            "the hiprtc of ROCm {}.{} cannot compile for {arch} (needs ROCm {}.{} or newer)",
            rocm.0, rocm.1, need.0, need.1
        ))),
        _ => Ok(()),
    }
}

type CodeCache = Mutex<HashMap<u128, Arc<Vec<u8>>>>;

/// Compiles `src` (+ `defines`) for `arch` ("gfx90a"); returns the code object.
pub fn compile(src: &KernelSource, defines: &str, arch: &str) -> Result<Arc<Vec<u8>>> {
    validate_arch(arch)?;
    let rtc = hiprtc::get()?;
    check_hiprtc_knows(arch, rocm_version())?;
    let (maj, min) = rtc.version();
    let text = full_source(src, defines);
    let opts = options(arch);
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
        assert!(check_hiprtc_knows("gfx942", (5, 2)).is_err());
        assert!(check_hiprtc_knows("gfx942", (6, 0)).is_ok());
        assert!(check_hiprtc_knows("gfx90a", (5, 2)).is_ok());
    }

    #[test]
    fn wall_clock_rates_become_defines() {
        assert_eq!(wall_clock_defines(None).unwrap(), "");
        assert_eq!(
            wall_clock_defines(Some("100000000")).unwrap(),
            "#define SYMM_WALL_CLOCK_KHZ 100000ull\n"
        );
        assert_eq!(
            wall_clock_defines(Some(" 25000000 ")).unwrap(),
            "#define SYMM_WALL_CLOCK_KHZ 25000ull\n"
        );
        assert_eq!(
            wall_clock_defines(Some("1000000000")).unwrap(),
            "#define SYMM_WALL_CLOCK_KHZ 1000000ull\n"
        );
        for bad in ["", "fast", "-1", "0", "100000500", "3000000", "2000000000"] {
            assert!(
                matches!(wall_clock_defines(Some(bad)), Err(Error::InvalidArgument(_))),
                "{bad:?} accepted"
            );
        }
    }
}
