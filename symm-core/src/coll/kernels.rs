//! The explicit collective kernels: the one vocabulary in which symm-ops' planner says what runs
//! and in which a backend with collective kernels (symm-cuda; symm-rocm, without the copy-engine
//! ones) offers them. A backend runs exactly the kernel it is given, or fails with an error naming the
//! precondition that does not hold (a zero-copy kernel whose buffer is not registered, say); it
//! never picks another one (with one rank, where nothing is exchanged, a backend may run the
//! ring kernel's local reduction for any kernel: NOTE [one-planner]). Choosing is the planner's alone (symm-ops' `select/`, NOTE
//! [one-planner] in docs/architecture.md).

use std::fmt;

/// Writes the shared methods of a kernel enum: `ALL`, `name`, `from_name` and `Display`.
macro_rules! kernel_names {
    ($ty:ident { $($v:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every kernel, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$v),+];

            /// The kernel's short name (benchmarks' `--algos`, tables, JSON).
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$v => $name),+
                }
            }

            /// The kernel named `s` ([`Self::name`]).
            pub fn from_name(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|k| k.name() == s)
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// All-reduce kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllReduceKernel {
    /// One-shot with data as flag: every rank pushes its input into every peer's sentinel-filled
    /// Lamport slot and reduces what arrived; no barrier. Messages up to the Lamport slot size.
    Lamport,
    /// One-shot through the ring buffers: every rank pushes its input to every peer (chunked,
    /// a release flag per chunk) and reduces everything it received. Any size, any buffers.
    OneShot,
    /// Two-shot through the ring buffers: reduce-scatter into this rank's shard of the output,
    /// then all-gather of the shards (in place works). Any size, any buffers.
    TwoShot,
    /// Zero-copy one-shot pull in one kernel (opening barrier, work, closing barrier): every rank
    /// reads every peer's input in place and reduces all of it. The input in registered
    /// symmetric memory, at the same offset on every rank, apart from the output.
    Pull,
    /// Zero-copy two-shot pull in one kernel: each rank reduces its shard from every peer's
    /// input and writes it into every peer's output. Input and output in registered symmetric
    /// memory (in place allowed), at the same offsets on every rank.
    PullTwoShot,
    /// The one-shot pull with a fraction of the peers' inputs copied by the copy engine while
    /// the reduction kernel reads the rest directly (the backend's tuning says how much; at 0 it
    /// is [`AllReduceKernel::Pull`]). The pull's preconditions.
    CopyEnginePull,
    /// Copy-engine two-shot (two ranks): a copy engine pulls the peer's half of the input into
    /// the output, the SMs reduce each chunk as it lands, a second copy engine pushes each
    /// reduced chunk into the peer's output. Input and output both registered, apart.
    CopyEngineTwoShot,
    /// Two-shot with data as flag in one kernel (NOTE [lamport-two-shot]): every rank pushes
    /// each peer's shard into the peer's Lamport slot, reduces its own shard as it arrives and
    /// pushes the sum into every peer's slot; no barrier. Each rank's links carry 2 (world - 1) /
    /// world of the message where [`AllReduceKernel::Lamport`] pushes world - 1 copies, for one
    /// more exchange. Messages whose two shards fit a Lamport slot. Any buffers.
    LamportTwoShot,
}

kernel_names!(AllReduceKernel {
    Lamport => "lamport",
    OneShot => "one_shot",
    TwoShot => "two_shot",
    Pull => "pull",
    PullTwoShot => "pull_two_shot",
    CopyEnginePull => "copy_engine_pull",
    CopyEngineTwoShot => "copy_engine_two_shot",
    LamportTwoShot => "lamport_two_shot",
});

/// Reduce-scatter kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceScatterKernel {
    /// Data as flag through the Lamport slots: every rank pushes each peer's segment into its
    /// slot. A rank's segment up to the Lamport slot size.
    Lamport,
    /// Chunked push through the ring buffers. Any size, any buffers.
    Ring,
    /// Zero-copy pull: every rank reads its segment straight from every peer's input and reduces
    /// it. The input in registered symmetric memory, at the same offset on every rank.
    Pull,
    /// Copy engine (two ranks): the copy engine pulls this rank's segment of the peer's input
    /// into the output in chunks, the SMs reduce each as it lands. The input registered, the
    /// output apart from it.
    CopyEngine,
}

kernel_names!(ReduceScatterKernel {
    Lamport => "lamport",
    Ring => "ring",
    Pull => "pull",
    CopyEngine => "copy_engine",
});

/// All-gather kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllGatherKernel {
    /// Data as flag through the Lamport slots (f32 / f16 / bf16 lanes; an input lane holding the
    /// all-ones NaN arrives as another NaN). A rank's input up to the Lamport slot size.
    Lamport,
    /// Push through the ring buffers by SMs. Any size, any buffers.
    Ring,
    /// Zero-copy SM pull in one kernel: every rank copies every peer's input in place. The input
    /// in registered symmetric memory, or the op in place in a registered output.
    Pull,
    /// Copy engine, zero-copy push: this rank's copy engine writes its input into every peer's
    /// output slice between two barriers. The output in registered symmetric memory.
    CopyEnginePush,
    /// Copy engine, zero-copy pull: the peers' inputs are copied in place. The input in
    /// registered symmetric memory.
    CopyEnginePull,
    /// Copy engine, staged through the ring buffers in rounds. Any buffers.
    CopyEngineStaged,
}

kernel_names!(AllGatherKernel {
    Lamport => "lamport",
    Ring => "ring",
    Pull => "pull",
    CopyEnginePush => "copy_engine_push",
    CopyEnginePull => "copy_engine_pull",
    CopyEngineStaged => "copy_engine_staged",
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(
            all: &[T],
            name: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
        ) {
            for &k in all {
                assert_eq!(parse(name(k)), Some(k));
            }
            let mut names: Vec<_> = all.iter().map(|&k| name(k)).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), all.len());
            assert_eq!(parse("auto"), None);
        }
        check(AllReduceKernel::ALL, AllReduceKernel::name, AllReduceKernel::from_name);
        check(
            ReduceScatterKernel::ALL,
            ReduceScatterKernel::name,
            ReduceScatterKernel::from_name,
        );
        check(AllGatherKernel::ALL, AllGatherKernel::name, AllGatherKernel::from_name);
        assert_eq!(AllReduceKernel::PullTwoShot.to_string(), "pull_two_shot");
    }
}
