//! [`PrefixStore`]: PyTorch's key layout for namespacing a shared store.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{Result, Store};

/// Wraps a store and puts `prefix + "/"` in front of every key, exactly as PyTorch's
/// `c10d::PrefixStore` does, so keys written by a torch process and by a Rust rank match.
///
/// `num_keys` counts the whole underlying store (as PyTorch's does).
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl std::fmt::Debug for PrefixStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl PrefixStore {
    /// A view of `inner` where key `k` is stored as `prefix/k`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> PrefixStore {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }

    /// The prefix (without the joining "/").
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The wrapped store.
    pub fn underlying(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The key as stored in the underlying store.
    pub fn join(&self, key: &str) -> String {
        let mut s = String::with_capacity(self.prefix.len() + 1 + key.len());
        s.push_str(&self.prefix);
        s.push('/');
        s.push_str(key);
        s
    }

    fn joined(&self, keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| self.join(k)).collect()
    }
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.join(key), value)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.inner.get(&self.join(key))
    }
    fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get_timeout(&self.join(key), timeout)
    }
    fn get_now(&self, key: &str) -> Result<Vec<u8>> {
        self.inner.get_now(&self.join(key))
    }
    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        let k = self.joined(keys);
        self.inner.wait(&refs(&k), timeout)
    }
    fn check(&self, keys: &[&str]) -> Result<bool> {
        let k = self.joined(keys);
        self.inner.check(&refs(&k))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.join(key), delta)
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner.compare_set(&self.join(key), expected, desired)
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.append(&self.join(key), value)
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.inner.delete_key(&self.join(key))
    }
    fn num_keys(&self) -> Result<i64> {
        self.inner.num_keys()
    }
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let k = self.joined(keys);
        self.inner.multi_get(&refs(&k))
    }
    fn multi_set(&self, kvs: &[(&str, &[u8])]) -> Result<()> {
        let k: Vec<String> = kvs.iter().map(|(k, _)| self.join(k)).collect();
        let pairs: Vec<(&str, &[u8])> = k.iter().zip(kvs).map(|(k, (_, v))| (k.as_str(), *v)).collect();
        self.inner.multi_set(&pairs)
    }
    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.queue_push(&self.join(key), value)
    }
    fn queue_pop(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        self.inner.queue_pop(&self.join(key), timeout)
    }
    fn queue_len(&self, key: &str) -> Result<i64> {
        self.inner.queue_len(&self.join(key))
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
}
