//! The TcpStore a process launch is hosted on, and the children's clients.
#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use symm_core::symm_store::{Store, StoreError, TcpServer, TcpStore};

/// A store server hosted by the launcher; stops when dropped.
pub(crate) struct HostedStore {
    server: TcpServer,
}

impl HostedStore {
    pub(crate) fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }
    /// A client of the hosted server.
    pub(crate) fn client(&self, timeout: Duration) -> Result<Arc<dyn Store>, StoreError> {
        Ok(TcpStore::connect(self.addr(), timeout)?)
    }
}

/// Hosts a store on `addr` (port 0: a free port).
pub(crate) fn serve_on(addr: SocketAddr) -> Result<HostedStore, StoreError> {
    Ok(HostedStore {
        server: TcpServer::bind(addr)?,
    })
}

/// Hosts a store on a free port of 127.0.0.1.
pub(crate) fn serve() -> Result<HostedStore, StoreError> {
    serve_on(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0))
}

/// Connects to the store at `addr:port`.
pub(crate) fn connect(addr: &str, port: u16, timeout: Duration) -> Result<Arc<dyn Store>, StoreError> {
    let sa = (addr, port)
        .to_socket_addrs()
        .map_err(|e| StoreError::InvalidArgument(format!("cannot resolve {addr}:{port}: {e}")))?
        .next()
        .ok_or_else(|| StoreError::InvalidArgument(format!("{addr}:{port} resolves to no address")))?;
    Ok(TcpStore::connect(sa, timeout)?)
}
