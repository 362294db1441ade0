//! The TCPStore client, following PyTorch's client-side conventions.

use crate::knobs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::protocol::{
    encode_request, Limits, Request, CHECK_NOT_READY, CHECK_READY, STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};
use super::server::{ServerOptions, TcpServer};
use crate::store::{Result, Store, StoreError};
use crate::util::parse_decimal;

/// PyTorch's client puts this in front of every user key.
pub const KEY_PREFIX: &str = "/";
/// PyTorch's worker counter key (not prefixed).
pub const INIT_KEY: &str = "init/";
/// PyTorch's default TCPStore port.
pub const DEFAULT_PORT: u16 = 29500;
/// Largest reply value the client accepts (a bound against a hostile server).
const MAX_REPLY_VALUE: u64 = 1 << 30;
/// Time allowed for the server to answer CANCEL_WAIT after a wait timed out.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// How to build a [`TcpStore`] (PyTorch's `TCPStore(host, port, world_size, is_master, ...)`).
#[derive(Debug, Clone)]
pub struct TcpStoreOptions {
    /// Host name or address of the server.
    pub host: String,
    /// Server port (with `is_master`, 0 picks a free one).
    pub port: u16,
    /// Host the server in this process.
    pub is_master: bool,
    /// Address the hosted server binds (default: what `host` resolves to, so loopback
    /// for `localhost` / `127.0.0.1`).
    pub bind: Option<SocketAddr>,
    /// Number of clients (ranks) to expect; with `wait_for_workers`, every client adds 1
    /// to `init/` and the master waits until it reaches this.
    pub world_size: Option<usize>,
    /// See `world_size`.
    pub wait_for_workers: bool,
    /// Default timeout of blocking calls, and the connect deadline.
    pub timeout: Duration,
    /// Options of the hosted server.
    pub server: ServerOptions,
}

impl Default for TcpStoreOptions {
    fn default() -> TcpStoreOptions {
        TcpStoreOptions {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            is_master: false,
            bind: None,
            world_size: None,
            wait_for_workers: true,
            timeout: Duration::from_secs(300),
            server: ServerOptions::default(),
        }
    }
}

/// A client of a TCPStore server (ours or PyTorch's), optionally hosting the server.
///
/// User keys are sent as `"/" + key`, GET and MULTI_GET are preceded by WAIT, and a
/// WAIT that times out is cancelled with CANCEL_WAIT: all as PyTorch's client does, so
/// the two share keys. One request is in flight at a time (a mutex serialises callers).
/// After an I/O error mid-request the connection is marked broken and every later call
/// fails at once with [`StoreError::Connection`].
#[derive(Debug)]
pub struct TcpStore {
    addr: SocketAddr,
    conn: Mutex<Option<Conn>>,
    timeout: Mutex<Duration>,
    limits: Limits,
    // Declared after `conn` so the client disconnects before the server stops.
    server: Option<TcpServer>,
}

fn conn_err(addr: SocketAddr, source: io::Error) -> StoreError {
    StoreError::Connection {
        addr: addr.to_string(),
        source,
    }
}

fn deadline_after(t: Duration) -> Instant {
    Instant::now()
        .checked_add(t)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365))
}

/// A connection whose socket timeouts are only lowered when a deadline needs it (a read
/// that outlives the socket timeout just loops and re-checks the deadline), so steady
/// state costs no setsockopt per request.
#[derive(Debug)]
struct Conn {
    s: TcpStream,
    rto: Option<Duration>,
    wto: Option<Duration>,
}

impl Conn {
    fn new(s: TcpStream) -> Conn {
        Conn {
            s,
            rto: None,
            wto: None,
        }
    }

    fn bound_reads(&mut self, left: Duration) -> io::Result<()> {
        let left = left.max(Duration::from_millis(1));
        if self.rto.is_none_or(|t| t > left) {
            self.s.set_read_timeout(Some(left))?;
            self.rto = Some(left);
        }
        Ok(())
    }

    fn bound_writes(&mut self, left: Duration) -> io::Result<()> {
        let left = left.max(Duration::from_millis(1));
        if self.wto.is_none_or(|t| t > left) {
            self.s.set_write_timeout(Some(left))?;
            self.wto = Some(left);
        }
        Ok(())
    }
}

