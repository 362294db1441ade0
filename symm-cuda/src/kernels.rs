//! Kernel sources, NVRTC compilation and the kernel caches.
//!
//! Every `.cu` file in `symm-cuda/kernels` is embedded ([`sources`]), with the
//! collectives, whose one source for both vendors is symm-core's
//! (`symm_core::kernel_source`), and compiled at first use for the device's
//! architecture (`sm_{major}{minor}`) as `common_header() + defines + source`,
//! where [`common_header`] is the pad `#define`s, this crate's vendor header
//! `kernels/vendor.cuh` (the CUDA primitives: PTX atomics and memory orders,
//! `%globaltimer`, PDL, warp shuffles, vector loads and stores, f16 / bf16
//! conversions) and symm-core's `common.cuh`. What NVRTC makes is cached:
//! - on disk through `symm_core::kernel_cache` (the one cache of every
//!   backend: `$SYMM_KERNEL_CACHE` or `~/.cache/symm/kernels`), two files per
//!   (full source text, defines, arch, NVRTC version, options), named by a
//!   128-bit FNV-1a hash of all of them and written atomically: the PTX, and the
//!   CUBIN for the device's architecture, which [`load`] loads (no driver JIT; the
//!   PTX where the driver refuses it); set `SYMM_KERNEL_CACHE=off` to disable it;
//! - in memory: the PTX and CUBIN per key, and loaded modules per (context, key).
//!
//! [`compile_all`] compiles every file without any cache; `cargo xtask
//! kernels` runs it on CPU-only CI (NVRTC from the `nvidia-cuda-nvrtc` wheel).

#![forbid(unsafe_code)]

use symm_core::{kernel_cache, kernel_source};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;
use symm_core::{Error, Result};

use crate::driver;

/// One embedded kernel file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// File stem (`sync` for `kernels/sync.cu`).
    pub name: &'static str,
    /// The file's text.
    pub source: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// symm-core's `kernels/common.cuh` (`symm_core::kernel_source::COMMON`): the device helpers
/// of every kernel file, shared with symm-rocm.
pub const COMMON_CUH: &str = kernel_source::COMMON;

/// `kernels/vendor.cuh`: the CUDA definitions of the primitives the shared kernel text uses.
pub const VENDOR_CUH: &str = include_str!("../kernels/vendor.cuh");

/// NVRTC options besides `--gpu-architecture` and `--std=c++17` (part of the
/// cache key).
const EXTRA_OPTIONS: &[&str] = &[];

/// Every `.cu` file in `symm-cuda/kernels` and symm-core's `collectives` (sorted by name).
pub fn sources() -> &'static [KernelSource] {
    SOURCES
}

/// The embedded file named `name` (stem, e.g. `"sync"`).
pub fn source(name: &str) -> Result<&'static KernelSource> {
    SOURCES
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Error::InvalidArgument(format!("no kernel file named {name:?}")))
}

/// `symm_core::pad::c_defines()`, `kernels/vendor.cuh`, then symm-core's `kernels/common.cuh`.
pub fn common_header() -> String {
    format!(
        "{}#line 1 \"vendor.cuh\"\n{}\n#line 1 \"common.cuh\"\n{}\n",
        symm_core::pad::c_defines(),
        VENDOR_CUH,
        COMMON_CUH
    )
}

/// The full text NVRTC compiles for `src` with `defines`: [`common_header`], the defines, then
/// the file, whose `#include "name.cuh"` lines are replaced by symm-core's embedded headers
/// (`kernel_source::expand_includes`; NVRTC is given no include path).
pub fn full_source(src: &KernelSource, defines: &str) -> String {
    let file = format!("{}.cu", src.name);
    format!(
        "{}\n#line 1 \"<defines>\"\n{}\n#line 1 \"{file}\"\n{}",
        common_header(),
        defines,
        kernel_source::expand_includes(&file, src.source)
    )
}

/// `Ok(())` if libnvrtc can be loaded, else [`Error::Unavailable`] with the reason.
pub fn nvrtc_available() -> Result<()> {
    driver::nvrtc::available()
}

