//! `symmrun`: a launcher in the manner of torchrun for one node.
//!
//! ```text
//! symmrun --nproc-per-node N [--master-addr ADDR] [--master-port PORT]
//!         [--timeout SECS] [--grace SECS] [--store-only] [-- PROGRAM ARGS...]
//! ```
//!
//! Hosts a TcpStore (PyTorch's wire protocol) on ADDR:PORT (default
//! 127.0.0.1 and a free port), starts N copies of PROGRAM with RANK,
//! LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
//! TORCHELASTIC_USE_AGENT_STORE=True (the ranks are clients of this store,
//! as under torchrun's agent), and exits with 0 if every rank did, else with
//! the first failed rank's code (128 + signal for a signal). After the first
//! failure the other ranks get `--grace` seconds (default 5) before they are
//! killed; at `--timeout` every rank is killed and symmrun exits 124.
//! `--store-only` hosts the store and prints `MASTER_ADDR=... MASTER_PORT=...`
//! without starting anything (until `--timeout`, or until killed).
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use symm_core::symm_store::TcpServer;
use symm_testkit::launch::{launch_exit_code, report, run_program, ChildStatus, ProgramSpec};

const USAGE: &str = "usage: symmrun --nproc-per-node N [--master-addr ADDR] [--master-port PORT] \
[--timeout SECS] [--grace SECS] [--store-only] [-- PROGRAM ARGS...]";

#[derive(Debug)]
struct Args {
    nproc: Option<usize>,
    addr: IpAddr,
    port: u16,
    timeout: Option<Duration>,
    grace: Duration,
    store_only: bool,
    program: Vec<String>,
}

fn secs(flag: &str, v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag}: {v:?} is not a number of seconds"))
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        nproc: None,
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 0,
        timeout: None,
        grace: Duration::from_secs(5),
        store_only: false,
        program: Vec::new(),
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{flag} needs a value"))
        };
        match flag {
            "--" => {
                a.program = it.cloned().collect();
                break;
            }
            "--nproc-per-node" | "--nproc_per_node" => {
                let v = value()?;
                a.nproc = Some(v.parse().map_err(|_| format!("{flag}: {v:?} is not a number"))?);
            }
            "--master-addr" | "--master_addr" => {
                let v = value()?;
                a.addr = v.parse().map_err(|_| format!("{flag}: {v:?} is not an IP address"))?;
            }
            "--master-port" | "--master_port" => {
                let v = value()?;
                a.port = v.parse().map_err(|_| format!("{flag}: {v:?} is not a port"))?;
            }
            "--timeout" => a.timeout = Some(secs(flag, &value()?)?),
            "--grace" => a.grace = secs(flag, &value()?)?,
            "--store-only" => a.store_only = true,
            "-h" | "--help" => return Err(String::new()),
            other if !other.starts_with('-') && a.program.is_empty() => {
                // torchrun style: the program without "--".
                a.program = std::iter::once(arg.clone()).chain(it.cloned()).collect();
                break;
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if !a.store_only {
        match a.nproc {
            Some(0) | None => return Err("--nproc-per-node N (N >= 1) is required".into()),
            Some(_) => {}
        }
        if a.program.is_empty() {
            return Err("no program given (symmrun ... -- PROGRAM ARGS)".into());
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("symmrun: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let server = match TcpServer::bind(SocketAddr::new(args.addr, args.port)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("symmrun: cannot host the store on {}:{}: {e}", args.addr, args.port);
            return ExitCode::from(1);
        }
    };
    let mut master = server.local_addr();
    if master.ip().is_unspecified() {
        master.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    if args.store_only {
        println!("MASTER_ADDR={} MASTER_PORT={}", master.ip(), master.port());
        match args.timeout {
            Some(t) => std::thread::sleep(t),
            None => server.join(),
        }
        return ExitCode::SUCCESS;
    }
    let spec = ProgramSpec {
        program: args.program[0].clone().into(),
        args: args.program[1..].to_vec(),
        nproc: args.nproc.unwrap_or(1),
        limit: args.timeout,
        grace: args.grace,
        env: Vec::new(),
        capture: false,
    };
    let outcomes = match run_program(&spec, master) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("symmrun: {e}");
            return ExitCode::from(1);
        }
    };
    drop(server);
    let code = launch_exit_code(&outcomes);
    if code != 0 {
        eprint!("symmrun: failed:\n{}", report(&outcomes));
    }
    if outcomes.iter().any(|o| o.status == ChildStatus::TimedOut) {
        eprintln!("symmrun: timeout after {:?}", args.timeout.unwrap_or_default());
    }
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn parses() {
        let a = parse(&v("--nproc-per-node 4 --master-port=29501 --timeout 2.5 -- prog --x 1")).unwrap();
        assert_eq!(a.nproc, Some(4));
        assert_eq!(a.port, 29501);
        assert_eq!(a.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(a.program, v("prog --x 1"));
        assert_eq!(parse(&v("--nproc_per_node=2 prog a")).unwrap().program, v("prog a"));
        assert!(parse(&v("--nproc-per-node 0 -- p")).is_err());
        assert!(parse(&v("--nproc-per-node 2")).is_err());
        assert!(parse(&v("--bogus -- p")).is_err());
        assert!(parse(&v("--store-only")).unwrap().store_only);
    }
}
