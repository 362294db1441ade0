//! Kernel sources, NVRTC compilation and the kernel caches.
//!
//! Every `.cu` file in `symm-cuda/kernels` is embedded ([`sources`]) and
//! compiled at first use for the device's architecture (`sm_{major}{minor}`)
//! as `common_header() + defines + source`. Compiled PTX is cached:
//! - on disk under `$SYMM_KERNEL_CACHE` (or `~/.cache/symm/kernels`), one
//!   file per (full source text, defines, arch, NVRTC version, options),
//!   named by a 128-bit FNV-1a hash of all of them and written atomically
//!   (temp file + rename); set `SYMM_KERNEL_CACHE=off` to disable it;
//! - in memory per (context, key), as loaded modules.
//!
//! [`compile_all`] compiles every file without any cache; `cargo xtask
//! kernels` runs it on CPU-only CI (NVRTC from the `nvidia-cuda-nvrtc` wheel).

#![forbid(unsafe_code)]

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

/// `kernels/common.cuh`.
pub const COMMON_CUH: &str = include_str!("../kernels/common.cuh");

/// NVRTC options besides `--gpu-architecture` and `--std=c++17` (part of the
/// cache key).
const EXTRA_OPTIONS: &[&str] = &[];

/// Every `.cu` file in `symm-cuda/kernels` (sorted by name).
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

/// `symm_core::pad::c_defines()` followed by `kernels/common.cuh`.
pub fn common_header() -> String {
    format!(
        "{}#line 1 \"common.cuh\"\n{}\n",
        symm_core::pad::c_defines(),
        COMMON_CUH
    )
}

/// The full text NVRTC compiles for `src` with `defines`: [`common_header`], the defines, then
/// the file, whose `#include "name.cuh"` lines are replaced by the embedded header `name.cuh`
/// (one level; NVRTC is given no include path).
pub fn full_source(src: &KernelSource, defines: &str) -> String {
    let mut body = String::with_capacity(src.source.len());
    for (i, line) in src.source.lines().enumerate() {
        let header = line
            .trim()
            .strip_prefix("#include \"")
            .and_then(|rest| rest.strip_suffix(".cuh\""))
            .and_then(|stem| HEADERS.iter().find(|h| h.name == stem));
        match header {
            Some(h) => {
                body.push_str(&format!("#line 1 \"{}.cuh\"\n{}\n", h.name, h.source));
                body.push_str(&format!("#line {} \"{}.cu\"\n", i + 2, src.name));
            }
            None => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    format!(
        "{}\n#line 1 \"<defines>\"\n{}\n#line 1 \"{}.cu\"\n{}",
        common_header(),
        defines,
        src.name,
        body
    )
}

/// Every embedded `.cuh` header a kernel file may include (not `common.cuh`).
pub fn headers() -> &'static [KernelSource] {
    HEADERS
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

/// 128-bit FNV-1a (stable across Rust versions, unlike `DefaultHasher`).
fn fnv1a128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    let mut h = OFFSET;
    for part in parts {
        // Length-prefix every part so ("ab","c") and ("a","bc") differ.
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

fn cache_key(full: &str, arch: &str) -> Result<u128> {
    let (maj, min) = driver::nvrtc::version()?;
    let version = format!("nvrtc {maj}.{min}");
    let opts = EXTRA_OPTIONS.join(" ");
    Ok(fnv1a128(&[
        b"symm-kernels-v1",
        full.as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
        opts.as_bytes(),
    ]))
}

/// The disk cache folder: `$SYMM_KERNEL_CACHE`, else `~/.cache/symm/kernels`;
/// `None` when disabled (`SYMM_KERNEL_CACHE=off`) or no home is known.
pub fn cache_dir() -> Option<PathBuf> {
    crate::knobs::kernel_cache()
}

fn cache_path(dir: &std::path::Path, name: &str, arch: &str, key: u128) -> PathBuf {
    dir.join(format!("{name}-{arch}-{key:032x}.ptx"))
}

fn key_line(key: u128) -> String {
    format!("// symm-kernel-cache {key:032x}\n")
}

fn read_cached(path: &std::path::Path, key: u128) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let body = text.strip_prefix(&key_line(key))?;
    (!body.is_empty()).then(|| body.to_string())
}

fn write_cached(dir: &std::path::Path, path: &std::path::Path, key: u128, ptx: &str) {
    // Best effort: a cache that cannot be written only costs a recompile.
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".tmp-{}-{nanos}-{key:032x}", std::process::id()));
    let text = format!("{}{ptx}", key_line(key));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn ptx_memory_cache() -> &'static Mutex<HashMap<u128, Arc<str>>> {
    static PTX: OnceLock<Mutex<HashMap<u128, Arc<str>>>> = OnceLock::new();
    PTX.get_or_init(Default::default)
}

