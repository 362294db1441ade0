//! The process launcher: children re-executing the test binary with torchrun's variables,
//! their supervision and outcomes, and the isolated single-process mode (module docs of
//! `launch`).

use super::*;

/// How one child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStatus {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal (not by the launcher).
    Signaled(i32),
    /// Killed by the launcher at the wall-clock limit.
    TimedOut,
    /// Killed by the launcher after another rank failed and the grace period passed.
    KilledAfterPeerFailure,
}

impl ChildStatus {
    pub fn success(self) -> bool {
        self == ChildStatus::Exited(0)
    }
    /// A shell-style exit code (128 + signal for signals, 124 for timeouts).
    pub fn code(self) -> i32 {
        match self {
            ChildStatus::Exited(c) => c,
            ChildStatus::Signaled(s) => 128 + s,
            ChildStatus::TimedOut => 124,
            ChildStatus::KilledAfterPeerFailure => 137,
        }
    }
}

impl std::fmt::Display for ChildStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildStatus::Exited(c) => write!(f, "exit code {c}"),
            ChildStatus::Signaled(s) => write!(f, "killed by signal {s}"),
            ChildStatus::TimedOut => f.write_str("killed at the wall-clock limit"),
            ChildStatus::KilledAfterPeerFailure => f.write_str("killed after another rank failed"),
        }
    }
}

impl From<ExitStatus> for ChildStatus {
    /// How a process the launcher did not kill ended.
    fn from(s: ExitStatus) -> ChildStatus {
        use std::os::unix::process::ExitStatusExt;
        match (s.code(), s.signal()) {
            (Some(c), _) => ChildStatus::Exited(c),
            (None, Some(sig)) => ChildStatus::Signaled(sig),
            (None, None) => ChildStatus::Exited(-1),
        }
    }
}

/// One child's end and its captured output.
#[derive(Debug, Clone)]
pub struct ChildOutcome {
    pub rank: usize,
    pub status: ChildStatus,
    /// The tail of its stdout and stderr (empty when not captured).
    pub output: String,
}

/// A started rank process and its captured output.
pub(crate) struct RankProcess {
    rank: usize,
    child: Child,
    output: Option<Arc<Mutex<Vec<u8>>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    status: Option<ChildStatus>,
}

/// Pumps a child's piped stdout and stderr into one buffer (its last output, interleaved).
fn capture(child: &mut Child) -> (Arc<Mutex<Vec<u8>>>, Vec<std::thread::JoinHandle<()>>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    if let Some(o) = child.stdout.take() {
        readers.push(pump(o, buf.clone()));
    }
    if let Some(e) = child.stderr.take() {
        readers.push(pump(e, buf.clone()));
    }
    (buf, readers)
}

fn pump(mut from: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut v = into.lock().unwrap_or_else(|e| e.into_inner());
            v.extend_from_slice(&buf[..n]);
            if v.len() > 2 * OUTPUT_TAIL {
                let cut = v.len() - OUTPUT_TAIL;
                v.drain(..cut);
            }
        }
    })
}

/// What [`spawn_ranks`] starts.
pub(crate) struct SpawnSpec<'a> {
    pub program: &'a std::path::Path,
    pub args: &'a [String],
    pub world: usize,
    pub master: SocketAddr,
    pub env: &'a [(String, String)],
    pub remove_env: &'a [&'a str],
    pub capture: bool,
}

/// `program args` as rank `rank` of `world` (one node) with torchrun's environment, a client
/// of the store at `master` that the launcher hosts (as under torchrun's agent store).
pub fn rank_command(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[String],
    rank: usize,
    world: usize,
    master: SocketAddr,
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("GROUP_RANK", "0")
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", master.ip().to_string())
        .env("MASTER_PORT", master.port().to_string())
        // As torchrun's agent store: the launcher hosts the store, ranks are clients.
        .env("TORCHELASTIC_USE_AGENT_STORE", "True")
        .env("SYMM_STORE_HOSTED", "1");
    cmd
}

