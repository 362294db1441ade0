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
//! Store keys of a group live under `symm/{name}/g{generation}/` (with a job
//! identity, `symm/job-{id}/{name}/g{generation}/`): the generation is agreed
//! through the store when the group is built, so a recycled group name never
//! sees the keys of its predecessor, and subgroups (their own names) never
//! share keys with their parent. Two jobs on one store with different job
//! identities never see each other's keys. Within one job (or none), every
//! rank claims its rank in its generation and the members of a generation
//! check at their first setup exchange that they come from one launch (NOTE
//! [membership], `membership.rs`), so a rank launched twice, or two launches
//! sharing a group name and job id, fail with [`Error::Mismatch`] naming both
//! processes instead of pairing up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use symm_store::{Liveness, Store, StoreExchange};

use crate::error::{Error, Result};
use crate::types::Rank;

/// Environment switch that turns [`GroupOptions::shared_devices`] on for groups built with
/// [`Group::new`] (PyTorch's `TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES`).
pub const ALLOW_OVERLAPPING_DEVICES_ENV: &str = crate::knobs::ALLOW_OVERLAPPING_DEVICES;

/// Environment variables naming the job a group belongs to, first set wins:
/// ours, then torchrun's run id ([`GroupOptions::from_env`]).
pub const JOB_ID_ENVS: [&str; 2] = [crate::knobs::JOB_ID, crate::knobs::TORCHELASTIC_RUN_ID];

/// Environment variable naming the launch a rank process belongs to ([`GroupOptions::launch`]).
pub const LAUNCH_ID_ENV: &str = crate::knobs::LAUNCH_ID;

/// A job's identity in store keys: a 64-bit FNV-1a hash of its text (so
/// options stay `Copy` and keys stay short).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobId(u64);

impl JobId {
    /// The identity of job `text` (any non-empty string; every rank of the job
    /// passes the same).
    pub fn new(text: &str) -> JobId {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        JobId(h)
    }

    /// The identity [`JOB_ID_ENVS`] give, in order, through `var`; `None`
    /// when none is set to a non-empty value.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<JobId> {
        JOB_ID_ENVS
            .iter()
            .find_map(|k| var(k).filter(|v| !v.is_empty()))
            .map(|v| JobId::new(&v))
    }

    /// The identity its [`Display`](std::fmt::Display) form (16 hex digits) shows.
    pub fn from_hex(hex: &str) -> Option<JobId> {
        (hex.len() == 16)
            .then(|| u64::from_str_radix(hex, 16).ok())
            .flatten()
            .map(JobId)
    }
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

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
    /// The job the group belongs to: its store keys carry it, so two jobs
    /// sharing a store and a group name never meet. `None`: no job segment.
    pub job: Option<JobId>,
    /// The launch this rank belongs to (symmrun sets `SYMM_LAUNCH_ID` per launch): members of
    /// one generation from different launches fail with [`Error::Mismatch`] (NOTE
    /// [membership]), so two launches sharing a job id by hand are refused, not mixed. `None`:
    /// not checked (ranks with and without a launch id differ).
    pub launch: Option<JobId>,
}

impl GroupOptions {
    /// The options [`Group::new`] uses: `shared_devices` when
    /// `SYMM_ALLOW_OVERLAPPING_DEVICES=1`; the job from [`JOB_ID_ENVS`]; the launch from
    /// [`LAUNCH_ID_ENV`].
    pub fn from_env() -> GroupOptions {
        GroupOptions {
            shared_devices: crate::knobs::get(ALLOW_OVERLAPPING_DEVICES_ENV) == Some("1"),
            job: JobId::from_vars(|k| crate::knobs::get(k).map(str::to_string)),
            launch: crate::knobs::get(LAUNCH_ID_ENV)
                .filter(|v| !v.is_empty())
                .map(JobId::new),
        }
    }
}

