//! `symmrun`: a launcher in the manner of torchrun for one node.
//!
//! ```text
//! symmrun --nproc-per-node N [--master-addr ADDR] [--master-port PORT]
//!         [--timeout SECS] [--grace SECS] [--store-only] [-- PROGRAM ARGS...]
//! ```
//!
//! Hosts a TcpStore (PyTorch's wire protocol) on ADDR:PORT (default
//! 127.0.0.1 and a free port), starts N copies of PROGRAM with RANK,
//! LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
//! TORCHELASTIC_USE_AGENT_STORE=True (the ranks are clients of this store,
//! as under torchrun's agent; NCCL_NVLS_ENABLE=0 unless set), and exits with 0 if every rank did, else with
//! the code of the rank that failed first in time (128 + signal for a
//! signal). After the first failure the other ranks get `--grace` seconds
//! (default 5) before they are killed; at `--timeout` every rank still
//! running is killed and symmrun exits 124 (unless a rank failed before).
//! SIGINT, SIGTERM and SIGHUP sent to symmrun are forwarded to every rank
//! still running; ranks still running `--grace` seconds later (or at a
//! second such signal) are killed, and symmrun exits 128 + the signal.
//! Every rank is reaped before symmrun exits. The ranks start with an empty
//! signal mask and with those three signals at their default action (symmrun
//! itself blocks them, and a child would inherit that), so a rank's own
//! handlers run when symmrun forwards a signal.
//!
//! Every launch has its own identity (as torchrun's run id): the ranks get
//! `SYMM_JOB_ID=symmrun-<16 hex digits>`, fresh per launch, unless symmrun's
//! environment sets `SYMM_JOB_ID` to a non-empty value (the ranks then inherit
//! it unchanged), and always a fresh `SYMM_LAUNCH_ID` (`symmrun-<16 hex
//! digits>`), so that ranks of two launches never pair up in one group, even
//! when a job id is given by hand.
//! `--store-only` hosts the store and prints `MASTER_ADDR=... MASTER_PORT=...
//! SYMM_JOB_ID=... SYMM_LAUNCH_ID=...` (the ids to give ranks started by hand)
//! without starting anything (until `--timeout`, or until killed).
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;
use symm_core::knobs::{JOB_ID, LAUNCH_ID};
use symm_core::symm_store::TcpServer;
use symm_testkit::launch::{clean_signal_mask, rank_command, ChildStatus, CHILD_ENV, FORWARDED_SIGNALS, ISOLATED_ENV};

/// The signals symmrun forwards to its ranks (at their default action in the ranks).
const FORWARDED: [Signal; 3] = FORWARDED_SIGNALS;

const USAGE: &str = "usage: symmrun --nproc-per-node N [--master-addr ADDR] [--master-port PORT] \
[--timeout SECS] [--grace SECS] [--store-only] [-- PROGRAM ARGS...]";

#[derive(Debug)]
struct Args {
    nproc: Option<usize>,
    addr: IpAddr,
    port: u16,
    timeout: Option<Duration>,
    grace: Duration,
    store_only: bool,
    program: Vec<String>,
}

