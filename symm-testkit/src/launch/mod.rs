//! Launchers: run the ranks of a test as threads of this process
//! ([`run_threads`]) or as processes re-executing the current test binary
//! ([`run_processes`]), the way torchrun runs a script.
//!
//! Process mode: the parent hosts a TcpStore on a free port of 127.0.0.1 and
//! starts `world` children, each `current_exe() --exact <test> --nocapture
//! --test-threads=1` with torchrun's variables (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) plus
//! [`CHILD_ENV`] naming the test and one random id per launch (as
//! [`LAUNCH_ID_ENV`] and as symm-core's `SYMM_LAUNCH_ID`). The same `#[test]` body runs in the
//! children; it branches on [`child_ctx`]:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use symm_testkit::launch::{child_ctx, run_processes, RankCtx, TestResult};
//! fn body(ctx: &RankCtx) -> TestResult { /* one rank's work */ Ok(()) }
//!
//! #[test]
//! fn two_ranks() {
//!     if let Some(ctx) = child_ctx().unwrap() {
//!         return body(&ctx).unwrap();
//!     }
//!     run_processes("two_ranks", 2, Duration::from_secs(60)).unwrap();
//! }
//! ```
//!
//! Every child's output is captured and shown when the launch fails; the
//! parent kills every child at the wall-clock limit, checks every exit
//! status, and checks that every child really ran the test (a mistyped test
//! name would otherwise run zero tests and "pass").
//!
//! `unsafe` is denied here, and allowed in one private module only (`sigmask`, behind the safe
//! [`clean_signal_mask`]).
#![deny(unsafe_code)]

use std::io::Read;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use symm_core::symm_store::{HashStore, Store, StoreError, StoreExchange};
use symm_core::{Group, GroupOptions};

use crate::fault::{set_thread_fault, Fault, FAULT_ENV};

/// Marks a child started by [`run_processes`]; its value is the test name.
pub const CHILD_ENV: &str = crate::knobs::CHILD;
/// Marks the single child started by [`run_isolated`]; its value is the test name.
pub const ISOLATED_ENV: &str = crate::knobs::ISOLATED;
/// The launch id of children ([`RankCtx::launch_id`]).
pub const LAUNCH_ID_ENV: &str = crate::knobs::LAUNCH_ID;
/// Store timeout of children, in milliseconds (default 60 s).
pub const STORE_TIMEOUT_ENV: &str = crate::knobs::STORE_TIMEOUT_MS;
/// Key a child sets when it starts running the test.
const STARTED_KEY: &str = "symm-testkit/started";
/// Bytes of a child's output kept for error reports.
const OUTPUT_TAIL: usize = 64 * 1024;
/// Default store timeout.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(60);

/// How ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One thread per rank in this process, sharing a HashStore.
    Threads,
    /// One process per rank, meeting through a TcpStore.
    Processes,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Threads => "threads",
            Mode::Processes => "processes",
        })
    }
}

/// What one rank of a launch gets.
#[derive(Clone)]
pub struct RankCtx {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub mode: Mode,
    pub store: Arc<dyn Store>,
    /// A random id shared by all ranks of one launch (see [`RankCtx::unique`]).
    pub launch_id: u64,
    /// Every rank of the launch uses device 0 (threads sharing one GPU, NOTE
    /// [shared-device]); groups from [`RankCtx::group`] allow it.
    pub shared_device: bool,
}

impl std::fmt::Debug for RankCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankCtx")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("mode", &self.mode)
            .field("shared_device", &self.shared_device)
            .finish()
    }
}

impl RankCtx {
    /// `base` made unique to this launch (for group names: process-wide
    /// tables such as the persistent-allocation pool are keyed by name).
    pub fn unique(&self, base: &str) -> String {
        format!("{base}-{:016x}", self.launch_id)
    }

    /// Builds group `name` of all ranks of the launch (collective). A
    /// shared-device launch's groups allow ranks to share a device; others
    /// take [`Group::new`]'s options.
    pub fn group(&self, name: &str) -> symm_core::Result<Arc<Group>> {
        if self.shared_device {
            let options = GroupOptions {
                shared_devices: true,
                ..GroupOptions::default()
            };
            Group::with_options(name, self.rank, self.world, self.store.clone(), options)
        } else {
            Group::new(name, self.rank, self.world, self.store.clone())
        }
    }

    /// The device ordinal (of a GPU backend) this rank uses: 0 in a
    /// shared-device launch, else its local rank.
    pub fn gpu(&self) -> usize {
        if self.shared_device {
            0
        } else {
            self.local_rank
        }
    }

