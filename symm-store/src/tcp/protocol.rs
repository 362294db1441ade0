//! PyTorch's TCPStore wire format: request parsing (server side, incremental and
//! bounded) and request encoding (client side).
//!
//! A request is one query-type byte followed by its arguments; integers are
//! little-endian; strings and byte vectors are a u64 length and the raw bytes.

/// Magic of the VALIDATE query (`c10d::detail::validationMagicNumber`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// WAIT reply: every key exists.
pub const STOP_WAITING: u8 = 0;
/// CANCEL_WAIT reply.
pub const WAIT_CANCELED: u8 = 1;
/// CHECK reply: all keys exist.
pub const CHECK_READY: u8 = 0;
/// CHECK reply: some key is missing.
pub const CHECK_NOT_READY: u8 = 1;

/// Query type bytes, numbered as PyTorch numbers them since VALIDATE was added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum QueryType {
    Validate = 0,
    Set = 1,
    CompareSet = 2,
    Get = 3,
    Add = 4,
    Check = 5,
    Wait = 6,
    GetNumKeys = 7,
    DeleteKey = 8,
    Append = 9,
    MultiGet = 10,
    MultiSet = 11,
    CancelWait = 12,
    Ping = 13,
    QueuePush = 14,
    QueuePop = 15,
    QueueLen = 16,
}

impl QueryType {
    /// The query type for a byte, if known.
    pub fn from_u8(b: u8) -> Option<QueryType> {
        use QueryType::*;
        Some(match b {
            0 => Validate,
            1 => Set,
            2 => CompareSet,
            3 => Get,
            4 => Add,
            5 => Check,
            6 => Wait,
            7 => GetNumKeys,
            8 => DeleteKey,
            9 => Append,
            10 => MultiGet,
            11 => MultiSet,
            12 => CancelWait,
            13 => Ping,
            14 => QueuePush,
            15 => QueuePop,
            16 => QueueLen,
            _ => return None,
        })
    }
}

/// One parsed request. Keys are raw bytes, exactly as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Validate(u32),
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    Check {
        keys: Vec<Vec<u8>>,
    },
    Wait {
        keys: Vec<Vec<u8>>,
    },
    GetNumKeys,
    DeleteKey {
        key: Vec<u8>,
    },
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    MultiSet {
        kvs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    CancelWait,
    Ping(u32),
    QueuePush {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    QueuePop {
        key: Vec<u8>,
    },
    QueueLen {
        key: Vec<u8>,
    },
}

/// Bounds every length on the wire (PyTorch's libuv server limits, plus a frame cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key in bytes (PyTorch: 8 KiB).
    pub max_key_len: u64,
    /// Longest value in bytes (PyTorch: 8 MiB).
    pub max_value_len: u64,
    /// Most keys in one CHECK / WAIT / MULTI_GET / MULTI_SET (PyTorch: 128 Ki).
    pub max_keys: u64,
    /// Largest whole request in bytes; bounds the memory one client can pin.
    pub max_frame_len: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_key_len: 8 * 1024,
            max_value_len: 8 * 1024 * 1024,
            max_keys: 128 * 1024,
            max_frame_len: 64 << 20,
        }
    }
}

/// Why a frame was rejected (the client that sent it is dropped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unknown query type {0}")]
    UnknownType(u8),
    #[error("key of {0} bytes exceeds the limit")]
    KeyTooLong(u64),
    #[error("value of {0} bytes exceeds the limit")]
    ValueTooLong(u64),
    #[error("{0} keys in one request exceeds the limit")]
    TooManyKeys(u64),
    #[error("request larger than the frame limit ({0} bytes or more)")]
    FrameTooLarge(u64),
}

/// Result of parsing the front of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A whole request and the number of bytes it used.
    Complete(Request, usize),
    /// The buffer holds the start of a request; at least `need` bytes are needed in all.
    Incomplete { need: usize },
}

enum E {
    Need(usize),
    Bad(FrameError),
}

