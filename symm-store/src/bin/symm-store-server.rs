//! Standalone TCPStore server (PyTorch wire protocol) for the store-only case.
//!
//! ```text
//! symm-store-server [--host ADDR] [--port PORT] [--port-file PATH] [--exit-on-stdin-eof]
//!                   [--first-frame-timeout-secs S] [--handshake-timeout-secs S] [--frame-timeout-secs S]
//!                   [--max-clients N] [--max-clients-per-peer N] [--max-pending N] [--max-pending-per-peer N]
//! ```
//! Binds 127.0.0.1:29500 by default (loopback unless an address is given), prints
//! `listening on ADDR`, and serves until killed or, with `--exit-on-stdin-eof`, until
//! its standard input closes.
#![forbid(unsafe_code)]

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use symm_store::{ServerOptions, TcpServer};

fn usage() -> ExitCode {
    eprintln!(
        "usage: symm-store-server [--host ADDR] [--port PORT] [--port-file PATH] [--exit-on-stdin-eof]\n\
         \x20                        [--first-frame-timeout-secs S] [--handshake-timeout-secs S] \
         [--frame-timeout-secs S]\n\
         \x20                        [--max-clients N] [--max-clients-per-peer N] [--max-pending N] \
         [--max-pending-per-peer N]\n\
         (defaults: ServerOptions::default(); see docs/store.md)"
    );
    ExitCode::from(2)
}

/// A value parsed as `T`.
fn num<T: std::str::FromStr>(v: Option<String>) -> Option<T> {
    v?.parse().ok()
}

/// A positive, finite number of seconds.
fn secs(v: Option<String>) -> Option<Duration> {
    match v?.parse::<f64>().ok()? {
        s if s > 0.0 && s.is_finite() => Duration::try_from_secs_f64(s).ok(),
        _ => None,
    }
}

fn main() -> ExitCode {
    let mut host: IpAddr = [127, 0, 0, 1].into();
    let mut port: u16 = symm_store::tcp::DEFAULT_PORT;
    let mut opts = ServerOptions::default();
    let mut port_file: Option<String> = None;
    let mut stdin_eof = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next();
        let parsed = match a.as_str() {
            "--host" => num(val()).map(|h| host = h),
            "--port" => num(val()).map(|p| port = p),
            "--first-frame-timeout-secs" => secs(val()).map(|d| opts.first_frame_timeout = d),
            "--handshake-timeout-secs" => secs(val()).map(|d| opts.handshake_timeout = d),
            "--frame-timeout-secs" => secs(val()).map(|d| opts.frame_timeout = d),
            "--max-clients" => num(val()).map(|n| opts.max_clients = n),
            "--max-clients-per-peer" => num(val()).map(|n| opts.max_clients_per_peer = n),
            "--max-pending" => num(val()).map(|n| opts.max_pending = n),
            "--max-pending-per-peer" => num(val()).map(|n| opts.max_pending_per_peer = n),
            "--port-file" => val().map(|p| port_file = Some(p)),
            "--exit-on-stdin-eof" => {
                stdin_eof = true;
                Some(())
            }
            "-h" | "--help" => {
                usage();
                return ExitCode::SUCCESS;
            }
            _ => None,
        };
        if parsed.is_none() {
            return usage();
        }
    }
    let server = match TcpServer::bind_with(SocketAddr::new(host, port), opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("symm-store-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = server.local_addr();
    println!("listening on {addr}");
    if let Some(p) = port_file {
        if let Err(e) = std::fs::write(&p, addr.port().to_string()) {
            eprintln!("symm-store-server: writing {p}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if stdin_eof {
        let mut sink = [0u8; 256];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        drop(server);
    } else {
        server.join();
    }
    ExitCode::SUCCESS
}
