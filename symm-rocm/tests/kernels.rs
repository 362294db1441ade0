//! Kernel sources: present, consistent with symm_core::pad, and compiled by
//! hiprtc for real gfx targets (no GPU needed: hiprtc compiles offline).

use std::collections::BTreeSet;

use symm_rocm::kernels::{self, KernelSource};

/// Identifiers starting with `SYMM_` in `text`.
fn symm_macros(text: &str) -> BTreeSet<String> {
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
        if let Some(rest) = l.trim().strip_prefix("SYMM_ONE_SHOT(") {
            out.insert(rest.split(',').next().unwrap_or_default().trim().to_string());
        }
    }
    out
}

#[test]
fn every_source_is_present_and_lists_its_kernels() {
    let srcs = kernels::sources();
    let names: Vec<&str> = srcs.iter().map(|s| s.name).collect();
    assert_eq!(names, ["sync", "collectives"]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".hip"))
        .map(|n| n.trim_end_matches(".hip").to_string())
        .collect();
    assert_eq!(
        on_disk,
        names.iter().map(|s| s.to_string()).collect(),
        "a .hip file is not embedded"
    );
    for s in srcs {
        assert!(!s.source.trim().is_empty(), "{} is empty", s.name);
        assert_eq!(
            global_functions(s),
            s.kernels.iter().map(|k| k.to_string()).collect(),
            "{}: kernel list out of date",
            s.name
        );
    }
    assert!(kernels::COMMON.contains("symm_bounded_wait"));
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
    let mut local = defined(kernels::COMMON);
    for s in kernels::sources() {
        local.extend(defined(s.source));
    }
    // The kernels never redefine a layout constant...
    let clash: Vec<_> = local.intersection(&core).collect();
    assert!(clash.is_empty(), "kernels redefine {clash:?}");
    // ...and use no SYMM_ macro that neither symm_core nor the kernels define.
    let mut used = symm_macros(kernels::COMMON);
    for s in kernels::sources() {
        used.extend(symm_macros(s.source));
    }
    let unknown: Vec<_> = used
        .iter()
        .filter(|m| !core.contains(*m) && !local.contains(*m))
        .collect();
    assert!(unknown.is_empty(), "undefined macros {unknown:?}");
    // the generated header carries the values symm_core has
    let h = kernels::common_header();
    assert!(h.contains(&format!("#define SYMM_ERROR_WORD {}", symm_core::pad::ERROR_WORD)));
    assert!(h.find("#define SYMM_SIGNAL_PAD_SIZE") < h.find("symm_bounded_wait"));
}

#[test]
fn every_kernel_compiles_for_cdna_targets() {
    // hiprtc comes with libamdhip64 (which this test binary links), so it must load.
    kernels::hiprtc_available().expect("hiprtc");
    // gfx90a (MI200) and gfx908 (MI100): targets every ROCm >= 5 compiler knows.
    for arch in ["gfx90a", "gfx908"] {
        let built = kernels::compile_all(arch).expect(arch);
        assert_eq!(built.len(), kernels::sources().len());
        for s in kernels::sources() {
            let code = kernels::compile(s, "", arch).unwrap();
            let text = String::from_utf8_lossy(&code);
            for k in s.kernels {
                assert!(
                    text.contains(&format!("{k}.kd")),
                    "{arch}: {k} missing from the code object"
                );
            }
        }
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
