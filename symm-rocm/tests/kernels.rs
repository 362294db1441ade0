//! Kernel sources: every one symm-core's shared text (symm_core::kernel_source, the sources
//! symm-cuda compiles), consistent with symm_core::pad, and compiled by hiprtc for real gfx
//! targets (no GPU needed: hiprtc compiles offline) into code objects holding their entries.

use std::collections::BTreeSet;

use symm_core::kernel_source;
use symm_rocm::kernels::{self, KernelSource};

/// Identifiers starting with `SYMM_` in the code of `text` (`//` comments left out: they name
/// environment knobs and families like `SYMM_ERR_*`).
fn symm_macros(text: &str) -> BTreeSet<String> {
    let code: Vec<&str> = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
    let text = code.join("\n");
    let text = text.as_str();
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("SYMM_") {
        let start = i + pos;
        let boundary = start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        if boundary {
            out.insert(text[start..end].to_string());
        }
        i = end;
    }
    out
}

fn defined(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|l| l.split([' ', '(']).next())
        .map(String::from)
        .collect()
}

/// The `extern "C" __global__` functions a source defines (macro-generated ones included).
fn global_functions(src: &KernelSource) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in src.source.lines() {
        if let Some(rest) = l.split("extern \"C\" __global__ void ").nth(1) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != "NAME" {
                out.insert(name);
            }
        }
    }
    out
}

/// The kernel descriptors (`NAME.kd` symbols) of a code object: its entries.
fn code_object_entries(code: &[u8]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, w) in code.windows(4).enumerate() {
        if w != b".kd\0" {
            continue;
        }
        let start = code[..i]
            .iter()
            .rposition(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
            .map_or(0, |p| p + 1);
        if start < i {
            out.insert(String::from_utf8_lossy(&code[start..i]).into_owned());
        }
    }
    out
}

