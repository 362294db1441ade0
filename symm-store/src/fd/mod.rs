//! [`FdChannel`]: pass file descriptors between the processes of one host.
//!
//! # Protocol
//! * Rendezvous (in [`FdChannel::new`]): every rank listens on an abstract unix stream
//!   socket `symm-fd/<128-bit random nonce>` and publishes `uid pid name` through a
//!   [`StoreExchange`] all_gather. The name cannot be guessed, and an abstract socket
//!   leaves nothing in the file system to squat or clean up.
//! * Each operation has a generation number (all ranks call the operations in the same
//!   order). A message is one `sendmsg` on a fresh connection: a 24-byte header
//!   (`SYMMFD01`, generation, sender rank, receiver rank) carrying exactly one fd
//!   (`SCM_RIGHTS`). The receiver answers one byte: 0 accepted, 1 rejected.
//! * The receiver checks the sender with `SO_PEERCRED` against the uid and pid the
//!   claimed rank published; checks exactly one fd, no `MSG_CTRUNC`, the generation and
//!   `fstat`s the fd (optionally requiring a regular file or a memfd, see [`FdKind`]).
//!   Received fds are close-on-exec (`MSG_CMSG_CLOEXEC`). Every wait is a `poll` with a
//!   deadline; a peer whose process has exited is reported as [`StoreError::PeerLost`]
//!   at once, instead of at the deadline.
//! * A message up to 64 generations ahead is kept for its operation (a fast root can run
//!   ahead of a slow receiver: a broadcast completes once every receiver has taken or
//!   kept its fd).
//! * Messages from processes that are not a rank of the channel, and stale generations,
//!   are rejected (fds closed) and the operation goes on waiting for the real sender.
//!   A malformed message from a real rank fails the operation with
//!   [`StoreError::BadFdMessage`] naming that rank.

mod sys;

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, sockopt, ControlMessage, MsgFlags, UnixAddr};

use crate::exchange::Liveness;
use crate::exchange::StoreExchange;
use crate::store::{Result, Store, StoreError};

const MAGIC: [u8; 8] = *b"SYMMFD01";
const HEADER_LEN: usize = 24;
const ACK_OK: u8 = 0;
const ACK_REJECT: u8 = 1;
/// How long one accepted connection may take to deliver its header.
const CONN_READ_LIMIT: Duration = Duration::from_secs(2);
/// How far ahead of this rank a peer's message may be and still be kept for later
/// (a broadcast completes once every receiver has taken, or stashed, its fd, so a fast
/// rank can run several generations ahead of a slow one).
const MAX_GENERATIONS_AHEAD: u64 = 64;
/// Poll slice between peer liveness checks.
const POLL_SLICE: Duration = Duration::from_millis(50);

/// What kind of descriptor a receiver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FdKind {
    /// Anything `fstat` accepts (e.g. CUDA/HIP shareable handles).
    #[default]
    Any,
    /// A regular file (memfd, tmpfs file, ...).
    Regular,
    /// A memfd: a regular file that supports `F_GET_SEALS`.
    Memfd,
}

#[derive(Debug, Clone)]
struct Peer {
    uid: u32,
    pid: i32,
    name: String,
}

#[derive(Debug, Default)]
struct OpState {
    gen: u64,
    /// Messages of the next generation that arrived early, by (generation, sender).
    pending: HashMap<(u64, usize), OwnedFd>,
}

/// Passes fds among `world` processes of one host (see the module docs for the protocol).
pub struct FdChannel {
    rank: usize,
    world: usize,
    timeout: Duration,
    expect: FdKind,
    listener: UnixListener,
    peers: Vec<Peer>,
    state: Mutex<OpState>,
    store: Arc<dyn Store>,
    abort_prefix: String,
}

impl std::fmt::Debug for FdChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdChannel")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("expect", &self.expect)
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

/// Why one incoming message was rejected.
struct Reject {
    reason: String,
    /// The message came from a real rank: fail the operation rather than keep waiting.
    fatal_rank: Option<usize>,
    /// The failure is ours (fd table full), not the sender's.
    exhausted: bool,
}

fn deadline_after(t: Duration) -> Instant {
    Instant::now()
        .checked_add(t)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365))
}

fn poll_timeout(d: Duration) -> PollTimeout {
    let ms = d.as_millis().min(u128::from(u16::MAX));
    PollTimeout::from(u16::try_from(ms).unwrap_or(u16::MAX))
}

