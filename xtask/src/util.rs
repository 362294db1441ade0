//! Small helpers: running commands, finding libraries and GPUs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

pub type Result<T, E = String> = std::result::Result<T, E>;

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// Cargo's target folder: `$CARGO_TARGET_DIR` (relative to the repo root when
/// relative) or `target/` of the repo.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        Some(d) => root().join(d),
        None => root().join("target"),
    }
}

/// The cargo binary that runs us (or `cargo`).
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// Renders a command line for logs.
pub fn show(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command with inherited stdio; an error names the command and its status.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", show(cmd));
    let t = Instant::now();
    let status = cmd.status().map_err(|e| format!("cannot start `{}`: {e}", show(cmd)))?;
    if status.success() {
        eprintln!("  ok ({:.1} s)", t.elapsed().as_secs_f64());
        Ok(())
    } else {
        Err(format!("`{}` failed: {status}", show(cmd)))
    }
}

/// What a cargo command that builds `symm-bench` (symm-ops' bin, `required-features =
/// ["host-backend"]`) adds: symm-ops' defaults leave the host backend and the bench's command line
/// out of the library (#38).
pub const BENCH_FEATURES: [&str; 2] = ["--features", "symm-ops/host-backend"];

/// Runs a command and returns its stdout (stderr inherited).
pub fn output(cmd: &mut Command) -> Result<String> {
    eprintln!("$ {}", show(cmd));
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start `{}`: {e}", show(cmd)))?;
    if !out.status.success() {
        return Err(format!("`{}` failed: {}", show(cmd), out.status));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("`{}` printed non-UTF-8: {e}", show(cmd)))
}

/// `PATH`-style list with `first` dirs in front of the current value of `var`.
pub fn prepend_path(var: &str, first: &[PathBuf]) -> OsString {
    let mut dirs: Vec<PathBuf> = first.to_vec();
    if let Some(v) = std::env::var_os(var) {
        dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs.dedup();
    std::env::join_paths(dirs).unwrap_or_default()
}

pub fn dir_has_lib(dir: &Path, stem: &str) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&format!("{stem}.so")))
        })
        .unwrap_or(false)
}

/// Python's site-packages folders (empty if there is no python3).
pub fn site_packages() -> Vec<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import site,sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))",
        ])
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let mut v: Vec<PathBuf> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.ends_with("-packages"))
                .map(PathBuf::from)
                .filter(|p| p.is_dir())
                .collect();
            v.sort();
            v.dedup();
            v
        }
        _ => Vec::new(),
    }
}

/// The `lib` folders of the packages under a pip `nvidia` folder: `nv/*/lib`, sorted.
pub fn nvidia_lib_dirs(nv: &Path) -> Vec<PathBuf> {
    let mut subs: Vec<PathBuf> = std::fs::read_dir(nv)
        .map(|rd| rd.flatten().map(|e| e.path().join("lib")).collect())
        .unwrap_or_default();
    subs.sort();
    subs
}

/// Folders that hold `lib{name}.so*`: LD_LIBRARY_PATH first, then pip's
/// `site-packages/nvidia/*/lib` (cu13 first), then /usr/local/cuda/lib64.
pub fn find_lib_dirs(stem: &str) -> Vec<PathBuf> {
    let mut cands: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    for sp in site_packages() {
        let nv = sp.join("nvidia");
        cands.push(nv.join("cu13").join("lib"));
        cands.extend(nvidia_lib_dirs(&nv));
    }
    cands.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut found: Vec<PathBuf> = Vec::new();
    for c in cands {
        if !c.as_os_str().is_empty() && dir_has_lib(&c, stem) && !found.contains(&c) {
            found.push(c);
        }
    }
    found
}

/// Number of NVIDIA GPUs: `nvidia-smi -L`, else /proc/driver/nvidia/gpus.
pub fn gpu_count() -> usize {
    if let Ok(o) = Command::new("nvidia-smi").arg("-L").stderr(Stdio::null()).output() {
        if o.status.success() {
            return String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU "))
                .count();
        }
    }
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|rd| rd.flatten().count())
        .unwrap_or(0)
}

/// Human size.
pub fn human_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Total bytes of the regular files under `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => total += dir_size(&e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

/// The workspace's packages and their bin / test targets, from `cargo metadata`.
pub struct Package {
    pub name: String,
    pub bins: Vec<String>,
    pub examples: Vec<String>,
}

pub fn workspace_packages() -> Result<Vec<Package>> {
    let text = output(cargo().args(["metadata", "--no-deps", "--format-version", "1"]))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("cargo metadata: {e}"))?;
    let mut out = Vec::new();
    for p in v["packages"].as_array().into_iter().flatten() {
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        let of_kind = |kind: &str| -> Vec<String> {
            targets
                .iter()
                .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|x| x == kind)))
                .filter_map(|t| t["name"].as_str().map(String::from))
                .collect()
        };
        out.push(Package {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            bins: of_kind("bin"),
            examples: of_kind("example"),
        });
    }
    Ok(out)
}

/// True when running under CI (`CI=true` or `CI=1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