/// Reads exactly `buf.len()` bytes by `deadline` (TimedOut otherwise).
fn read_exact_by(s: &mut Conn, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut pos = 0;
    while pos < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "store reply deadline passed"));
        }
        s.bound_reads(left)?;
        match s.s.read(&mut buf[pos..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "store server closed the connection",
                ))
            }
            Ok(n) => pos += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_all_by(s: &mut Conn, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut pos = 0;
    while pos < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "store request deadline passed"));
        }
        s.bound_writes(left)?;
        match s.s.write(&buf[pos..]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "store connection closed")),
            Ok(n) => pos += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_u8(s: &mut Conn, d: Instant) -> io::Result<u8> {
    let mut b = [0u8; 1];
    read_exact_by(s, &mut b, d)?;
    Ok(b[0])
}

fn read_i64(s: &mut Conn, d: Instant) -> io::Result<i64> {
    let mut b = [0u8; 8];
    read_exact_by(s, &mut b, d)?;
    Ok(i64::from_le_bytes(b))
}

fn read_vec(s: &mut Conn, d: Instant) -> io::Result<Vec<u8>> {
    let mut b = [0u8; 8];
    read_exact_by(s, &mut b, d)?;
    let len = u64::from_le_bytes(b);
    if len > MAX_REPLY_VALUE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("reply value of {len} bytes exceeds the limit"),
        ));
    }
    let len = len as usize;
    // Grow as bytes arrive: a bogus length allocates at most one chunk ahead.
    let mut v = Vec::with_capacity(len.min(1 << 20));
    let mut chunk = vec![0u8; len.min(1 << 20)];
    while v.len() < len {
        let n = (len - v.len()).min(chunk.len());
        read_exact_by(s, &mut chunk[..n], d)?;
        v.extend_from_slice(&chunk[..n]);
    }
    Ok(v)
}

/// Handshakes in a row that the server cuts off (accepts the connection, then closes it
/// before answering) before the client reports a refusal instead of retrying.
const CUT_OFFS_BEFORE_REFUSAL: u32 = 3;

/// The server closed or reset the connection.
fn closed_by_peer(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The error when the connect deadline (`timeout` after the start) has passed.
fn connect_deadline_error(addr: SocketAddr, timeout: Duration, last: Option<io::Error>) -> StoreError {
    let what = match last {
        None => format!("connecting to the store at {addr}"),
        Some(e) => format!("connecting to the store at {addr} (last attempt: {e})"),
    };
    StoreError::Timeout { what, timeout }
}

/// Connects with retry and backoff for up to `timeout`, then VALIDATE + PING.
///
/// Refused connections (nothing listening yet) are retried until the deadline, as
/// PyTorch's client does. A server that accepts and then closes the connection before
/// answering the handshake [`CUT_OFFS_BEFORE_REFUSAL`] times in a row is refusing this
/// client (it is full): that is reported at once as a refusal.
fn connect_handshake(addr: SocketAddr, timeout: Duration) -> Result<Conn> {
    let deadline = deadline_after(timeout);
    let mut backoff = Duration::from_millis(10);
    let mut last_err: Option<io::Error> = None;
    let mut cut_offs = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(connect_deadline_error(addr, timeout, last_err));
        }
        let (e, cut_off) = match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
            Ok(s) => match handshake(Conn::new(s), deadline) {
                Ok(c) => return Ok(c),
                // Said here: a timed-out connect is also TimedOut, and means something else.
                Err(e) if e.kind() == io::ErrorKind::TimedOut => (
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the server accepted the connection but did not answer the handshake",
                    ),
                    false,
                ),
                Err(e) => {
                    let cut_off = closed_by_peer(&e);
                    (e, cut_off)
                }
            },
            Err(e) => (e, false),
        };
        cut_offs = if cut_off { cut_offs + 1 } else { 0 };
        if cut_offs >= CUT_OFFS_BEFORE_REFUSAL {
            return Err(conn_err(
                addr,
                io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "the server refused the connection: it accepted and then closed it before answering \
                         the handshake, {cut_offs} times in a row (it is at its max_clients or per-address \
                         limit, or out of file descriptors); last: {e}"
                    ),
                ),
            ));
        }
        last_err = Some(e);
        // (A deadline reached here is reported at the top of the loop.)
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn handshake(mut c: Conn, deadline: Instant) -> io::Result<Conn> {
    let s = &mut c;
    s.s.set_nodelay(true)?;
    let nonce = std::process::id();
    let mut buf = Vec::with_capacity(16);
    encode_request(&Request::Validate(VALIDATION_MAGIC), &mut buf);
    encode_request(&Request::Ping(nonce), &mut buf);
    write_all_by(s, &buf, deadline)?;
    let mut b = [0u8; 4];
    read_exact_by(s, &mut b, deadline)?;
    if u32::from_le_bytes(b) != nonce {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "PING reply does not echo the nonce",
        ));
    }
    Ok(c)
}

