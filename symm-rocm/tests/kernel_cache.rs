//! The on-disk kernel cache (its own test binary: it sets SYMM_KERNEL_CACHE).

use symm_rocm::kernels;

#[test]
fn compiled_code_objects_are_cached_on_disk_per_arch() {
    let dir = std::env::temp_dir().join(format!("symm-rocm-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Only test in this binary, so no other thread reads the environment.
    std::env::set_var("SYMM_KERNEL_CACHE", &dir);
    let code = kernels::compile(&kernels::SYNC, "#define SYMM_CACHE_PROBE 1", "gfx90a").unwrap();
    let arch_dir = dir.join("rocm").join("gfx90a");
    let files: Vec<_> = std::fs::read_dir(&arch_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "co"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(std::fs::read(&files[0]).unwrap(), *code);
    assert!(files[0].file_name().unwrap().to_string_lossy().starts_with("sync-"));
    std::fs::remove_dir_all(&dir).unwrap();
}
