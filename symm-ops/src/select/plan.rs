//! The plans (NOTE [one-planner]): an op's request and its buffers to the explicit kernel (or
//! NCCL) that runs.

use symm_core::{AllGatherKernel, AllReduceKernel, DType, ReduceScatterKernel};

use super::{AllGatherAlgo, AllReduceAlgo, Bufs, EngineKind, Plan, ReduceScatterAlgo, Selector, Side};

impl Selector {
    // ---- plans: the request and the buffers to the kernel that runs -------------------------

    /// What an all-reduce of `bytes` requested as `req` runs on buffers `b`. The zero-copy
    /// requests need their buffers in registered symmetric memory ([`AllReduceAlgo::Pull`]: two
    /// ranks the input, apart from the output; three or more, the two-shot pull, input and
    /// output, in place allowed; [`AllReduceAlgo::CopyEngine`]: two ranks, both, apart); others
    /// run the table's pick without its zero-copy rows.
    pub(crate) fn plan_all_reduce(&self, req: AllReduceAlgo, bytes: usize, b: &Bufs<'_>) -> Plan<AllReduceKernel> {
        if self.engine == EngineKind::Host {
            return Plan::Kernel(match req {
                AllReduceAlgo::TwoShot | AllReduceAlgo::LamportTwoShot => AllReduceKernel::TwoShot,
                _ => AllReduceKernel::OneShot,
            });
        }
        let zero_copy = |ce: bool| {
            if self.world >= 3 {
                let ok = (b.apart || b.in_place) && (b.registered)(Side::Input) && (b.registered)(Side::Output);
                return ok.then_some(AllReduceKernel::PullTwoShot);
            }
            if !(b.apart && (b.registered)(Side::Input)) {
                return None;
            }
            Some(if ce && self.world == 2 && (b.registered)(Side::Output) {
                AllReduceKernel::CopyEngineTwoShot
            } else {
                AllReduceKernel::Pull
            })
        };
        let k = match req {
            AllReduceAlgo::Nccl => return Plan::Nccl,
            // One rank: nothing to exchange; the ring kernel reduces the rank's own data.
            _ if self.world == 1 => AllReduceKernel::OneShot,
            AllReduceAlgo::Lamport => AllReduceKernel::Lamport,
            AllReduceAlgo::LamportTwoShot => AllReduceKernel::LamportTwoShot,
            AllReduceAlgo::OneShot => AllReduceKernel::OneShot,
            AllReduceAlgo::TwoShot => AllReduceKernel::TwoShot,
            // Without the copy engine (a backend fact) the pull runs for it.
            AllReduceAlgo::Pull | AllReduceAlgo::CopyEngine => {
                match zero_copy(req == AllReduceAlgo::CopyEngine && self.copy_engine) {
                    Some(k) => k,
                    None => return self.plan_all_reduce(self.fallback_all_reduce(bytes), bytes, b),
                }
            }
        };
        Plan::Kernel(k)
    }

    /// Whether a reduce-scatter / all-gather of `whole` bytes (`whole / world` per rank) takes
    /// the Lamport kernel under the bound `max`.
    pub(super) fn rs_ag_lamport(&self, whole: usize, max: usize) -> bool {
        self.world > 1 && whole / self.world <= self.lamport_slot && whole <= max
    }

    /// What a reduce-scatter of `whole` input bytes requested as `req` runs; `input_registered`
    /// is asked only for the pull.
    pub(crate) fn plan_reduce_scatter(
        &self,
        req: ReduceScatterAlgo,
        whole: usize,
        input_registered: &dyn Fn() -> bool,
    ) -> Plan<ReduceScatterKernel> {
        if self.engine == EngineKind::Host {
            return Plan::Kernel(ReduceScatterKernel::Pull);
        }
        match req {
            ReduceScatterAlgo::Nccl => Plan::Nccl,
            ReduceScatterAlgo::Pull if input_registered() => Plan::Kernel(ReduceScatterKernel::Pull),
            ReduceScatterAlgo::Pull => match self.fallback_reduce_scatter(whole) {
                // Without NCCL the kernels run every size.
                ReduceScatterAlgo::Nccl if !self.nccl => {
                    self.plan_reduce_scatter(ReduceScatterAlgo::Push, whole, &|| false)
                }
                a => self.plan_reduce_scatter(a, whole, &|| false),
            },
            ReduceScatterAlgo::Push => Plan::Kernel(
                if self.rs_ag_lamport(whole, self.thresholds.reduce_scatter_lamport_max_bytes) {
                    ReduceScatterKernel::Lamport
                } else {
                    ReduceScatterKernel::Ring
                },
            ),
        }
    }

    /// What an all-gather of `whole` output bytes of `dtype` requested as `req` runs on buffers
    /// `b` (in place: the input is this rank's slice of the output).
    pub(crate) fn plan_all_gather(
        &self,
        req: AllGatherAlgo,
        whole: usize,
        dtype: DType,
        b: &Bufs<'_>,
    ) -> Plan<AllGatherKernel> {
        if self.engine == EngineKind::Host {
            return Plan::Kernel(AllGatherKernel::Pull);
        }
        // Without the copy engine (a backend fact) the pull runs for it.
        let req = match req {
            AllGatherAlgo::CopyEngine if !self.copy_engine => AllGatherAlgo::Pull,
            r => r,
        };
        let zero_copy = match req {
            AllGatherAlgo::Nccl => return Plan::Nccl,
            // One rank: the ring kernel's local copy.
            _ if self.world == 1 => Some(AllGatherKernel::Ring),
            AllGatherAlgo::CopyEngine if (b.registered)(Side::Output) => Some(AllGatherKernel::CopyEnginePush),
            AllGatherAlgo::CopyEngine if (b.registered)(Side::Input) => Some(AllGatherKernel::CopyEnginePull),
            AllGatherAlgo::Pull if (b.in_place && (b.registered)(Side::Output)) || (b.registered)(Side::Input) => {
                Some(AllGatherKernel::Pull)
            }
            AllGatherAlgo::CopyEngine | AllGatherAlgo::Pull => None,
            AllGatherAlgo::Push => {
                let lamport = dtype.is_reducible_float()
                    && self.rs_ag_lamport(whole, self.thresholds.all_gather_lamport_max_bytes);
                Some(if lamport {
                    AllGatherKernel::Lamport
                } else {
                    AllGatherKernel::Ring
                })
            }
        };
        match zero_copy {
            Some(k) => Plan::Kernel(k),
            None => {
                let no = Bufs {
                    in_place: b.in_place,
                    apart: b.apart,
                    registered: &|_| false,
                };
                match self.fallback_all_gather(whole) {
                    // Without NCCL the kernels run every size.
                    AllGatherAlgo::Nccl if !self.nccl => self.plan_all_gather(AllGatherAlgo::Push, whole, dtype, &no),
                    a => self.plan_all_gather(a, whole, dtype, &no),
                }
            }
        }
    }
}