/// `sm_{major}{minor}` of a context's device.
pub fn arch_of(ctx: &CudaContext) -> Result<String> {
    let (major, minor) = driver::compute_capability(ctx.cu_device())?;
    Ok(format!("sm_{major}{minor}"))
}

fn cache_key(full: &str, arch: &str) -> Result<u128> {
    let (maj, min) = driver::nvrtc::version()?;
    let version = format!("nvrtc {maj}.{min}");
    let opts = EXTRA_OPTIONS.join(" ");
    Ok(kernel_cache::key(&[
        b"symm-kernels-v1",
        full.as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
        opts.as_bytes(),
    ]))
}

/// The disk cache folder (`symm_core::kernel_cache`: `$SYMM_KERNEL_CACHE`, else
/// `~/.cache/symm/kernels`); `None` when disabled (`SYMM_KERNEL_CACHE=off`) or no home is known.
pub fn cache_dir() -> Option<PathBuf> {
    kernel_cache::dir()
}

/// What one NVRTC run left for a key, kept for the process: each context's load and every
/// PTX check reuse it, so nothing compiles twice even with the disk cache off or unwritable.
#[derive(Default)]
struct Artefacts {
    ptx: Option<Arc<str>>,
    cubin: Option<Arc<[u8]>>,
}

fn memory_cache() -> &'static Mutex<HashMap<u128, Artefacts>> {
    static M: OnceLock<Mutex<HashMap<u128, Artefacts>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn remembered<T>(key: u128, pick: impl FnOnce(&Artefacts) -> Option<T>) -> Option<T> {
    memory_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .and_then(pick)
}

fn remember(key: u128, fill: impl FnOnce(&mut Artefacts)) {
    fill(
        memory_cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default(),
    )
}

/// Runs NVRTC on `full` and keeps its PTX and CUBIN under `key`: in memory, and in the disk
/// cache when there is one.
fn compile_and_store(src: &KernelSource, full: &str, arch: &str, key: u128) -> Result<(Arc<str>, Arc<[u8]>)> {
    let extra: Vec<String> = EXTRA_OPTIONS.iter().map(|s| s.to_string()).collect();
    let c = driver::nvrtc::compile(src.name, full, arch, &extra)?;
    if let Some(d) = cache_dir() {
        kernel_cache::write(
            &d,
            &kernel_cache::path(&d, src.name, arch, key, "ptx"),
            key,
            c.ptx.as_bytes(),
        );
        kernel_cache::write(&d, &kernel_cache::path(&d, src.name, arch, key, "cubin"), key, &c.cubin);
    }
    let (ptx, cubin): (Arc<str>, Arc<[u8]>) = (c.ptx.into(), c.cubin.into());
    remember(key, |a| {
        a.ptx = Some(ptx.clone());
        a.cubin = Some(cubin.clone());
    });
    Ok((ptx, cubin))
}

fn compile_keyed(src: &KernelSource, defines: &str, arch: &str) -> Result<(u128, Arc<str>)> {
    nvrtc_available()?;
    let full = full_source(src, defines);
    let key = cache_key(&full, arch)?;
    if let Some(p) = remembered(key, |a| a.ptx.clone()) {
        return Ok((key, p));
    }
    let cached = cache_dir()
        .and_then(|d| kernel_cache::read(&kernel_cache::path(&d, src.name, arch, key, "ptx"), key))
        .and_then(|b| String::from_utf8(b).ok());
    let ptx: Arc<str> = match cached {
        Some(p) => {
            let p: Arc<str> = p.into();
            remember(key, |a| a.ptx = Some(p.clone()));
            p
        }
        None => compile_and_store(src, &full, arch, key)?.0,
    };
    Ok((key, ptx))
}

