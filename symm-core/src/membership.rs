//! Group membership (NOTE [membership]): which process holds which rank of a group generation,
//! and the check that every member of a generation belongs to one launch.
//!
//! Generations are counted by joins (`world` joins per generation), so two launches that share a
//! store, a group name and a job id (or have none) can land in one generation. Three rules keep
//! them from pairing up:
//! - a rank is claimed once per generation: the second claimant fails at once with
//!   [`Error::Mismatch`] naming both processes, and poisons the generation's member records of
//!   the ranks not yet present (a generation with a double claim can never be complete), so the
//!   members that did claim fail with the same `Mismatch` at their first setup exchange instead
//!   of waiting out the timeout;
//! - at a generation's first setup exchange every member publishes its launch
//!   ([`GroupOptions::launch`](crate::GroupOptions::launch), `SYMM_LAUNCH_ID`, which symmrun sets
//!   per launch) and its process; members of different launches fail with `Mismatch` naming both;
//! - a launch does not start a new generation while a member of the previous one, of another
//!   launch, is still running on this host.
//!
//! Without a launch identity (ranks started by hand, no job id) two launches whose ranks
//! interleave cannot be told apart: that case needs `SYMM_JOB_ID` or a launcher that sets one.

use std::sync::Arc;

use symm_store::{Liveness, Store, StoreExchange};

use crate::error::{Error, Result};
use crate::group::JobId;
use crate::liveness::ProcessRecord;

/// The first line of a member record; a poisoned record starts with [`POISON`].
const MEMBER: &str = "symm-member-1";
/// The first line of a poisoned member record; the rest says why.
const POISON: &str = "symm-conflict-1";

/// One rank's claim: its launch and its process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub launch: Option<JobId>,
    pub process: ProcessRecord,
}

impl Member {
    pub(crate) fn me(launch: Option<JobId>) -> Member {
        Member {
            launch,
            process: ProcessRecord::me(),
        }
    }

    fn encode(&self) -> String {
        let launch = self.launch.map_or_else(|| "-".to_string(), |l| l.to_string());
        format!("{MEMBER}\n{launch}\n{}", self.process.encode())
    }

    /// `Ok(member)`, or `Err(why)` for a poisoned record.
    fn decode(b: &[u8]) -> std::result::Result<Option<Member>, String> {
        let text = String::from_utf8_lossy(b);
        if let Some(why) = text.strip_prefix(POISON) {
            return Err(why.trim_start().to_string());
        }
        let Some(rest) = text.strip_prefix(MEMBER).and_then(|r| r.strip_prefix('\n')) else {
            return Ok(None);
        };
        let (launch, process) = rest.split_once('\n').unwrap_or((rest, ""));
        let launch = match launch {
            "-" => None,
            hex => Some(JobId::from_hex(hex).ok_or_else(|| format!("a member record with launch {hex:?}"))?),
        };
        Ok(ProcessRecord::decode(process.as_bytes()).map(|process| Member { launch, process }))
    }

    fn describe(&self) -> String {
        match self.launch {
            Some(l) => format!("{} of launch {l}", self.process.describe()),
            None => format!("{} (no launch id)", self.process.describe()),
        }
    }
}

/// The keys of one generation (`prefix` = the group's generation prefix).
pub(crate) struct Keys<'a> {
    pub prefix: &'a str,
}

impl Keys<'_> {
    /// Counts the claims of `rank`.
    pub(crate) fn claims(&self, rank: usize) -> String {
        format!("{}/rank/{rank}", self.prefix)
    }
    /// The record of the `n`-th claimant (from 1) of `rank`; kept for the generation's life.
    fn claim(&self, rank: usize, n: i64) -> String {
        format!("{}/claim/{rank}/{n}", self.prefix)
    }
    /// The exchange of the generation's member records.
    fn members(&self) -> String {
        format!("{}/member", self.prefix)
    }
    /// `rank`'s key in that exchange (its first all-gather: sequence number 0).
    fn member(&self, rank: usize) -> String {
        format!("{}/0/{rank}", self.members())
    }
}

/// What one claim of `rank` in a generation needs to know.
pub(crate) struct Claim<'a> {
    pub store: &'a Arc<dyn Store>,
    pub keys: Keys<'a>,
    pub name: &'a str,
    pub generation: u64,
    pub rank: usize,
    pub world: usize,
    pub me: &'a Member,
}

