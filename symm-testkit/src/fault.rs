//! Fault injection: re-exports [`symm_core::fault`] (it lives in symm-core so
//! that every backend can call [`fault_point`]).
//!
//! - Processes: `SYMM_FAULT=kill:<rank>:<point>[,...]` (set by
//!   [`crate::launch::run_processes_outcomes`] from a [`Fault`]) ends the
//!   process whose `RANK` is `<rank>` with status 137 when it reaches `<point>`.
//! - Threads: [`set_thread_fault`] (set by the thread launcher) makes
//!   [`fault_point`] return an [`symm_core::Error::Aborted`] starting with
//!   [`INJECTED_FAULT`] in that thread.
//!
//! Points of the host backend: `rendezvous.before_send`,
//! `rendezvous.after_send`, `rendezvous.after_map`, `barrier.mid`.
#![forbid(unsafe_code)]

pub use symm_core::fault::*;

/// Exit status of a process killed by a fault.
pub const KILLED_STATUS: i32 = 137;
