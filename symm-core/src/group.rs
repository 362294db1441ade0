//! Groups: a name, this process's (or thread's) rank in it, the world size and
//! the store the ranks meet through.
//!
//! A [`Group`] is an explicit handle, so one process can hold several ranks (one
//! thread per GPU). For one process per rank, [`set_group_info`] /
//! [`group_info`] keep a process-wide registry by name, as PyTorch does.
//!
//! A group also carries the options every rank must agree on
//! ([`GroupOptions`]: whether ranks may share a device); backends compare
//! them at rendezvous, so ranks that disagree fail alike instead of deciding
//! differently.
//!
//! Store keys of a group live under `symm/{name}/g{generation}/`: the
//! generation is agreed through the store when the group is built, so a
//! recycled group name never sees the keys of its predecessor, and subgroups
//! (their own names) never share keys with their parent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use symm_store::Store;

use crate::error::{Error, Result};
use crate::types::Rank;

/// Environment switch that turns [`GroupOptions::shared_devices`] on for groups built with
/// [`Group::new`] (PyTorch's `TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES`).
pub const ALLOW_OVERLAPPING_DEVICES_ENV: &str = "SYMM_ALLOW_OVERLAPPING_DEVICES";

/// Options of a group that every rank must pass alike (checked at every
/// rendezvous: a rank that disagrees makes every rank fail with
/// [`Error::Mismatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupOptions {
    /// Ranks may share a device (several ranks on one GPU, NOTE
    /// [shared-device] in docs/architecture.md). CUDA and ROCm allow it for
    /// ranks that are threads of one process (one context, the kernels of
    /// every rank resident together); the NCCL fallback is off in such a
    /// group. Default false: two ranks on one device is usually a mistake.
    pub shared_devices: bool,
}

impl GroupOptions {
    /// The options [`Group::new`] uses: `shared_devices` when
    /// `SYMM_ALLOW_OVERLAPPING_DEVICES=1`.
    pub fn from_env() -> GroupOptions {
        GroupOptions {
            shared_devices: std::env::var(ALLOW_OVERLAPPING_DEVICES_ENV).is_ok_and(|v| v == "1"),
        }
    }
}

/// One rank's view of a group.
pub struct Group {
    name: String,
    rank: Rank,
    store: Arc<dyn Store>,
    generation: u64,
    timeout: Duration,
    seq: AtomicU64,
    options: GroupOptions,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("generation", &self.generation)
            .field("options", &self.options)
            .finish()
    }
}

impl Group {
    /// Builds a group and agrees its generation with the other ranks through
    /// the store. Every rank of the group must call this (with the same name
    /// and world size) before any rank builds the next generation of the same
    /// name. Options: [`GroupOptions::from_env`].
    pub fn new(name: impl Into<String>, rank: usize, world_size: usize, store: Arc<dyn Store>) -> Result<Arc<Group>> {
        Self::with_options(name, rank, world_size, store, GroupOptions::from_env())
    }

    /// [`Group::new`] with explicit options (every rank passes the same).
    pub fn with_options(
        name: impl Into<String>,
        rank: usize,
        world_size: usize,
        store: Arc<dyn Store>,
        options: GroupOptions,
    ) -> Result<Arc<Group>> {
        let name = name.into();
        if name.is_empty() || name.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "group name {name:?} must be non-empty text"
            )));
        }
        let rank = Rank::new(rank, world_size)?;
        let timeout = store.timeout();
        let joins = store.add(&format!("symm/{name}/joins"), 1)?;
        let generation = ((joins - 1).max(0) as u64) / world_size as u64;
        Ok(Arc::new(Group {
            name,
            rank,
            store,
            generation,
            timeout,
            seq: AtomicU64::new(0),
            options,
        }))
    }

    /// The options the group was built with.
    pub fn options(&self) -> GroupOptions {
        self.options
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn rank(&self) -> Rank {
        self.rank
    }
    pub fn world_size(&self) -> usize {
        self.rank.world_size()
    }
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// Default timeout for waits of this group (the store's, when built).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    /// The store-key prefix of this group's generation.
    pub fn prefix(&self) -> String {
        format!("symm/{}/g{}", self.name, self.generation)
    }
    /// A fresh prefix for the next collective setup step (rendezvous,
    /// communicator). Every rank calls this in the same order, so the
    /// sequence numbers agree.
    pub fn next_prefix(&self, what: &str) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{}/{what}/{n}", self.prefix())
    }

    /// Builds a subgroup of `ranks` (global ranks of this group, in order)
    /// named `name`, with this group's options. Ranks not in the list get
    /// `None`. Every rank of this group must call it.
    pub fn subgroup(&self, name: &str, ranks: &[usize]) -> Result<Option<Arc<Group>>> {
        let mut seen = vec![false; self.world_size()];
        for &r in ranks {
            self.rank.peer(r)?;
            if std::mem::replace(&mut seen[r], true) {
                return Err(Error::InvalidArgument(format!(
                    "rank {r} listed twice in subgroup {name:?}"
                )));
            }
        }
        match ranks.iter().position(|&r| r == self.rank.get()) {
            Some(i) => Group::with_options(name, i, ranks.len(), self.store.clone(), self.options).map(Some),
            None => Ok(None),
        }
    }
}

fn registry() -> &'static Mutex<HashMap<String, Arc<Group>>> {
    static REG: OnceLock<Mutex<HashMap<String, Arc<Group>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

/// Registers this process's membership of group `name` (one rank per
/// process, as PyTorch's `set_group_info`). Replaces a previous registration
/// of the same name with a new generation.
pub fn set_group_info(name: &str, rank: usize, world_size: usize, store: Arc<dyn Store>) -> Result<Arc<Group>> {
    let g = Group::new(name, rank, world_size, store)?;
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_string(), g.clone());
    Ok(g)
}

/// Looks up a group registered with [`set_group_info`].
pub fn group_info(name: &str) -> Result<Arc<Group>> {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .cloned()
        .ok_or_else(|| Error::UnknownGroup(name.to_string()))
}

/// Forgets a registered group (its name can then be recycled).
pub fn remove_group_info(name: &str) -> bool {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name)
        .is_some()
}
