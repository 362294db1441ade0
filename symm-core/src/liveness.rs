//! Setup liveness (NOTE [setup-liveness]): every rank publishes which process it is when it
//! joins a group; a setup exchange waiting for a rank that has not arrived asks whether that
//! process still exists, and fails naming the rank within [`symm_store::LIVENESS_POLL`] instead
//! of at the store timeout.
//!
//! Only a peer on this host, in this pid namespace, can be judged (through `/proc`); any other
//! peer is presumed alive until the exchange's timeout, which then names the missing ranks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use symm_store::{Liveness, Store, StoreError};

use crate::agree::{host_id, pid_namespace};

/// Which process a rank is: host, pid namespace, pid and the process's start time (so a reused
/// pid is not taken for the rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessRecord {
    host: String,
    pid_ns: String,
    pid: u32,
    start: u64,
}

impl ProcessRecord {
    /// This process.
    pub(crate) fn me() -> ProcessRecord {
        let pid = std::process::id();
        ProcessRecord {
            host: host_id(),
            pid_ns: pid_namespace(),
            pid,
            start: symm_store::process::stat(pid).map_or(0, |s| s.start),
        }
    }

    pub(crate) fn encode(&self) -> String {
        format!("{}\n{}\n{}\n{}", self.host, self.pid_ns, self.pid, self.start)
    }

    pub(crate) fn decode(b: &[u8]) -> Option<ProcessRecord> {
        let text = std::str::from_utf8(b).ok()?;
        let mut it = text.split('\n');
        Some(ProcessRecord {
            host: it.next()?.to_string(),
            pid_ns: it.next()?.to_string(),
            pid: it.next()?.parse().ok()?,
            start: it.next()?.parse().ok()?,
        })
    }

    /// `pid N on host H` (the host's name part).
    pub(crate) fn describe(&self) -> String {
        let host = self.host.split('/').next().unwrap_or(&self.host);
        format!("pid {} on {host}", self.pid)
    }

    /// Whether this process is known to be running, judged from `me`'s host and namespace (one
    /// elsewhere cannot be judged: false).
    pub(crate) fn alive_here(&self, me: &ProcessRecord) -> bool {
        self.host == me.host && self.pid_ns == me.pid_ns && self.pid != 0 && self.gone(me).is_none()
    }

    /// Why this process is known to be gone, judged from `me`'s host and namespace; `None` when it
    /// may be alive or cannot be judged from here.
    fn gone(&self, me: &ProcessRecord) -> Option<String> {
        if self.host != me.host || self.pid_ns != me.pid_ns || self.pid == 0 {
            return None;
        }
        match symm_store::process::stat(self.pid).ok() {
            None => Some(format!("its process (pid {}) exited", self.pid)),
            Some(s) if s.start != self.start => Some(format!(
                "its process (pid {}) exited (the pid now belongs to another process)",
                self.pid
            )),
            Some(s) if s.exited() => Some(format!("its process (pid {}) exited (state {})", self.pid, s.state)),
            Some(s) if s.exiting => Some(format!(
                "its process (pid {}) is exiting (killed or returned; state {})",
                self.pid, s.state
            )),
            Some(_) => None,
        }
    }
}

/// The store key of `rank`'s process record under a group's `prefix`.
fn record_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/process/{rank}")
}

/// The [`Liveness`] of a group's ranks, from the records they published.
pub(crate) struct GroupLiveness {
    store: Arc<dyn Store>,
    prefix: String,
    me: ProcessRecord,
    known: Mutex<HashMap<usize, ProcessRecord>>,
}

impl GroupLiveness {
    pub(crate) fn new(store: Arc<dyn Store>, prefix: String, me: ProcessRecord) -> GroupLiveness {
        GroupLiveness {
            store,
            prefix,
            me,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes this process as `rank`'s.
    pub(crate) fn publish(&self, rank: usize) -> Result<(), StoreError> {
        self.store
            .set(&record_key(&self.prefix, rank), self.me.encode().as_bytes())
    }

    fn record(&self, rank: usize) -> Option<ProcessRecord> {
        let cached = self.known.lock().unwrap_or_else(|e| e.into_inner()).get(&rank).cloned();
        if cached.is_some() {
            return cached;
        }
        // The store round trips run without the lock (another thread's lookup need not wait).
        let key = record_key(&self.prefix, rank);
        if !self.store.check(&[&key]).ok()? {
            return None;
        }
        let r = ProcessRecord::decode(&self.store.get(&key).ok()?)?;
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(rank, r.clone());
        Some(r)
    }
}

impl Liveness for GroupLiveness {
    fn lost(&self, missing: &[usize]) -> Option<(usize, String)> {
        missing
            .iter()
            .find_map(|&r| self.record(r).and_then(|p| p.gone(&self.me)).map(|why| (r, why)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_judge_processes() {
        let me = ProcessRecord::me();
        assert!(me.start > 0, "start time read from /proc/self/stat");
        assert_eq!(ProcessRecord::decode(me.encode().as_bytes()), Some(me.clone()));
        assert_eq!(ProcessRecord::decode(b"host\nns\nnot-a-pid\n1"), None);
        // This process is alive.
        assert_eq!(me.gone(&me), None);
        // A reused pid (another start time) and a pid that does not exist are gone.
        let reused = ProcessRecord {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(reused.gone(&me).is_some_and(|w| w.contains("another process")));
        let none = ProcessRecord {
            pid: u32::MAX - 1,
            ..me.clone()
        };
        assert!(none.gone(&me).is_some_and(|w| w.contains("exited")));
        // Another host or namespace cannot be judged from here.
        let elsewhere = ProcessRecord {
            host: "other/boot".into(),
            ..none.clone()
        };
        assert_eq!(elsewhere.gone(&me), None);
        let other_ns = ProcessRecord {
            pid_ns: "pid:[1]".into(),
            ..none
        };
        assert_eq!(other_ns.gone(&me), None);
    }
}
