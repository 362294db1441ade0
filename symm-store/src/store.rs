//! The [`Store`] trait: a key-value store shared by the ranks of a group.
//!
//! Semantics follow PyTorch's `c10d::Store`: keys are strings, values bytes;
//! `get` waits for the key up to the timeout; `add` keeps its value as ASCII
//! decimal text; `wait` blocks until every key exists.

use std::time::Duration;

/// Errors from any store, exchange or fd channel operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A wait (get, wait, queue pop, exchange) did not complete in time.
    #[error("store timeout after {timeout:?} waiting for {what}")]
    Timeout { what: String, timeout: Duration },
    /// The connection to the store server failed or was lost.
    #[error("store connection to {addr} failed: {source}")]
    Connection {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The peer sent bytes that do not parse as the protocol says.
    #[error("malformed store message: {0}")]
    Protocol(String),
    /// A key, value or count exceeds the protocol's bounds.
    #[error("{what} too large: {len} > {max}")]
    TooLarge { what: &'static str, len: u64, max: u64 },
    /// The value under `key` is not what the operation needs (e.g. ADD on non-numeric text).
    #[error("bad value for key {key:?}: {reason}")]
    BadValue { key: String, reason: String },
    /// Some ranks did not take part in an exchange before its deadline.
    #[error("exchange {what} timed out after {timeout:?}; missing ranks {missing:?}")]
    MissingRanks {
        what: String,
        missing: Vec<usize>,
        timeout: Duration,
    },
    /// A peer process died or closed its side mid-exchange.
    #[error("peer rank {rank} lost: {reason}")]
    PeerLost { rank: usize, reason: String },
    /// The fd channel received a message that violates its rules.
    #[error("fd channel rejected a message: {0}")]
    BadFdMessage(String),
    /// `get_now` (or a GET answered without a preceding wait) found no such key.
    #[error("key {0:?} not found")]
    KeyNotFound(String),
    /// The process ran out of file descriptors (RLIMIT_NOFILE) while receiving or duplicating an fd.
    #[error("fd channel: {context}: too many open files (RLIMIT_NOFILE soft limit {limit})")]
    FdExhausted { context: String, limit: String },
    /// Invalid argument from the caller (rank out of range, empty key list...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Any other I/O error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A key-value store shared by the ranks of a group (PyTorch's `c10d::Store`).
///
/// Every blocking call is bounded: by the explicit timeout where one is given,
/// else by the store's own [`Store::timeout`].
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, waking waiters.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Gets `key`, waiting for it up to the store's timeout.
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.wait(&[key], Some(self.timeout()))?;
        self.get_now(key)
    }
    /// Gets `key`, waiting for it up to `timeout`.
    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[key], Some(timeout))?;
        self.get_now(key)
    }
    /// Gets `key` without waiting: `Ok(value)` if present; an error otherwise.
    fn get_now(&self, key: &str) -> Result<Vec<u8>>;
    /// Waits until every key exists; `None` means the store's timeout.
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()>;
    /// True if every key exists now.
    fn check(&self, keys: &[&str]) -> Result<bool>;
    /// Adds `delta` to the integer under `key` (missing = 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// PyTorch's compare-and-set; returns the value now stored (see the protocol reference).
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;
    /// Appends to `key` (creating it), waking waiters.
    fn append(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Deletes `key`; true if it existed.
    fn delete_key(&self, key: &str) -> Result<bool>;
    /// Number of keys in the store.
    fn num_keys(&self) -> Result<i64>;
    /// Gets several keys (waiting for all of them up to the timeout).
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>>;
    /// Sets several keys at once.
    fn multi_set(&self, kvs: &[(&str, &[u8])]) -> Result<()>;
    /// Pushes onto the queue under `key`.
    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Pops from the queue under `key`, waiting up to `timeout` (None = store timeout) for an element.
    fn queue_pop(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>>;
    /// Length of the queue under `key`.
    fn queue_len(&self, key: &str) -> Result<i64>;
    /// The store's default timeout for blocking calls.
    fn timeout(&self) -> Duration;
    /// Changes the store's default timeout.
    fn set_timeout(&self, timeout: Duration);
}
