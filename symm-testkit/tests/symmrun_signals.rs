//! `symmrun` with small shell ranks (issue #17): SIGTERM and SIGINT reach
//! the ranks and no rank outlives symmrun; the exit code is the first
//! failure's in time, not the lowest failed rank's, also when the other
//! ranks are killed after the grace period. Issue #39: the ranks start with
//! an empty signal mask (symmrun blocks the signals it forwards), so their
//! own handlers run.
//!
//! `sh` here is often dash, which clears the signal mask it inherits; the
//! tests of #39 use bash and grep, which keep it, as most programs do.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A rank script: writes its pid to `$PID_DIR/$RANK`, then runs `body`
/// (a leading `trap ...;` runs before the pid is written).
fn script(body: &str) -> String {
    let (trap, body) = match body.split_once("; ") {
        Some((t, b)) if t.starts_with("trap ") => (format!("{t}; "), b),
        _ => (String::new(), body),
    };
    format!("{trap}echo $$ > \"$PID_DIR/$RANK.tmp\" && mv \"$PID_DIR/$RANK.tmp\" \"$PID_DIR/$RANK\"; {body}")
}

/// A fresh directory for the ranks' pid files.
fn pid_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("symmrun-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn start(args: &[&str], body: &str, dir: &Path) -> Child {
    start_in("sh", args, body, dir)
}

