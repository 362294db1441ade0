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
    /// Times `accept` failed for want of file descriptors (EMFILE / ENFILE).
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
            debug: std::env::var_os("SYMM_STORE_DEBUG").is_some(),
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

    fn pause_accept(&mut self) {
        let _ = self.epoll.delete(&self.listener);
        self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
    }

    fn accept_all(&mut self, dirty: &mut HashSet<ClientId>) {
        for _ in 0..ACCEPT_BUDGET {
            match self.listener.accept() {
                Ok((s, peer)) => self.admit(s, peer, dirty),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
                Err(e) if is_fd_exhaustion(&e) => {
                    // Out of descriptors: evict a pending connection to free one, else
                    // refuse the newcomer through the spare descriptor; only if both fail
                    // (another thread took the descriptor) pause instead of spinning on a
                    // listener that stays readable.
                    self.counters.fd_exhausted.fetch_add(1, Ordering::Relaxed);
                    if self.free_slot(None, dirty) || self.refuse_with_spare() {
                        continue;
                    }
                    self.pause_accept();
                    return;
                }
                Err(_) => {
                    self.pause_accept();
                    return;
                }
            }
        }
    }

    /// Admits a newly accepted connection, evicting pending connections or refusing it
    /// as the caps require.
    fn admit(&mut self, s: TcpStream, peer: SocketAddr, dirty: &mut HashSet<ClientId>) {
        let ip = peer.ip().to_canonical();
        let peer_total = |srv: &Server| srv.peers.get(&ip).map_or(0, |p| p.total);
        let peer_pending = |srv: &Server| srv.peers.get(&ip).map_or(0, |p| p.pending.len());
        if peer_total(self) >= self.opts.max_clients_per_peer && !self.free_slot(Some(ip), dirty) {
            let n = peer_total(self);
            return self.refuse(s, || format!("{ip} already has {n} connections (max_clients_per_peer)"));
        }
        while peer_pending(self) >= self.opts.max_pending_per_peer.max(1) && self.shrink_pending(Some(ip), dirty) {}
        while self.pending.len() >= self.opts.max_pending.max(1) && self.shrink_pending(None, dirty) {}
        if self.clients.len() >= self.opts.max_clients && !self.free_slot(None, dirty) {
            let n = self.clients.len();
            return self.refuse(s, || format!("{n} clients connected (max_clients)"));
        }
        if s.set_nonblocking(true).is_err() {
            return;
        }
        let _ = s.set_nodelay(true);
        let id = self.next_id;
        self.next_id += 1;
        if self.epoll.add(&s, EpollEvent::new(EpollFlags::EPOLLIN, id)).is_err() {
            return;
        }
        self.clients.insert(
            id,
            Client {
                stream: s,
                peer: ip,
                accepted_at: Instant::now(),
                inbuf: Vec::new(),
                need: 0,
                partial_since: None,
                out: Vec::new(),
                out_pos: 0,
                validated: false,
                established: false,
                want_out: false,
            },
        );
        self.pending.insert(id);
        let p = self.peers.entry(ip).or_default();
        p.total += 1;
        p.pending.insert(id);
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        self.update_gauges();
    }

    /// Closes a just-accepted connection at once: the client sees the connection closed
    /// before its handshake is answered.
    fn refuse(&mut self, s: TcpStream, why: impl FnOnce() -> String) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        if self.debug {
            eprintln!("symm-store server: refusing a connection: {}", why());
        }
        drop(s);
    }

    /// Out of descriptors and nothing to evict: closes the spare descriptor, accepts one
    /// queued connection with it, closes that (a clear refusal instead of a client left
    /// in the backlog) and takes the spare back. False if that did not work.
    fn refuse_with_spare(&mut self) -> bool {
        let Some(spare) = self.spare.take() else { return false };
        drop(spare);
        let got = loop {
            match self.listener.accept() {
                Ok((s, _)) => break Some(s),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break None,
            }
        };
        let refused = got.is_some();
        if let Some(s) = got {
            self.refuse(s, || {
                "out of file descriptors and no pending connection to evict".into()
            });
        }
        self.spare = self.listener.as_fd().try_clone_to_owned().ok();
        refused
    }

    /// The oldest pending connection (of `ip` if given).
    fn oldest_pending(&self, ip: Option<IpAddr>) -> Option<ClientId> {
        match ip {
            Some(ip) => self.peers.get(&ip).and_then(|p| p.pending.first().copied()),
            None => self.pending.first().copied(),
        }
    }

    /// Reads a pending connection one last time: a client whose handshake has arrived
    /// is served and stays.
    fn examine(&mut self, id: ClientId, dirty: &mut HashSet<ClientId>) -> Examined {
        self.on_readable(id, dirty);
        match self.clients.get(&id) {
            None => Examined::Gone,
            Some(c) if c.established => Examined::Established,
            Some(_) => Examined::Pending,
        }
    }

    /// One pending connection (of `ip` if given) fewer: established or evicted. False if
    /// there is none.
    fn shrink_pending(&mut self, ip: Option<IpAddr>, dirty: &mut HashSet<ClientId>) -> bool {
        let Some(id) = self.oldest_pending(ip) else {
            return false;
        };
        if let Examined::Pending = self.examine(id, dirty) {
            self.evict(id);
        }
        true
    }

    /// Frees one connection slot (of `ip` if given) by evicting the oldest pending
    /// connection that is still pending once read. False if there is none.
    fn free_slot(&mut self, ip: Option<IpAddr>, dirty: &mut HashSet<ClientId>) -> bool {
        while let Some(id) = self.oldest_pending(ip) {
            match self.examine(id, dirty) {
                Examined::Gone => return true,
                Examined::Established => {}
                Examined::Pending => {
                    self.evict(id);
                    return true;
                }
            }
        }
        false
    }

    fn evict(&mut self, id: ClientId) {
        let age = self
            .clients
            .get(&id)
            .map_or(Duration::ZERO, |c| c.accepted_at.elapsed());
        self.drop_client(
            id,
            DropReason::Evicted(format!("evicted for a newcomer: handshake not completed after {age:?}")),
        );
    }

    fn update_gauges(&self) {
        let c = &self.counters;
        c.active.store(self.clients.len() as u64, Ordering::Relaxed);
        c.pending.store(self.pending.len() as u64, Ordering::Relaxed);
    }

    /// The connection completed its handshake.
    fn establish(&mut self, id: ClientId, c: &mut Client) {
        c.established = true;
        self.pending.remove(&id);
        if let Some(p) = self.peers.get_mut(&c.peer) {
            p.pending.remove(&id);
        }
        // (`c` is out of `clients` while it is served: only the pending gauge is right.)
        self.counters
            .pending
            .store(self.pending.len() as u64, Ordering::Relaxed);
    }

    fn drop_client(&mut self, id: ClientId, why: DropReason) {
        let c = &self.counters;
        let (counter, reason) = match why {
            DropReason::Malformed(r) => (&c.dropped_malformed, Some(r)),
            DropReason::Slow(r) => (&c.dropped_slow, Some(r)),
            DropReason::Overflow(r) => (&c.dropped_overflow, Some(r)),
            DropReason::Idle(r) => (&c.dropped_idle, Some(r)),
            DropReason::Evicted(r) => (&c.evicted, Some(r)),
            DropReason::Closed => (&c.closed, None),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = reason {
            if self.debug {
                eprintln!("symm-store server: dropping client {id}: {r}");
            }
            if let Ok(mut g) = c.last_drop.lock() {
                *g = Some(r);
            }
        }
        self.db.clear_wait(id);
        if let Some(cl) = self.clients.remove(&id) {
            let _ = self.epoll.delete(&cl.stream);
            self.pending.remove(&id);
            if let Some(p) = self.peers.get_mut(&cl.peer) {
                p.total = p.total.saturating_sub(1);
                p.pending.remove(&id);
                if p.total == 0 {
                    self.peers.remove(&cl.peer);
                }
            }
        }
        self.update_gauges();
    }

    fn on_readable(&mut self, id: ClientId, dirty: &mut HashSet<ClientId>) {
        let mut chunk = std::mem::take(&mut self.chunk);
        if chunk.len() != READ_CHUNK {
            chunk = vec![0u8; READ_CHUNK];
        }
        self.read_client(id, &mut chunk, dirty);
        self.chunk = chunk;
    }

    fn read_client(&mut self, id: ClientId, chunk: &mut [u8], dirty: &mut HashSet<ClientId>) {
        let Some(mut c) = self.clients.remove(&id) else { return };
        let mut eof = false;
        let mut budget = READ_BUDGET;
        while budget > 0 {
            match c.stream.read(chunk) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    c.inbuf.extend_from_slice(&chunk[..n]);
                    budget = budget.saturating_sub(n);
                    // Never buffer more than one maximal frame ahead of parsing.
                    if c.inbuf.len() >= c.need.max(1) {
                        let r = self.parse_and_serve(id, &mut c, dirty);
                        if let Err(why) = r {
                            self.clients.insert(id, c);
                            self.drop_client(id, why);
                            return;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        self.clients.insert(id, c);
        if eof {
            self.drop_client(id, DropReason::Closed);
        } else {
            dirty.insert(id);
        }
    }

    /// Serves every complete frame in `c.inbuf`; keeps the incomplete tail.
    fn parse_and_serve(
        &mut self,
        id: ClientId,
        c: &mut Client,
        dirty: &mut HashSet<ClientId>,
    ) -> std::result::Result<(), DropReason> {
        let mut off = 0usize;
        let mut progressed = false;
        loop {
            if off == c.inbuf.len() {
                c.need = 0;
                break;
            }
            // A connection must open with VALIDATE: garbage is dropped at its first byte.
            if !c.validated && c.inbuf[off] != QueryType::Validate as u8 {
                return Err(DropReason::Malformed(format!(
                    "first request is not VALIDATE (type {})",
                    c.inbuf[off]
                )));
            }
            match parse_request(&c.inbuf[off..], &self.opts.limits) {
                Ok(Parsed::Complete(req, n)) => {
                    off += n;
                    progressed = true;
                    self.counters.requests.fetch_add(1, Ordering::Relaxed);
                    self.serve(id, c, req, dirty)?;
                }
                Ok(Parsed::Incomplete { need }) => {
                    c.need = need;
                    break;
                }
                Err(e) => return Err(DropReason::Malformed(frame_reason(&e))),
            }
        }
        c.inbuf.drain(..off);
        if c.inbuf.is_empty() {
            c.partial_since = None;
        } else if progressed || c.partial_since.is_none() {
            c.partial_since = Some(Instant::now());
        }
        if c.out.len() - c.out_pos > self.opts.max_out_buffer {
            return Err(DropReason::Overflow(format!(
                "{} bytes of unread replies",
                c.out.len() - c.out_pos
            )));
        }
        Ok(())
    }

    fn serve(
        &mut self,
        id: ClientId,
        c: &mut Client,
        req: Request,
        dirty: &mut HashSet<ClientId>,
    ) -> std::result::Result<(), DropReason> {
        if !c.validated {
            return match req {
                Request::Validate(VALIDATION_MAGIC) => {
                    c.validated = true;
                    Ok(())
                }
                Request::Validate(m) => Err(DropReason::Malformed(format!("bad VALIDATE magic {m:#x}"))),
                _ => Err(DropReason::Malformed("first request is not VALIDATE".into())),
            };
        }
        if !c.established {
            self.establish(id, c);
        }
        let db = &mut self.db;
        let out = &mut c.out;
        let mut woken = Vec::new();
        match req {
            Request::Validate(_) => {}
            Request::Ping(n) => out.extend_from_slice(&n.to_le_bytes()),
            Request::Set { key, value } => {
                db.wake_all(&key, &mut woken);
                db.kv.insert(key, value);
            }
            Request::CompareSet { key, expected, desired } => {
                let reply = compare_set_bytes(&mut db.kv, &key, &expected, &desired);
                db.wake_all(&key, &mut woken);
                put_bytes(out, &reply);
            }
            Request::Get { key } => put_bytes(out, db.kv.get(&key).map_or(&[][..], |v| v.as_slice())),
            Request::Add { key, delta } => {
                let base = match db.kv.get(&key) {
                    None => 0,
                    Some(v) => parse_decimal(v)
                        .ok_or_else(|| DropReason::Malformed("ADD on a value that is not a decimal integer".into()))?,
                };
                let v = base.wrapping_add(delta);
                db.kv.insert(key.clone(), v.to_string().into_bytes());
                db.wake_all(&key, &mut woken);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Request::Check { keys } => out.push(if keys.iter().all(|k| db.present(k)) {
                CHECK_READY
            } else {
                CHECK_NOT_READY
            }),
            Request::Wait { keys } => {
                db.clear_wait(id);
                if keys.iter().all(|k| db.present(k)) {
                    out.push(STOP_WAITING);
                } else {
                    let mut n = 0usize;
                    for k in keys {
                        if !db.kv.contains_key(&k) {
                            db.waiting.entry(k).or_default().push(id);
                            n += 1;
                        }
                    }
                    db.awaited.insert(id, n);
                }
            }
            Request::GetNumKeys => out.extend_from_slice(&i64_of(db.kv.len()).to_le_bytes()),
            Request::DeleteKey { key } => {
                let n: i64 = if db.kv.remove(&key).is_some() { 1 } else { 0 };
                out.extend_from_slice(&n.to_le_bytes());
            }
            Request::Append { key, value } => {
                db.kv.entry(key.clone()).or_default().extend_from_slice(&value);
                db.wake_all(&key, &mut woken);
            }
            Request::MultiGet { keys } => {
                for k in keys {
                    put_bytes(out, db.kv.get(&k).map_or(&[][..], |v| v.as_slice()));
                    if out.len() - c.out_pos > self.opts.max_out_buffer {
                        return Err(DropReason::Overflow(
                            "MULTI_GET reply exceeds the output buffer limit".into(),
                        ));
                    }
                }
            }
            Request::MultiSet { kvs } => {
                for (k, v) in kvs {
                    db.wake_all(&k, &mut woken);
                    db.kv.insert(k, v);
                }
            }
            Request::CancelWait => {
                db.clear_wait(id);
                out.push(WAIT_CANCELED);
            }
            Request::QueuePush { key, value } => {
                db.queues.entry(key.clone()).or_default().push_back(value);
                db.wake_one(&key, &mut woken);
            }
            Request::QueuePop { key } => {
                let q = db.queues.get_mut(&key);
                let len = q.as_ref().map_or(0, |q| q.len());
                out.extend_from_slice(&i64_of(len).to_le_bytes());
                if let Some(q) = q {
                    if let Some(v) = q.pop_front() {
                        put_bytes(out, &v);
                    }
                    if q.is_empty() {
                        db.queues.remove(&key);
                    }
                }
            }
            Request::QueueLen { key } => {
                out.extend_from_slice(&i64_of(db.queues.get(&key).map_or(0, |q| q.len())).to_le_bytes())
            }
        }
        for w in woken {
            if w == id {
                c.out.push(STOP_WAITING);
            } else if let Some(other) = self.clients.get_mut(&w) {
                other.out.push(STOP_WAITING);
                dirty.insert(w);
            }
        }
        Ok(())
    }

    fn flush(&mut self, id: ClientId) {
        let Some(c) = self.clients.get_mut(&id) else { return };
        while c.out_pos < c.out.len() {
            match c.stream.write(&c.out[c.out_pos..]) {
                Ok(0) => break,
                Ok(n) => c.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.drop_client(id, DropReason::Closed);
                    return;
                }
            }
        }
        if c.out_pos == c.out.len() {
            c.out.clear();
            c.out_pos = 0;
        } else if c.out_pos > (1 << 20) {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
        let pending = c.out.len() - c.out_pos;
        if pending > self.opts.max_out_buffer {
            self.drop_client(id, DropReason::Overflow(format!("{pending} bytes of unread replies")));
            return;
        }
        if (pending > 0) != c.want_out {
            c.want_out = pending > 0;
            let fl = if c.want_out {
                EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT
            } else {
                EpollFlags::EPOLLIN
            };
            let _ = self.epoll.modify(&c.stream, &mut EpollEvent::new(fl, id));
        }
    }

    /// Drops connections past their deadlines: pending ones past `first_frame_timeout`
    /// (no VALIDATE yet) or `handshake_timeout`, and any client with a frame left
    /// incomplete past `frame_timeout`. Established clients between frames are never
    /// touched.
    fn sweep(&mut self, now: Instant) {
        let ff = self.opts.first_frame_timeout;
        let hs = self.opts.handshake_timeout;
        let earliest = ff.min(hs);
        let mut idle = Vec::new();
        // Pending ids grow with accept time: stop at the first one too young to expire.
        for &id in &self.pending {
            let Some(c) = self.clients.get(&id) else { continue };
            let age = now.saturating_duration_since(c.accepted_at);
            if age <= earliest {
                break;
            }
            if !c.validated && age > ff {
                idle.push((id, format!("no VALIDATE within the first-frame timeout ({ff:?})")));
            } else if age > hs {
                idle.push((id, format!("handshake not completed within {hs:?}")));
            }
        }
        for (id, why) in idle {
            self.drop_client(id, DropReason::Idle(why));
        }
        let limit = self.opts.frame_timeout;
        let slow: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, c)| {
                c.partial_since
                    .is_some_and(|t| now.saturating_duration_since(t) > limit)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in slow {
            self.drop_client(
                id,
                DropReason::Slow(format!("frame left incomplete for more than {limit:?}")),
            );
        }
        if self.spare.is_none() {
            self.spare = self.listener.as_fd().try_clone_to_owned().ok();
        }
    }
}

fn frame_reason(e: &FrameError) -> String {
    format!("malformed frame: {e}")
}