/// One rank's view of a group.
pub struct Group {
    name: String,
    /// The generation's store-key prefix: `symm/{name}/g{generation}` or
    /// `symm/job-{id}/{name}/g{generation}`.
    prefix: String,
    rank: Rank,
    store: Arc<dyn Store>,
    generation: u64,
    timeout: Duration,
    seq: AtomicU64,
    options: GroupOptions,
    /// Shared by every setup exchange of the group, so peers' process records are read once.
    liveness: Arc<crate::liveness::GroupLiveness>,
    /// This rank's claim (launch and process), and whether the generation's members were checked
    /// (NOTE [membership]; at the first setup exchange).
    member: crate::membership::Member,
    members_checked: Mutex<bool>,
    /// `symm/{name}` or `symm/job-{id}/{name}`: the prefix without the generation.
    base: String,
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
        let base = match options.job {
            Some(j) => format!("symm/job-{j}/{name}"),
            None => format!("symm/{name}"),
        };
        let joins = store.add(&format!("{base}/joins"), 1)?;
        let generation = ((joins - 1).max(0) as u64) / world_size as u64;
        let prefix = format!("{base}/g{generation}");
        let member = crate::membership::Member::me(options.launch);
        let g = Group {
            name,
            liveness: Arc::new(crate::liveness::GroupLiveness::new(
                store.clone(),
                prefix.clone(),
                member.process.clone(),
            )),
            prefix,
            rank,
            store,
            generation,
            timeout,
            seq: AtomicU64::new(0),
            options,
            member,
            members_checked: Mutex::new(false),
            base,
        };
        // Every rank claims its place in the generation once: a second claim is a rank launched
        // twice, or another launch sharing the name (NOTE [membership]).
        g.claim().run()?;
        // Which process this rank is, for peers waiting on it during setup (NOTE [setup-liveness]).
        g.liveness.publish(rank.get())?;
        Ok(Arc::new(g))
    }

    fn claim(&self) -> crate::membership::Claim<'_> {
        crate::membership::Claim {
            store: &self.store,
            keys: crate::membership::Keys { prefix: &self.prefix },
            name: &self.name,
            generation: self.generation,
            rank: self.rank.get(),
            world: self.world_size(),
            me: &self.member,
        }
    }

    /// Checks once, collectively, that the generation's members come from one launch (NOTE
    /// [membership]), waiting at most `timeout` for them; every setup exchange
    /// ([`Group::exchange`]) asks first. A failure is not remembered: the next exchange checks
    /// again (and fails alike).
    fn check_members(&self, timeout: Duration) -> Result<()> {
        let mut checked = self.members_checked.lock().unwrap_or_else(|e| e.into_inner());
        if *checked {
            return Ok(());
        }
        crate::membership::Verify {
            claim: self.claim(),
            liveness: self.liveness(),
            timeout,
            base: &self.base,
        }
        .run()?;
        *checked = true;
        Ok(())
    }

    /// A [`StoreExchange`] under `prefix` that fails early, naming the rank, when a rank it waits
    /// for is a process on this host that has exited (NOTE [setup-liveness]). Setup steps use it
    /// for every wait on peers. Collective: the first call checks the generation's membership
    /// (NOTE [membership]: every member of one launch, no rank claimed twice), waiting for the
    /// members at most `timeout` (the bound of the step's own waits), so a setup step never pairs
    /// ranks of two launches.
    pub fn exchange(&self, prefix: impl Into<String>, timeout: Duration) -> Result<StoreExchange> {
        self.check_members(timeout)?;
        Ok(StoreExchange::new(self.store.clone(), prefix).with_liveness(self.liveness()))
    }

    /// Whether ranks of this group that have not arrived somewhere are gone (their process on
    /// this host exited), for waits on peers outside [`Group::exchange`] (the fd channel).
    pub fn liveness(&self) -> Arc<dyn Liveness> {
        self.liveness.clone()
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
        self.prefix.clone()
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

#[cfg(test)]
mod tests {
    use super::*;
    use symm_store::HashStore;

    fn opts(job: Option<&str>) -> GroupOptions {
        GroupOptions {
            shared_devices: false,
            job: job.map(JobId::new),
            launch: None,
        }
    }

    #[test]
    fn job_identity_comes_from_the_first_variable_set() {
        let vars = |set: &'static [(&'static str, &'static str)]| {
            move |k: &str| set.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(JobId::from_vars(vars(&[])), None);
        assert_eq!(JobId::from_vars(vars(&[("SYMM_JOB_ID", "")])), None);
        assert_eq!(
            JobId::from_vars(vars(&[("TORCHELASTIC_RUN_ID", "t")])),
            Some(JobId::new("t"))
        );
        assert_eq!(
            JobId::from_vars(vars(&[("TORCHELASTIC_RUN_ID", "t"), ("SYMM_JOB_ID", "s")])),
            Some(JobId::new("s"))
        );
        assert_ne!(JobId::new("a"), JobId::new("b"));
    }

    #[test]
    fn two_jobs_with_identities_never_meet() {
        let store: Arc<dyn Store> = HashStore::new(Duration::from_secs(5));
        // The unlucky order: the jobs' ranks interleave.
        let a0 = Group::with_options("tp", 0, 2, store.clone(), opts(Some("a"))).unwrap();
        let b0 = Group::with_options("tp", 0, 2, store.clone(), opts(Some("b"))).unwrap();
        let b1 = Group::with_options("tp", 1, 2, store.clone(), opts(Some("b"))).unwrap();
        let a1 = Group::with_options("tp", 1, 2, store.clone(), opts(Some("a"))).unwrap();
        assert_eq!(a0.prefix(), a1.prefix());
        assert_eq!(b0.prefix(), b1.prefix());
        assert_ne!(a0.prefix(), b0.prefix());
        assert_eq!((a0.generation(), b0.generation()), (0, 0));
        // Subgroups keep the job.
        let sub = a0.subgroup("tp-sub", &[0]).unwrap().unwrap();
        assert!(sub.prefix().starts_with(&format!("symm/job-{}/", JobId::new("a"))));
    }

    #[test]
    fn a_second_claim_of_a_rank_is_a_mismatch() {
        let store: Arc<dyn Store> = HashStore::new(Duration::from_secs(5));
        // Two jobs without identities, same name, same unlucky order: no group pairs ranks of
        // both jobs; the second claimant of a rank fails at once, naming it.
        let a0 = Group::with_options("tp", 0, 2, store.clone(), opts(None)).unwrap();
        let b0 = Group::with_options("tp", 0, 2, store.clone(), opts(None));
        match b0 {
            Err(Error::Mismatch { what, detail }) => {
                assert_eq!(what, "group membership");
                assert!(detail.contains("rank 0 of group \"tp\""), "{detail}");
                assert!(detail.contains("SYMM_JOB_ID"), "{detail}");
            }
            other => panic!("second rank 0: {other:?}"),
        }
        let a1 = Group::with_options("tp", 1, 2, store.clone(), opts(None)).unwrap();
        let b1 = Group::with_options("tp", 1, 2, store.clone(), opts(None));
        assert!(matches!(b1, Err(Error::Mismatch { .. })), "{b1:?}");
        // What is left never pairs up (its ops time out): a0 and a1 are in different generations.
        assert_ne!(a0.prefix(), a1.prefix());
    }
}
