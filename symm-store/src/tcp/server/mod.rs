//! The TCPStore server: one thread, `epoll(7)` over every client socket.
//!
//! Requests are parsed incrementally (see [`super::protocol`]); WAIT replies are
//! deferred until the last awaited key appears; a client that sends a malformed frame,
//! stalls in the middle of a frame past `frame_timeout`, or lets its unread replies pile
//! up past `max_out_buffer` is dropped, and only that client.
//!
//! # Admission
//! A new connection is *pending* until it has sent VALIDATE and one request after it
//! (PyTorch's client and ours send PING straight after VALIDATE); then it is
//! *established* and no time limit applies to it any more except `frame_timeout` for a
//! frame that has started arriving. A pending connection must deliver VALIDATE within
//! `first_frame_timeout` and finish its handshake within `handshake_timeout`. Pending
//! connections never keep a newcomer out: when `max_pending`, `max_pending_per_peer`,
//! `max_clients`, `max_clients_per_peer` or the process's fd limit (accept failing with
//! EMFILE / ENFILE) is reached, the oldest pending connection (of the newcomer's address
//! for the per-address caps) is read one last time (a client whose handshake already
//! arrived becomes established and stays) and otherwise evicted. When nothing is left to
//! evict, the newcomer is accepted and closed at once (a spare descriptor is kept for
//! that when the fd limit is reached), so it gets a clear refusal instead of waiting in
//! the listen backlog.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::Backlog;

use super::protocol::{
    parse_request, put_bytes, FrameError, Limits, Parsed, QueryType, Request, CHECK_NOT_READY, CHECK_READY,
    STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};
use crate::store::{Result, StoreError};
use crate::util::{compare_set_bytes, is_fd_exhaustion, parse_decimal};

/// Server settings. `Default` gives PyTorch's limits and timeouts generous for any real
/// client (see the module docs for how pending and established connections differ).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Bounds on keys, values, key counts and whole frames.
    pub limits: Limits,
    /// A new connection whose first frame (VALIDATE) is not complete this long after it
    /// was accepted is dropped (silent connections, a VALIDATE trickled byte by byte).
    pub first_frame_timeout: Duration,
    /// A new connection that has not sent VALIDATE and one request after it this long
    /// after it was accepted is dropped (connections that sent only VALIDATE). PyTorch's
    /// client (2.3 and later) and ours send PING right after VALIDATE; raise this for
    /// older clients that may sit idle between VALIDATE and their first request.
    pub handshake_timeout: Duration,
    /// A client that leaves a frame half-sent this long is dropped. Measured from the
    /// first byte of the frame; the time between frames is not limited.
    pub frame_timeout: Duration,
    /// Most connections at once. A newcomer beyond it evicts the oldest pending
    /// connection, or, when every connection is established, is closed at once.
    pub max_clients: usize,
    /// Most connections from one peer address (IP, any port). A newcomer beyond it evicts
    /// that address's oldest pending connection, or is closed at once.
    pub max_clients_per_peer: usize,
    /// Most pending (not yet established) connections; a newcomer beyond it evicts the
    /// oldest pending one.
    pub max_pending: usize,
    /// Most pending connections from one peer address; a newcomer beyond it evicts that
    /// address's oldest pending one (a flood from one address only displaces itself).
    pub max_pending_per_peer: usize,
    /// A client whose unread replies exceed this many bytes is dropped.
    pub max_out_buffer: usize,
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            limits: Limits::default(),
            first_frame_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(10),
            max_clients: 16 * 1024,
            max_clients_per_peer: 4 * 1024,
            max_pending: 1024,
            max_pending_per_peer: 128,
            max_out_buffer: 256 << 20,
        }
    }
}

