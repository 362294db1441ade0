//! The client's connection: deadline-bounded reads and writes on the socket, and connecting
//! with retry, backoff and the VALIDATE + PING handshake.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::store::{Result, StoreError};
use crate::tcp::protocol::{encode_request, Request, VALIDATION_MAGIC};

/// Largest reply value the client accepts (a bound against a hostile server).
const MAX_REPLY_VALUE: u64 = 1 << 30;

pub(super) fn conn_err(addr: SocketAddr, source: io::Error) -> StoreError {
    StoreError::Connection {
        addr: addr.to_string(),
        source,
    }
}

pub(super) fn deadline_after(t: Duration) -> Instant {
    Instant::now()
        .checked_add(t)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365))
}

/// A connection whose socket timeouts are only lowered when a deadline needs it (a read
/// that outlives the socket timeout just loops and re-checks the deadline), so steady
/// state costs no setsockopt per request.
#[derive(Debug)]
pub(super) struct Conn {
    s: TcpStream,
    rto: Option<Duration>,
    wto: Option<Duration>,
}

impl Conn {
    fn new(s: TcpStream) -> Conn {
        Conn {
            s,
            rto: None,
            wto: None,
        }
    }

    fn bound_reads(&mut self, left: Duration) -> io::Result<()> {
        let left = left.max(Duration::from_millis(1));
        if self.rto.is_none_or(|t| t > left) {
            self.s.set_read_timeout(Some(left))?;
            self.rto = Some(left);
        }
        Ok(())
    }

    fn bound_writes(&mut self, left: Duration) -> io::Result<()> {
        let left = left.max(Duration::from_millis(1));
        if self.wto.is_none_or(|t| t > left) {
            self.s.set_write_timeout(Some(left))?;
            self.wto = Some(left);
        }
        Ok(())
    }
}

/// Reads exactly `buf.len()` bytes by `deadline` (TimedOut otherwise).
pub(super) fn read_exact_by(s: &mut Conn, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut pos = 0;
    while pos < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "store reply deadline passed"));
        }
        s.bound_reads(left)?;
        match s.s.read(&mut buf[pos..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "store server closed the connection",
                ))
            }
            Ok(n) => pos += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn write_all_by(s: &mut Conn, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut pos = 0;
    while pos < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "store request deadline passed"));
        }
        s.bound_writes(left)?;
        match s.s.write(&buf[pos..]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "store connection closed")),
            Ok(n) => pos += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn read_u8(s: &mut Conn, d: Instant) -> io::Result<u8> {
    let mut b = [0u8; 1];
    read_exact_by(s, &mut b, d)?;
    Ok(b[0])
}

pub(super) fn read_i64(s: &mut Conn, d: Instant) -> io::Result<i64> {
    let mut b = [0u8; 8];
    read_exact_by(s, &mut b, d)?;
    Ok(i64::from_le_bytes(b))
}

pub(super) fn read_vec(s: &mut Conn, d: Instant) -> io::Result<Vec<u8>> {
    let mut b = [0u8; 8];
    read_exact_by(s, &mut b, d)?;
    let len = u64::from_le_bytes(b);
    if len > MAX_REPLY_VALUE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("reply value of {len} bytes exceeds the limit"),
        ));
    }
    let len = len as usize;
    // Grow as bytes arrive: a bogus length allocates at most one chunk ahead.
    let mut v = Vec::with_capacity(len.min(1 << 20));
    let mut chunk = vec![0u8; len.min(1 << 20)];
    while v.len() < len {
        let n = (len - v.len()).min(chunk.len());
        read_exact_by(s, &mut chunk[..n], d)?;
        v.extend_from_slice(&chunk[..n]);
    }
    Ok(v)
}

/// Handshakes in a row that the server cuts off (accepts the connection, then closes it
/// before answering) before the client reports a refusal instead of retrying.
const CUT_OFFS_BEFORE_REFUSAL: u32 = 3;

/// The server closed or reset the connection.
fn closed_by_peer(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The error when the connect deadline (`timeout` after the start) has passed.
fn connect_deadline_error(addr: SocketAddr, timeout: Duration, last: Option<io::Error>) -> StoreError {
    let what = match last {
        None => format!("connecting to the store at {addr}"),
        Some(e) => format!("connecting to the store at {addr} (last attempt: {e})"),
    };
    StoreError::Timeout { what, timeout }
}

/// Connects with retry and backoff for up to `timeout`, then VALIDATE + PING.
///
/// Refused connections (nothing listening yet) are retried until the deadline, as
/// PyTorch's client does. A server that accepts and then closes the connection before
/// answering the handshake [`CUT_OFFS_BEFORE_REFUSAL`] times in a row is refusing this
/// client (it is full): that is reported at once as a refusal.
pub(super) fn connect_handshake(addr: SocketAddr, timeout: Duration) -> Result<Conn> {
    let deadline = deadline_after(timeout);
    let mut backoff = Duration::from_millis(10);
    let mut last_err: Option<io::Error> = None;
    let mut cut_offs = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(connect_deadline_error(addr, timeout, last_err));
        }
        let (e, cut_off) = match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
            Ok(s) => match handshake(Conn::new(s), deadline) {
                Ok(c) => return Ok(c),
                // Said here: a timed-out connect is also TimedOut, and means something else.
                Err(e) if e.kind() == io::ErrorKind::TimedOut => (
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the server accepted the connection but did not answer the handshake",
                    ),
                    false,
                ),
                Err(e) => {
                    let cut_off = closed_by_peer(&e);
                    (e, cut_off)
                }
            },
            Err(e) => (e, false),
        };
        cut_offs = if cut_off { cut_offs + 1 } else { 0 };
        if cut_offs >= CUT_OFFS_BEFORE_REFUSAL {
            return Err(conn_err(
                addr,
                io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "the server refused the connection: it accepted and then closed it before answering \
                         the handshake, {cut_offs} times in a row (it is at its max_clients or per-address \
                         limit, or out of file descriptors); last: {e}"
                    ),
                ),
            ));
        }
        last_err = Some(e);
        // (A deadline reached here is reported at the top of the loop.)
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn handshake(mut c: Conn, deadline: Instant) -> io::Result<Conn> {
    let s = &mut c;
    s.s.set_nodelay(true)?;
    let nonce = std::process::id();
    let mut buf = Vec::with_capacity(16);
    encode_request(&Request::Validate(VALIDATION_MAGIC), &mut buf);
    encode_request(&Request::Ping(nonce), &mut buf);
    write_all_by(s, &buf, deadline)?;
    let mut b = [0u8; 4];
    read_exact_by(s, &mut b, deadline)?;
    if u32::from_le_bytes(b) != nonce {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "PING reply does not echo the nonce",
        ));
    }
    Ok(c)
}