/// Whether `fd` became readable within `wait` (false on a timeout or an interrupted poll: the
/// caller's loop looks at its deadline and its peers, then polls again).
fn readable_within(fd: BorrowedFd<'_>, wait: Duration) -> std::result::Result<bool, Errno> {
    let mut pfd = [PollFd::new(fd, PollFlags::POLLIN)];
    match nix::poll::poll(&mut pfd, poll_timeout(wait)) {
        Ok(n) => Ok(n > 0),
        Err(Errno::EINTR) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Soft RLIMIT_NOFILE, for error messages.
fn nofile_limit() -> String {
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => soft.to_string(),
        Err(_) => "unknown".to_owned(),
    }
}

fn exhausted(context: &str) -> StoreError {
    StoreError::FdExhausted {
        context: context.to_owned(),
        limit: nofile_limit(),
    }
}

/// Maps an I/O error of `context`, turning fd-table exhaustion into a clear error.
fn io_err(context: &str, e: io::Error) -> StoreError {
    if crate::util::is_fd_exhaustion(&e) {
        return exhausted(context);
    }
    StoreError::Io(io::Error::new(e.kind(), format!("fd channel: {context}: {e}")))
}

/// True while `pid` exists and is neither a zombie nor exiting (`process::alive`).
fn pid_alive(pid: i32) -> bool {
    crate::process::alive(pid)
}

fn encode_header(gen: u64, from: usize, to: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..16].copy_from_slice(&gen.to_le_bytes());
    h[16..20].copy_from_slice(&u32::try_from(from).unwrap_or(u32::MAX).to_le_bytes());
    h[20..24].copy_from_slice(&u32::try_from(to).unwrap_or(u32::MAX).to_le_bytes());
    h
}

fn decode_header(h: &[u8; HEADER_LEN]) -> Option<(u64, usize, usize)> {
    if h[..8] != MAGIC {
        return None;
    }
    let gen = u64::from_le_bytes(h[8..16].try_into().ok()?);
    let from = u32::from_le_bytes(h[16..20].try_into().ok()?) as usize;
    let to = u32::from_le_bytes(h[20..24].try_into().ok()?) as usize;
    Some((gen, from, to))
}

/// Checks the received fd's kind with `fstat` (and `F_GET_SEALS` for memfds).
fn check_kind(fd: BorrowedFd<'_>, kind: FdKind) -> std::result::Result<(), String> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| format!("fstat of the received fd failed: {e}"))?;
    let is_reg = (st.st_mode & libc::S_IFMT) == libc::S_IFREG;
    match kind {
        FdKind::Any => Ok(()),
        FdKind::Regular | FdKind::Memfd if !is_reg => {
            Err(format!("received fd is not a regular file (st_mode {:o})", st.st_mode))
        }
        FdKind::Regular => Ok(()),
        FdKind::Memfd => match nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GET_SEALS) {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("received fd is not a memfd (F_GET_SEALS: {e})")),
        },
    }
}

impl FdChannel {
    /// Creates this rank's socket and meets the other ranks through `store` under `prefix`.
    ///
    /// Every rank of the channel must call this with the same `prefix` and `world`.
    pub fn new(store: Arc<dyn Store>, prefix: &str, rank: usize, world: usize, timeout: Duration) -> Result<FdChannel> {
        Self::meet(store, prefix, rank, world, timeout, None)
    }

    /// [`FdChannel::new`], asking `liveness` about ranks that have not arrived while it waits
    /// (a rank found gone fails the meeting at once, [`StoreExchange::with_liveness`]).
    pub fn with_liveness(
        store: Arc<dyn Store>,
        prefix: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
        liveness: Arc<dyn Liveness>,
    ) -> Result<FdChannel> {
        Self::meet(store, prefix, rank, world, timeout, Some(liveness))
    }