    /// A store barrier of all ranks, keyed by `name` (call each name once).
    pub fn barrier(&self, name: &str, timeout: Duration) -> Result<(), StoreError> {
        StoreExchange::new(self.store.clone(), format!("symm-testkit/barrier/{name}"))
            .barrier(self.rank, self.world, timeout)
    }

    /// Ranks sharing a GPU: a store barrier keyed by `name` (call each name once), so no rank
    /// launches an op (whose kernel spins until every peer's kernel runs) while a peer is still
    /// in a host call that waits for the whole device, such as a first pinned-host allocation
    /// (NOTE [co-residency]). Distinct devices: nothing.
    pub fn shared_ready(&self, name: &str, timeout: Duration) -> Result<(), StoreError> {
        if self.shared_device {
            self.barrier(&format!("shared-ready/{name}"), timeout)?;
        }
        Ok(())
    }

    /// An all_gather of bytes among all ranks, keyed by `name` (call each name once).
    pub fn all_gather(&self, name: &str, data: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        StoreExchange::new(self.store.clone(), format!("symm-testkit/gather/{name}"))
            .all_gather(self.rank, self.world, data, timeout)
    }
}

/// Error type of rank bodies: anything that displays.
pub type TestError = Box<dyn std::error::Error + Send + Sync>;
/// Result of a rank body.
pub type TestResult<T = ()> = Result<T, TestError>;

/// How one rank of a thread launch ended.
#[derive(Debug)]
pub enum RankOutcome<T> {
    Ok(T),
    /// The body returned an error (its text, with sources).
    Err(String),
    /// The body panicked (the panic message).
    Panicked(String),
    /// The body was still running at the wall-clock limit (its thread is left
    /// running, detached).
    TimedOut,
}

impl<T> RankOutcome<T> {
    pub fn is_ok(&self) -> bool {
        matches!(self, RankOutcome::Ok(_))
    }
}

/// Launch failures.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("invalid launch: {0}")]
    Invalid(String),
    #[error("cannot start rank {rank}: {source}")]
    Spawn {
        rank: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("launch store: {0}")]
    Store(#[from] StoreError),
    #[error("launch environment: {0}")]
    Env(String),
    /// Some ranks failed; the text has one entry per failed rank (with output).
    #[error("{0}")]
    Failed(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic payload".into())
}

/// Options of [`run_threads_outcomes`].
#[derive(Debug, Clone)]
pub struct ThreadOptions {
    pub world: usize,
    /// Wall-clock limit for the whole launch.
    pub limit: Duration,
    /// Timeout of the shared HashStore.
    pub store_timeout: Duration,
    /// A fault armed in the faulted rank's thread ([`crate::fault`]).
    pub fault: Option<Fault>,
    /// Every rank uses device 0 ([`RankCtx::shared_device`]).
    pub shared_device: bool,
}

impl ThreadOptions {
    pub fn new(world: usize, limit: Duration) -> ThreadOptions {
        ThreadOptions {
            world,
            limit,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            fault: None,
            shared_device: false,
        }
    }
}

/// Runs `f` once per rank, each in its own thread, with a shared HashStore;
/// returns every rank's outcome (panics and overruns included, never
/// propagated or waited on past `opts.limit`).
pub fn run_threads_outcomes<T, F>(opts: &ThreadOptions, f: F) -> Vec<RankOutcome<T>>
where
    T: Send + 'static,
    F: Fn(RankCtx) -> TestResult<T> + Send + Sync + 'static,
{
    let world = opts.world;
    let store: Arc<dyn Store> = HashStore::new(opts.store_timeout);
    let f = Arc::new(f);
    let launch_id: u64 = rand::random();
    let (tx, rx) = mpsc::channel::<(usize, RankOutcome<T>)>();
    let mut outcomes: Vec<Option<RankOutcome<T>>> = (0..world).map(|_| None).collect();
    let mut handles = Vec::new();
    for (rank, slot) in outcomes.iter_mut().enumerate() {
        let ctx = RankCtx {
            rank,
            world,
            local_rank: rank,
            mode: Mode::Threads,
            store: store.clone(),
            launch_id,
            shared_device: opts.shared_device,
        };
        let (f, tx) = (f.clone(), tx.clone());
        let fault = opts.fault.as_ref().filter(|x| x.rank == rank).map(|x| x.point.clone());
        let spawned = std::thread::Builder::new().name(format!("rank-{rank}")).spawn(move || {
            set_thread_fault(fault.as_deref());
            let out = match catch_unwind(AssertUnwindSafe(|| f(ctx))) {
                Ok(Ok(v)) => RankOutcome::Ok(v),
                Ok(Err(e)) => RankOutcome::Err(error_text(e.as_ref())),
                Err(p) => RankOutcome::Panicked(panic_text(p.as_ref())),
            };
            set_thread_fault(None);
            let _ = tx.send((rank, out));
        });
        match spawned {
            Ok(h) => handles.push((rank, h)),
            Err(e) => *slot = Some(RankOutcome::Err(format!("cannot spawn thread: {e}"))),
        }
    }
    drop(tx);
    let deadline = Instant::now() + opts.limit;
    while outcomes.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((r, o)) => outcomes[r] = Some(o),
            Err(_) => break,
        }
    }
    for (rank, h) in handles {
        if outcomes[rank].is_some() {
            let _ = h.join();
        }
    }
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or(RankOutcome::TimedOut))
        .collect()
}

