//! hiprtc, the HIP runtime compiler, loaded at run time with libloading
//! (`libhiprtc.so` on ROCm 6, inside `libamdhip64.so` on ROCm 5).

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Mutex, OnceLock};

use libloading::Library;
use symm_core::Error;

type Program = *mut std::ffi::c_void;
type Res = c_int;

/// The libraries tried, in order ($ROCM_PATH/lib first when set).
pub const CANDIDATES: &[&str] = &[
    "libhiprtc.so",
    "libhiprtc.so.6",
    "libhiprtc.so.5",
    "libamdhip64.so",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

struct Fns {
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Res,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Res,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Res,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Res,
    code_size: unsafe extern "C" fn(Program, *mut usize) -> Res,
    code: unsafe extern "C" fn(Program, *mut c_char) -> Res,
    destroy: unsafe extern "C" fn(*mut Program) -> Res,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Res,
}

/// A loaded hiprtc.
pub struct Hiprtc {
    fns: Fns,
    /// Which library it came from.
    pub library: String,
    lock: Mutex<()>,
    _lib: Library,
}

impl std::fmt::Debug for Hiprtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hiprtc").field("library", &self.library).finish()
    }
}

fn load() -> Result<Hiprtc, String> {
    let mut names: Vec<String> = Vec::new();
    if let Some(root) = crate::knobs::get(crate::knobs::ROCM_PATH) {
        names.push(format!("{root}/lib/libhiprtc.so"));
        names.push(format!("{root}/lib/libamdhip64.so"));
    }
    names.extend(CANDIDATES.iter().map(|s| s.to_string()));
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: loading a shared library runs its initialisers; these are
        // AMD's runtime libraries, which are designed to be dlopen'ed.
        let lib = match unsafe { Library::new(&name) } {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{name}: {e}"));
                continue;
            }
        };
        // SAFETY: each symbol is looked up with the signature of hiprtc.h.
        let fns = unsafe {
            (|| -> Result<Fns, libloading::Error> {
                Ok(Fns {
                    create: *lib.get(b"hiprtcCreateProgram\0")?,
                    compile: *lib.get(b"hiprtcCompileProgram\0")?,
                    log_size: *lib.get(b"hiprtcGetProgramLogSize\0")?,
                    log: *lib.get(b"hiprtcGetProgramLog\0")?,
                    code_size: *lib.get(b"hiprtcGetCodeSize\0")?,
                    code: *lib.get(b"hiprtcGetCode\0")?,
                    destroy: *lib.get(b"hiprtcDestroyProgram\0")?,
                    version: *lib.get(b"hiprtcVersion\0")?,
                })
            })()
        };
        match fns {
            Ok(fns) => {
                return Ok(Hiprtc {
                    fns,
                    library: name,
                    lock: Mutex::new(()),
                    _lib: lib,
                })
            }
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "hiprtc not found (install ROCm or Debian's libamdhip64-dev); tried {}",
        tried.join("; ")
    ))
}

/// The process's hiprtc, loaded once; `Unavailable` if there is none.
pub fn get() -> Result<&'static Hiprtc, Error> {
    static RTC: OnceLock<Result<Hiprtc, String>> = OnceLock::new();
    RTC.get_or_init(load)
        .as_ref()
        .map_err(|e| Error::Unavailable(e.clone()))
}

/// Frees a program on every path.
struct ProgramGuard<'a>(Program, &'a Fns);

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by hiprtcCreateProgram and is destroyed once.
        let _ = unsafe { (self.1.destroy)(&mut self.0) };
    }
}

impl Hiprtc {
    /// (major, minor) of hiprtc.
    pub fn version(&self) -> (i32, i32) {
        let (mut a, mut b) = (0, 0);
        // SAFETY: valid out-pointers.
        let _ = unsafe { (self.fns.version)(&mut a, &mut b) };
        (a, b)
    }

    /// Compiles `source` (named `name` in messages) with `options`; returns the
    /// code object, or the compiler log as the error.
    pub fn compile(&self, name: &str, source: &str, options: &[String]) -> Result<Vec<u8>, Error> {
        let err = |call: &str, detail: String| Error::Backend {
            backend: "hiprtc",
            call: format!("{call} ({name})"),
            detail,
        };
        let src = CString::new(source).map_err(|_| err("hiprtcCreateProgram", "source contains NUL".into()))?;
        let cname = CString::new(name).map_err(|_| err("hiprtcCreateProgram", "name contains NUL".into()))?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| err("hiprtcCompileProgram", "option contains NUL".into()))?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings alive for the call; no headers.
        let r = unsafe {
            (self.fns.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(err("hiprtcCreateProgram", format!("hiprtc error {r}")));
        }
        let prog = ProgramGuard(prog, &self.fns);
        // SAFETY: live program; opt_ptrs holds opts.len() valid C strings.
        let r = unsafe { (self.fns.compile)(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        if r != 0 {
            return Err(err(
                "hiprtcCompileProgram",
                format!("hiprtc error {r}:\n{}", self.log(prog.0)),
            ));
        }
        let mut n = 0usize;
        // SAFETY: live program, valid out-pointer.
        let r = unsafe { (self.fns.code_size)(prog.0, &mut n) };
        if r != 0 || n == 0 {
            return Err(err("hiprtcGetCodeSize", format!("hiprtc error {r}, size {n}")));
        }
        let mut code = vec![0u8; n];
        // SAFETY: `code` has the size hiprtc reported.
        let r = unsafe { (self.fns.code)(prog.0, code.as_mut_ptr().cast()) };
        if r != 0 {
            return Err(err("hiprtcGetCode", format!("hiprtc error {r}")));
        }
        Ok(code)
    }

    fn log(&self, prog: Program) -> String {
        let mut n = 0usize;
        // SAFETY: live program, valid out-pointer.
        if unsafe { (self.fns.log_size)(prog, &mut n) } != 0 || n == 0 {
            return String::new();
        }
        let mut buf = vec![0 as c_char; n + 1];
        // SAFETY: buf has room for the log and a terminator.
        if unsafe { (self.fns.log)(prog, buf.as_mut_ptr()) } != 0 {
            return String::new();
        }
        // SAFETY: buf is NUL-terminated (zeroed with one spare byte).
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }
}