    fn meet(
        store: Arc<dyn Store>,
        prefix: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
        liveness: Option<Arc<dyn Liveness>>,
    ) -> Result<FdChannel> {
        if world == 0 || rank >= world {
            return Err(StoreError::InvalidArgument(format!(
                "FdChannel: rank {rank} out of range for world size {world}"
            )));
        }
        let nonce: u128 = rand::random();
        let name = format!("symm-fd/{nonce:032x}");
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| io_err("socket address", e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| io_err("bind", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("set_nonblocking", e))?;
        let uid = nix::unistd::getuid().as_raw();
        let pid = std::process::id();
        let info = format!("symmfd1 {uid} {pid} {name}");
        let mut ex = StoreExchange::new(store.clone(), format!("{prefix}/fdchannel"));
        if let Some(l) = liveness {
            ex = ex.with_liveness(l);
        }
        let all = ex.all_gather(rank, world, info.as_bytes(), timeout)?;
        let mut peers = Vec::with_capacity(world);
        for (r, bytes) in all.iter().enumerate() {
            let bad = || StoreError::Protocol(format!("fd channel rendezvous: rank {r} published an invalid record"));
            let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
            let parts: Vec<&str> = text.split(' ').collect();
            if parts.len() != 4 || parts[0] != "symmfd1" || !parts[3].starts_with("symm-fd/") {
                return Err(bad());
            }
            let uid: u32 = parts[1].parse().map_err(|_| bad())?;
            let pid: i32 = parts[2].parse().map_err(|_| bad())?;
            if pid <= 0 {
                return Err(bad());
            }
            peers.push(Peer {
                uid,
                pid,
                name: parts[3].to_owned(),
            });
        }
        // Abort records are per channel instance (rank 0's random socket name), so a
        // recycled prefix never sees an old instance's aborts.
        let instance = peers[0].name.trim_start_matches("symm-fd/").to_owned();
        let abort_prefix = format!("{prefix}/fdchannel/abort/{instance}");
        Ok(FdChannel {
            rank,
            world,
            timeout,
            expect: FdKind::Any,
            listener,
            peers,
            state: Mutex::new(OpState::default()),
            store,
            abort_prefix,
        })
    }

    /// Requires received fds to be of `kind` (default [`FdKind::Any`]).
    pub fn with_expected_kind(mut self, kind: FdKind) -> FdChannel {
        self.expect = kind;
        self
    }

    /// This process's rank in the channel.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The timeout given at construction.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The pid that `rank` published at rendezvous.
    pub fn peer_pid(&self, rank: usize) -> Option<i32> {
        self.peers.get(rank).map(|p| p.pid)
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, OpState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every rank contributes `fd`; returns one fd per rank (own slot: a dup of `fd`),
    /// each referring to the same open file as the sender's.
    pub fn all_gather_fds(&self, fd: BorrowedFd<'_>, timeout: Duration) -> Result<Vec<OwnedFd>> {
        let mut st = self.lock_state();
        st.gen += 1;
        let gen = st.gen;
        let r = self.all_gather_inner(&mut st, gen, fd, timeout);
        r.map_err(|e| self.fail(gen, e))
    }

    fn all_gather_inner(
        &self,
        st: &mut OpState,
        gen: u64,
        fd: BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<Vec<OwnedFd>> {
        let deadline = deadline_after(timeout);
        let own = fd.try_clone_to_owned().map_err(|e| io_err("dup of own fd", e))?;
        let others: Vec<usize> = (0..self.world).filter(|&r| r != self.rank).collect();
        let mut conns = Vec::with_capacity(others.len());
        for &to in &others {
            conns.push((to, self.send_message(to, gen, &[fd.as_raw_fd()], deadline, timeout)?));
        }
        let mut got = self.receive(st, gen, &others, deadline, timeout, "all_gather_fds")?;
        for (to, conn) in conns {
            self.read_ack(to, conn, gen, deadline, timeout, "all_gather_fds")?;
        }
        got.insert(self.rank, own);
        let mut out = Vec::with_capacity(self.world);
        for r in 0..self.world {
            out.push(got.remove(&r).ok_or_else(|| StoreError::PeerLost {
                rank: r,
                reason: "no fd received (internal error)".to_owned(),
            })?);
        }
        Ok(out)
    }

    /// `root` passes `Some(fd)`, the others `None`; every rank returns an fd for the
    /// root's open file (the root a dup of its own).
    pub fn broadcast_fds(&self, root: usize, fd: Option<BorrowedFd<'_>>, timeout: Duration) -> Result<OwnedFd> {
        if root >= self.world {
            return Err(StoreError::InvalidArgument(format!(
                "broadcast_fds: root {root} out of range for world size {}",
                self.world
            )));
        }
        if self.rank == root && fd.is_none() {
            return Err(StoreError::InvalidArgument(
                "broadcast_fds: the root must pass an fd".into(),
            ));
        }
        let mut st = self.lock_state();
        st.gen += 1;
        let gen = st.gen;
        let r = self.broadcast_inner(&mut st, gen, root, fd, timeout);
        r.map_err(|e| self.fail(gen, e))
    }

    fn broadcast_inner(
        &self,
        st: &mut OpState,
        gen: u64,
        root: usize,
        fd: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<OwnedFd> {
        let deadline = deadline_after(timeout);
        match fd {
            Some(fd) if self.rank == root => {
                let own = fd.try_clone_to_owned().map_err(|e| io_err("dup of own fd", e))?;
                let mut conns = Vec::new();
                for to in (0..self.world).filter(|&r| r != root) {
                    conns.push((to, self.send_message(to, gen, &[fd.as_raw_fd()], deadline, timeout)?));
                }
                for (to, conn) in conns {
                    self.read_ack(to, conn, gen, deadline, timeout, "broadcast_fds")?;
                }
                Ok(own)
            }
            _ => {
                let mut got = self.receive(st, gen, &[root], deadline, timeout, "broadcast_fds")?;
                got.remove(&root).ok_or_else(|| StoreError::PeerLost {
                    rank: root,
                    reason: "no fd received (internal error)".into(),
                })
            }
        }
    }

    fn abort_key(&self, gen: u64) -> String {
        format!("{}/{gen}", self.abort_prefix)
    }

    /// An abort another rank published for `gen`, as the error this rank should report.
    fn peer_abort(&self, gen: u64) -> Option<StoreError> {
        let key = self.abort_key(gen);
        if !self.store.check(&[&key]).ok()? {
            return None;
        }
        let rec = self.store.get_now(&key).ok()?;
        let rec = String::from_utf8_lossy(&rec).into_owned();
        let mut it = rec.splitn(3, ' ');
        let from: usize = it.next()?.parse().ok()?;
        let lost = it.next()?;
        let text = it.next().unwrap_or("").to_owned();
        if from == self.rank {
            return None;
        }
        if let Some(r) = lost.strip_prefix("lost:").and_then(|r| r.parse::<usize>().ok()) {
            return Some(StoreError::PeerLost {
                rank: r,
                reason: format!("reported by rank {from}: {text}"),
            });
        }
        if let Some(list) = lost.strip_prefix("missing:") {
            let missing: Vec<usize> = list.split(',').filter_map(|r| r.parse().ok()).collect();
            return Some(StoreError::MissingRanks {
                what: format!("fd exchange generation {gen} (reported by rank {from}: {text})"),
                missing,
                timeout: self.timeout,
            });
        }
        Some(StoreError::PeerLost {
            rank: from,
            reason: format!("rank {from} aborted the operation: {text}"),
        })
    }

    /// Turns an operation's error into the one to report, and tells the other ranks.
    fn fail(&self, gen: u64, e: StoreError) -> StoreError {
        // A peer that failed first knows better which rank is really gone.
        let e = match e {
            StoreError::PeerLost { .. } | StoreError::MissingRanks { .. } => self.peer_abort(gen).unwrap_or(e),
            e => e,
        };
        let what = match &e {
            StoreError::PeerLost { rank, .. } => format!("lost:{rank}"),
            StoreError::MissingRanks { missing, .. } => {
                format!(
                    "missing:{}",
                    missing.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",")
                )
            }
            _ => "error:".to_owned(),
        };
        let rec = format!("{} {what} {e}", self.rank);
        // Best effort: only the first failure of a generation is recorded.
        let _ = self.store.compare_set(&self.abort_key(gen), b"", rec.as_bytes());
        e
    }

    /// The current generation (number of operations started). For tests and diagnostics.
    #[doc(hidden)]
    pub fn generation(&self) -> u64 {
        self.lock_state().gen
    }

    /// Advances the generation as if `n` operations had run (fault-injection tests).
    #[doc(hidden)]
    pub fn skip_generations_for_testing(&self, n: u64) {
        let mut st = self.lock_state();
        st.gen = st.gen.saturating_add(n);
    }

    /// Sends a raw message (any generation, any number of fds) to `to` and returns
    /// whether it was accepted. Only for fault-injection tests.
    #[doc(hidden)]
    pub fn send_raw_for_testing(&self, to: usize, gen: u64, fds: &[BorrowedFd<'_>], timeout: Duration) -> Result<()> {
        if to >= self.world {
            return Err(StoreError::InvalidArgument(format!("rank {to} out of range")));
        }
        let deadline = deadline_after(timeout);
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let conn = self.send_message(to, gen, &raw, deadline, timeout)?;
        self.read_ack(to, conn, gen, deadline, timeout, "send_raw")
    }

    /// The abstract socket name of `rank` (for fault-injection tests).
    #[doc(hidden)]
    pub fn socket_name_for_testing(&self, rank: usize) -> Option<String> {
        self.peers.get(rank).map(|p| p.name.clone())
    }
}

mod transport;
