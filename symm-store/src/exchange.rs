//! [`StoreExchange`]: all_gather / broadcast / barrier of plain bytes through a store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{Result, Store, StoreError};

/// Tells whether a rank that has not written yet is gone for good (its process exited), so an
/// exchange fails in about [`LIVENESS_POLL`] instead of at its timeout.
pub trait Liveness: Send + Sync {
    /// The first of `missing` known to be gone, with why; `None` when all may still come.
    fn lost(&self, missing: &[usize]) -> Option<(usize, String)>;
}

/// How often an exchange with a [`Liveness`] asks it about the ranks still missing.
pub const LIVENESS_POLL: Duration = Duration::from_millis(200);

/// Collective exchange of small byte strings through a [`Store`].
///
/// Every call takes a fresh sequence number, so all ranks must make the same calls in
/// the same order (as with any collective). Keys live under `prefix/seq/...`; the last
/// rank to finish a call deletes them. A call that does not complete within its
/// timeout fails with [`StoreError::MissingRanks`] naming the ranks that never wrote.
pub struct StoreExchange {
    store: Arc<dyn Store>,
    prefix: String,
    seq: AtomicU64,
    liveness: Option<Arc<dyn Liveness>>,
}

impl std::fmt::Debug for StoreExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreExchange")
            .field("prefix", &self.prefix)
            .field("seq", &self.seq.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn check_rank(rank: usize, world: usize, what: &str) -> Result<()> {
    if world == 0 {
        return Err(StoreError::InvalidArgument(format!("{what}: world size is 0")));
    }
    if rank >= world {
        return Err(StoreError::InvalidArgument(format!(
            "{what}: rank {rank} out of range for world size {world}"
        )));
    }
    Ok(())
}

impl StoreExchange {
    /// An exchange whose keys live under `prefix` in `store`.
    pub fn new(store: Arc<dyn Store>, prefix: impl Into<String>) -> StoreExchange {
        StoreExchange {
            store,
            prefix: prefix.into(),
            seq: AtomicU64::new(0),
            liveness: None,
        }
    }

    /// The exchange, asking `liveness` about missing ranks while it waits: a rank found gone
    /// gives [`StoreError::PeerLost`] naming it, without waiting for the timeout.
    pub fn with_liveness(mut self, liveness: Arc<dyn Liveness>) -> StoreExchange {
        self.liveness = Some(liveness);
        self
    }

    /// The store this exchange talks through.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn next_base(&self) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{}/{}", self.prefix, seq)
    }

    /// Waits for `keys` (one per rank in `ranks`); on timeout names the ranks still missing, and
    /// with a [`Liveness`] fails early naming a missing rank found gone.
    fn wait_ranks(&self, what: &str, keys: &[String], ranks: &[usize], timeout: Duration) -> Result<()> {
        let start = Instant::now();
        // (key, rank) still missing; keys stay until every rank finished, so it only shrinks.
        let mut missing: Vec<(&str, usize)> = keys.iter().map(String::as_str).zip(ranks.iter().copied()).collect();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            let slice = match &self.liveness {
                Some(_) => left.min(LIVENESS_POLL),
                None => left,
            }
            // A zero timeout can mean "no deadline" to a store; the loop ends on elapsed time.
            .max(Duration::from_millis(1));
            let refs: Vec<&str> = missing.iter().map(|&(k, _)| k).collect();
            match self.store.wait(&refs, Some(slice)) {
                Ok(()) => return Ok(()),
                Err(StoreError::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
            let mut still = Vec::with_capacity(missing.len());
            for (k, r) in missing {
                if !self.store.check(&[k])? {
                    still.push((k, r));
                }
            }
            missing = still;
            if missing.is_empty() {
                // Everyone arrived just as the wait gave up.
                return Ok(());
            }
            let ranks: Vec<usize> = missing.iter().map(|&(_, r)| r).collect();
            if let Some((rank, reason)) = self.liveness.as_ref().and_then(|l| l.lost(&ranks)) {
                return Err(StoreError::PeerLost {
                    rank,
                    reason: format!("{reason} (during {what}; ranks {ranks:?} had not arrived)"),
                });
            }
            if start.elapsed() >= timeout {
                return Err(StoreError::MissingRanks {
                    what: what.to_owned(),
                    missing: ranks,
                    timeout,
                });
            }
        }
    }

    /// Marks this rank done with `base`; the last of `world` ranks deletes `keys`.
    fn finish(&self, base: &str, keys: &[String], world: usize) -> Result<()> {
        let done_key = format!("{base}/done");
        let n = self.store.add(&done_key, 1)?;
        if usize::try_from(n).is_ok_and(|n| n >= world) {
            for k in keys {
                self.store.delete_key(k)?;
            }
            self.store.delete_key(&done_key)?;
        }
        Ok(())
    }

    /// Every rank contributes `data`; returns all contributions indexed by rank.
    pub fn all_gather(&self, rank: usize, world: usize, data: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        check_rank(rank, world, "all_gather")?;
        let base = self.next_base();
        let keys: Vec<String> = (0..world).map(|r| format!("{base}/{r}")).collect();
        self.store.set(&keys[rank], data)?;
        let ranks: Vec<usize> = (0..world).collect();
        self.wait_ranks(&format!("all_gather {base}"), &keys, &ranks, timeout)?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let out = self.store.multi_get(&refs)?;
        if out.len() != world {
            return Err(StoreError::Protocol(format!(
                "multi_get returned {} values for {world} keys",
                out.len()
            )));
        }
        self.finish(&base, &keys, world)?;
        Ok(out)
    }

    /// `root` contributes `data` (others pass `&[]`); every rank returns the root's bytes.
    pub fn broadcast(&self, rank: usize, world: usize, root: usize, data: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        check_rank(rank, world, "broadcast")?;
        check_rank(root, world, "broadcast root")?;
        let base = self.next_base();
        let key = format!("{base}/root");
        let out = if rank == root {
            self.store.set(&key, data)?;
            data.to_vec()
        } else {
            self.wait_ranks(
                &format!("broadcast {base}"),
                std::slice::from_ref(&key),
                &[root],
                timeout,
            )?;
            self.store.get_now(&key)?
        };
        self.finish(&base, &[key], world)?;
        Ok(out)
    }

    /// Returns once every rank has called `barrier` (or fails naming the absent ranks).
    pub fn barrier(&self, rank: usize, world: usize, timeout: Duration) -> Result<()> {
        check_rank(rank, world, "barrier")?;
        let base = self.next_base();
        let keys: Vec<String> = (0..world).map(|r| format!("{base}/{r}")).collect();
        self.store.set(&keys[rank], b"")?;
        let ranks: Vec<usize> = (0..world).collect();
        self.wait_ranks(&format!("barrier {base}"), &keys, &ranks, timeout)?;
        self.finish(&base, &keys, world)
    }
}
