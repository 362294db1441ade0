//! The compiled-kernel disk cache every backend uses (symm-cuda's PTX, symm-rocm's code
//! objects), written once: the folder (`SYMM_KERNEL_CACHE`, else `~/.cache/symm/kernels`;
//! `off`, `0` or empty disables it), the key (128-bit FNV-1a over length-prefixed parts: the
//! source, the architecture, the compiler's version, its options), and one file per key whose
//! first line names the key, written atomically (a cache that cannot be written only costs a
//! recompile).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The disk cache folder, `None` when disabled or when no home is known (read once).
pub fn dir() -> Option<PathBuf> {
    static V: OnceLock<Option<PathBuf>> = OnceLock::new();
    V.get_or_init(|| match crate::knobs::get(crate::knobs::KERNEL_CACHE) {
        Some(v) if v == "off" || v == "0" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => crate::knobs::get(crate::knobs::HOME).map(|h| PathBuf::from(h).join(".cache/symm/kernels")),
    })
    .clone()
}

/// 128-bit FNV-1a over `parts`, each length-prefixed so ("ab", "c") and ("a", "bc") differ
/// (stable across Rust versions, unlike `DefaultHasher`).
pub fn key(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    let mut h = OFFSET;
    for part in parts {
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The file of `name` compiled for `arch` under `key`, with extension `ext` (`ptx`, `co`).
pub fn path(dir: &Path, name: &str, arch: &str, key: u128, ext: &str) -> PathBuf {
    dir.join(format!("{name}-{arch}-{key:032x}.{ext}"))
}

fn key_line(key: u128) -> String {
    format!("// symm-kernel-cache {key:032x}\n")
}

/// The cached bytes at `path` when its first line names `key` and something follows it.
pub fn read(path: &Path, key: u128) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let body = bytes.strip_prefix(key_line(key).as_bytes())?;
    (!body.is_empty()).then(|| body.to_vec())
}

/// Writes `code` under `key` at `path` in `dir` (created if missing), atomically; best effort.
pub fn write(dir: &Path, path: &Path, key: u128, code: &[u8]) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".tmp-{}-{nanos}-{key:032x}", std::process::id()));
    let mut text = key_line(key).into_bytes();
    text.extend_from_slice(code);
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_stable_and_length_prefixed() {
        assert_eq!(key(&[b"ab", b"c"]), key(&[b"ab", b"c"]));
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        // Pinned value: a change of the hash invalidates every disk cache.
        assert_eq!(key(&[]), 0x6c62272e07bb014262b821756295c58d);
    }

    #[test]
    fn files_round_trip_and_a_wrong_key_misses() {
        let dir = std::env::temp_dir().join(format!("symm-kcache-core-test-{}", std::process::id()));
        let p = path(&dir, "sync", "sm_90", 42, "ptx");
        write(&dir, &p, 42, b".version 9.0\n");
        assert_eq!(read(&p, 42).as_deref(), Some(&b".version 9.0\n"[..]));
        assert_eq!(read(&p, 43), None, "wrong key must miss");
        let co = path(&dir, "collectives", "gfx942", 7, "co");
        write(&dir, &co, 7, &[0u8, 1, 2, 255]);
        assert_eq!(
            read(&co, 7).as_deref(),
            Some(&[0u8, 1, 2, 255][..]),
            "binary code objects too"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
