//! Helpers for tests that re-exec the test binary as child processes.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Env var naming a child's role; unset in the parent.
pub const ROLE: &str = "SYMM_STORE_TEST_ROLE";

/// The role of this process when it is a child, else None.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Runs `test` of this test binary in a child with `role` and `envs`.
pub fn spawn(test: &str, role: &str, envs: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Waits for every child up to `timeout` (killing all on timeout) and returns statuses.
pub fn wait_all(children: &mut [Child], timeout: Duration) -> Vec<ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut out: Vec<Option<ExitStatus>> = vec![None; children.len()];
    while out.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if out[i].is_none() {
                out[i] = c.try_wait().unwrap();
            }
        }
        if Instant::now() > deadline {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("children did not finish within {timeout:?}: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    out.into_iter().map(Option::unwrap).collect()
}

/// Exit code of a child whose role body ran to the end (a child whose test name did
/// not match would exit 0 after running nothing, so 0 does not count as success).
pub const DONE: i32 = 42;

/// Ends a child after its role body completed.
pub fn child_done() -> ! {
    use std::io::Write as _;
    let _ = std::io::stderr().flush();
    std::process::exit(DONE)
}

/// True when a child's status shows its role body completed.
pub fn done(s: &ExitStatus) -> bool {
    s.code() == Some(DONE)
}

/// Asserts every child ran its role body to the end.
pub fn assert_all_ok(children: &mut [Child], timeout: Duration) {
    let st = wait_all(children, timeout);
    for (i, s) in st.iter().enumerate() {
        assert!(done(s), "child {i} failed: {s:?}");
    }
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Number of open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A raw protocol connection that already sent VALIDATE.
pub fn raw_client(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut v = vec![0u8];
    v.extend_from_slice(&0x3C85_F7CEu32.to_le_bytes());
    s.write_all(&v).unwrap();
    s
}

/// Sends PING over a raw connection; true if echoed.
pub fn raw_ping(s: &mut TcpStream, nonce: u32) -> bool {
    let mut v = vec![13u8];
    v.extend_from_slice(&nonce.to_le_bytes());
    if s.write_all(&v).is_err() {
        return false;
    }
    let mut b = [0u8; 4];
    s.read_exact(&mut b).is_ok() && u32::from_le_bytes(b) == nonce
}

/// True once the server has closed `s` (EOF or reset) within `timeout`.
pub fn closed_by_server(s: &mut TcpStream, timeout: Duration) -> bool {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut b = [0u8; 64];
    let deadline = Instant::now() + timeout;
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
        if Instant::now() > deadline {
            return false;
        }
    }
}