fn secs(flag: &str, v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag}: {v:?} is not a number of seconds"))
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        nproc: None,
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 0,
        timeout: None,
        grace: Duration::from_secs(5),
        store_only: false,
        program: Vec::new(),
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{flag} needs a value"))
        };
        match flag {
            "--" => {
                a.program = it.cloned().collect();
                break;
            }
            "--nproc-per-node" | "--nproc_per_node" => {
                let v = value()?;
                a.nproc = Some(v.parse().map_err(|_| format!("{flag}: {v:?} is not a number"))?);
            }
            "--master-addr" | "--master_addr" => {
                let v = value()?;
                a.addr = v.parse().map_err(|_| format!("{flag}: {v:?} is not an IP address"))?;
            }
            "--master-port" | "--master_port" => {
                let v = value()?;
                a.port = v.parse().map_err(|_| format!("{flag}: {v:?} is not a port"))?;
            }
            "--timeout" => a.timeout = Some(secs(flag, &value()?)?),
            "--grace" => a.grace = secs(flag, &value()?)?,
            "--store-only" => a.store_only = true,
            "-h" | "--help" => return Err(String::new()),
            other if !other.starts_with('-') && a.program.is_empty() => {
                // torchrun style: the program without "--".
                a.program = std::iter::once(arg.clone()).chain(it.cloned()).collect();
                break;
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if !a.store_only {
        match a.nproc {
            Some(0) | None => return Err("--nproc-per-node N (N >= 1) is required".into()),
            Some(_) => {}
        }
        if a.program.is_empty() {
            return Err("no program given (symmrun ... -- PROGRAM ARGS)".into());
        }
    }
    Ok(a)
}

/// Blocks the forwarded signals in this thread (and so in every thread
/// started after it), and receives them on a thread of their own through
/// `sigwait`. A child inherits the mask (`std::process::Command` has not
/// cleared it since Rust 1.66, rust-lang/rust#101077), so [`spawn`] starts
/// every rank through [`clean_signal_mask`].
fn catch_signals() -> Result<mpsc::Receiver<Signal>, nix::Error> {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.thread_block()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(sig) = set.wait() {
            if tx.send(sig).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// One rank process.
struct Rank {
    rank: usize,
    child: Child,
    /// How it ended, once reaped.
    status: Option<ChildStatus>,
    /// Why symmrun killed it, if it did.
    killed: Option<String>,
}

impl Rank {
    fn pid(&self) -> Option<Pid> {
        i32::try_from(self.child.id()).ok().map(Pid::from_raw)
    }

    /// Sends `sig` if it is still running (not reaped, so its pid is not reused).
    fn signal(&self, sig: Signal) {
        if let (None, Some(pid)) = (self.status, self.pid()) {
            let _ = kill(pid, sig);
        }
    }

    /// Kills and reaps it if it is still running.
    fn kill(&mut self, status: ChildStatus, why: &str) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let st = self.child.wait().map_or(ChildStatus::Exited(-1), ChildStatus::from);
            // It may have ended on its own meanwhile: keep what it did.
            if st == ChildStatus::Signaled(Signal::SIGKILL as i32) {
                self.status = Some(status);
                self.killed = Some(why.to_string());
            } else {
                self.status = Some(st);
            }
        }
    }
}

/// The identity of one launch: `SYMM_JOB_ID` and `SYMM_LAUNCH_ID` of its ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LaunchIds {
    /// The job id: symmrun's own `SYMM_JOB_ID` when set (not empty), else a fresh one.
    job: String,
    /// The job id came from symmrun's environment: the ranks inherit it unchanged.
    job_inherited: bool,
    /// A fresh launch id.
    launch: String,
}

/// `symmrun-` and 64 random bits in hex.
fn fresh_id() -> String {
    format!("symmrun-{:016x}", rand::random::<u64>())
}

impl LaunchIds {
    /// This launch's ids, given symmrun's own `SYMM_JOB_ID`.
    fn new(job_env: Option<&std::ffi::OsStr>) -> LaunchIds {
        let (job, job_inherited) = match job_env.filter(|v| !v.is_empty()) {
            Some(v) => (v.to_string_lossy().into_owned(), true),
            None => (fresh_id(), false),
        };
        LaunchIds {
            job,
            job_inherited,
            launch: fresh_id(),
        }
    }
}