/// symm-core's entry list of a shared source (`kernel_source::*_ENTRIES`).
fn shared_entries(src: &KernelSource) -> BTreeSet<String> {
    let list = match src.name {
        "sync" => kernel_source::SYNC_ENTRIES,
        "collectives" => kernel_source::COLLECTIVE_ENTRIES,
        other => panic!("{other} is not a shared source"),
    };
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_source_is_a_shared_one() {
    let srcs = kernels::sources();
    let names: Vec<&str> = srcs.iter().map(|s| s.name).collect();
    assert_eq!(names, ["sync", "collectives"]);
    // Each is symm-core's text and entry list, the ones symm-cuda compiles.
    assert_eq!(kernels::SYNC.source, kernel_source::SYNC);
    assert_eq!(kernels::SYNC.kernels, kernel_source::SYNC_ENTRIES);
    assert_eq!(kernels::COLLECTIVES.source, kernel_source::COLLECTIVES);
    assert_eq!(kernels::COLLECTIVES.kernels, kernel_source::COLLECTIVE_ENTRIES);
    for s in srcs {
        assert!(!s.source.trim().is_empty(), "{} is empty", s.name);
        assert_eq!(
            s.kernels.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>(),
            shared_entries(s),
            "{}: not symm-core's entry list",
            s.name
        );
    }
    // sync.cu spells its entries out (no macros): the list is the text's.
    assert_eq!(global_functions(&kernels::SYNC), shared_entries(&kernels::SYNC));
    // No ROCm-only kernel text: the crate's kernels folder holds the vendor header alone.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(on_disk, BTreeSet::from(["vendor.hip.h".to_string()]));
    // Each compiles after the pad defines, vendor.hip.h and common.cuh, its includes expanded.
    for s in srcs {
        let full = kernels::full_source(s, "#define SYMM_PROBE_DEFINE 1");
        let at = |needle: &str| {
            full.find(needle)
                .unwrap_or_else(|| panic!("{}: {needle:?} missing", s.name))
        };
        // The defines precede vendor.hip.h, so they can set its #ifndef defaults.
        let order = [
            at("#define SYMM_ERROR_WORD"),
            at("SYMM_PROBE_DEFINE"),
            at("#ifndef SYMM_WALL_CLOCK_KHZ"),
            at("symm_ld_acquire_sys"),
            at("symm_bounded_wait_code"),
            at(&format!("#line 1 \"{}.cu\"", s.name)),
        ];
        assert!(order.is_sorted(), "{}: {order:?}", s.name);
        assert!(
            !full.lines().any(|l| l.trim_start().starts_with("#include")),
            "{}",
            s.name
        );
        assert!(full.ends_with(&kernel_source::expand_includes(&format!("{}.cu", s.name), s.source)));
    }
    let full = kernels::full_source(&kernels::COLLECTIVES, "");
    for h in kernel_source::HEADERS {
        assert!(full.contains(h.text), "{} not expanded", h.file);
    }
}

#[test]
fn every_pad_macro_comes_from_symm_core() {
    let core = defined(&symm_core::pad::c_defines());
    for name in [
        "SYMM_BARRIER_BASE",
        "SYMM_SIGNAL_BASE",
        "SYMM_OPS_BASE",
        "SYMM_ABORT_WORD",
        "SYMM_ERROR_WORD",
        "SYMM_ERR_TIMEOUT",
        "SYMM_ERR_ABORTED",
    ] {
        assert!(core.contains(name), "c_defines lacks {name}");
    }
    let mut local = defined(kernels::VENDOR);
    for s in kernels::sources() {
        local.extend(defined(s.source));
    }
    for h in kernel_source::HEADERS {
        local.extend(defined(h.text));
    }
    // The kernels never redefine a layout constant...
    let clash: Vec<_> = local.intersection(&core).collect();
    assert!(clash.is_empty(), "kernels redefine {clash:?}");
    // (symm-core's common.cuh keeps a hand copy of the layout under #ifndef, which symm-cuda's
    // `common_cuh_defines_match_pad` checks equal to c_defines(); its other macros count here.)
    local.extend(
        defined(kernel_source::COMMON)
            .difference(&core)
            .cloned()
            .collect::<Vec<_>>(),
    );
    // ...and use no SYMM_ macro that neither symm_core nor the kernels define.
    let mut used = symm_macros(kernels::VENDOR);
    used.extend(symm_macros(kernel_source::COMMON));
    for s in kernels::sources() {
        used.extend(symm_macros(s.source));
    }
    for h in kernel_source::HEADERS {
        used.extend(symm_macros(h.text));
    }
    let unknown: Vec<_> = used
        .iter()
        .filter(|m| !core.contains(*m) && !local.contains(*m))
        .collect();
    assert!(unknown.is_empty(), "undefined macros {unknown:?}");
    // the generated header carries the values symm_core has
    let h = kernels::shared_header();
    assert!(h.contains(&format!("#define SYMM_ERROR_WORD {}", symm_core::pad::ERROR_WORD)));
    assert!(h.find("#define SYMM_SIGNAL_PAD_SIZE") < h.find("symm_bounded_wait"));
}

/// Every source compiles for MI100 (gfx908), MI200 (gfx90a) and MI300 (gfx942), and each code
/// object holds exactly the entries symm-cuda's PTX holds (`kernel_source::SYNC_ENTRIES`,
/// `kernel_source::COLLECTIVE_ENTRIES`). gfx942 needs hiprtc from ROCm 6.0 on
/// (`kernels::min_hiprtc_for`): with an older one (Debian bookworm's 5.2, which crashes on it) it
/// is skipped, loudly.
#[test]
fn every_kernel_compiles_for_cdna_targets() {
    // hiprtc comes with libamdhip64 (which this test binary links), so it must load.
    kernels::hiprtc_available().expect("hiprtc");
    let mut compiled = 0;
    for arch in ["gfx90a", "gfx908", "gfx942"] {
        if let Err(e) = kernels::compile(&kernels::SYNC, "", arch) {
            assert!(
                kernels::min_hiprtc_for(arch).is_some() && matches!(e, symm_core::Error::Unavailable(_)),
                "{arch}: {e}"
            );
            println!("SKIP {arch} (ROCm {:?}): {e}", kernels::rocm_version());
            continue;
        }
        let built = kernels::compile_all(arch).expect(arch);
        assert_eq!(built.len(), kernels::sources().len());
        for s in kernels::sources() {
            let code = kernels::compile(s, "", arch).unwrap();
            let entries = code_object_entries(&code);
            for k in s.kernels {
                assert!(entries.contains(*k), "{arch}: {k} missing from the code object");
            }
            assert_eq!(
                entries,
                shared_entries(s),
                "{arch}: {} entries differ from symm-cuda's list",
                s.name
            );
            compiled += 1;
            println!(
                "compiled {} for {arch}: {} bytes, {} entries",
                s.name,
                code.len(),
                entries.len()
            );
        }
    }
    // gfx90a and gfx908 compile with every hiprtc: never all skipped.
    assert!(compiled >= 2 * kernels::sources().len(), "{compiled} code objects");
}

/// `SYMM_ROCM_WALL_CLOCK_HZ`'s define reaches the compiler: a rate the host accepts compiles,
/// and one vendor.hip.h's static_assert refuses (a tick of no whole nanoseconds) is one the host
/// refuses too.
#[test]
fn wall_clock_defines_compile() {
    let ok = kernels::wall_clock_defines(Some("25000000")).unwrap();
    assert!(ok.contains("SYMM_WALL_CLOCK_KHZ 25000ull"));
    kernels::compile(&kernels::SYNC, &ok, "gfx90a").unwrap();
    assert!(kernels::wall_clock_defines(Some("3000000")).is_err());
    match kernels::compile(&kernels::SYNC, "#define SYMM_WALL_CLOCK_KHZ 3000ull\n", "gfx90a") {
        Err(symm_core::Error::Backend { backend, detail, .. }) => {
            assert_eq!(backend, "hiprtc");
            assert!(detail.contains("SYMM_WALL_CLOCK_KHZ must divide 1 GHz"), "{detail}");
        }
        other => panic!("expected the static_assert, got {:?}", other.map(|c| c.len())),
    }
}

#[test]
fn a_broken_kernel_is_a_compile_error_with_the_log() {
    let broken = KernelSource {
        name: "broken",
        source: "extern \"C\" __global__ void k(int* p) { *p = undefined_symbol; }",
        kernels: &["k"],
    };
    match kernels::compile(&broken, "", "gfx90a") {
        Err(symm_core::Error::Backend { backend, detail, .. }) => {
            assert_eq!(backend, "hiprtc");
            assert!(detail.contains("undefined_symbol"), "log missing: {detail}");
        }
        other => panic!("expected a compile error, got {:?}", other.map(|c| c.len())),
    }
    assert!(kernels::compile(&kernels::SYNC, "", "sm_90").is_err());
}

#[test]
fn defines_reach_the_compiler() {
    let src = KernelSource {
        name: "defines",
        source: "#ifndef SYMM_TEST_FLAG\n#error flag missing\n#endif\nextern \"C\" __global__ void k() {}",
        kernels: &["k"],
    };
    assert!(kernels::compile(&src, "", "gfx90a").is_err());
    assert!(kernels::compile(&src, "#define SYMM_TEST_FLAG 1", "gfx90a").is_ok());
}
