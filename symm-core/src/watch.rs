//! NOTE [peer-watch]: a communicator's watch on its peers while it lives. A thread polls, every
//! [`WATCH_POLL`], whether a peer's process on this host has exited (the records of NOTE
//! [setup-liveness]) and whether a peer announced that it left (dropped its communicator: the
//! watch's `Drop` writes `{scope}/left/{rank}`). On the first such peer it calls the owner's
//! `on_lost` once (the communicator sets the abort word every wait polls, host and device, so
//! an op waiting on the peer stops at its next poll) and remembers the peer, so the owner
//! reports [`Error::PeerLost`] naming it instead of `Aborted` or a timeout.
//!
//! A peer on another host is judged only by its announcement; a store that cannot be reached is
//! treated as "nothing announced" (the process check still runs).

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use symm_store::{Liveness, Store};

use crate::error::{Error, Result};
use crate::group::Group;

/// How often the watch looks at its peers.
pub const WATCH_POLL: Duration = Duration::from_millis(20);

/// A peer found gone: its rank and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub rank: usize,
    pub reason: String,
}

impl Lost {
    /// The error an op reports once the peer is gone.
    pub fn error(&self) -> Error {
        Error::PeerLost {
            rank: self.rank,
            reason: self.reason.clone(),
        }
    }
}

struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
    lost: OnceLock<Lost>,
}

/// The watch of one communicator (NOTE [peer-watch]). Dropping it announces this rank's
/// departure to the peers' watches and stops the thread (without waiting for it: it exits at
/// its next poll).
pub struct PeerWatch {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    scope: String,
    rank: usize,
}

impl std::fmt::Debug for PeerWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerWatch")
            .field("scope", &self.scope)
            .field("rank", &self.rank)
            .field("lost", &self.lost())
            .finish()
    }
}

fn left_count(scope: &str) -> String {
    format!("{scope}/left")
}

fn left_key(scope: &str, rank: usize) -> String {
    format!("{scope}/left/{rank}")
}

impl PeerWatch {
    /// Watches the peers of `group` for the communicator set up under `scope` (a store prefix
    /// every rank of the group agrees on, such as one from [`Group::next_prefix`]); `on_lost`
    /// runs once, on the watch's thread, when a peer is found gone.
    pub fn start(group: &Group, scope: String, on_lost: Box<dyn Fn(&Lost) + Send>) -> Result<PeerWatch> {
        let shared = Arc::new(Shared {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            lost: OnceLock::new(),
        });
        let me = group.rank().get();
        let peers: Vec<usize> = (0..group.world_size()).filter(|&r| r != me).collect();
        let watch = PeerWatch {
            shared: shared.clone(),
            store: group.store().clone(),
            scope: scope.clone(),
            rank: me,
        };
        if peers.is_empty() {
            return Ok(watch);
        }
        let (store, liveness) = (group.store().clone(), group.liveness());
        std::thread::Builder::new()
            .name(format!("symm-watch-{me}"))
            .spawn(move || run(&shared, &*store, &*liveness, &scope, &peers, &*on_lost))
            .map_err(|e| Error::Io(std::io::Error::other(format!("starting the peer watch: {e}"))))?;
        Ok(watch)
    }

    /// The peer found gone, if one was.
    pub fn lost(&self) -> Option<&Lost> {
        self.shared.lost.get()
    }

    /// `e`, or [`Error::PeerLost`] naming the peer found gone when `e` is what a wait on it
    /// gives (an abort, a timeout, a latched device error).
    pub fn explain(&self, e: Error) -> Error {
        match (self.lost(), &e) {
            (Some(l), Error::Aborted(_) | Error::Timeout { .. } | Error::PeerLost { .. }) => l.error(),
            _ => e,
        }
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        // Stop our thread first: taking the lock waits for a callback in progress (it runs under
        // it), so none runs once the owner goes on dropping what the callback touches.
        *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_all();
        // Tell the peers (their ops waiting on this rank stop). Before the owner's drop goes on,
        // on this thread: a thread of its own could queue behind the owner's next store request
        // (a TcpStore client serves one request at a time) and tell nobody. Bounded by the
        // store's timeout when the store does not answer.
        let told = self
            .store
            .set(&left_key(&self.scope, self.rank), b"dropped its communicator")
            .and_then(|()| self.store.add(&left_count(&self.scope), 1));
        if let Err(e) = told {
            log::debug!("symm peer watch: announcing that rank {} left: {e}", self.rank);
        }
    }
}

