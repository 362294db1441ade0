//! The symmetric allocations registered with a backend's collectives for the zero-copy kernels
//! (the fused pulls, the copy-engine paths): an input lying inside one is read by the peers in
//! place, at the same offset on every rank (a mismatch latches an error on the device). Local
//! to one rank, not collective; written once for every backend.

use std::sync::{Arc, RwLock};

use crate::{Device, Error, Result, SymmetricMemory};

use super::layout::MAX_WORLD;

/// A registered symmetric allocation.
struct Registered {
    mem: Arc<dyn SymmetricMemory>,
    base: u64,
    size: usize,
}

/// Where a zero-copy buffer lies: every rank's address of it (the first `world` entries), and
/// its offset and allocation size (what the ranks' check words compare). A fixed array, so an
/// op's launch path allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymInput {
    pub ptrs: [u64; MAX_WORLD],
    pub offset: usize,
    pub alloc_size: usize,
}

/// One rank's registered allocations.
#[derive(Default)]
pub struct Registry {
    reg: RwLock<Vec<Registered>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reg = self.reg.read().unwrap_or_else(|e| e.into_inner());
        f.debug_list().entries(reg.iter().map(|r| (r.base, r.size))).finish()
    }
}

impl Registry {
    /// Registers `mem`, which must be of the group of `(rank, world)` and on `device` (an
    /// allocation already registered stays once).
    pub fn register(&self, mem: Arc<dyn SymmetricMemory>, (rank, world): (usize, usize), device: Device) -> Result<()> {
        if mem.world_size() != world || mem.rank().get() != rank {
            return Err(Error::Mismatch {
                what: "registered memory group",
                detail: format!(
                    "rank {}/{} registered in collectives of rank {rank}/{world}",
                    mem.rank().get(),
                    mem.world_size(),
                ),
            });
        }
        if mem.device() != device {
            return Err(Error::Mismatch {
                what: "registered memory device",
                detail: format!("{} is not this object's device", mem.device()),
            });
        }
        let base = mem.buffer_ptrs().get(rank).copied().unwrap_or(0);
        let size = mem.buffer_size();
        let mut reg = self.reg.write().unwrap_or_else(|e| e.into_inner());
        if !reg.iter().any(|r| r.base == base) {
            reg.push(Registered { mem, base, size });
        }
        Ok(())
    }

    /// Forgets the registered allocation whose local buffer starts at `base`; true if found.
    pub fn unregister(&self, base: u64) -> bool {
        let mut reg = self.reg.write().unwrap_or_else(|e| e.into_inner());
        let before = reg.len();
        reg.retain(|r| r.base != base);
        reg.len() != before
    }

    /// Where `bytes` at this rank's `ptr` lie, when inside a registered allocation.
    pub fn lookup(&self, ptr: u64, bytes: usize) -> Option<SymInput> {
        let reg = self.reg.read().unwrap_or_else(|e| e.into_inner());
        reg.iter().find_map(|r| {
            let end = ptr.checked_add(bytes as u64)?;
            if ptr >= r.base && end <= r.base + r.size as u64 {
                let offset = (ptr - r.base) as usize;
                let mut ptrs = [0u64; MAX_WORLD];
                for (p, b) in ptrs.iter_mut().zip(r.mem.buffer_ptrs()) {
                    *p = b + offset as u64;
                }
                Some(SymInput {
                    ptrs,
                    offset,
                    alloc_size: r.size,
                })
            } else {
                None
            }
        })
    }

    /// [`Self::lookup`], or an `InvalidArgument` that says `needs` ("the ... needs its input")
    /// and what registration means.
    pub fn registered(&self, ptr: u64, bytes: usize, needs: &str) -> Result<SymInput> {
        self.lookup(ptr, bytes).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{needs} in symmetric memory registered with register_symmetric (the same offset on every rank)"
            ))
        })
    }
}