/// Starts `world` processes with torchrun's environment. On a spawn error
/// the ranks already started are killed.
pub(crate) fn spawn_ranks(spec: &SpawnSpec<'_>) -> Result<Vec<RankProcess>, LaunchError> {
    let mut procs: Vec<RankProcess> = Vec::with_capacity(spec.world);
    for rank in 0..spec.world {
        let mut cmd = rank_command(spec.program, spec.args, rank, spec.world, spec.master);
        for k in spec.remove_env {
            cmd.env_remove(k);
        }
        for (k, v) in spec.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null());
        if spec.capture {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(source) => {
                kill_all(&mut procs, ChildStatus::KilledAfterPeerFailure);
                return Err(LaunchError::Spawn { rank, source });
            }
        };
        let (output, readers) = if spec.capture {
            let (buf, readers) = capture(&mut child);
            (Some(buf), readers)
        } else {
            (None, Vec::new())
        };
        procs.push(RankProcess {
            rank,
            child,
            output,
            readers,
            status: None,
        });
    }
    Ok(procs)
}

fn kill_all(procs: &mut [RankProcess], why: ChildStatus) {
    for p in procs.iter_mut().filter(|p| p.status.is_none()) {
        let _ = p.child.kill();
        let _ = p.child.wait();
        p.status = Some(why);
    }
}

