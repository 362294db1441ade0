//! A child's signal state at its start (issue #39): the one `unsafe` of the launchers.
//!
//! A process started with `std::process::Command` inherits its parent's signal mask (the
//! standard library stopped clearing it in Rust 1.66, rust-lang/rust#101077) and the signals
//! its parent ignores. `symmrun` blocks the signals it forwards (it receives them with
//! `sigwait`), so without [`clean_signal_mask`] a forwarded SIGTERM would stay pending in a
//! rank forever: the rank's own handler would never run, and the rank would be SIGKILLed after
//! the grace period.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::{sigaction, sigprocmask, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};

/// The signals `symmrun` forwards to its ranks; a rank started through [`clean_signal_mask`]
/// has each at its default action.
pub const FORWARDED_SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Makes the process `cmd` starts begin with an empty signal mask and with
/// [`FORWARDED_SIGNALS`] at their default action (not ignored, as they would stay if this
/// process ignored them), whatever this thread blocks or this process ignores. The program's
/// own handlers, installed after it starts, then run when those signals arrive.
///
/// `cmd` then starts its process with fork and exec (a closure runs between them) rather than
/// `posix_spawn`; a failure in the child (which does not happen for these arguments) makes
/// `spawn` return the error.
pub fn clean_signal_mask(cmd: &mut Command) {
    // Built here, before the fork; the closure captures them by value.
    let empty = SigSet::empty();
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    let closure = move || -> std::io::Result<()> {
        for sig in FORWARDED_SIGNALS {
            // SAFETY: installs SIG_DFL, no handler function, so no pointer of unknown
            // provenance is involved; the previous action, returned, is dropped unread.
            unsafe { sigaction(sig, &default) }?;
        }
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&empty), None)?;
        Ok(())
    };
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe functions may be called and nothing may be allocated (another thread
    // of the parent may have held the allocator's lock at the fork). It calls `sigaction` and
    // `sigprocmask` (both async-signal-safe per POSIX) on values built before the fork and
    // copied into the closure; an error becomes `io::Error::from_raw_os_error` (an integer, no
    // allocation). It touches no lock, no file descriptor and no memory shared with the
    // parent's other threads.
    unsafe {
        cmd.pre_exec(closure);
    }
}