/// The CUBIN of `src` (full text `full`, cache key `key`) for `arch` (the device's own
/// architecture), through the memory and disk caches: NVRTC's machine code, which a module
/// loads without the driver's JIT (for the collectives' tens of MB of PTX that JIT takes a
/// minute in every fresh process on a machine whose driver cache is cold).
fn cubin_keyed(src: &KernelSource, full: &str, arch: &str, key: u128) -> Result<Arc<[u8]>> {
    if let Some(c) = remembered(key, |a| a.cubin.clone()) {
        return Ok(c);
    }
    let cached =
        cache_dir().and_then(|d| kernel_cache::read(&kernel_cache::path(&d, src.name, arch, key, "cubin"), key));
    match cached {
        Some(c) => {
            let c: Arc<[u8]> = c.into();
            remember(key, |a| a.cubin = Some(c.clone()));
            Ok(c)
        }
        None => Ok(compile_and_store(src, full, arch, key)?.1),
    }
}

/// NVRTC-compiles `src` (prefixed with [`common_header`] and `defines`) for
/// `arch` (e.g. `"sm_90"`), through the disk and memory caches.
pub fn compile(src: &KernelSource, defines: &str, arch: &str) -> Result<String> {
    compile_keyed(src, defines, arch).map(|(_, p)| p.to_string())
}

/// As [`compile`], and the disk cache then also holds the CUBIN a module loads ([`load`]): what
/// `cargo xtask gpu-bundle` puts into the bundle's cache.
pub fn compile_for_load(src: &KernelSource, defines: &str, arch: &str) -> Result<usize> {
    let full = full_source(src, defines);
    let key = cache_key(&full, arch)?;
    Ok(compile(src, defines, arch)?.len() + cubin_keyed(src, &full, arch, key)?.len())
}

/// Compiles without any cache (what CI wants: every call runs NVRTC); the PTX.
pub fn compile_uncached(src: &KernelSource, defines: &str, arch: &str) -> Result<String> {
    let extra: Vec<String> = EXTRA_OPTIONS.iter().map(|s| s.to_string()).collect();
    Ok(driver::nvrtc::compile(src.name, &full_source(src, defines), arch, &extra)?.ptx)
}

/// Compiles every embedded kernel file (no defines, no cache) for `arch`;
/// returns `(file name, PTX length)` per file. Used by `cargo xtask kernels`.
pub fn compile_all(arch: &str) -> Result<Vec<(String, usize)>> {
    nvrtc_available()?;
    SOURCES
        .iter()
        .map(|s| compile_uncached(s, "", arch).map(|ptx| (s.name.to_string(), ptx.len())))
        .collect()
}

/// The defines the library compiles `src` with at run time: for the collectives, NOTE
/// [device-trace]'s `SYMM_TRACE` when `SYMM_TRACE=1`; nothing otherwise.
pub fn defines_for(src: &KernelSource) -> &'static str {
    if src.name == "collectives" {
        crate::trace::defines()
    } else {
        ""
    }
}

/// Compiles `src` for `ctx`'s device and loads it into `ctx` (cached per
/// context and key, so repeated calls are cheap). The module is loaded from NVRTC's CUBIN
/// (no JIT); where the driver refuses it (a driver older than NVRTC), from the PTX.
pub fn load(ctx: &Arc<CudaContext>, src: &KernelSource, defines: &str) -> Result<Arc<CudaModule>> {
    type Modules = Mutex<HashMap<(usize, u128), Arc<CudaModule>>>;
    static MODULES: OnceLock<Modules> = OnceLock::new();
    driver::bind(ctx)?;
    let arch = arch_of(ctx)?;
    nvrtc_available()?;
    let full = full_source(src, defines);
    let key = cache_key(&full, &arch)?;
    let ctx_id = ctx.cu_ctx() as usize;
    let modules = MODULES.get_or_init(Default::default);
    if let Some(m) = modules.lock().unwrap_or_else(|e| e.into_inner()).get(&(ctx_id, key)) {
        return Ok(m.clone());
    }
    let cubin = cubin_keyed(src, &full, &arch, key)?;
    let m = match ctx.load_module(Ptx::from_binary(cubin.to_vec())) {
        Ok(m) => m,
        Err(e) => {
            log::warn!(
                "symm-cuda: the driver refused the CUBIN of {} ({e}); loading its PTX (JIT)",
                src.name
            );
            let (_, ptx) = compile_keyed(src, defines, &arch)?;
            ctx.load_module(Ptx::from_src(ptx.to_string()))
                .map_err(|e| driver::from_driver(e, &format!("cuModuleLoadData({})", src.name)))?
        }
    };
    Ok(modules
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((ctx_id, key))
        .or_insert(m)
        .clone())
}

