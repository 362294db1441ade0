//! What agreements among ranks share: the checks run on the records every rank
//! exchanged (identical on every rank, so every rank reaches the same verdict
//! and fails the same way before anything is mapped; [`crate::rendezvous`]
//! runs them on its records), the host identity they compare, and the
//! deadline of the rendezvous's steps.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Time left until `deadline`, or [`Error::Timeout`] naming `what` and the
/// whole `timeout` once it has passed (each step of a rendezvous waits at most
/// this long, so the steps together stay within one timeout).
pub fn time_left(deadline: Instant, timeout: Duration, what: &str) -> Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Timeout {
            what: what.to_string(),
            timeout,
        });
    }
    Ok(left)
}

/// Fails with [`Error::Mismatch`] naming every rank's value unless `get`
/// gives the same value for every record.
pub fn check_equal<R, T: PartialEq + std::fmt::Display>(
    what: &'static str,
    records: &[R],
    get: impl Fn(&R) -> T,
) -> Result<()> {
    let Some(first) = records.first().map(&get) else {
        return Ok(());
    };
    if records.iter().all(|r| get(r) == first) {
        return Ok(());
    }
    let values: Vec<String> = records
        .iter()
        .enumerate()
        .map(|(rank, r)| format!("rank {rank}: {}", get(r)))
        .collect();
    Err(Error::Mismatch {
        what,
        detail: values.join(", "),
    })
}

/// Checks that there is one record per rank of a world of `world` and that
/// every rank reports that world size (`get_world` reads it from a record).
pub fn check_world_size<R>(world: usize, records: &[R], get_world: impl Fn(&R) -> usize) -> Result<()> {
    if records.len() != world || records.is_empty() {
        return Err(Error::Mismatch {
            what: "world size",
            detail: format!("{} records for a world of {world}", records.len()),
        });
    }
    check_equal("world size", records, &get_world)?;
    if get_world(&records[0]) != world {
        return Err(Error::Mismatch {
            what: "world size",
            detail: format!("ranks say {}, the group has {world}", get_world(&records[0])),
        });
    }
    Ok(())
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// This host's identity as ranks compare it at rendezvous: the host name and the kernel's boot
/// id (shared by every process and container of one machine).
pub fn host_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        format!(
            "{}/{}",
            read_trimmed("/proc/sys/kernel/hostname"),
            read_trimmed("/proc/sys/kernel/random/boot_id")
        )
    })
    .clone()
}

/// This process's pid namespace (ranks that pass fds check each other's pids, which needs one
/// namespace).
pub fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_left_until_the_deadline() {
        let t = std::time::Duration::from_secs(5);
        let left = super::time_left(std::time::Instant::now() + t, t, "x").unwrap();
        assert!(left > std::time::Duration::from_secs(4) && left <= t);
        let e = super::time_left(std::time::Instant::now(), t, "rendezvous").unwrap_err();
        assert!(matches!(e, crate::Error::Timeout { ref what, timeout } if what == "rendezvous" && timeout == t));
    }

    use super::*;

    #[test]
    fn equal_and_world() {
        assert!(check_equal("x", &[1, 1, 1], |v| *v).is_ok());
        let e = check_equal("x", &[1, 2, 1], |v| *v)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("rank 1: 2"), "{e}");
        assert!(check_world_size(2, &[2usize, 2], |w| *w).is_ok());
        assert!(check_world_size(3, &[2usize, 2], |w| *w).is_err());
        assert!(check_world_size(2, &[3usize, 3], |w| *w).is_err());
        assert!(check_world_size(2, &[2usize, 3], |w| *w).is_err());
        assert!(check_world_size(0, &[] as &[usize], |w| *w).is_err());
        assert!(host_id().contains('/'));
    }
}