struct Reader<'a> {
    b: &'a [u8],
    p: usize,
    l: &'a Limits,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], E> {
        let end = self
            .p
            .checked_add(n)
            .ok_or(E::Bad(FrameError::FrameTooLarge(u64::MAX)))?;
        if end > self.l.max_frame_len {
            return Err(E::Bad(FrameError::FrameTooLarge(end as u64)));
        }
        if end > self.b.len() {
            return Err(E::Need(end));
        }
        let s = &self.b[self.p..end];
        self.p = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], E> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, E> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, E> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn i64(&mut self) -> Result<i64, E> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    fn sized(&mut self, max: u64, err: fn(u64) -> FrameError) -> Result<Vec<u8>, E> {
        let len = self.u64()?;
        if len > max {
            return Err(E::Bad(err(len)));
        }
        let len = usize::try_from(len).map_err(|_| E::Bad(err(len)))?;
        Ok(self.take(len)?.to_vec())
    }
    fn key(&mut self) -> Result<Vec<u8>, E> {
        self.sized(self.l.max_key_len, FrameError::KeyTooLong)
    }
    fn value(&mut self) -> Result<Vec<u8>, E> {
        self.sized(self.l.max_value_len, FrameError::ValueTooLong)
    }
    fn count(&mut self) -> Result<usize, E> {
        let n = self.u64()?;
        if n > self.l.max_keys {
            return Err(E::Bad(FrameError::TooManyKeys(n)));
        }
        // Each key needs at least its 8-byte length: a cheap early frame-size check.
        let min_end = (self.p as u64).saturating_add(n.saturating_mul(8));
        if min_end > self.l.max_frame_len as u64 {
            return Err(E::Bad(FrameError::FrameTooLarge(min_end)));
        }
        usize::try_from(n).map_err(|_| E::Bad(FrameError::TooManyKeys(n)))
    }
    fn keys(&mut self) -> Result<Vec<Vec<u8>>, E> {
        let n = self.count()?;
        // Capacity grows as keys actually arrive: a claimed count allocates nothing.
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(self.key()?);
        }
        Ok(v)
    }
}

/// Parses one request from the front of `buf`. Never panics, never allocates more than
/// the bytes present, and rejects anything beyond `limits`.
pub fn parse_request(buf: &[u8], limits: &Limits) -> Result<Parsed, FrameError> {
    let mut r = Reader {
        b: buf,
        p: 0,
        l: limits,
    };
    match parse_inner(&mut r) {
        Ok(req) => Ok(Parsed::Complete(req, r.p)),
        Err(E::Need(need)) => Ok(Parsed::Incomplete { need }),
        Err(E::Bad(e)) => Err(e),
    }
}

fn parse_inner(r: &mut Reader<'_>) -> Result<Request, E> {
    let t = r.arr::<1>()?[0];
    let qt = QueryType::from_u8(t).ok_or(E::Bad(FrameError::UnknownType(t)))?;
    Ok(match qt {
        QueryType::Validate => Request::Validate(r.u32()?),
        QueryType::Set => Request::Set {
            key: r.key()?,
            value: r.value()?,
        },
        QueryType::CompareSet => Request::CompareSet {
            key: r.key()?,
            expected: r.value()?,
            desired: r.value()?,
        },
        QueryType::Get => Request::Get { key: r.key()? },
        QueryType::Add => Request::Add {
            key: r.key()?,
            delta: r.i64()?,
        },
        QueryType::Check => Request::Check { keys: r.keys()? },
        QueryType::Wait => Request::Wait { keys: r.keys()? },
        QueryType::GetNumKeys => Request::GetNumKeys,
        QueryType::DeleteKey => Request::DeleteKey { key: r.key()? },
        QueryType::Append => Request::Append {
            key: r.key()?,
            value: r.value()?,
        },
        QueryType::MultiGet => Request::MultiGet { keys: r.keys()? },
        QueryType::MultiSet => {
            let n = r.count()?;
            let mut kvs = Vec::new();
            for _ in 0..n {
                let k = r.key()?;
                let v = r.value()?;
                kvs.push((k, v));
            }
            Request::MultiSet { kvs }
        }
        QueryType::CancelWait => Request::CancelWait,
        QueryType::Ping => Request::Ping(r.u32()?),
        QueryType::QueuePush => Request::QueuePush {
            key: r.key()?,
            value: r.value()?,
        },
        QueryType::QueuePop => Request::QueuePop { key: r.key()? },
        QueryType::QueueLen => Request::QueueLen { key: r.key()? },
    })
}

/// Appends a u64-length-prefixed byte string.
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_keys(out: &mut Vec<u8>, keys: &[Vec<u8>]) {
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for k in keys {
        put_bytes(out, k);
    }
}