fn compile_keyed(src: &KernelSource, defines: &str, arch: &str) -> Result<(u128, Arc<str>)> {
    nvrtc_available()?;
    let full = full_source(src, defines);
    let key = cache_key(&full, arch)?;
    if let Some(p) = ptx_memory_cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok((key, p.clone()));
    }
    let dir = cache_dir();
    let cached = dir
        .as_ref()
        .and_then(|d| read_cached(&cache_path(d, src.name, arch, key), key));
    let ptx: Arc<str> = match cached {
        Some(p) => p.into(),
        None => {
            let extra: Vec<String> = EXTRA_OPTIONS.iter().map(|s| s.to_string()).collect();
            let p = driver::nvrtc::compile(src.name, &full, arch, &extra)?;
            if let Some(d) = &dir {
                write_cached(d, &cache_path(d, src.name, arch, key), key, &p);
            }
            p.into()
        }
    };
    ptx_memory_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ptx.clone());
    Ok((key, ptx))
}

/// NVRTC-compiles `src` (prefixed with [`common_header`] and `defines`) for
/// `arch` (e.g. `"sm_90"`), through the disk and memory caches.
pub fn compile(src: &KernelSource, defines: &str, arch: &str) -> Result<String> {
    compile_keyed(src, defines, arch).map(|(_, p)| p.to_string())
}

/// Compiles without any cache (what CI wants: every call runs NVRTC).
pub fn compile_uncached(src: &KernelSource, defines: &str, arch: &str) -> Result<String> {
    let extra: Vec<String> = EXTRA_OPTIONS.iter().map(|s| s.to_string()).collect();
    driver::nvrtc::compile(src.name, &full_source(src, defines), arch, &extra)
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

/// Compiles `src` for `ctx`'s device and loads it into `ctx` (cached per
/// context and key, so repeated calls are cheap).
pub fn load(ctx: &Arc<CudaContext>, src: &KernelSource, defines: &str) -> Result<Arc<CudaModule>> {
    type Modules = Mutex<HashMap<(usize, u128), Arc<CudaModule>>>;
    static MODULES: OnceLock<Modules> = OnceLock::new();
    driver::bind(ctx)?;
    let arch = arch_of(ctx)?;
    let (key, ptx) = compile_keyed(src, defines, &arch)?;
    let ctx_id = ctx.cu_ctx() as usize;
    let modules = MODULES.get_or_init(Default::default);
    if let Some(m) = modules.lock().unwrap_or_else(|e| e.into_inner()).get(&(ctx_id, key)) {
        return Ok(m.clone());
    }
    let m = ctx
        .load_module(Ptx::from_src(ptx.to_string()))
        .map_err(|e| driver::from_driver(e, &format!("cuModuleLoadData({})", src.name)))?;
    Ok(modules
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((ctx_id, key))
        .or_insert(m)
        .clone())
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
            .chain([("common.cuh", COMMON_CUH)])
        {
            let c = code(text);
            for banned in ["__trap", "trap;", "multimem", "cuMulticast", "nvls"] {
                assert!(!c.contains(banned), "{name} uses {banned}");
            }
        }
    }

    #[test]
    fn hash_is_stable_and_length_prefixed() {
        assert_eq!(fnv1a128(&[b"ab", b"c"]), fnv1a128(&[b"ab", b"c"]));
        assert_ne!(fnv1a128(&[b"ab", b"c"]), fnv1a128(&[b"a", b"bc"]));
        // Pinned value: a change of the hash invalidates every disk cache.
        assert_eq!(fnv1a128(&[]), 0x6c62272e07bb014262b821756295c58d);
    }

    #[test]
    fn cache_files_round_trip() {
        let dir = std::env::temp_dir().join(format!("symm-kcache-test-{}", std::process::id()));
        let path = cache_path(&dir, "sync", "sm_90", 42);
        write_cached(&dir, &path, 42, ".version 9.0\n");
        assert_eq!(read_cached(&path, 42).as_deref(), Some(".version 9.0\n"));
        assert_eq!(read_cached(&path, 43), None, "wrong key must miss");
        let _ = std::fs::remove_dir_all(&dir);
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
            let path = cache_path(&dir, "sync", "sm_90", key);
            if let Some(cached) = read_cached(&path, key) {
                assert_eq!(cached, a);
                let _ = std::fs::remove_file(&path);
            } else {
                println!("note: kernel disk cache {} not writable here", dir.display());
            }
        }
    }
}