/// Starts `nproc` ranks of `program` with torchrun's environment
/// ([`rank_command`]), this launch's `ids`, an empty signal mask and the
/// forwarded signals at their default action ([`clean_signal_mask`]). On a
/// spawn error the ranks already started are killed and reaped.
fn spawn(program: &[String], nproc: usize, master: SocketAddr, ids: &LaunchIds) -> Result<Vec<Rank>, String> {
    let Some((exe, args)) = program.split_first() else {
        return Err("no program given".into());
    };
    // symm's NCCL fallback runs only with NVLink multicast off (symm-ops refuses it otherwise):
    // ranks get NCCL_NVLS_ENABLE=0 unless the caller set the variable (then they inherit it).
    let set_nvls = std::env::var_os("NCCL_NVLS_ENABLE").is_none();
    let mut ranks: Vec<Rank> = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let mut cmd = rank_command(exe, args, rank, nproc, master);
        if set_nvls {
            cmd.env("NCCL_NVLS_ENABLE", "0");
        }
        if !ids.job_inherited {
            cmd.env(JOB_ID, &ids.job);
        }
        cmd.env(LAUNCH_ID, &ids.launch);
        cmd.env_remove(CHILD_ENV).env_remove(ISOLATED_ENV).stdin(Stdio::null());
        clean_signal_mask(&mut cmd);
        match cmd.spawn() {
            Ok(child) => ranks.push(Rank {
                rank,
                child,
                status: None,
                killed: None,
            }),
            Err(e) => {
                for r in &mut ranks {
                    r.kill(ChildStatus::KilledAfterPeerFailure, "a later rank could not be started");
                }
                return Err(format!("cannot start rank {rank} ({exe:?}): {e}"));
            }
        }
    }
    Ok(ranks)
}

/// What ended a launch early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// A rank failed (the first in time).
    Failure { rank: usize, status: ChildStatus },
    /// symmrun got this signal (and forwarded it).
    Signal(Signal),
    /// The wall-clock limit.
    Timeout,
}