/// [`start`] with ranks of `shell -c <script>`.
fn start_in(shell: &str, args: &[&str], body: &str, dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_symmrun"))
        .args(args)
        .args(["--", shell, "-c", &script(body)])
        .env("PID_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` up to `limit`; kills it and `ranks` (and fails) past that.
fn wait_for(child: &mut Child, ranks: &[Pid], limit: Duration) -> (ExitStatus, Duration) {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s, t0.elapsed());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            for &p in ranks {
                let _ = kill(p, Signal::SIGKILL);
            }
            panic!("symmrun still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// symmrun's stderr. Read once its ranks are known to be gone: a rank that
/// outlived symmrun would hold the pipe open.
fn stderr_of(child: &mut Child) -> String {
    use std::io::Read;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

/// Waits for symmrun as [`wait_for`], asserts its `ranks` are gone within
/// 200 ms (`what` names the case), and returns its status, how long the
/// wait took and its stderr.
fn finish(run: &mut Child, ranks: &[Pid], limit: Duration, what: &str) -> (ExitStatus, Duration, String) {
    let (status, took) = wait_for(run, ranks, limit);
    assert_gone(ranks, Duration::from_millis(200), what);
    (status, took, stderr_of(run))
}

/// The pids the ranks wrote (waits up to 10 s for all `n`).
fn rank_pids(dir: &Path, n: usize) -> Vec<Pid> {
    let t0 = Instant::now();
    loop {
        let pids: Vec<Pid> = (0..n)
            .filter_map(|r| std::fs::read_to_string(dir.join(r.to_string())).ok())
            .filter_map(|s| s.trim().parse::<i32>().ok())
            .map(Pid::from_raw)
            .collect();
        if pids.len() == n {
            return pids;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "only {} of {n} ranks started",
            pids.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` still exists (running, or a zombie nobody reaped).
fn alive(pid: Pid) -> bool {
    kill(pid, None) != Err(Errno::ESRCH)
}

/// Asserts every pid is gone within `limit` (then SIGKILLs survivors so no
/// failed test leaves a process behind).
fn assert_gone(pids: &[Pid], limit: Duration, what: &str) {
    let t0 = Instant::now();
    while pids.iter().any(|&p| alive(p)) && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left: Vec<Pid> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        let _ = kill(p, Signal::SIGKILL);
    }
    assert!(left.is_empty(), "{what}: ranks {left:?} outlived symmrun");
}

fn forwards(sig: Signal) {
    let dir = pid_dir(sig.as_str());
    let mut run = start(&["--nproc-per-node", "3", "--timeout", "60"], "exec sleep 30", &dir);
    let pids = rank_pids(&dir, 3);
    let sent = Instant::now();
    kill(Pid::from_raw(run.id() as i32), sig).unwrap();
    let (status, _) = wait_for(&mut run, &pids, Duration::from_secs(10));
    let took = sent.elapsed();
    assert_gone(&pids, Duration::from_millis(200), sig.as_str());
    let err = stderr_of(&mut run);
    assert!(
        took < Duration::from_secs(2),
        "{sig}: symmrun took {took:?} to end\n{err}"
    );
    assert_eq!(status.code(), Some(128 + sig as i32), "{sig}: {status:?}\n{err}");
    assert!(err.contains(&format!("got {sig}")), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_is_forwarded_and_no_rank_outlives_symmrun() {
    forwards(Signal::SIGTERM);
}

#[test]
fn sigint_is_forwarded_and_no_rank_outlives_symmrun() {
    forwards(Signal::SIGINT);
}

/// Ranks that ignore the forwarded signal are killed `--grace` later.
#[test]
fn ranks_ignoring_sigterm_are_killed_after_the_grace() {
    let dir = pid_dir("ignore");
    let mut run = start(
        &["--nproc-per-node", "2", "--grace", "0.5", "--timeout", "60"],
        "trap '' TERM; exec sleep 30",
        &dir,
    );
    let pids = rank_pids(&dir, 2);
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    let (status, took, err) = finish(&mut run, &pids, Duration::from_secs(10), "ignoring SIGTERM");
    assert!(took < Duration::from_secs(3), "took {took:?}\n{err}");
    assert_eq!(status.code(), Some(143), "{status:?}\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exits_with_the_first_failure_in_time() {
    // Rank 1 fails first (7 at 0.1 s), rank 0 later (3 at 1 s).
    let dir = pid_dir("first");
    let mut run = start(
        &["--nproc-per-node", "2", "--timeout", "60"],
        r#"if [ "$RANK" = 1 ]; then sleep 0.1; exit 7; fi; sleep 1; exit 3"#,
        &dir,
    );
    let pids = rank_pids(&dir, 2);
    let (status, took, err) = finish(&mut run, &pids, Duration::from_secs(20), "after the ranks ended");
    assert_eq!(status.code(), Some(7), "{status:?} after {took:?}\n{err}");
    assert!(err.contains("rank 1: exit code 7 (the first failure)"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    // The other way round: rank 0 first (its own pid folder, so its ranks are the ones checked).
    let dir = pid_dir("first-0");
    let mut run = start(
        &["--nproc-per-node", "2", "--timeout", "60"],
        r#"if [ "$RANK" = 0 ]; then sleep 0.1; exit 5; fi; sleep 1; exit 9"#,
        &dir,
    );
    let pids = rank_pids(&dir, 2);
    let (status, took, err) = finish(&mut run, &pids, Duration::from_secs(20), "rank 0 first");
    assert_eq!(status.code(), Some(5), "{status:?} after {took:?}\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn first_failure_code_survives_killing_the_rest() {
    // Rank 2 fails first (7), rank 1 later (3, within the grace), rank 0
    // never ends and is killed after the grace.
    let dir = pid_dir("grace");
    let mut run = start(
        &["--nproc-per-node", "3", "--grace", "0.7", "--timeout", "60"],
        r#"case "$RANK" in 2) sleep 0.1; exit 7;; 1) sleep 0.3; exit 3;; *) exec sleep 30;; esac"#,
        &dir,
    );
    let pids = rank_pids(&dir, 3);
    let (status, took, err) = finish(&mut run, &pids, Duration::from_secs(20), "after a failure");
    assert_eq!(status.code(), Some(7), "{status:?}\n{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}\n{err}");
    assert!(err.contains("rank 0: killed after another rank failed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ranks whose handler for `sig` writes a marker file and exits 0: symmrun
/// sent `sig` ends promptly (long before the grace period), every rank's
/// handler ran, and symmrun exits 128 + `sig`, as for any forwarded signal.
fn handlers_run(sig: Signal) {
    let name = sig.as_str().trim_start_matches("SIG");
    let dir = pid_dir(&format!("handler-{name}"));
    // bash, not sh: bash keeps the signal mask it inherits (dash clears it).
    let body =
        format!(r#"trap 'echo "$RANK" > "$PID_DIR/handled-$RANK" && exit 0' {name}; while :; do sleep 0.05; done"#);
    let mut run = start_in(
        "bash",
        &["--nproc-per-node", "3", "--grace", "20", "--timeout", "60"],
        &body,
        &dir,
    );
    let pids = rank_pids(&dir, 3);
    let sent = Instant::now();
    kill(Pid::from_raw(run.id() as i32), sig).unwrap();
    let (status, _, err) = finish(&mut run, &pids, Duration::from_secs(40), name);
    let took = sent.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "{sig}: symmrun took {took:?} to end (the ranks' handlers did not run?)\n{err}"
    );
    assert_eq!(status.code(), Some(128 + sig as i32), "{sig}: {status:?}\n{err}");
    for r in 0..3 {
        let marker = std::fs::read_to_string(dir.join(format!("handled-{r}"))).ok();
        assert_eq!(
            marker.as_deref().map(str::trim),
            Some(r.to_string().as_str()),
            "{sig}: rank {r}'s handler did not run\n{err}"
        );
        assert!(
            err.contains(&format!("--- rank {r}: exit code 0\n")),
            "{sig}: rank {r}\n{err}"
        );
    }
    assert!(!err.contains("killed"), "{sig}: a rank was killed\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_runs_the_ranks_own_handlers() {
    handlers_run(Signal::SIGTERM);
}

#[test]
fn sigint_runs_the_ranks_own_handlers() {
    handlers_run(Signal::SIGINT);
}

/// The ranks' signal mask is empty and the forwarded signals are not
/// ignored in them, even where symmrun's own parent ignores them (as a shell
/// does for a job started with `&`). grep is the rank: it keeps the mask and
/// dispositions it inherits.
#[test]
fn ranks_start_with_an_empty_signal_mask() {
    let out = Command::new("sh")
        .args([
            "-c",
            r#"trap '' INT TERM HUP; exec "$0" "$@""#,
            env!("CARGO_BIN_EXE_symmrun"),
            "--nproc-per-node",
            "2",
            "--timeout",
            "30",
            "--",
            "grep",
            "-E",
            "^Sig(Blk|Ign):",
            "/proc/self/status",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{text}\n{err}", out.status);
    let field = |name: &str| -> Vec<u64> {
        text.lines()
            .filter_map(|l| l.strip_prefix(name))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .collect()
    };
    let blocked = field("SigBlk:");
    let ignored = field("SigIgn:");
    assert_eq!(blocked, vec![0, 0], "the ranks' blocked signals\n{text}");
    assert_eq!(ignored.len(), 2, "{text}");
    let forwarded = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]
        .iter()
        .fold(0u64, |m, &s| m | 1 << (s as u64 - 1));
    for ign in ignored {
        assert_eq!(
            ign & forwarded,
            0,
            "a forwarded signal is ignored in a rank: {ign:#x}\n{text}"
        );
    }
}