/// The watch's thread: polls until stopped or a peer is found gone.
fn run(
    shared: &Shared,
    store: &dyn Store,
    liveness: &dyn Liveness,
    scope: &str,
    peers: &[usize],
    on_lost: &dyn Fn(&Lost),
) {
    let mut stop = shared.stop.lock().unwrap_or_else(|e| e.into_inner());
    while !*stop {
        drop(stop);
        let found = look(store, liveness, scope, peers);
        stop = shared.stop.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lost) = found {
            // Under the lock, and only while the owner has not begun to drop the watch.
            if !*stop {
                on_lost(shared.lost.get_or_init(|| lost));
            }
            return;
        }
        if !*stop {
            stop = shared
                .wake
                .wait_timeout(stop, WATCH_POLL)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }
}

/// One look at the peers: a process on this host that exited, or a peer that announced it left.
fn look(store: &dyn Store, liveness: &dyn Liveness, scope: &str, peers: &[usize]) -> Option<Lost> {
    if let Some((rank, why)) = liveness.lost(peers) {
        return Some(Lost {
            rank,
            reason: format!("{why} while this communicator was in use"),
        });
    }
    // One round trip while nobody left (ADD of 0 reads the count, creating it at 0).
    match store.add(&left_count(scope), 0) {
        Ok(n) if n > 0 => peers.iter().find_map(|&r| {
            let key = left_key(scope, r);
            match store.get_now(&key) {
                Ok(v) => Some(Lost {
                    rank: r,
                    reason: format!("it {}", String::from_utf8_lossy(&v)),
                }),
                Err(_) => None,
            }
        }),
        Ok(_) => None,
        Err(e) => {
            log::trace!("symm peer watch: reading {scope}: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;
    use symm_store::HashStore;

    #[test]
    fn a_dropped_watch_is_seen_by_its_peers_with_the_rank() {
        let store: Arc<dyn Store> = HashStore::new(Duration::from_secs(5));
        let groups: Vec<Arc<Group>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let store = store.clone();
                    s.spawn(move || Group::new("watch", r, 3, store))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        let calls = Arc::new(AtomicUsize::new(0));
        let watches: Vec<PeerWatch> = groups
            .iter()
            .map(|g| {
                let calls = calls.clone();
                PeerWatch::start(
                    g,
                    "symm/watch-test/comm/0".into(),
                    Box::new(move |_| {
                        calls.fetch_add(1, Ordering::SeqCst);
                    }),
                )
                .unwrap()
            })
            .collect();
        std::thread::sleep(3 * WATCH_POLL);
        assert!(watches.iter().all(|w| w.lost().is_none()), "nobody left yet");
        let mut watches = watches.into_iter();
        let gone = watches.next().unwrap();
        let t = Instant::now();
        drop(gone);
        let rest: Vec<PeerWatch> = watches.collect();
        while rest.iter().any(|w| w.lost().is_none()) {
            assert!(t.elapsed() < Duration::from_secs(1), "peers did not learn within 1 s");
            std::thread::sleep(Duration::from_millis(2));
        }
        for w in &rest {
            let lost = w.lost().unwrap();
            assert_eq!(lost.rank, 0);
            assert!(lost.reason.contains("dropped"), "{}", lost.reason);
            assert!(matches!(
                w.explain(Error::Aborted("x".into())),
                Error::PeerLost { rank: 0, .. }
            ));
            assert!(matches!(
                w.explain(Error::InvalidArgument("x".into())),
                Error::InvalidArgument(_)
            ));
        }
        // Each survivor's callback ran exactly once.
        let deadline = Instant::now() + Duration::from_secs(1);
        while calls.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