/// Counters of a running server.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    closed: AtomicU64,
    dropped_malformed: AtomicU64,
    dropped_slow: AtomicU64,
    dropped_overflow: AtomicU64,
    dropped_idle: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
    fd_exhausted: AtomicU64,
    requests: AtomicU64,
    active: AtomicU64,
    pending: AtomicU64,
    last_drop: Mutex<Option<String>>,
}

/// A snapshot of a server's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections closed by their clients.
    pub closed: u64,
    /// Clients dropped for a malformed frame (bad type, bound exceeded, bad VALIDATE).
    pub dropped_malformed: u64,
    /// Clients dropped for leaving a frame incomplete past the frame timeout.
    pub dropped_slow: u64,
    /// Clients dropped for not reading their replies.
    pub dropped_overflow: u64,
    /// Connections dropped for not completing the handshake in time
    /// (`first_frame_timeout`, `handshake_timeout`).
    pub dropped_idle: u64,
    /// Pending connections evicted to make room for a newcomer.
    pub evicted: u64,
    /// Connections accepted and closed at once (`max_clients` or `max_clients_per_peer`
    /// reached with nothing to evict, or out of file descriptors).
    pub refused: u64,
    /// Times `accept` failed for want of file descriptors (EMFILE / ENFILE) while a
    /// connection was waiting for it.
    pub fd_exhausted: u64,
    /// Requests served.
    pub requests: u64,
    /// Clients connected now.
    pub active: u64,
    /// Connections connected now that have not completed the handshake.
    pub pending: u64,
    /// Why the last client was dropped.
    pub last_drop: Option<String>,
}