impl Claim<'_> {
    /// Claims the rank. A second claimant poisons the generation and gets `Mismatch` naming both
    /// processes.
    pub(crate) fn run(&self) -> Result<()> {
        let n = self.store.add(&self.keys.claims(self.rank), 1)?;
        self.store
            .set(&self.keys.claim(self.rank, n), self.me.encode().as_bytes())?;
        if n == 1 {
            return Ok(());
        }
        // The first claimant writes its record right after its count; a short wait covers the gap.
        let first = self
            .store
            .get_timeout(&self.keys.claim(self.rank, 1), std::time::Duration::from_secs(2))
            .ok()
            .and_then(|b| Member::decode(&b).ok().flatten())
            .map_or_else(|| "another process".to_string(), |m| m.describe());
        let detail = format!(
            "rank {} of group {:?} (generation {}, world {}) claimed by {first} and again by {}: a rank launched \
             twice, or two launches sharing the group name on one store (give each job its own {} or \
             GroupOptions::job; symmrun sets one per launch)",
            self.rank,
            self.name,
            self.generation,
            self.world,
            self.me.describe(),
            crate::group::JOB_ID_ENVS[0]
        );
        // The ranks nobody claimed yet can never complete this generation: their members'
        // records say so, and the members that did claim fail alike at their first exchange.
        let poison = format!("{POISON}\n{detail}");
        for r in 0..self.world {
            // A store that fails here leaves the others to their timeout; this rank's error
            // stays the Mismatch.
            if let Err(e) = self.store.compare_set(&self.keys.member(r), b"", poison.as_bytes()) {
                log::debug!("symm membership: poisoning rank {r}'s member record: {e}");
                break;
            }
        }
        Err(Error::Mismatch {
            what: "group membership",
            detail,
        })
    }
}

/// The check a generation's members run at its first setup exchange (collective).
pub(crate) struct Verify<'a> {
    pub claim: Claim<'a>,
    pub liveness: Arc<dyn Liveness>,
    pub timeout: std::time::Duration,
    /// The group's store prefix without the generation (`symm/{name}` or `symm/job-{id}/{name}`).
    pub base: &'a str,
}

impl Verify<'_> {
    pub(crate) fn run(&self) -> Result<()> {
        let c = &self.claim;
        let gathered = StoreExchange::new(c.store.clone(), c.keys.members())
            .with_liveness(self.liveness.clone())
            .all_gather(c.rank, c.world, c.me.encode().as_bytes(), self.timeout)?;
        for (r, b) in gathered.iter().enumerate() {
            match Member::decode(b) {
                Err(why) => {
                    return Err(Error::Mismatch {
                        what: "group membership",
                        detail: why,
                    })
                }
                Ok(Some(m)) if m.launch != c.me.launch => {
                    return Err(Error::Mismatch {
                        what: "group membership",
                        detail: format!(
                            "ranks of group {:?} (generation {}) come from different launches: rank {} is {}, \
                             rank {r} is {}; two launches share the group name on one store (give each job its \
                             own {})",
                            c.name,
                            c.generation,
                            c.rank,
                            c.me.describe(),
                            m.describe(),
                            crate::group::JOB_ID_ENVS[0]
                        ),
                    })
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(Error::Mismatch {
                        what: "group membership",
                        detail: format!("rank {r}'s member record is not one of this version's"),
                    })
                }
            }
        }
        self.previous_generation()
    }

    /// A launch starts no generation while a member of the previous one, of another launch, still
    /// runs on this host (two launches sharing a job id whose ranks arrived launch by launch).
    fn previous_generation(&self) -> Result<()> {
        let c = &self.claim;
        let (Some(mine), Some(prev)) = (c.me.launch, c.generation.checked_sub(1)) else {
            return Ok(());
        };
        let prefix = format!("{}/g{prev}", self.base);
        let keys = Keys { prefix: &prefix };
        for r in 0..c.world {
            let Ok(b) = c.store.get_now(&keys.claim(r, 1)) else {
                continue;
            };
            let Ok(Some(m)) = Member::decode(&b) else {
                continue;
            };
            if m.launch.is_some_and(|l| l != mine) && m.process.alive_here(&c.me.process) {
                return Err(Error::Mismatch {
                    what: "group membership",
                    detail: format!(
                        "generation {} of group {:?} would follow one whose rank {r} is {}, still running: two \
                         launches share the group name and job id on one store (give each job its own {})",
                        c.generation,
                        c.name,
                        m.describe(),
                        crate::group::JOB_ID_ENVS[0]
                    ),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_records_round_trip_and_poison_reads_as_its_reason() {
        let m = Member::me(Some(JobId::new("launch")));
        assert_eq!(Member::decode(m.encode().as_bytes()), Ok(Some(m.clone())));
        let none = Member::me(None);
        assert_eq!(Member::decode(none.encode().as_bytes()), Ok(Some(none)));
        assert_eq!(
            Member::decode(format!("{POISON}\nrank 0 claimed twice").as_bytes()),
            Err("rank 0 claimed twice".to_string())
        );
        assert_eq!(Member::decode(b"something else"), Ok(None));
        assert!(m.describe().contains(&format!("pid {}", std::process::id())));
    }
}