/// Waits for every rank; returns the first cause that ended the launch
/// early, if any. Every rank is reaped when it returns.
fn supervise(
    ranks: &mut [Rank],
    signals: &mpsc::Receiver<Signal>,
    timeout: Option<Duration>,
    grace: Duration,
) -> Option<Cause> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut cause: Option<Cause> = None;
    // When the ranks still running get killed, and why.
    let mut kill_at: Option<Instant> = None;
    loop {
        while let Ok(sig) = signals.try_recv() {
            let live = ranks.iter().filter(|r| r.status.is_none()).count();
            match cause {
                Some(Cause::Signal(first)) => {
                    eprintln!("symmrun: got {sig} after {first}: killing the {live} ranks still running");
                    kill_at = Some(Instant::now());
                }
                _ => {
                    eprintln!("symmrun: got {sig}: forwarding it to the {live} ranks still running");
                    for r in ranks.iter() {
                        r.signal(sig);
                    }
                    cause = Some(Cause::Signal(sig));
                    let t = Instant::now() + grace;
                    kill_at = Some(kill_at.map_or(t, |k| k.min(t)));
                }
            }
        }
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            let st = match r.child.try_wait() {
                Ok(Some(s)) => ChildStatus::from(s),
                Ok(None) => continue,
                Err(_) => ChildStatus::Exited(-1),
            };
            r.status = Some(st);
            if !st.success() && cause.is_none() {
                cause = Some(Cause::Failure {
                    rank: r.rank,
                    status: st,
                });
                let t = Instant::now() + grace;
                kill_at = Some(kill_at.map_or(t, |k| k.min(t)));
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            return cause;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            for r in ranks.iter_mut() {
                r.kill(ChildStatus::TimedOut, "at the --timeout");
            }
            return cause.or(Some(Cause::Timeout));
        }
        if kill_at.is_some_and(|k| now >= k) {
            let why = match cause {
                Some(Cause::Signal(sig)) => format!("after symmrun got {sig}"),
                _ => "after another rank failed".to_string(),
            };
            for r in ranks.iter_mut() {
                r.kill(ChildStatus::KilledAfterPeerFailure, &why);
            }
            return cause;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// symmrun's exit code for how the launch ended.
fn exit_code(cause: Option<Cause>) -> u8 {
    let code = match cause {
        None => 0,
        Some(Cause::Failure { status, .. }) => status.code(),
        Some(Cause::Signal(sig)) => 128 + sig as i32,
        Some(Cause::Timeout) => 124,
    };
    // 1 for what is not a code a process can exit with (a rank that could not be waited for).
    u8::try_from(code).unwrap_or(1)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("symmrun: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Before any thread starts (the store's), so that every thread blocks them.
    let signals = if args.store_only {
        None
    } else {
        match catch_signals() {
            Ok(rx) => Some(rx),
            Err(e) => {
                eprintln!("symmrun: cannot catch signals: {e}");
                return ExitCode::from(1);
            }
        }
    };
    let server = match TcpServer::bind(SocketAddr::new(args.addr, args.port)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("symmrun: cannot host the store on {}:{}: {e}", args.addr, args.port);
            return ExitCode::from(1);
        }
    };
    let mut master = server.local_addr();
    if master.ip().is_unspecified() {
        master.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let ids = LaunchIds::new(std::env::var_os(JOB_ID).as_deref());
    let signals = match signals {
        Some(rx) => rx,
        None => {
            println!(
                "MASTER_ADDR={} MASTER_PORT={} {JOB_ID}={} {LAUNCH_ID}={}",
                master.ip(),
                master.port(),
                ids.job,
                ids.launch
            );
            match args.timeout {
                Some(t) => std::thread::sleep(t),
                None => server.join(),
            }
            return ExitCode::SUCCESS;
        }
    };
    let mut ranks = match spawn(&args.program, args.nproc.unwrap_or(1), master, &ids) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("symmrun: {e}");
            return ExitCode::from(1);
        }
    };
    let cause = supervise(&mut ranks, &signals, args.timeout, args.grace);
    drop(server);
    let code = exit_code(cause);
    if code != 0 {
        let mut report = String::new();
        for r in &ranks {
            let status = r.status.unwrap_or(ChildStatus::TimedOut);
            let first = matches!(cause, Some(Cause::Failure { rank, .. }) if rank == r.rank);
            report.push_str(&match (&r.killed, first) {
                (Some(why), _) => format!("--- rank {}: killed {why}\n", r.rank),
                (None, true) => format!("--- rank {}: {status} (the first failure)\n", r.rank),
                (None, false) => format!("--- rank {}: {status}\n", r.rank),
            });
        }
        eprint!("symmrun: failed:\n{report}");
    }
    if cause == Some(Cause::Timeout) || ranks.iter().any(|r| r.status == Some(ChildStatus::TimedOut)) {
        eprintln!("symmrun: timeout after {:?}", args.timeout.unwrap_or_default());
    }
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn parses() {
        let a = parse(&v("--nproc-per-node 4 --master-port=29501 --timeout 2.5 -- prog --x 1")).unwrap();
        assert_eq!(a.nproc, Some(4));
        assert_eq!(a.port, 29501);
        assert_eq!(a.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(a.program, v("prog --x 1"));
        assert_eq!(parse(&v("--nproc_per_node=2 prog a")).unwrap().program, v("prog a"));
        assert!(parse(&v("--nproc-per-node 0 -- p")).is_err());
        assert!(parse(&v("--nproc-per-node 2")).is_err());
        assert!(parse(&v("--bogus -- p")).is_err());
        assert!(parse(&v("--store-only")).unwrap().store_only);
    }

    #[test]
    fn launch_ids() {
        let a = LaunchIds::new(None);
        let b = LaunchIds::new(Some(std::ffi::OsStr::new("")));
        assert!(!a.job_inherited && !b.job_inherited);
        for id in [&a.job, &a.launch, &b.job, &b.launch] {
            let hex = id.strip_prefix("symmrun-").unwrap();
            assert!(hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        assert_ne!(a.job, b.job);
        assert_ne!(a.launch, b.launch);
        assert_ne!(a.job, a.launch);
        let c = LaunchIds::new(Some(std::ffi::OsStr::new("mine")));
        assert!(c.job_inherited);
        assert_eq!(c.job, "mine");
        assert_ne!(c.launch, LaunchIds::new(Some(std::ffi::OsStr::new("mine"))).launch);
    }
}
