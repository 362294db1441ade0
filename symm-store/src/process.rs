//! Whether a process of this host is alive, from `kill(pid, 0)` and `/proc/<pid>/stat`: one
//! reader of the stat line for the fd channel, the group liveness records (symm-core) and the
//! host backend's peer checks (symm-testkit).

use std::io;

/// State letter and start time (clock ticks since boot) of process `pid`, from
/// `/proc/<pid>/stat`. `NotFound` when there is no such process; `InvalidData` when the line
/// cannot be read as a stat line.
pub fn stat(pid: u32) -> io::Result<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/stat: {text:?}"));
    // The command name (field 2) is in parentheses and may hold spaces: fields after the last ')'.
    let rest = &text[text.rfind(')').ok_or_else(bad)? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next().and_then(|s| s.chars().next()).ok_or_else(bad)?;
    // Field 22 (starttime) is the 20th after the state (field 3).
    let start = f.nth(18).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    Ok((state, start))
}

/// False when process `pid` is known to be gone: no such process, or a zombie / dead one. True
/// when it runs or cannot be judged (an unreadable stat line).
pub fn alive(pid: i32) -> bool {
    if let Err(nix::errno::Errno::ESRCH) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        return false;
    }
    let Ok(pid) = u32::try_from(pid) else {
        return true;
    };
    match stat(pid) {
        Ok((state, _)) => !matches!(state, 'Z' | 'X'),
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_not() {
        let me = std::process::id();
        let (state, start) = stat(me).unwrap();
        assert!(state == 'R' || state == 'S', "{state}");
        assert!(start > 0);
        assert!(alive(me as i32));
        assert!(!alive(i32::MAX - 1));
        assert_eq!(stat(u32::MAX - 1).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
