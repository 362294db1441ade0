//! Runs `torch_interop.py` (PyTorch's TCPStore against ours, both directions) when torch
//! is importable; otherwise prints "skipped: torch not installed" and passes
//! (SYMM_REQUIRE_TORCH=1 turns the skip into a failure). The interpreter is
//! `$SYMM_STORE_PYTHON`, else `python3`.

use std::process::Command;

#[test]
fn torch_interop() {
    let python = std::env::var("SYMM_STORE_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python)
        .args(["-c", "import torch.distributed"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_torch {
        assert!(
            std::env::var("SYMM_REQUIRE_TORCH").as_deref() != Ok("1"),
            "SYMM_REQUIRE_TORCH=1 but `{python} -c 'import torch'` fails"
        );
        println!("skipped: torch not installed (for {python})");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/torch_interop.py");
    let out = Command::new(&python)
        .arg(script)
        .env("SYMM_STORE_INTEROP_BIN", env!("CARGO_BIN_EXE_symm-store-interop"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "torch interop failed");
    assert!(text.contains("INTEROP PASSED"));
}