/// A running TCPStore server (PyTorch wire protocol). Stops when dropped.
#[derive(Debug)]
pub struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: UnixStream,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// Listens on `addr` (port 0 picks a free port) with default options.
    pub fn bind(addr: SocketAddr) -> Result<TcpServer> {
        TcpServer::bind_with(addr, ServerOptions::default())
    }

    /// Listens on `addr` with `opts`.
    pub fn bind_with(addr: SocketAddr, opts: ServerOptions) -> Result<TcpServer> {
        let conn_err = |source: io::Error| StoreError::Connection {
            addr: addr.to_string(),
            source,
        };
        let listener = TcpListener::bind(addr).map_err(conn_err)?;
        // std listens with a backlog of 128: a burst of connections (a flood, or a large
        // job starting) overflows it and the kernel drops SYNs, so a client waits for a
        // 1 s retransmit. Listening again on Linux just raises the backlog (the kernel
        // caps it at net.core.somaxconn); failing to is harmless.
        if let Ok(b) = Backlog::new(LISTEN_BACKLOG) {
            let _ = nix::sys::socket::listen(&listener, b);
        }
        listener.set_nonblocking(true).map_err(conn_err)?;
        let local = listener.local_addr().map_err(conn_err)?;
        let (waker, wake_rx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
        epoll
            .add(&wake_rx, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN))
            .map_err(io::Error::from)?;
        epoll
            .add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTEN_TOKEN))
            .map_err(io::Error::from)?;
        // A spare descriptor (a duplicate of the listener): closed to accept and refuse a
        // newcomer when the fd limit is reached and nothing can be evicted.
        let spare = listener.as_fd().try_clone_to_owned().ok();
        let shortest = opts
            .first_frame_timeout
            .min(opts.handshake_timeout)
            .min(opts.frame_timeout);
        let sweep_every = (shortest / 4).clamp(MIN_SWEEP, MAX_SWEEP);
        let mut srv = Server {
            epoll,
            listener,
            wake_rx,
            stop: stop.clone(),
            counters: counters.clone(),
            opts,
            clients: HashMap::new(),
            next_id: FIRST_CLIENT_TOKEN,
            db: Db::default(),
            accept_paused_until: None,
            chunk: vec![0u8; READ_CHUNK],
            pending: BTreeSet::new(),
            peers: HashMap::new(),
            spare,
            sweep_every,
            next_sweep: Instant::now() + sweep_every,
            debug: crate::knobs::get(crate::knobs::DEBUG).is_some(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("symm-store-server:{}", local.port()))
            .spawn(move || srv.run())?;
        Ok(TcpServer {
            addr: local,
            stop,
            waker,
            counters,
            thread: Some(thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A snapshot of the server's counters.
    pub fn stats(&self) -> ServerStats {
        let c = &self.counters;
        ServerStats {
            accepted: c.accepted.load(Ordering::Relaxed),
            closed: c.closed.load(Ordering::Relaxed),
            dropped_malformed: c.dropped_malformed.load(Ordering::Relaxed),
            dropped_slow: c.dropped_slow.load(Ordering::Relaxed),
            dropped_overflow: c.dropped_overflow.load(Ordering::Relaxed),
            dropped_idle: c.dropped_idle.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            fd_exhausted: c.fd_exhausted.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            active: c.active.load(Ordering::Relaxed),
            pending: c.pending.load(Ordering::Relaxed),
            last_drop: c.last_drop.lock().map(|g| g.clone()).unwrap_or(None),
        }
    }

    /// True while the server thread runs.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Blocks until the server thread ends (it only ends when stopped or on a fatal error).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&self.waker).write(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type ClientId = u64;

struct Client {
    stream: TcpStream,
    /// The peer's address (IPv4-mapped IPv6 addresses as IPv4).
    peer: IpAddr,
    accepted_at: Instant,
    inbuf: Vec<u8>,
    /// Bytes the current incomplete frame needs in all (0 = none pending).
    need: usize,
    /// When the current incomplete frame started arriving.
    partial_since: Option<Instant>,
    out: Vec<u8>,
    out_pos: usize,
    validated: bool,
    /// Sent a request after VALIDATE: the handshake is over, no idle limit applies.
    established: bool,
    /// Registered for EPOLLOUT (replies are waiting for socket space).
    want_out: bool,
}

#[derive(Default)]
struct Db {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key -> clients waiting on it (a client appears once per awaited occurrence).
    waiting: HashMap<Vec<u8>, Vec<ClientId>>,
    /// client -> number of awaited keys still missing.
    awaited: HashMap<ClientId, usize>,
}

impl Db {
    fn present(&self, k: &[u8]) -> bool {
        self.kv.contains_key(k) || self.queues.get(k).is_some_and(|q| !q.is_empty())
    }

    fn clear_wait(&mut self, id: ClientId) {
        if self.awaited.remove(&id).is_none() {
            return;
        }
        self.waiting.retain(|_, v| {
            v.retain(|c| *c != id);
            !v.is_empty()
        });
    }

    /// Every client waiting on `key` counts it as arrived; those with nothing left to wait
    /// for are returned (they get STOP_WAITING).
    fn wake_all(&mut self, key: &[u8], woken: &mut Vec<ClientId>) {
        if let Some(list) = self.waiting.remove(key) {
            for c in list {
                if let Some(n) = self.awaited.get_mut(&c) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.awaited.remove(&c);
                        woken.push(c);
                    }
                }
            }
        }
    }

    /// A queue push satisfies waiters in order until one of them is fully woken (so one
    /// element wakes one blocked pop, as PyTorch's server does).
    fn wake_one(&mut self, key: &[u8], woken: &mut Vec<ClientId>) {
        let Some(list) = self.waiting.get_mut(key) else { return };
        while !list.is_empty() {
            let c = list.remove(0);
            if let Some(n) = self.awaited.get_mut(&c) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.awaited.remove(&c);
                    woken.push(c);
                    break;
                }
            }
        }
        if list.is_empty() {
            self.waiting.remove(key);
        }
    }
}

enum DropReason {
    Malformed(String),
    Slow(String),
    Overflow(String),
    Idle(String),
    Evicted(String),
    Closed,
}

/// Connections of one peer address.
#[derive(Default)]
struct PeerConns {
    total: usize,
    /// Its pending connections (ids grow with accept time: the first is the oldest).
    pending: BTreeSet<ClientId>,
}

