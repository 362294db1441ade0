//! Fault injection: kill a rank at a named point.
//!
//! It lives in symm-core so that every backend can call it. [`fault_point`]
//! is called at named points: `rendezvous.before_send`,
//! `rendezvous.after_send` and `rendezvous.after_map` by
//! [`crate::rendezvous`] (so in every backend), `barrier.mid` by the host
//! and CUDA backends' blocking barriers. A fault is armed in one of two ways:
//!
//! - Processes: the environment variable `SYMM_FAULT=kill:<rank>:<point>`
//!   (several separated by `,`). In the process whose `RANK` is `<rank>`,
//!   reaching `<point>` ends the process at once with exit status 137 (no
//!   unwinding, no destructors: as if it had been killed). symm-testkit's
//!   process launcher sets it.
//! - Threads: [`set_thread_fault`] arms the calling thread (the thread
//!   launcher of symm-testkit does it for the faulted rank); reaching the point returns
//!   [`Error::Aborted`] with a message starting with [`INJECTED_FAULT`], so
//!   the rank stops and drops its resources as a dead process would.
//!
//! Both exist only with the `fault-injection` feature (symm-testkit turns it on): without it
//! [`fault_point`] is `Ok(())`, nothing reads `SYMM_FAULT`, and a program cannot be killed
//! through it.

#[cfg(feature = "fault-injection")]
use std::cell::RefCell;
#[cfg(feature = "fault-injection")]
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Environment variable arming faults in processes.
pub const FAULT_ENV: &str = crate::knobs::FAULT;
/// Prefix of the message of a fault injected into a thread.
pub const INJECTED_FAULT: &str = "injected fault";

/// A fault to inject: kill `rank` when it reaches `point`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub rank: usize,
    pub point: String,
}

impl Fault {
    pub fn kill(rank: usize, point: &str) -> Fault {
        Fault {
            rank,
            point: point.to_string(),
        }
    }
    /// The `SYMM_FAULT` form: `kill:<rank>:<point>`.
    pub fn to_env(&self) -> String {
        format!("kill:{}:{}", self.rank, self.point)
    }
}

/// Parses a `SYMM_FAULT` value (`kill:<rank>:<point>[,...]`).
pub fn parse_faults(spec: &str) -> std::result::Result<Vec<Fault>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let mut it = item.splitn(3, ':');
            match (it.next(), it.next(), it.next()) {
                (Some("kill"), Some(r), Some(p)) if !p.is_empty() => r
                    .parse::<usize>()
                    .map(|rank| Fault::kill(rank, p))
                    .map_err(|_| format!("{FAULT_ENV}: bad rank {r:?} in {item:?}")),
                _ => Err(format!("{FAULT_ENV}: expected kill:<rank>:<point>, got {item:?}")),
            }
        })
        .collect()
}

#[cfg(feature = "fault-injection")]
fn env_faults() -> &'static [Fault] {
    static FAULTS: OnceLock<Vec<Fault>> = OnceLock::new();
    FAULTS.get_or_init(|| {
        let Some(spec) = crate::knobs::get(FAULT_ENV) else {
            return Vec::new();
        };
        match parse_faults(spec) {
            Ok(f) => f,
            Err(e) => {
                // A malformed spec must not silently disable a fault test.
                eprintln!("symm-testkit: {e}; killing this process");
                die()
            }
        }
    })
}

#[cfg(feature = "fault-injection")]
fn env_rank() -> Option<usize> {
    static RANK: OnceLock<Option<usize>> = OnceLock::new();
    *RANK.get_or_init(|| crate::knobs::get(crate::knobs::RANK).and_then(|r| r.parse().ok()))
}

#[cfg(feature = "fault-injection")]
thread_local! {
    static THREAD_FAULT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Arms (or with `None` disarms) a fault point for the calling thread.
#[cfg(feature = "fault-injection")]
pub fn set_thread_fault(point: Option<&str>) {
    THREAD_FAULT.with(|f| *f.borrow_mut() = point.map(str::to_string));
}

/// Ends the process at once with status 137 (what a SIGKILL'd process
/// reports through a shell): no unwinding, no destructors of live objects.
#[cfg(feature = "fault-injection")]
fn die() -> ! {
    std::process::exit(137)
}

/// A named fault point. Returns an error in a thread armed for `point`, kills
/// the process when `SYMM_FAULT` names this rank and `point`, and otherwise
/// returns `Ok(())` (always, without the `fault-injection` feature).
#[cfg(not(feature = "fault-injection"))]
pub fn fault_point(_point: &str) -> Result<()> {
    Ok(())
}

/// A named fault point. Returns an error in a thread armed for `point`, kills
/// the process when `SYMM_FAULT` names this rank and `point`, and otherwise
/// returns `Ok(())`.
#[cfg(feature = "fault-injection")]
pub fn fault_point(point: &str) -> Result<()> {
    let armed = THREAD_FAULT.with(|f| f.borrow().as_deref() == Some(point));
    if armed {
        return Err(Error::Aborted(format!("{INJECTED_FAULT}: rank killed at {point}")));
    }
    let faults = env_faults();
    if !faults.is_empty() && faults.iter().any(|f| f.point == point && Some(f.rank) == env_rank()) {
        die();
    }
    Ok(())
}

/// True if `e` is the error of a fault injected into a thread.
pub fn is_injected(e: &Error) -> bool {
    matches!(e, Error::Aborted(m) if m.starts_with(INJECTED_FAULT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(
            parse_faults("kill:1:barrier.mid, kill:0:rendezvous.after_map").unwrap(),
            vec![Fault::kill(1, "barrier.mid"), Fault::kill(0, "rendezvous.after_map")]
        );
        assert!(parse_faults("kill:x:a").is_err());
        assert!(parse_faults("stop:1:a").is_err());
        assert!(parse_faults("kill:1:").is_err());
        assert_eq!(parse_faults("").unwrap(), vec![]);
        assert_eq!(Fault::kill(2, "p").to_env(), "kill:2:p");
    }

    #[test]
    fn thread_fault() {
        assert!(fault_point("x.y").is_ok());
        set_thread_fault(Some("x.y"));
        let e = fault_point("x.y").unwrap_err();
        assert!(is_injected(&e), "{e}");
        assert!(fault_point("x.z").is_ok());
        set_thread_fault(None);
        assert!(fault_point("x.y").is_ok());
    }
}
