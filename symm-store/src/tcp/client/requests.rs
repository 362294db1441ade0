//! The client's requests: one exchange at a time on the connection (an I/O error marks it
//! broken), the raw WAIT / GET / ADD / PING, the key and value limits, and the [`Store`]
//! methods built on them.

use std::io;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::conn::{conn_err, deadline_after, read_exact_by, read_i64, read_u8, read_vec, write_all_by, Conn};
use super::{TcpStore, KEY_PREFIX};
use crate::store::{Result, Store, StoreError};
use crate::tcp::protocol::{encode_request, Request, CHECK_NOT_READY, CHECK_READY, STOP_WAITING, WAIT_CANCELED};

/// Time allowed for the server to answer CANCEL_WAIT after a wait timed out.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

impl TcpStore {
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

    /// The error of every request after the connection was marked broken.
    fn broken(&self) -> StoreError {
        conn_err(
            self.addr,
            io::Error::new(io::ErrorKind::NotConnected, "the connection failed earlier"),
        )
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
            return Err(self.broken());
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
            return Err(self.broken());
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

    pub(super) fn raw_get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        self.raw_wait(vec![key.to_vec()], timeout)?;
        let mut buf = Vec::new();
        encode_request(&Request::Get { key: key.to_vec() }, &mut buf);
        self.exchange("GET", self.timeout(), |s, d| {
            write_all_by(s, &buf, d)?;
            read_vec(s, d)
        })
    }

    pub(super) fn raw_add(&self, key: &[u8], delta: i64) -> Result<i64> {
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