/// What reading a pending connection one last time before evicting it found.
enum Examined {
    /// It closed, or was dropped (malformed): its slot is free.
    Gone,
    /// It completed its handshake: it stays.
    Established,
    /// Still pending: evict it.
    Pending,
}

struct Server {
    epoll: Epoll,
    listener: TcpListener,
    wake_rx: UnixStream,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    opts: ServerOptions,
    clients: HashMap<ClientId, Client>,
    next_id: ClientId,
    db: Db,
    accept_paused_until: Option<Instant>,
    /// Reused read buffer.
    chunk: Vec<u8>,
    /// Connections that have not completed the handshake, oldest first.
    pending: BTreeSet<ClientId>,
    peers: HashMap<IpAddr, PeerConns>,
    spare: Option<OwnedFd>,
    sweep_every: Duration,
    next_sweep: Instant,
    /// `SYMM_STORE_DEBUG` was set at bind: print why connections are dropped or refused.
    debug: bool,
}

const WAKE_TOKEN: u64 = 0;
const LISTEN_TOKEN: u64 = 1;
const FIRST_CLIENT_TOKEN: u64 = 2;
const READ_CHUNK: usize = 64 * 1024;
/// Most bytes read from one client per poll round (fairness).
const READ_BUDGET: usize = 4 << 20;
/// Listen backlog (capped by the kernel at net.core.somaxconn).
const LISTEN_BACKLOG: i32 = 4096;
/// Most connections accepted per poll round (fairness under a connection flood).
const ACCEPT_BUDGET: usize = 256;
/// How long accepting pauses when `accept` fails and nothing can be freed.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);
/// Bounds of the interval between deadline sweeps (a quarter of the shortest timeout).
const MIN_SWEEP: Duration = Duration::from_millis(5);
const MAX_SWEEP: Duration = Duration::from_millis(100);

fn i64_of(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Server {
    fn run(&mut self) {
        let mut events = vec![EpollEvent::empty(); 256];
        while !self.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            if let Some(t) = self.accept_paused_until {
                if now >= t {
                    self.accept_paused_until = None;
                    let _ = self
                        .epoll
                        .add(&self.listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTEN_TOKEN));
                }
            }
            let mut wake_at = self.next_sweep;
            if let Some(t) = self.accept_paused_until {
                wake_at = wake_at.min(t);
            }
            // Rounded up: a wait of 0 ms while under 1 ms is left would spin until the sweep.
            let ms = wake_at
                .saturating_duration_since(now)
                .as_micros()
                .div_ceil(1000)
                .min(MAX_SWEEP.as_millis());
            let tick = EpollTimeout::from(u16::try_from(ms).unwrap_or(100));
            let n = match self.epoll.wait(&mut events, tick) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            let mut dirty: HashSet<ClientId> = HashSet::new();
            for ev in &events[..n] {
                let flags = ev.events();
                match ev.data() {
                    WAKE_TOKEN => {
                        let mut b = [0u8; 64];
                        while matches!((&self.wake_rx).read(&mut b), Ok(n) if n > 0) {}
                    }
                    LISTEN_TOKEN => self.accept_all(&mut dirty),
                    id => {
                        if flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
                            self.on_readable(id, &mut dirty);
                        }
                        if flags.contains(EpollFlags::EPOLLOUT) {
                            dirty.insert(id);
                        }
                    }
                }
            }
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            for id in dirty {
                self.flush(id);
            }
            let now = Instant::now();
            if now >= self.next_sweep {
                self.sweep(now);
                self.next_sweep = now + self.sweep_every;
            }
        }
        // Closing the listener and every client happens when `self` drops.
        self.counters.active.store(0, Ordering::Relaxed);
        self.counters.pending.store(0, Ordering::Relaxed);
    }
}

mod admission;
mod serving;
