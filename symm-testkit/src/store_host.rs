//! The TcpStore a process launch is hosted on, and the children's clients.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use symm_core::symm_store::{Store, StoreError};

/// A store server hosted by the launcher.
pub(crate) struct HostedStore {
    addr: SocketAddr,
}

impl HostedStore {
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub(crate) fn client(&self, timeout: Duration) -> Result<Arc<dyn Store>, StoreError> {
        connect(&self.addr.ip().to_string(), self.addr.port() as usize, timeout)
    }
}

/// Hosts a store on a free port of 127.0.0.1.
pub(crate) fn serve(_timeout: Duration) -> Result<HostedStore, StoreError> {
    Err(StoreError::InvalidArgument("TcpStore not available yet".into()))
}

/// Connects to the store at `addr:port`.
pub(crate) fn connect(_addr: &str, _port: usize, _timeout: Duration) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::InvalidArgument("TcpStore not available yet".into()))
}