/// Runs `f` once per rank in threads (see [`run_threads_outcomes`]); Ok with
/// every rank's value if every rank returned Ok, else an error listing each
/// failed, panicked or overrunning rank.
pub fn run_threads<T, F>(world: usize, limit: Duration, f: F) -> Result<Vec<T>, LaunchError>
where
    T: Send + 'static,
    F: Fn(RankCtx) -> TestResult<T> + Send + Sync + 'static,
{
    run_threads_with(&ThreadOptions::new(world, limit), f)
}

/// [`run_threads`] with options (a shared-device launch, a store timeout).
pub fn run_threads_with<T, F>(opts: &ThreadOptions, f: F) -> Result<Vec<T>, LaunchError>
where
    T: Send + 'static,
    F: Fn(RankCtx) -> TestResult<T> + Send + Sync + 'static,
{
    if opts.world == 0 {
        return Err(LaunchError::Invalid("world size 0".into()));
    }
    let limit = opts.limit;
    let outcomes = run_threads_outcomes(opts, f);
    let mut failed = Vec::new();
    let mut values = Vec::new();
    for (rank, o) in outcomes.into_iter().enumerate() {
        match o {
            RankOutcome::Ok(v) => values.push(v),
            RankOutcome::Err(e) => failed.push(format!("rank {rank} failed: {e}")),
            RankOutcome::Panicked(p) => failed.push(format!("rank {rank} panicked: {p}")),
            RankOutcome::TimedOut => failed.push(format!("rank {rank} still running after the {limit:?} limit")),
        }
    }
    if failed.is_empty() {
        Ok(values)
    } else {
        Err(LaunchError::Failed(failed.join("\n")))
    }
}

mod processes;
mod sigmask;

pub use processes::*;
pub use sigmask::{clean_signal_mask, FORWARDED_SIGNALS};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_collect_every_outcome() {
        let mut opts = ThreadOptions::new(4, Duration::from_secs(2));
        opts.fault = Some(Fault::kill(3, "p"));
        let out = run_threads_outcomes(&opts, |ctx| match ctx.rank {
            0 => Ok(ctx.world * 10),
            1 => Err("rank one says no".into()),
            2 => panic!("rank two panics"),
            _ => {
                crate::fault::fault_point("p")?;
                std::thread::sleep(Duration::from_secs(30));
                Ok(0)
            }
        });
        assert!(matches!(out[0], RankOutcome::Ok(40)));
        assert!(matches!(&out[1], RankOutcome::Err(e) if e.contains("says no")));
        assert!(matches!(&out[2], RankOutcome::Panicked(p) if p.contains("two panics")));
        assert!(matches!(&out[3], RankOutcome::Err(e) if e.contains(crate::fault::INJECTED_FAULT)));
    }

    #[test]
    fn threads_time_out_without_hanging() {
        let t = Instant::now();
        let out = run_threads_outcomes(&ThreadOptions::new(2, Duration::from_millis(300)), |ctx| {
            if ctx.rank == 1 {
                std::thread::sleep(Duration::from_secs(5));
            }
            Ok(())
        });
        assert!(t.elapsed() < Duration::from_secs(3));
        assert!(out[0].is_ok());
        assert!(matches!(out[1], RankOutcome::TimedOut));
        let e = run_threads(2, Duration::from_secs(5), |ctx| {
            if ctx.rank == 0 {
                Err("bad".into())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("rank 0 failed: bad"), "{e}");
    }

    #[test]
    fn threads_share_a_store() {
        let v = run_threads(3, Duration::from_secs(20), |ctx| {
            let all = ctx.all_gather("x", &[ctx.rank as u8], Duration::from_secs(10))?;
            Ok(all.concat())
        })
        .unwrap();
        assert_eq!(v, vec![vec![0, 1, 2]; 3]);
    }

    #[test]
    fn test_paths() {
        assert_eq!(test_path("host_conformance::host::barrier", "w2"), "host::barrier::w2");
        assert_eq!(test_path("lonely", "t"), "t");
    }
}