/// Resolves `host:port`, preferring an IPv4 address (so "localhost" means 127.0.0.1 for
/// both the hosting rank and the clients).
fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| StoreError::InvalidArgument(format!("cannot resolve {host}:{port}: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| StoreError::InvalidArgument(format!("{host}:{port} resolves to no address")))
}

fn env_var(name: &str) -> Result<String> {
    crate::knobs::get(name)
        .map(str::to_string)
        .ok_or_else(|| StoreError::InvalidArgument(format!("environment variable {name} is not set")))
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Result<T> {
    let v = env_var(name)?;
    v.trim()
        .parse()
        .map_err(|_| StoreError::InvalidArgument(format!("environment variable {name}={v:?} is invalid")))
}

impl TcpStore {
    /// A client of the server at `addr` (retrying the connection until `timeout`).
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Arc<TcpStore>> {
        let stream = connect_handshake(addr, timeout)?;
        Ok(Arc::new(TcpStore {
            addr,
            conn: Mutex::new(Some(stream)),
            timeout: Mutex::new(timeout),
            limits: Limits::default(),
            server: None,
        }))
    }

    /// Hosts a server on `addr` (port 0 picks one; see [`TcpStore::addr`]) in this
    /// process and returns a client of it; the server lives as long as the client.
    pub fn server(addr: SocketAddr, timeout: Duration) -> Result<Arc<TcpStore>> {
        TcpStore::server_with(addr, timeout, ServerOptions::default())
    }

    /// [`TcpStore::server`] with explicit server options.
    pub fn server_with(addr: SocketAddr, timeout: Duration, opts: ServerOptions) -> Result<Arc<TcpStore>> {
        let server = TcpServer::bind_with(addr, opts)?;
        let local = server.local_addr();
        let connect_to = if local.ip().is_unspecified() {
            SocketAddr::new(
                if local.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                },
                local.port(),
            )
        } else {
            local
        };
        let stream = connect_handshake(connect_to, timeout)?;
        Ok(Arc::new(TcpStore {
            addr: connect_to,
            conn: Mutex::new(Some(stream)),
            timeout: Mutex::new(timeout),
            limits: Limits::default(),
            server: Some(server),
        }))
    }

    /// PyTorch's constructor: hosts the server when `is_master`, connects, and counts
    /// workers on `init/` when `world_size` is given and `wait_for_workers` is set.
    pub fn with_options(opts: TcpStoreOptions) -> Result<Arc<TcpStore>> {
        let store = if opts.is_master {
            let bind = match opts.bind {
                Some(b) => b,
                None => resolve(&opts.host, opts.port)?,
            };
            TcpStore::server_with(bind, opts.timeout, opts.server.clone())?
        } else {
            TcpStore::connect(resolve(&opts.host, opts.port)?, opts.timeout)?
        };
        if let (Some(world), true) = (opts.world_size, opts.wait_for_workers) {
            store.wait_for_workers(world, opts.timeout)?;
        }
        Ok(store)
    }

    /// The env:// way (torchrun's conventions): MASTER_ADDR, MASTER_PORT, RANK and
    /// WORLD_SIZE; rank 0 hosts the server (bound to MASTER_ADDR's address, or to
    /// SYMM_STORE_BIND if set) unless TORCHELASTIC_USE_AGENT_STORE=True.
    pub fn from_env(timeout: Duration) -> Result<Arc<TcpStore>> {
        let host = env_var(knobs::MASTER_ADDR)?;
        let port: u16 = env_parse(knobs::MASTER_PORT)?;
        let rank: usize = env_parse(knobs::RANK)?;
        let world: usize = env_parse(knobs::WORLD_SIZE)?;
        if world == 0 || rank >= world {
            return Err(StoreError::InvalidArgument(format!(
                "RANK={rank} is out of range for WORLD_SIZE={world}"
            )));
        }
        let agent_store = knobs::get(knobs::AGENT_STORE) == Some("True");
        let bind = match knobs::get(knobs::BIND) {
            Some(b) => Some(
                b.parse::<SocketAddr>()
                    .or_else(|_| b.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, port)))
                    .map_err(|_| StoreError::InvalidArgument(format!("SYMM_STORE_BIND={b:?} is not an address")))?,
            ),
            None => None,
        };
        TcpStore::with_options(TcpStoreOptions {
            host,
            port,
            is_master: rank == 0 && !agent_store,
            bind,
            world_size: Some(world),
            wait_for_workers: true,
            timeout,
            server: ServerOptions::default(),
        })
    }

    /// Adds 1 to `init/`; the master then waits until `world` clients did so.
    fn wait_for_workers(&self, world: usize, timeout: Duration) -> Result<()> {
        let deadline = deadline_after(timeout);
        self.raw_add(INIT_KEY.as_bytes(), 1)?;
        if self.server.is_none() {
            return Ok(());
        }
        loop {
            let v = self.raw_get(INIT_KEY.as_bytes(), timeout)?;
            let joined = parse_decimal(&v).unwrap_or(0);
            if usize::try_from(joined).is_ok_and(|j| j >= world) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Timeout {
                    what: format!("workers to join the store: {joined}/{world} clients joined"),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server address this client talks to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// True when this process hosts the server.
    pub fn is_master(&self) -> bool {
        self.server.is_some()
    }

    /// The hosted server, if this process hosts it.
    pub fn hosted_server(&self) -> Option<&TcpServer> {
        self.server.as_ref()
    }

    fn lock_conn(&self) -> MutexGuard<'_, Option<Conn>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wire_key(&self, key: &str) -> Result<Vec<u8>> {
        let mut k = Vec::with_capacity(KEY_PREFIX.len() + key.len());
        k.extend_from_slice(KEY_PREFIX.as_bytes());
        k.extend_from_slice(key.as_bytes());
        self.check_key(&k)?;
        Ok(k)
    }

    fn check_key(&self, k: &[u8]) -> Result<()> {
        check_limit("key", k.len(), self.limits.max_key_len)
    }

    fn check_value(&self, v: &[u8]) -> Result<()> {
        check_limit("value", v.len(), self.limits.max_value_len)
    }

    fn check_count(&self, n: usize) -> Result<()> {
        check_limit("key count", n, self.limits.max_keys)
    }

    /// Runs one exchange on the connection; an error leaves it marked broken.
    fn exchange<T>(
        &self,
        what: &str,
        timeout: Duration,
        f: impl FnOnce(&mut Conn, Instant) -> io::Result<T>,
    ) -> Result<T> {
        let mut g = self.lock_conn();
        let Some(s) = g.as_mut() else {
            return Err(conn_err(
                self.addr,
                io::Error::new(io::ErrorKind::NotConnected, "the connection failed earlier"),
            ));
        };
        let deadline = deadline_after(timeout);
        match f(s, deadline) {
            Ok(v) => Ok(v),
            Err(e) => {
                *g = None;
                if e.kind() == io::ErrorKind::TimedOut {
                    Err(StoreError::Timeout {
                        what: format!("store reply to {what}"),
                        timeout,
                    })
                } else if e.kind() == io::ErrorKind::InvalidData {
                    Err(StoreError::Protocol(format!("{what}: {e}")))
                } else {
                    Err(conn_err(self.addr, e))
                }
            }
        }
    }

    fn send_only(&self, req: &Request) -> Result<()> {
        let mut buf = Vec::new();
        encode_request(req, &mut buf);
        self.exchange("send", self.timeout(), |s, d| write_all_by(s, &buf, d))
    }

    /// WAIT on raw keys; on timeout CANCEL_WAIT and report Timeout (PyTorch's doWait).
    fn raw_wait(&self, keys: Vec<Vec<u8>>, timeout: Duration) -> Result<()> {
        self.check_count(keys.len())?;
        let what = format!(
            "keys {:?}",
            keys.iter()
                .take(8)
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect::<Vec<_>>()
        );
        let mut buf = Vec::new();
        encode_request(&Request::Wait { keys }, &mut buf);
        let mut g = self.lock_conn();
        let Some(s) = g.as_mut() else {
            return Err(conn_err(
                self.addr,
                io::Error::new(io::ErrorKind::NotConnected, "the connection failed earlier"),
            ));
        };
        let deadline = deadline_after(timeout);
        let first = write_all_by(s, &buf, deadline).and_then(|()| read_u8(s, deadline));
        let r = match first {
            Ok(STOP_WAITING) => return Ok(()),
            Ok(b) => Err(StoreError::Protocol(format!("WAIT reply {b}, expected STOP_WAITING"))),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                // Cancel; a STOP_WAITING already in flight arrives first.
                let grace = deadline_after(CANCEL_GRACE);
                let mut cancel = Vec::new();
                encode_request(&Request::CancelWait, &mut cancel);
                let res = write_all_by(s, &cancel, grace).and_then(|()| {
                    let mut b = read_u8(s, grace)?;
                    if b == STOP_WAITING {
                        b = read_u8(s, grace)?;
                    }
                    Ok(b)
                });
                match res {
                    Ok(WAIT_CANCELED) => return Err(StoreError::Timeout { what, timeout }),
                    Ok(b) => Err(StoreError::Protocol(format!(
                        "CANCEL_WAIT reply {b}, expected WAIT_CANCELED"
                    ))),
                    Err(e) => Err(conn_err(self.addr, e)),
                }
            }
            Err(e) => Err(conn_err(self.addr, e)),
        };
        *g = None;
        r
    }

    fn raw_get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        self.raw_wait(vec![key.to_vec()], timeout)?;
        let mut buf = Vec::new();
        encode_request(&Request::Get { key: key.to_vec() }, &mut buf);
        self.exchange("GET", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_vec(s, d)
        })
    }

    fn raw_add(&self, key: &[u8], delta: i64) -> Result<i64> {
        let mut buf = Vec::new();
        encode_request(
            &Request::Add {
                key: key.to_vec(),
                delta,
            },
            &mut buf,
        );
        self.exchange("ADD", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_i64(s, d)
        })
    }

    /// Sends PING and checks the echo (a liveness probe).
    pub fn ping(&self) -> Result<()> {
        let nonce: u32 = rand::random();
        let mut buf = Vec::new();
        encode_request(&Request::Ping(nonce), &mut buf);
        let got = self.exchange("PING", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            let mut b = [0u8; 4];
            read_exact_by(s, &mut b, d)?;
            Ok(u32::from_le_bytes(b))
        })?;
        if got != nonce {
            return Err(StoreError::Protocol("PING reply does not echo the nonce".into()));
        }
        Ok(())
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let key = self.wire_key(key)?;
        self.check_value(value)?;
        self.send_only(&Request::Set {
            key,
            value: value.to_vec(),
        })
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.raw_get(&self.wire_key(key)?, self.timeout())
    }

    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.raw_get(&self.wire_key(key)?, timeout)
    }

    fn get_now(&self, key: &str) -> Result<Vec<u8>> {
        if !self.check(&[key])? {
            return Err(StoreError::KeyNotFound(key.to_owned()));
        }
        self.raw_get(&self.wire_key(key)?, self.timeout())
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        let keys = keys.iter().map(|k| self.wire_key(k)).collect::<Result<Vec<_>>>()?;
        self.raw_wait(keys, timeout.unwrap_or_else(|| self.timeout()))
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.check_count(keys.len())?;
        let keys = keys.iter().map(|k| self.wire_key(k)).collect::<Result<Vec<_>>>()?;
        let mut buf = Vec::new();
        encode_request(&Request::Check { keys }, &mut buf);
        let b = self.exchange("CHECK", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_u8(s, d)
        })?;
        match b {
            CHECK_READY => Ok(true),
            CHECK_NOT_READY => Ok(false),
            b => Err(StoreError::Protocol(format!("CHECK reply {b}"))),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.raw_add(&self.wire_key(key)?, delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let key = self.wire_key(key)?;
        self.check_value(expected)?;
        self.check_value(desired)?;
        let mut buf = Vec::new();
        encode_request(
            &Request::CompareSet {
                key,
                expected: expected.to_vec(),
                desired: desired.to_vec(),
            },
            &mut buf,
        );
        self.exchange("COMPARE_SET", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_vec(s, d)
        })
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let key = self.wire_key(key)?;
        self.check_value(value)?;
        self.send_only(&Request::Append {
            key,
            value: value.to_vec(),
        })
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        let key = self.wire_key(key)?;
        let mut buf = Vec::new();
        encode_request(&Request::DeleteKey { key }, &mut buf);
        let n = self.exchange("DELETE_KEY", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_i64(s, d)
        })?;
        Ok(n == 1)
    }

    fn num_keys(&self) -> Result<i64> {
        let mut buf = Vec::new();
        encode_request(&Request::GetNumKeys, &mut buf);
        self.exchange("GETNUMKEYS", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_i64(s, d)
        })
    }

    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.check_count(keys.len())?;
        let keys = keys.iter().map(|k| self.wire_key(k)).collect::<Result<Vec<_>>>()?;
        self.raw_wait(keys.clone(), self.timeout())?;
        let n = keys.len();
        let mut buf = Vec::new();
        encode_request(&Request::MultiGet { keys }, &mut buf);
        self.exchange("MULTI_GET", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            (0..n).map(|_| read_vec(s, d)).collect()
        })
    }

    fn multi_set(&self, kvs: &[(&str, &[u8])]) -> Result<()> {
        self.check_count(kvs.len())?;
        let mut pairs = Vec::with_capacity(kvs.len());
        for (k, v) in kvs {
            self.check_value(v)?;
            pairs.push((self.wire_key(k)?, v.to_vec()));
        }
        self.send_only(&Request::MultiSet { kvs: pairs })
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        let key = self.wire_key(key)?;
        self.check_value(value)?;
        self.send_only(&Request::QueuePush {
            key,
            value: value.to_vec(),
        })
    }

    fn queue_pop(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let deadline = deadline_after(timeout);
        let key = self.wire_key(key)?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.raw_wait(vec![key.clone()], left) {
                Err(StoreError::Timeout { what, .. }) => return Err(StoreError::Timeout { what, timeout }),
                r => r?,
            }
            let mut buf = Vec::new();
            encode_request(&Request::QueuePop { key: key.clone() }, &mut buf);
            let got = self.exchange("QUEUE_POP", self.timeout(), |s, d| {
                write_all_by(s, &buf, d)?;
                let len = read_i64(s, d)?;
                if len > 0 {
                    Ok(Some(read_vec(s, d)?))
                } else {
                    Ok(None)
                }
            })?;
            if let Some(v) = got {
                return Ok(v);
            }
            // Another client took the element (or a plain key of that name exists).
            if Instant::now() >= deadline {
                return Err(StoreError::Timeout {
                    what: format!("queue {:?} to be non-empty", String::from_utf8_lossy(&key)),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        let key = self.wire_key(key)?;
        let mut buf = Vec::new();
        encode_request(&Request::QueueLen { key }, &mut buf);
        self.exchange("QUEUE_LEN", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_i64(s, d)
        })
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout;
    }
}

/// [`StoreError::TooLarge`] when `len` exceeds `max`.
fn check_limit(what: &'static str, len: usize, max: u64) -> Result<()> {
    if len as u64 > max {
        return Err(StoreError::TooLarge {
            what,
            len: len as u64,
            max,
        });
    }
    Ok(())
}
