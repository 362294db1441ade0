//! The TCPStore client, following PyTorch's client-side conventions.
//!
//! `mod.rs` holds [`TcpStore`] and [`TcpStoreOptions`] and the ways to build a client
//! (connect, host the server, torchrun's environment, counting workers); `conn.rs` the
//! connection (deadline-bounded socket I/O, connecting with retry and the handshake);
//! `requests.rs` the requests and the [`Store`](crate::store::Store) methods.

mod conn;
mod requests;

use crate::knobs;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::protocol::Limits;
use super::server::{ServerOptions, TcpServer};
use crate::store::{Result, StoreError};
use crate::util::parse_decimal;
use conn::{connect_handshake, deadline_after, Conn};

/// PyTorch's client puts this in front of every user key.
pub const KEY_PREFIX: &str = "/";
/// PyTorch's worker counter key (not prefixed).
pub const INIT_KEY: &str = "init/";
/// PyTorch's default TCPStore port.
pub const DEFAULT_PORT: u16 = 29500;

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
}
