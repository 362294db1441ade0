//! # symm-store: rendezvous and exchange for symm
//!
//! Ranks find each other and hand each other memory through this crate.
//!
//! * [`Store`]: the key-value store trait (PyTorch's `c10d::Store` semantics: `get`
//!   waits for its key, `add` keeps ASCII decimal text, PyTorch's `compare_set`).
//!   Every blocking call is bounded by a timeout.
//! * [`HashStore`]: in-process, for one thread per rank (condvar waits).
//! * [`TcpStore`]: a client of a TCPStore server speaking PyTorch's wire protocol, and
//!   [`TcpServer`], the server (one thread, epoll, bounded parser, slow and malformed
//!   clients dropped; connections that stall before their handshake dropped or evicted
//!   for newcomers, a full server refusing at once instead of leaving clients hanging). A PyTorch process and a Rust rank can share one store, either
//!   side hosting it. [`TcpStore::from_env`] follows torchrun's env:// conventions.
//! * [`PrefixStore`]: PyTorch's `prefix/key` layout.
//! * [`StoreExchange`]: all_gather / broadcast / barrier of bytes through any store,
//!   with errors that name the ranks that did not answer.
//! * [`FdChannel`]: passes file descriptors among the processes of one host over an
//!   abstract unix socket (`SCM_RIGHTS`), credentials checked, every receive bounded.
//!
//! All unsafe code lives in one small module (`fd::sys`: `recvmsg` with `SCM_RIGHTS`).
//! `docs/store.md` describes the design, limits and tests.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use symm_store::{HashStore, Store, StoreExchange, TcpStore};
//!
//! # fn main() -> symm_store::Result<()> {
//! let t = Duration::from_secs(10);
//! // Threads: an in-process store.
//! let store: Arc<dyn Store> = HashStore::new(t);
//! let ex = StoreExchange::new(store.clone(), "demo");
//! let all = ex.all_gather(0, 1, b"hello", t)?;
//! assert_eq!(all, vec![b"hello".to_vec()]);
//!
//! // Processes: host a TCPStore server here (port 0 picks one) and connect to it.
//! let host = TcpStore::server("127.0.0.1:0".parse().unwrap(), t)?;
//! let client = TcpStore::connect(host.addr(), t)?;
//! client.set("k", b"v")?; // "/k" on the wire, as PyTorch's client writes it
//! assert_eq!(host.get("k")?, b"v");
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]

mod exchange;
mod fd;
mod hash;
pub mod knobs;
mod prefix;
pub mod process;
mod store;
pub mod tcp;
mod util;

pub use exchange::{Liveness, StoreExchange, LIVENESS_POLL};
pub use fd::{FdChannel, FdKind};
pub use hash::HashStore;
pub use prefix::PrefixStore;
pub use store::{Result, Store, StoreError};
pub use tcp::{ServerOptions, ServerStats, TcpServer, TcpStore, TcpStoreOptions};
