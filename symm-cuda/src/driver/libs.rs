//! Whether a CUDA library can be loaded, checked by symm itself before anything calls into it.
//!
//! cudarc loads its libraries in one of two ways, chosen by the program (symm asks for
//! `fallback-dynamic-loading`, which leaves the choice to it): with `dynamic-loading` (the
//! default) it `dlopen`s them at first use and panics when one is missing; with
//! `dynamic-linking` (candle's choice) they are linked, so the program does not start without
//! them. cudarc's own check, `is_culib_present`, exists only in the first mode, so symm checks
//! itself: first whether the running program already holds the library's entry symbol (the
//! second mode, whatever soname it was linked by, `libnccl.so.2` say), then whether one of the
//! names cudarc's loader tries on Linux loads (the first mode: a library cudarc could not load
//! would make it panic).

/// The file names cudarc's loader tries for `lib{stem}` (cudarc 0.19, Linux), for the CUDA
/// major version its bindings were built for.
fn candidates(stem: &str) -> Vec<String> {
    let major = cudarc::driver::sys::CUDA_VERSION / 1000;
    let mut v = vec![format!("lib{stem}.so"), format!("lib{stem}.so.{major}")];
    for m in [12, 11, 10, 9, 1] {
        if m != major {
            v.push(format!("lib{stem}.so.{m}"));
        }
    }
    v
}

/// A symbol every version of `lib{stem}` exports.
fn entry_symbol(stem: &str) -> Option<&'static [u8]> {
    match stem {
        "cuda" => Some(b"cuInit\0"),
        "nvrtc" => Some(b"nvrtcVersion\0"),
        "nccl" => Some(b"ncclGetVersion\0"),
        _ => None,
    }
}

/// Whether the running program already holds `lib{stem}` (linked in, or loaded globally).
fn linked(stem: &str) -> bool {
    let Some(sym) = entry_symbol(stem) else {
        return false;
    };
    let this = libloading::os::unix::Library::this();
    // SAFETY: only looks the symbol up in the program's global scope; the pointer is neither
    // called nor kept.
    unsafe { this.get::<*const std::ffi::c_void>(sym) }.is_ok()
}

/// Whether `lib{stem}` is linked into the program or loads under one of the names cudarc tries.
pub(crate) fn present(stem: &str) -> bool {
    linked(stem) || loadable(stem)
}

/// `Ok(())` when `lib{stem}` is [`present`] (looked for once per process and library), else
/// [`Error::Unavailable`] saying `missing`.
pub(crate) fn require(stem: &'static str, missing: &str) -> symm_core::Result<()> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static FOUND: OnceLock<Mutex<HashMap<&'static str, bool>>> = OnceLock::new();
    let found = *FOUND
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(stem)
        .or_insert_with(|| present(stem));
    if found {
        Ok(())
    } else {
        Err(symm_core::Error::Unavailable(missing.to_string()))
    }
}

fn loadable(stem: &str) -> bool {
    candidates(stem).iter().any(|name| {
        // SAFETY: loading a shared library runs its initialisers, as any library load does; the
        // handle is dropped (closed) at once and nothing in the library is called.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_cudarcs_names() {
        let c = candidates("nvrtc");
        assert_eq!(c[0], "libnvrtc.so");
        assert_eq!(
            c[1],
            format!("libnvrtc.so.{}", cudarc::driver::sys::CUDA_VERSION / 1000)
        );
        assert!(c.contains(&"libnvrtc.so.1".to_string()));
        let unique: std::collections::BTreeSet<_> = c.iter().collect();
        assert_eq!(unique.len(), c.len());
        assert!(!present("symm-no-such-library"));
        // Without dynamic-linking nothing of CUDA is linked into this test binary.
        assert!(!linked("nccl"));
    }
}
