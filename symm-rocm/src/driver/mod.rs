//! The only place symm-rocm touches the HIP runtime, hiprtc and rocm-smi:
//! raw calls wrapped in small RAII types. Every `unsafe` block says why it is
//! sound; everything above this module is safe code. No safe public function
//! here takes a raw device address (NOTE [raw-addresses]): the stream copies,
//! the memset and kernel launches are crate-private, and [`runtime::DeviceBuffer`]'s
//! copies check their range against the buffer they own.
//!
//! - [`ffi`]: the HIP runtime functions (NOTE [hip-ffi]).
//! - [`vmm`]: hipMemCreate with POSIX-fd handles, export / import, address
//!   reservations, mappings and access.
//! - [`runtime`]: devices, device buffers, streams, modules and launches.
//! - [`hiprtc`]: the runtime compiler, loaded with libloading.
//! - [`rsmi`]: rocm-smi, loaded with libloading.

pub mod ffi;
pub mod hiprtc;
pub mod rsmi;
pub mod runtime;
pub mod vmm;

use std::ffi::CStr;

use symm_core::Error;

/// This backend's name in errors that name one.
pub const BACKEND: &str = "rocm";

/// Name of a HIP error code, for messages (works without a device).
pub fn error_name(code: ffi::hipError) -> String {
    // SAFETY: hipGetErrorName returns a pointer to a static NUL-terminated
    // string (or NULL) for any code.
    let p = unsafe { ffi::hipGetErrorName(code) };
    if p.is_null() {
        return format!("hipError {code}");
    }
    // SAFETY: non-null, static and NUL-terminated (above).
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    format!("{s} ({code})")
}

/// Turns a HIP return code into a symm error.
pub fn check(code: ffi::hipError, call: &str) -> Result<(), Error> {
    if code == ffi::HIP_SUCCESS {
        return Ok(());
    }
    Err(to_error(code, call))
}

/// The symm error for a failed HIP call (pure mapping, see the tests).
pub fn to_error(code: ffi::hipError, call: &str) -> Error {
    match code {
        // hipErrorOutOfMemory
        2 => Error::OutOfMemory {
            device: "rocm".into(),
            detail: format!("{call}: {}", error_name(code)),
        },
        // hipErrorNoDevice, hipErrorInsufficientDriver, hipErrorNotInitialized
        100 | 35 | 3 => Error::Unavailable(format!("{call}: {}", error_name(code))),
        _ => Error::Backend {
            backend: "hip",
            call: call.to_string(),
            detail: error_name(code),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_convert() {
        assert!(check(0, "x").is_ok());
        assert!(matches!(to_error(2, "hipMemCreate"), Error::OutOfMemory { .. }));
        assert!(matches!(to_error(100, "hipGetDeviceCount"), Error::Unavailable(_)));
        match to_error(1, "hipMemMap") {
            Error::Backend { backend, call, detail } => {
                assert_eq!(backend, "hip");
                assert_eq!(call, "hipMemMap");
                assert!(detail.contains("(1)"), "{detail}");
            }
            e => panic!("unexpected {e:?}"),
        }
        // Unknown codes are just numbers, never undefined behaviour.
        assert!(error_name(987_654).contains("987654"));
    }
}