/// Encodes `req` as PyTorch's client does (MULTI_SET's count as i64: the same 8 bytes).
pub fn encode_request(req: &Request, out: &mut Vec<u8>) {
    match req {
        Request::Validate(m) => {
            out.push(QueryType::Validate as u8);
            out.extend_from_slice(&m.to_le_bytes());
        }
        Request::Set { key, value } => {
            out.push(QueryType::Set as u8);
            put_bytes(out, key);
            put_bytes(out, value);
        }
        Request::CompareSet { key, expected, desired } => {
            out.push(QueryType::CompareSet as u8);
            put_bytes(out, key);
            put_bytes(out, expected);
            put_bytes(out, desired);
        }
        Request::Get { key } => {
            out.push(QueryType::Get as u8);
            put_bytes(out, key);
        }
        Request::Add { key, delta } => {
            out.push(QueryType::Add as u8);
            put_bytes(out, key);
            out.extend_from_slice(&delta.to_le_bytes());
        }
        Request::Check { keys } => {
            out.push(QueryType::Check as u8);
            put_keys(out, keys);
        }
        Request::Wait { keys } => {
            out.push(QueryType::Wait as u8);
            put_keys(out, keys);
        }
        Request::GetNumKeys => out.push(QueryType::GetNumKeys as u8),
        Request::DeleteKey { key } => {
            out.push(QueryType::DeleteKey as u8);
            put_bytes(out, key);
        }
        Request::Append { key, value } => {
            out.push(QueryType::Append as u8);
            put_bytes(out, key);
            put_bytes(out, value);
        }
        Request::MultiGet { keys } => {
            out.push(QueryType::MultiGet as u8);
            put_keys(out, keys);
        }
        Request::MultiSet { kvs } => {
            out.push(QueryType::MultiSet as u8);
            out.extend_from_slice(&(kvs.len() as i64).to_le_bytes());
            for (k, v) in kvs {
                put_bytes(out, k);
                put_bytes(out, v);
            }
        }
        Request::CancelWait => out.push(QueryType::CancelWait as u8),
        Request::Ping(n) => {
            out.push(QueryType::Ping as u8);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Request::QueuePush { key, value } => {
            out.push(QueryType::QueuePush as u8);
            put_bytes(out, key);
            put_bytes(out, value);
        }
        Request::QueuePop { key } => {
            out.push(QueryType::QueuePop as u8);
            put_bytes(out, key);
        }
        Request::QueueLen { key } => {
            out.push(QueryType::QueueLen as u8);
            put_bytes(out, key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_round_trip_and_prefixes() {
        let req = Request::Set {
            key: b"/k".to_vec(),
            value: b"value".to_vec(),
        };
        let mut buf = Vec::new();
        encode_request(&req, &mut buf);
        let l = Limits::default();
        assert_eq!(parse_request(&buf, &l), Ok(Parsed::Complete(req, buf.len())));
        for cut in 0..buf.len() {
            match parse_request(&buf[..cut], &l) {
                Ok(Parsed::Incomplete { need }) => assert!(need > cut && need <= buf.len()),
                other => panic!("prefix {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn bounds_are_enforced_before_allocation() {
        let l = Limits::default();
        let mut huge = vec![QueryType::Set as u8];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(parse_request(&huge, &l), Err(FrameError::KeyTooLong(u64::MAX)));
        let mut many = vec![QueryType::Wait as u8];
        many.extend_from_slice(&(128u64 * 1024 + 1).to_le_bytes());
        assert!(matches!(parse_request(&many, &l), Err(FrameError::TooManyKeys(_))));
        assert_eq!(parse_request(&[17], &l), Err(FrameError::UnknownType(17)));
        assert_eq!(parse_request(&[255], &l), Err(FrameError::UnknownType(255)));
        let mut val = vec![QueryType::Set as u8];
        put_bytes(&mut val, b"k");
        val.extend_from_slice(&(8u64 * 1024 * 1024 + 1).to_le_bytes());
        assert!(matches!(parse_request(&val, &l), Err(FrameError::ValueTooLong(_))));
        let small = Limits {
            max_frame_len: 64,
            ..Limits::default()
        };
        let mut big = vec![QueryType::Set as u8];
        put_bytes(&mut big, b"k");
        put_bytes(&mut big, &[0u8; 100]);
        assert!(matches!(parse_request(&big, &small), Err(FrameError::FrameTooLarge(_))));
    }
}
