//! TcpStore: PyTorch's TCPStore protocol, server and client.

mod client;
pub mod protocol;
mod server;

pub use client::{TcpStore, TcpStoreOptions, DEFAULT_PORT, INIT_KEY, KEY_PREFIX};
pub use server::{ServerOptions, ServerStats, TcpServer};
