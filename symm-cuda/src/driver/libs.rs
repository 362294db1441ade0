//! Whether a CUDA library can be loaded, checked by symm itself before anything calls into it.
//!
//! cudarc loads its libraries in one of two ways, chosen by the program (symm asks for
//! `fallback-dynamic-loading`, which leaves the choice to it): with `dynamic-loading` (the
//! default) it `dlopen`s them at first use and panics when one is missing; with
//! `dynamic-linking` (candle's choice) they are linked, so the program does not start without
//! them. cudarc's own check, `is_culib_present`, exists only in the first mode, so symm checks
//! with the same candidate names cudarc's loader tries on Linux, which in the second mode name
//! the libraries the program already holds.

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

/// Whether `lib{stem}` loads under one of the names cudarc tries.
pub(crate) fn present(stem: &str) -> bool {
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
    }
}
