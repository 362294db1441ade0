//! NVRTC-compiles every CUDA kernel of symm-cuda for one architecture (no GPU
//! needed): `cargo run -p symm-cuda --example nvrtc_compile_all -- sm_90`.
//! `cargo xtask kernels` runs it with libnvrtc's folder on LD_LIBRARY_PATH.
//! With `--cache` it compiles through the kernel disk cache instead (what a
//! program's first launch on that architecture would compile and load: PTX and CUBIN, with the
//! defines the library uses, `SYMM_TRACE=1`'s included, stored where `SYMM_KERNEL_CACHE` points): `cargo xtask gpu-bundle` fills the bundle's
//! `kernel-cache/` this way. With `--dump DIR` it also writes each file's PTX
//! to `DIR/<name>.ptx` (to diff what NVRTC generates before and after a change
//! to the kernel sources).

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cached = args.iter().any(|a| a == "--cache");
    let dump = args
        .iter()
        .position(|a| a == "--dump")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let arch = args
        .iter()
        .enumerate()
        .find(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--dump"))
        .map(|(_, a)| a.clone())
        .unwrap_or_else(|| "sm_90".to_string());
    if let Err(e) = symm_cuda::kernels::nvrtc_available() {
        eprintln!("error: NVRTC is not available: {e}");
        return ExitCode::FAILURE;
    }
    let total = symm_cuda::kernels::sources().len();
    let result = if cached {
        symm_cuda::kernels::sources()
            .iter()
            .map(|src| {
                symm_cuda::kernels::compile_for_load(src, symm_cuda::kernels::defines_for(src), &arch)
                    .map(|len| (src.name.to_string(), len))
            })
            .collect()
    } else {
        symm_cuda::kernels::compile_all(&arch)
    };
    if let (Some(dir), Ok(_)) = (&dump, &result) {
        if let Err(e) = dump_ptx(dir, &arch) {
            eprintln!("error: --dump {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    match result {
        Ok(built) => {
            for (name, len) in &built {
                println!("  {name}.cu -> {len} bytes of PTX for {arch}");
            }
            println!("kernels: {} of {total} files compiled for {arch}", built.len());
            if built.len() == total && total > 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: expected {total} kernel files, compiled {}", built.len());
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: kernel compilation for {arch} failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes every kernel file's PTX (compiled without any cache) to `dir/<name>.ptx`.
fn dump_ptx(dir: &std::path::Path, arch: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    for src in symm_cuda::kernels::sources() {
        let ptx = symm_cuda::kernels::compile_uncached(src, "", arch).map_err(|e| e.to_string())?;
        let path = dir.join(format!("{}.ptx", src.name));
        std::fs::write(&path, ptx).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("  wrote {}", path.display());
    }
    Ok(())
}
