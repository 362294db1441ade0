//! Whether a process of this host is alive, from `kill(pid, 0)` and `/proc/<pid>/stat`: one
//! reader of the stat line for the fd channel, the group liveness records (symm-core) and the
//! host backend's peer checks (symm-testkit).

use std::io;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (field 3).
    pub state: char,
    /// `PF_EXITING` in the flags (field 9): the process has begun to exit (it was killed, or
    /// returned from `main`) and will not run its code again. A killed GPU process stays in this
    /// state, not yet a zombie, while its driver context is torn down (hundreds of ms).
    pub exiting: bool,
    /// The start time (field 22, clock ticks since boot): tells a reused pid apart.
    pub start: u64,
}

impl ProcStat {
    /// Exited: a zombie (state Z) or dead (X) process.
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    /// Gone for good: exited, or begun to exit.
    pub fn gone(&self) -> bool {
        self.exited() || self.exiting
    }
}

/// `PF_EXITING` of the kernel's task flags (include/linux/sched.h), set first thing in the exit
/// path of a thread, before its memory and files (the GPU driver's context) are released.
const PF_EXITING: u64 = 0x4;

/// The stat line of process `pid`. `NotFound` when there is no such process; `InvalidData` when
/// the line cannot be read as a stat line.
pub fn stat(pid: u32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/stat: {text:?}")))
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may hold spaces: fields after the last ')'.
    let mut f = text[text.rfind(')')? + 1..].split_whitespace();
    let state = f.next()?.chars().next()?;
    // Field 9 (flags) is the 6th after the state (field 3); field 22 (starttime) the 13th after it.
    let flags: u64 = f.nth(5)?.parse().ok()?;
    let start = f.nth(12)?.parse().ok()?;
    Some(ProcStat {
        state,
        exiting: flags & PF_EXITING != 0,
        start,
    })
}

/// False when process `pid` is known to be gone: no such process, or a zombie, dead or exiting
/// one. True when it runs or cannot be judged (an unreadable stat line).
pub fn alive(pid: i32) -> bool {
    if let Err(nix::errno::Errno::ESRCH) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        return false;
    }
    let Ok(pid) = u32::try_from(pid) else {
        return true;
    };
    match stat(pid) {
        Ok(s) => !s.gone(),
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_not() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert!(s.state == 'R' || s.state == 'S', "{s:?}");
        assert!(s.start > 0 && !s.exiting && !s.gone(), "{s:?}");
        assert!(alive(me as i32));
        assert!(!alive(i32::MAX - 1));
        assert_eq!(stat(u32::MAX - 1).unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    /// A stat line of a process killed while in its GPU driver's teardown (state D, flags with
    /// PF_EXITING), with a command name holding ") (" and spaces; then the same flags without it.
    #[test]
    fn exiting_is_read_from_the_flags() {
        let tail = "1 2 3 0 -1 {flags} 100 0 0 0 5 6 0 0 20 0 9 0 123456 0 0";
        let line = |flags: u64| format!("4242 (my (odd) cmd) D {}", tail.replace("{flags}", &flags.to_string()));
        let s = parse_stat(&line(0x40_4044)).unwrap();
        assert_eq!((s.state, s.exiting, s.start), ('D', true, 123456));
        assert!(s.gone());
        let s = parse_stat(&line(0x40_4040)).unwrap();
        assert!(!s.exiting && !s.gone(), "{s:?}");
        assert!(parse_stat("4242 (cmd) S 1 2").is_none());
    }

    /// A killed child not yet reaped is a zombie: gone, though its pid still answers kill(0).
    #[test]
    fn a_killed_unreaped_child_is_gone() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        child.kill().unwrap();
        let t = std::time::Instant::now();
        while alive(pid as i32) {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "{:?}", stat(pid));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(stat(pid).unwrap().gone());
        child.wait().unwrap();
    }
}
