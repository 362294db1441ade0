//! # symm-store: rendezvous and exchange for symm
//!
//! Ranks find each other and hand each other memory through this crate.
//!
//! * [`Store`]: the key-value store trait (PyTorch's `c10d::Store` semantics), with
//!   [`HashStore`] (in-process, one thread per rank) and [`PrefixStore`] (PyTorch's
//!   `prefix/key` layout).
//! * [`StoreExchange`]: all_gather / broadcast / barrier of bytes through any store,
//!   bounded by a timeout, errors naming the ranks that did not answer.
//! * [`FdChannel`]: passes file descriptors among the processes of one host over an
//!   abstract unix socket (`SCM_RIGHTS`), with credentials checked and every receive
//!   bounded by a deadline.
//!
//! All unsafe code lives in one small module (`fd::sys`, `recvmsg` with `SCM_RIGHTS`).
#![deny(unsafe_code)]

mod exchange;
mod fd;
mod hash;
mod prefix;
mod store;
pub mod tcp;
mod util;

pub use exchange::StoreExchange;
pub use fd::{FdChannel, FdKind};
pub use hash::HashStore;
pub use prefix::PrefixStore;
pub use store::{Result, Store, StoreError};
pub use tcp::{ServerOptions, ServerStats, TcpServer, TcpStore, TcpStoreOptions};
