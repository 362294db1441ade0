//! Small helpers shared by the stores.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::store::{Result, StoreError};

/// Whether `e` says the process (EMFILE) or the system (ENFILE) ran out of file descriptors.
pub(crate) fn is_fd_exhaustion(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// `now + timeout`, or `None` when that overflows (treated as "no deadline" by callers
/// that then still wake up periodically).
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// PyTorch's ADD: the old value (ASCII decimal, missing = 0) plus `delta`, as text and number.
pub(crate) fn add_to_decimal(key: &str, old: Option<&[u8]>, delta: i64) -> Result<(Vec<u8>, i64)> {
    let base = match old {
        None => 0,
        Some(bytes) => parse_decimal(bytes).ok_or_else(|| StoreError::BadValue {
            key: key.to_owned(),
            reason: format!("ADD on a value that is not a decimal integer ({} bytes)", bytes.len()),
        })?,
    };
    let v = base.checked_add(delta).ok_or_else(|| StoreError::BadValue {
        key: key.to_owned(),
        reason: format!("ADD overflows: {base} + {delta}"),
    })?;
    Ok((v.to_string().into_bytes(), v))
}

/// Parses ASCII decimal text the way `std::stoll` accepts it (leading spaces, sign, digits).
pub(crate) fn parse_decimal(bytes: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(bytes).ok()?;
    let s = s.trim_start();
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(s.len(), |(i, _)| i);
    s[..end].parse().ok()
}

/// PyTorch's COMPARE_SET on a map; returns the reply value.
pub(crate) fn compare_set_in(kv: &mut HashMap<String, Vec<u8>>, key: &str, expected: &[u8], desired: &[u8]) -> Vec<u8> {
    match kv.get_mut(key) {
        None if expected.is_empty() => {
            kv.insert(key.to_owned(), desired.to_vec());
            desired.to_vec()
        }
        None => expected.to_vec(),
        Some(cur) => {
            if cur.as_slice() == expected {
                *cur = desired.to_vec();
            }
            cur.clone()
        }
    }
}

/// COMPARE_SET on a byte-keyed map (the TCP server's).
pub(crate) fn compare_set_bytes(
    kv: &mut HashMap<Vec<u8>, Vec<u8>>,
    key: &[u8],
    expected: &[u8],
    desired: &[u8],
) -> Vec<u8> {
    match kv.get_mut(key) {
        None if expected.is_empty() => {
            kv.insert(key.to_vec(), desired.to_vec());
            desired.to_vec()
        }
        None => expected.to_vec(),
        Some(cur) => {
            if cur.as_slice() == expected {
                *cur = desired.to_vec();
            }
            cur.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_parsing_follows_stoll() {
        assert_eq!(parse_decimal(b"42"), Some(42));
        assert_eq!(parse_decimal(b"  -7xyz"), Some(-7));
        assert_eq!(parse_decimal(b"+3"), Some(3));
        assert_eq!(parse_decimal(b"abc"), None);
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"99999999999999999999"), None);
    }

    #[test]
    fn add_overflow_is_an_error() {
        assert!(add_to_decimal("k", Some(b"9223372036854775807"), 1).is_err());
        assert_eq!(add_to_decimal("k", None, 5).unwrap().1, 5);
    }
}