/// Waits for every process until `deadline` (then kills the rest as timed
/// out). With `grace`, once one rank fails the others get `grace` more
/// before they are killed.
pub(crate) fn supervise(mut procs: Vec<RankProcess>, deadline: Instant, grace: Option<Duration>) -> Vec<ChildOutcome> {
    let mut kill_at = deadline;
    let mut kill_why = ChildStatus::TimedOut;
    loop {
        for p in procs.iter_mut().filter(|p| p.status.is_none()) {
            match p.child.try_wait() {
                Ok(Some(s)) => {
                    let st = ChildStatus::from(s);
                    p.status = Some(st);
                    if let (false, Some(g)) = (st.success(), grace) {
                        let t = Instant::now() + g;
                        if t < kill_at {
                            kill_at = t;
                            kill_why = ChildStatus::KilledAfterPeerFailure;
                        }
                    }
                }
                Ok(None) => {}
                Err(_) => p.status = Some(ChildStatus::Exited(-1)),
            }
        }
        if procs.iter().all(|p| p.status.is_some()) {
            break;
        }
        if Instant::now() >= kill_at {
            kill_all(&mut procs, kill_why);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    procs
        .into_iter()
        .map(|p| {
            for r in p.readers {
                let _ = r.join();
            }
            let output = p
                .output
                .map(|b| {
                    let v = b.lock().unwrap_or_else(|e| e.into_inner());
                    let start = v.len().saturating_sub(OUTPUT_TAIL);
                    String::from_utf8_lossy(&v[start..]).into_owned()
                })
                .unwrap_or_default();
            ChildOutcome {
                rank: p.rank,
                status: p.status.unwrap_or(ChildStatus::TimedOut),
                output,
            }
        })
        .collect()
}

/// Options of [`run_processes_outcomes`].
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// The full name of the `#[test]` to run in each child (as `--exact` wants it).
    pub test_name: String,
    pub world: usize,
    /// Wall-clock limit for the whole launch.
    pub limit: Duration,
    /// A fault armed through `SYMM_FAULT` in every child.
    pub fault: Option<Fault>,
    /// Extra environment for the children.
    pub env: Vec<(String, String)>,
    /// Store timeout of the children.
    pub store_timeout: Duration,
    /// After one rank fails, how long the others may keep running (None: until the limit).
    pub grace: Option<Duration>,
}

impl ProcessOptions {
    pub fn new(test_name: &str, world: usize, limit: Duration) -> ProcessOptions {
        ProcessOptions {
            test_name: test_name.to_string(),
            world,
            limit,
            fault: None,
            env: Vec::new(),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            grace: None,
        }
    }
}

fn test_args(test_name: &str) -> Vec<String> {
    vec![
        test_name.to_string(),
        "--exact".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

/// Starts one child per rank re-executing the current test binary with
/// `--exact <test_name>`, hosts their store, and returns how every child
/// ended. Fails if a child could not start or did not run the test.
pub fn run_processes_outcomes(opts: &ProcessOptions) -> Result<Vec<ChildOutcome>, LaunchError> {
    if opts.world == 0 {
        return Err(LaunchError::Invalid("world size 0".into()));
    }
    if is_child() || is_isolated_child() {
        return Err(LaunchError::Invalid(format!(
            "run_processes called inside a child ({}): branch on child_ctx() first",
            opts.test_name
        )));
    }
    let exe = std::env::current_exe()?;
    let server = crate::store_host::serve()?;
    let mut env = opts.env.clone();
    env.push((CHILD_ENV.into(), opts.test_name.clone()));
    // One id per launch, as symm-testkit's (`RankCtx::launch_id`) and as symm-core's launch
    // identity (`SYMM_LAUNCH_ID`, which symmrun sets too).
    let launch_id = rand::random::<u64>().to_string();
    env.push((LAUNCH_ID_ENV.into(), launch_id.clone()));
    env.push((symm_core::knobs::LAUNCH_ID.into(), launch_id));
    env.push((STORE_TIMEOUT_ENV.into(), opts.store_timeout.as_millis().to_string()));
    if let Some(f) = &opts.fault {
        env.push((FAULT_ENV.into(), f.to_env()));
    }
    let remove: &[&str] = if opts.fault.is_some() {
        &[ISOLATED_ENV]
    } else {
        &[ISOLATED_ENV, FAULT_ENV]
    };
    let args = test_args(&opts.test_name);
    let procs = spawn_ranks(&SpawnSpec {
        program: &exe,
        args: &args,
        world: opts.world,
        master: server.addr(),
        env: &env,
        remove_env: remove,
        capture: true,
    })?;
    let outcomes = supervise(procs, Instant::now() + opts.limit, opts.grace);
    let client = server.client(Duration::from_secs(5))?;
    let not_started: Vec<usize> = (0..opts.world)
        .filter(|r| !matches!(client.check(&[&format!("{STARTED_KEY}/{r}")]), Ok(true)))
        .collect();
    if !not_started.is_empty() && outcomes.iter().all(|o| o.status.success()) {
        return Err(LaunchError::Failed(format!(
            "ranks {not_started:?} exited without running test {:?} (wrong test name?)\n{}",
            opts.test_name,
            report(&outcomes)
        )));
    }
    Ok(outcomes)
}

/// Formats every child's status and output.
pub fn report(outcomes: &[ChildOutcome]) -> String {
    let mut s = String::new();
    for o in outcomes {
        s.push_str(&format!("--- rank {}: {}\n", o.rank, o.status));
        if !o.output.is_empty() {
            s.push_str(&o.output);
            if !o.output.ends_with('\n') {
                s.push('\n');
            }
        }
    }
    s
}

/// Runs test `test_name` as `world` processes (see the module docs); Ok if
/// every child exited 0 within `limit`. After a failure the others get 10 s.
pub fn run_processes(test_name: &str, world: usize, limit: Duration) -> Result<(), LaunchError> {
    let mut opts = ProcessOptions::new(test_name, world, limit);
    opts.grace = Some(Duration::from_secs(10));
    let outcomes = run_processes_outcomes(&opts)?;
    if outcomes.iter().all(|o| o.status.success()) {
        // Captured by the test harness; shown on failure or with --nocapture.
        print!("{}", report(&outcomes));
        Ok(())
    } else {
        Err(LaunchError::Failed(format!(
            "test {test_name:?} with {world} processes failed:\n{}",
            report(&outcomes)
        )))
    }
}

/// True in a child started by [`run_processes`].
pub fn is_child() -> bool {
    crate::knobs::get(CHILD_ENV).is_some()
}

/// This child's rank (None outside a child).
pub fn child_rank() -> Option<usize> {
    if !is_child() {
        return None;
    }
    crate::knobs::get(crate::knobs::RANK).and_then(|r| r.parse().ok())
}

fn env_usize(name: &str) -> Result<usize, LaunchError> {
    let v = crate::knobs::get(name).ok_or_else(|| LaunchError::Env(format!("{name} is not set")))?;
    v.parse()
        .map_err(|_| LaunchError::Env(format!("{name}={v:?} is not a number")))
}

/// Dies with the parent: a child must not outlive its launcher.
fn die_with_parent() {
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    if nix::unistd::getppid() == nix::unistd::Pid::from_raw(1) {
        std::process::exit(137);
    }
}

/// In a child started by [`run_processes`]: this rank's context (its store
/// a client of the launcher's TcpStore). `Ok(None)` outside a child.
pub fn child_ctx() -> Result<Option<RankCtx>, LaunchError> {
    if !is_child() {
        return Ok(None);
    }
    die_with_parent();
    use crate::knobs::{LOCAL_RANK, MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE};
    let rank = env_usize(RANK)?;
    let world = env_usize(WORLD_SIZE)?;
    let local_rank = env_usize(LOCAL_RANK).unwrap_or(rank);
    let addr = crate::knobs::get(MASTER_ADDR).ok_or_else(|| LaunchError::Env("MASTER_ADDR is not set".into()))?;
    let port = u16::try_from(env_usize(MASTER_PORT)?)
        .map_err(|_| LaunchError::Env("MASTER_PORT is not a port number".into()))?;
    let timeout = crate::knobs::get(STORE_TIMEOUT_ENV)
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_STORE_TIMEOUT);
    let launch_id = crate::knobs::get(LAUNCH_ID_ENV)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let store = crate::store_host::connect(addr, port, timeout)?;
    store.set(&format!("{STARTED_KEY}/{rank}"), b"")?;
    Ok(Some(RankCtx {
        rank,
        world,
        local_rank,
        mode: Mode::Processes,
        store,
        launch_id,
        shared_device: false,
    }))
}

/// True in the child started by [`run_isolated`].
pub fn is_isolated_child() -> bool {
    crate::knobs::get(ISOLATED_ENV).is_some()
}

/// Re-executes the current test binary once, running only `test_name`, in a
/// process of its own (for tests that measure process-wide resources such as
/// open fds). The test body branches on [`is_isolated_child`].
pub fn run_isolated(test_name: &str, limit: Duration) -> Result<(), LaunchError> {
    if is_child() || is_isolated_child() {
        return Err(LaunchError::Invalid("run_isolated called inside a child".into()));
    }
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(test_args(test_name))
        .env(ISOLATED_ENV, test_name)
        .env_remove(CHILD_ENV)
        .env_remove(FAULT_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn { rank: 0, source })?;
    let (buf, readers) = capture(&mut child);
    let procs = vec![RankProcess {
        rank: 0,
        child,
        output: Some(buf),
        readers,
        status: None,
    }];
    let outcomes = supervise(procs, Instant::now() + limit, None);
    let ran = outcomes
        .iter()
        .all(|o| o.output.contains(&format!("test {test_name} ... ok")) || !o.status.success());
    if outcomes.iter().all(|o| o.status.success()) && ran {
        print!("{}", report(&outcomes));
        Ok(())
    } else if !ran {
        Err(LaunchError::Failed(format!(
            "isolated run of {test_name:?} did not run the test (wrong test name?)\n{}",
            report(&outcomes)
        )))
    } else {
        Err(LaunchError::Failed(format!(
            "isolated run of {test_name:?} failed:\n{}",
            report(&outcomes)
        )))
    }
}

/// The name `--exact` wants for test function `func` declared in module
/// `module_path` (as `module_path!()` gives it: the crate name is dropped).
pub fn test_path(module_path: &str, func: &str) -> String {
    match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{func}"),
        None => func.to_string(),
    }
}
