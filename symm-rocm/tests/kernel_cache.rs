//! The on-disk kernel cache (its own test binary: it sets SYMM_KERNEL_CACHE).

use symm_rocm::kernels;

#[test]
fn compiled_code_objects_are_cached_on_disk_per_arch() {
    let dir = std::env::temp_dir().join(format!("symm-rocm-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Only test in this binary, so no other thread reads the environment.
    std::env::set_var("SYMM_KERNEL_CACHE", &dir);
    let code = kernels::compile(&kernels::SYNC, "#define SYMM_CACHE_PROBE 1", "gfx90a").unwrap();
    // symm_core::kernel_cache's layout: `<name>-<arch>-<key>.co`, a key line, then the code.
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "co"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let bytes = std::fs::read(&files[0]).unwrap();
    assert!(bytes.starts_with(b"// symm-kernel-cache "), "no key line");
    assert!(bytes.ends_with(&code), "the code object follows the key line");
    assert!(files[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("sync-gfx90a-"));
    // The defines are part of the key: another wall-clock rate is another code object.
    let clock = kernels::wall_clock_defines(Some("25000000")).unwrap();
    let other = kernels::compile(
        &kernels::SYNC,
        &format!("#define SYMM_CACHE_PROBE 1\n{clock}"),
        "gfx90a",
    )
    .unwrap();
    let count = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|e| e == "co"))
        .count();
    assert_eq!(count, 2);
    assert_ne!(other, code);
    std::fs::remove_dir_all(&dir).unwrap();
}
