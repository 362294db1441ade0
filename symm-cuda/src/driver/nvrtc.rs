//! NVRTC: presence, version and compilation to PTX and CUBIN through cudarc's NVRTC bindings.
//!
//! cudarc panics when libnvrtc cannot be loaded, so [`available`] checks for
//! the library (with the same candidate names cudarc tries) before anything
//! calls into it.

use std::sync::OnceLock;

use std::ffi::CString;

use cudarc::nvrtc::{result, sys};
use symm_core::{Error, Result};

/// `Ok(())` if libnvrtc can be loaded, else [`Error::Unavailable`].
pub fn available() -> Result<()> {
    super::libs::require(
        "nvrtc",
        "NVRTC (libnvrtc.so) was not found; put its folder on LD_LIBRARY_PATH \
         (e.g. /usr/local/cuda/lib64, or site-packages/nvidia/cu13/lib from the \
         nvidia-cuda-nvrtc wheel)",
    )
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

/// What NVRTC made of one source: the PTX and the machine code (CUBIN) for the real
/// architecture it was compiled for.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub ptx: String,
    /// SASS for exactly `arch`: a module loaded from it needs no JIT (NVRTC ran ptxas already).
    pub cubin: Vec<u8>,
}

/// Compiles a complete CUDA C++ source for `arch` (e.g. `sm_90`): its PTX and its CUBIN.
/// `name` names the program in NVRTC's log.
pub fn compile(name: &str, source: &str, arch: &str, extra_options: &[String]) -> Result<Compiled> {
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
    let fail = |call: &str, detail: String| Error::Backend {
        backend: "nvrtc",
        call: format!("{call} ({name} for {arch})"),
        detail,
    };
    let (src_c, name_c) = match (CString::new(source), CString::new(format!("{name}.cu"))) {
        (Ok(s), Ok(n)) => (s, n),
        _ => {
            return Err(Error::InvalidArgument(
                "kernel source or name contains a NUL byte".into(),
            ))
        }
    };
    let opts_c: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::InvalidArgument("an NVRTC option contains a NUL byte".into()))?;
    let prog =
        result::create_program(&src_c, Some(&name_c)).map_err(|e| fail("nvrtcCreateProgram", format!("{e:?}")))?;
    let out = (|| {
        // SAFETY: `prog` was created above and is destroyed only after this closure; the option
        // strings outlive the call.
        if let Err(e) = unsafe { result::compile_program(prog, &opts_c) } {
            // SAFETY: as above.
            let log = unsafe { result::get_program_log(prog) }.unwrap_or_default();
            let log: Vec<u8> = log.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            return Err(fail(
                "nvrtcCompileProgram",
                format!("{e:?}: {}", String::from_utf8_lossy(&log)),
            ));
        }
        // SAFETY: as above; the program compiled.
        let ptx = unsafe { result::get_ptx(prog) }.map_err(|e| fail("nvrtcGetPTX", format!("{e:?}")))?;
        let ptx: Vec<u8> = ptx.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
        let mut size = 0usize;
        // SAFETY: as above; writes one usize.
        let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("nvrtcGetCUBINSize", format!("{r:?}")));
        }
        let mut cubin = vec![0u8; size];
        // SAFETY: as above; `cubin` holds the `size` bytes NVRTC reported.
        let r = unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("nvrtcGetCUBIN", format!("{r:?}")));
        }
        Ok(Compiled {
            ptx: String::from_utf8_lossy(&ptx).into_owned(),
            cubin,
        })
    })();
    // SAFETY: `prog` came from create_program and is destroyed once, here.
    let _ = unsafe { result::destroy_program(prog) };
    out
}