/// Parameter sizes (bytes) of `.entry name(...)` in `ptx`, or None if the entry is missing.
#[cfg(test)]
pub(crate) fn ptx_param_sizes(ptx: &str, name: &str) -> Option<Vec<usize>> {
    let start = ptx.find(&format!(".entry {name}("))?;
    let rest = &ptx[start..];
    let end = rest.find(')')?;
    Some(
        rest[..end]
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let ty = l.strip_prefix(".param .")?;
                let ty = ty.split_whitespace().next()?;
                Some(match &ty[1..] {
                    "64" => 8,
                    "32" => 4,
                    "16" => 2,
                    "8" => 1,
                    _ => 0,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `#define` of the generated layout appears verbatim in the hand
    /// copy in common.cuh, and the hand copy defines nothing else of the layout.
    #[test]
    fn common_cuh_defines_match_pad() {
        let defines = symm_core::pad::c_defines();
        let generated: Vec<&str> = defines.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        assert!(generated.len() >= 15, "c_defines() lost lines: {generated:?}");
        let hand: Vec<&str> = COMMON_CUH
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("#define SYMM_") && !l.starts_with("#define SYMM_CHECK_EVERY"))
            .filter(|l| !l.starts_with("#define SYMM_ABORT_EVERY"))
            .collect();
        for g in &generated {
            assert!(
                hand.contains(g),
                "common.cuh lacks `{g}` (symm-core/src/pad.rs changed?)"
            );
        }
        for h in &hand {
            assert!(
                generated.contains(h),
                "common.cuh has `{h}`, which pad.rs does not generate"
            );
        }
        // A few values spelled out, so a change in both places is noticed too.
        assert!(hand.contains(&format!("#define SYMM_ERROR_WORD {}", symm_core::pad::ERROR_WORD).as_str()));
        assert!(hand.contains(&format!("#define SYMM_SIGNAL_PAD_SIZE {}", symm_core::pad::SIGNAL_PAD_SIZE).as_str()));
    }

    #[test]
    fn sources_are_embedded() {
        let names: Vec<&str> = sources().iter().map(|s| s.name).collect();
        assert!(names.contains(&"sync"), "{names:?}");
        let sync = source("sync").unwrap();
        for k in ["symm_barrier", "symm_put_signal", "symm_wait_signal"] {
            assert!(sync.source.contains(&format!("void {k}(")), "{k} missing");
        }
        assert!(source("nope").is_err());
        // Code (comments stripped) never traps and never uses multicast.
        let code = |text: &str| -> String {
            text.lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n")
        };
        for (name, text) in sources()
            .iter()
            .map(|s| (s.name, s.source))
            .chain([("common.cuh", COMMON_CUH), ("vendor.cuh", VENDOR_CUH)])
            .chain(kernel_source::HEADERS.iter().map(|h| (h.file, h.text)))
        {
            let c = code(text);
            for banned in ["__trap", "trap;", "multimem", "cuMulticast", "nvls"] {
                assert!(!c.contains(banned), "{name} uses {banned}");
            }
        }
    }

    /// Compiles every kernel file when NVRTC is present; skips (printing why)
    /// otherwise, and fails then if SYMM_REQUIRE_NVRTC=1.
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        if let Err(e) = nvrtc_available() {
            assert!(!crate::knobs::require_nvrtc(), "SYMM_REQUIRE_NVRTC=1 but {e}");
            println!("SKIP every_kernel_compiles_with_nvrtc: {e}");
            return;
        }
        let (maj, min) = driver::nvrtc::version().unwrap();
        for arch in ["sm_90"] {
            let out = compile_all(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(out.len(), sources().len());
            for (name, len) in &out {
                assert!(*len > 0, "{name} gave empty PTX");
                println!("compiled {name}.cu for {arch} with NVRTC {maj}.{min}: {len} bytes of PTX");
            }
        }
        let ptx = compile_uncached(source("sync").unwrap(), "", "sm_90").unwrap();
        for k in ["symm_barrier", "symm_put_signal", "symm_wait_signal"] {
            assert!(ptx.contains(&format!(".entry {k}(")), "{k} not in PTX");
        }
        assert!(ptx.contains("ld.acquire.sys"), "acquire loads missing");
        assert!(ptx.contains("st.release.sys"), "release stores missing");
        assert!(ptx.contains("%globaltimer"), "deadline timer missing");
        assert!(!ptx.contains("trap;"), "kernels must never trap");
        // A broken kernel is an error with NVRTC's log, not a panic.
        let broken = KernelSource {
            name: "broken",
            source: "extern \"C\" __global__ void k() { this is not cuda; }",
        };
        match compile_uncached(&broken, "", "sm_90") {
            Err(Error::Backend { detail, .. }) => assert!(detail.contains("error"), "{detail}"),
            other => panic!("broken kernel gave {other:?}"),
        }
        // Defines reach the source.
        let with_def = KernelSource {
            name: "defs",
            source: "#ifndef MY_DEF\n#error MY_DEF missing\n#endif\nextern \"C\" __global__ void k() {}",
        };
        assert!(compile_uncached(&with_def, "", "sm_90").is_err());
        assert!(compile_uncached(&with_def, "#define MY_DEF 1", "sm_90").is_ok());
        assert!(compile_uncached(&with_def, "", "bogus").is_err());
    }

    /// The collectives' PTX holds exactly the entries symm-core lists for every vendor
    /// (`kernel_source::COLLECTIVE_ENTRIES`; symm-rocm's tests compare hiprtc's code objects with
    /// the same list).
    #[test]
    fn collectives_build_the_shared_entry_list() {
        let src = source("collectives").unwrap();
        assert_eq!(src.source, kernel_source::COLLECTIVES);
        if let Err(e) = nvrtc_available() {
            assert!(!crate::knobs::require_nvrtc(), "SYMM_REQUIRE_NVRTC=1 but {e}");
            println!("SKIP collectives_build_the_shared_entry_list: {e}");
            return;
        }
        let ptx = compile(src, "", "sm_90").unwrap_or_else(|e| panic!("collectives: {e}"));
        let built: std::collections::BTreeSet<&str> = ptx
            .match_indices(".entry ")
            .map(|(i, _)| ptx[i + ".entry ".len()..].split('(').next().unwrap_or("").trim())
            .collect();
        let listed: std::collections::BTreeSet<&str> = kernel_source::COLLECTIVE_ENTRIES.iter().copied().collect();
        assert_eq!(
            built, listed,
            "NVRTC's entries differ from kernel_source::COLLECTIVE_ENTRIES"
        );
    }

    #[test]
    fn disk_cache_is_used_when_nvrtc_present() {
        if let Err(e) = nvrtc_available() {
            println!("SKIP disk_cache_is_used_when_nvrtc_present: {e}");
            return;
        }
        // compile() goes through the memory cache first; a fresh define makes
        // the key new, so this call compiles and writes the disk file.
        let src = source("sync").unwrap();
        let defines = format!("#define SYMM_TEST_NONCE {}", std::process::id());
        let a = compile(src, &defines, "sm_90").unwrap();
        let b = compile(src, &defines, "sm_90").unwrap();
        assert_eq!(a, b);
        if let Some(dir) = cache_dir() {
            let key = cache_key(&full_source(src, &defines), "sm_90").unwrap();
            let path = kernel_cache::path(&dir, "sync", "sm_90", key, "ptx");
            if let Some(cached) = kernel_cache::read(&path, key) {
                assert_eq!(cached, a.as_bytes());
                let _ = std::fs::remove_file(&path);
            } else {
                println!("note: kernel disk cache {} not writable here", dir.display());
            }
        }
    }
}
