//! Rust side of the PyTorch interop check (driven by `tests/torch_interop.py`).
//!
//! ```text
//! symm-store-interop server          # our server on 127.0.0.1:0; prints "PORT <n>"; exits when stdin closes
//! symm-store-interop client <port>   # our client against a (torch) server: every Store method
//! ```
//! The client mode checks keys the Python side wrote (`from_torch`, `grp/pk`, `counter`)
//! and leaves keys for it to check (`from_rust`, `rust_add`, `grp/rust_pk`, `rust_q`).
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_store::{PrefixStore, Store, StoreError, TcpServer, TcpStore};

const T: Duration = Duration::from_secs(20);

fn check(cond: bool, what: &str) -> Result<(), String> {
    if cond {
        println!("ok   {what}");
        Ok(())
    } else {
        Err(format!("FAIL {what}"))
    }
}

fn client(port: u16, with_queues: bool) -> Result<(), String> {
    let e = |e: StoreError| e.to_string();
    let s = TcpStore::connect(SocketAddr::from(([127, 0, 0, 1], port)), T).map_err(e)?;
    check(
        s.get("from_torch").map_err(e)? == b"hello from torch",
        "get key set by torch",
    )?;
    check(s.add("counter", 5).map_err(e)? == 15, "add on torch's counter (10 + 5)")?;
    s.set("from_rust", b"hello from rust").map_err(e)?;
    s.set("binary", &[0, 159, 146, 150, 255]).map_err(e)?;
    check(
        s.get("binary").map_err(e)? == [0, 159, 146, 150, 255],
        "binary value round trip",
    )?;
    check(s.add("rust_add", 3).map_err(e)? == 3, "add creates")?;
    check(
        s.compare_set("rust_cas", b"", b"first").map_err(e)? == b"first",
        "compare_set on missing, empty expected",
    )?;
    check(
        s.compare_set("rust_cas", b"wrong", b"x").map_err(e)? == b"first",
        "compare_set mismatch",
    )?;
    check(
        s.compare_set("rust_cas", b"first", b"second").map_err(e)? == b"second",
        "compare_set match",
    )?;
    check(
        s.compare_set("rust_cas_missing", b"exp", b"x").map_err(e)? == b"exp",
        "compare_set missing, non-empty",
    )?;
    check(s.check(&["from_torch", "from_rust"]).map_err(e)?, "check present")?;
    check(!s.check(&["nope_never"]).map_err(e)?, "check missing")?;
    s.wait(&["from_torch"], None).map_err(e)?;
    let t0 = Instant::now();
    let r = s.wait(&["nope_never"], Some(Duration::from_millis(300)));
    check(
        matches!(r, Err(StoreError::Timeout { .. })) && t0.elapsed() < Duration::from_secs(5),
        "wait timeout + CANCEL_WAIT",
    )?;
    check(
        s.add("after_cancel", 1).map_err(e)? == 1,
        "connection usable after CANCEL_WAIT",
    )?;
    s.append("rust_append", b"ab").map_err(e)?;
    s.append("rust_append", b"cd").map_err(e)?;
    check(s.get("rust_append").map_err(e)? == b"abcd", "append")?;
    s.multi_set(&[("rust_m1", b"1"), ("rust_m2", b"2")]).map_err(e)?;
    check(
        s.multi_get(&["rust_m1", "rust_m2", "from_torch"]).map_err(e)?
            == vec![b"1".to_vec(), b"2".to_vec(), b"hello from torch".to_vec()],
        "multi_set + multi_get",
    )?;
    s.set("rust_del", b"x").map_err(e)?;
    check(s.delete_key("rust_del").map_err(e)?, "delete existing")?;
    check(!s.delete_key("rust_del").map_err(e)?, "delete missing")?;
    check(s.num_keys().map_err(e)? > 5, "num_keys")?;
    let p = PrefixStore::new("grp", s.clone() as Arc<dyn Store>);
    check(
        p.get("pk").map_err(e)? == b"pv",
        "PrefixStore key set by torch's PrefixStore",
    )?;
    p.set("rust_pk", b"rust_pv").map_err(e)?;
    // A GET that blocks until torch sets the key (python sets it after seeing "rust_waiting").
    s.set("rust_waiting", b"1").map_err(e)?;
    check(
        s.get("late_from_torch").map_err(e)? == b"late",
        "blocking get woken by torch's set",
    )?;
    if with_queues {
        check(
            s.queue_pop("torch_q", None).map_err(e)? == b"q1",
            "queue_pop of torch's push",
        )?;
        s.queue_push("rust_q", b"r1").map_err(e)?;
        s.queue_push("rust_q", b"r2").map_err(e)?;
        check(s.queue_len("rust_q").map_err(e)? == 2, "queue_len")?;
    }
    s.ping().map_err(e)?;
    s.set("rust_done", b"1").map_err(e)?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => {
            let srv = match TcpServer::bind(SocketAddr::from(([127, 0, 0, 1], 0))) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("server: {e}");
                    return ExitCode::FAILURE;
                }
            };
            println!("PORT {}", srv.local_addr().port());
            let _ = std::io::stdout().flush();
            let mut sink = [0u8; 256];
            while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
            let st = srv.stats();
            eprintln!("server stats: {st:?}");
            ExitCode::SUCCESS
        }
        Some("client") => {
            let Some(port) = args.get(1).and_then(|p| p.parse().ok()) else {
                eprintln!("usage: symm-store-interop client <port> [--no-queues]");
                return ExitCode::from(2);
            };
            let queues = !args.iter().any(|a| a == "--no-queues");
            match client(port, queues) {
                Ok(()) => {
                    println!("rust client: all checks passed");
                    ExitCode::SUCCESS
                }
                Err(m) => {
                    println!("{m}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: symm-store-interop server | client <port> [--no-queues]");
            ExitCode::from(2)
        }
    }
}
