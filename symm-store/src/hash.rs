//! [`HashStore`]: an in-process store for groups that run one thread per rank.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::store::{Result, Store, StoreError};
use crate::util::{add_to_decimal, compare_set_in, deadline_after};

#[derive(Default)]
struct State {
    kv: HashMap<String, Vec<u8>>,
    queues: HashMap<String, VecDeque<Vec<u8>>>,
}

impl State {
    fn present(&self, key: &str) -> bool {
        self.kv.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }
}

/// An in-process key-value store (PyTorch's `HashStore`).
///
/// Waits block on a condition variable and are always bounded by a timeout.
pub struct HashStore {
    state: Mutex<State>,
    cv: Condvar,
    timeout: Mutex<Duration>,
}

impl std::fmt::Debug for HashStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashStore")
            .field("timeout", &self.timeout())
            .finish_non_exhaustive()
    }
}

impl HashStore {
    /// A new empty store whose blocking calls wait at most `timeout` by default.
    pub fn new(timeout: Duration) -> Arc<HashStore> {
        Arc::new(HashStore {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            timeout: Mutex::new(timeout),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps inconsistent
        // (every mutation is a single insert/remove), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits on the condition variable until `ready(state)` or the deadline.
    fn wait_until<'a>(
        &'a self,
        mut guard: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        mut ready: impl FnMut(&State) -> bool,
    ) -> (MutexGuard<'a, State>, bool) {
        loop {
            if ready(&guard) {
                return (guard, true);
            }
            let wait = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return (guard, false);
                    }
                    d - now
                }
                None => Duration::from_secs(3600),
            };
            guard = match self.cv.wait_timeout(guard, wait) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

impl Store for HashStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock().kv.insert(key.to_owned(), value.to_vec());
        self.cv.notify_all();
        Ok(())
    }

    fn get_now(&self, key: &str) -> Result<Vec<u8>> {
        self.lock()
            .kv
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::KeyNotFound(key.to_owned()))
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<()> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let deadline = deadline_after(timeout);
        let (guard, ok) = self.wait_until(self.lock(), deadline, |s| keys.iter().all(|k| s.present(k)));
        if ok {
            return Ok(());
        }
        let missing: Vec<&str> = keys.iter().copied().filter(|k| !guard.present(k)).collect();
        Err(StoreError::Timeout {
            what: format!("keys {missing:?}"),
            timeout,
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let s = self.lock();
        Ok(keys.iter().all(|k| s.present(k)))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut s = self.lock();
        let (text, v) = add_to_decimal(key, s.kv.get(key).map(|v| v.as_slice()), delta)?;
        s.kv.insert(key.to_owned(), text);
        drop(s);
        self.cv.notify_all();
        Ok(v)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let mut s = self.lock();
        let out = compare_set_in(&mut s.kv, key, expected, desired);
        drop(s);
        self.cv.notify_all();
        Ok(out)
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock()
            .kv
            .entry(key.to_owned())
            .or_default()
            .extend_from_slice(value);
        self.cv.notify_all();
        Ok(())
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.lock().kv.remove(key).is_some())
    }

    fn num_keys(&self) -> Result<i64> {
        Ok(i64::try_from(self.lock().kv.len()).unwrap_or(i64::MAX))
    }

    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.wait(keys, None)?;
        let s = self.lock();
        keys.iter()
            .map(|k| {
                s.kv.get(*k)
                    .cloned()
                    .ok_or_else(|| StoreError::KeyNotFound((*k).to_owned()))
            })
            .collect()
    }

    fn multi_set(&self, kvs: &[(&str, &[u8])]) -> Result<()> {
        let mut s = self.lock();
        for (k, v) in kvs {
            s.kv.insert((*k).to_owned(), v.to_vec());
        }
        drop(s);
        self.cv.notify_all();
        Ok(())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock()
            .queues
            .entry(key.to_owned())
            .or_default()
            .push_back(value.to_vec());
        self.cv.notify_all();
        Ok(())
    }

    fn queue_pop(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let deadline = deadline_after(timeout);
        let (mut guard, ok) = self.wait_until(self.lock(), deadline, |s| {
            s.queues.get(key).is_some_and(|q| !q.is_empty())
        });
        if !ok {
            return Err(StoreError::Timeout {
                what: format!("queue {key:?} to be non-empty"),
                timeout,
            });
        }
        guard
            .queues
            .get_mut(key)
            .and_then(|q| q.pop_front())
            .ok_or_else(|| StoreError::KeyNotFound(key.to_owned()))
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        Ok(self
            .lock()
            .queues
            .get(key)
            .map_or(0, |q| i64::try_from(q.len()).unwrap_or(i64::MAX)))
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout;
    }
}
