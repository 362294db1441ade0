//! NVRTC: presence, version and compilation to PTX through cudarc.
//!
//! cudarc panics when libnvrtc cannot be loaded, so [`available`] checks for
//! the library (with the same candidate names cudarc tries) before anything
//! calls into it.

use std::sync::OnceLock;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
use symm_core::{Error, Result};

/// `Ok(())` if libnvrtc can be loaded, else [`Error::Unavailable`].
pub fn available() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate names (running their
    // initialisers, as any library load does).
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(Error::Unavailable(
            "NVRTC (libnvrtc.so) was not found; put its folder on LD_LIBRARY_PATH \
             (e.g. /usr/local/cuda/lib64, or site-packages/nvidia/cu13/lib from the \
             nvidia-cuda-nvrtc wheel)"
                .into(),
        ))
    }
}

/// `(major, minor)` of the loaded NVRTC.
pub fn version() -> Result<(i32, i32)> {
    available()?;
    static VERSION: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: libnvrtc is present (checked above); writes two ints.
            let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
            if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                Ok((major, minor))
            } else {
                Err(format!("nvrtcVersion failed: {r:?}"))
            }
        })
        .clone()
        .map_err(|detail| Error::Backend {
            backend: "nvrtc",
            call: "nvrtcVersion".into(),
            detail,
        })
}

/// Compiles a complete CUDA C++ source to PTX for `arch` (e.g. `sm_90`).
/// `name` names the program in NVRTC's log.
pub fn compile(name: &str, source: &str, arch: &str, extra_options: &[String]) -> Result<String> {
    available()?;
    if source.contains('\0') || name.contains('\0') {
        return Err(Error::InvalidArgument(
            "kernel source or name contains a NUL byte".into(),
        ));
    }
    if !arch.starts_with("sm_") || !arch[3..].chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::InvalidArgument(format!(
            "bad GPU architecture {arch:?} (want e.g. sm_90)"
        )));
    }
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    options.extend(extra_options.iter().cloned());
    let opts = CompileOptions {
        options,
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    // cudarc unwraps a few NVRTC results internally; where panics unwind, one must not take the
    // caller down (a missing libnvrtc never gets here: `available` checked it, which also holds
    // under `panic = "abort"`, where this catches nothing).
    let out = std::panic::catch_unwind(|| compile_ptx_with_opts(source, opts).map(|p| p.to_src())).map_err(|_| {
        Error::Backend {
            backend: "nvrtc",
            call: "nvrtcCompileProgram".into(),
            detail: format!("NVRTC panicked while compiling {name}"),
        }
    })?;
    match out {
        Ok(ptx) => Ok(ptx),
        Err(CompileError::CompileError { log, .. }) => Err(Error::Backend {
            backend: "nvrtc",
            call: format!("compile {name} for {arch}"),
            detail: log.to_string_lossy().into_owned(),
        }),
        Err(e) => Err(Error::Backend {
            backend: "nvrtc",
            call: format!("compile {name} for {arch}"),
            detail: format!("{e:?}"),
        }),
    }
}
