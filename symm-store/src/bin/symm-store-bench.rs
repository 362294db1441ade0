//! set/get round trips per second through a TcpStore: ours and PyTorch's, same run.
//!
//! ```text
//! symm-store-bench [--seconds S] [--clients 1,64] [--value-bytes B] [--python PY] [--torch-script PATH] [--no-torch]
//! ```
//! One "pair" is a SET then a GET of the same key by one client (the GET is a WAIT + GET
//! on the wire, as PyTorch's client does it). Rows: our server with our clients; and when
//! `PY -c 'import torch.distributed'` works: torch's server with torch clients, our server
//! with torch clients, torch's server with our clients. Torch clients are threads of one
//! Python process, each with its own connection.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use symm_store::knobs;

use symm_store::{Store, TcpServer, TcpStore};

struct Args {
    seconds: f64,
    clients: Vec<usize>,
    value_bytes: usize,
    python: String,
    script: String,
    torch: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seconds: 2.0,
        clients: vec![1, 64],
        value_bytes: 64,
        python: knobs::get(knobs::BENCH_PYTHON).unwrap_or("python3").into(),
        script: knobs::get(knobs::BENCH_TORCH_SCRIPT)
            .unwrap_or(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/torch_store_bench.py"))
            .into(),
        torch: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--seconds" => a.seconds = v()?.parse().map_err(|_| "bad --seconds")?,
            "--clients" => {
                a.clients = v()?
                    .split(',')
                    .map(|c| c.parse::<usize>().map_err(|_| "bad --clients".to_string()))
                    .collect::<Result<_, _>>()?
            }
            "--value-bytes" => a.value_bytes = v()?.parse().map_err(|_| "bad --value-bytes")?,
            "--python" => a.python = v()?,
            "--torch-script" => a.script = v()?,
            "--no-torch" => a.torch = false,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if !(a.seconds > 0.0 && a.seconds.is_finite()) || a.clients.contains(&0) {
        return Err("--seconds must be > 0 and client counts >= 1".into());
    }
    Ok(a)
}

/// Our clients against `addr`: total pairs and elapsed seconds.
fn our_clients(addr: SocketAddr, n: usize, seconds: f64, value_bytes: usize) -> Result<(u64, f64), String> {
    let clients: Vec<Arc<TcpStore>> = (0..n)
        .map(|_| TcpStore::connect(addr, Duration::from_secs(60)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let barrier = Arc::new(Barrier::new(n + 1));
    let dur = Duration::from_secs_f64(seconds);
    let value = vec![b'x'; value_bytes];
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let barrier = barrier.clone();
            let value = value.clone();
            std::thread::spawn(move || -> Result<u64, String> {
                barrier.wait();
                let t0 = Instant::now();
                let mut k = 0u64;
                while t0.elapsed() < dur {
                    let key = format!("bench/{i}/{}", k % 128);
                    c.set(&key, &value).map_err(|e| e.to_string())?;
                    if c.get(&key).map_err(|e| e.to_string())? != value {
                        return Err("bad value".into());
                    }
                    k += 1;
                }
                Ok(k)
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    let mut total = 0;
    for h in handles {
        total += h.join().map_err(|_| "client thread panicked".to_string())??;
    }
    Ok((total, t0.elapsed().as_secs_f64()))
}

/// Runs the Python side in client mode; parses its JSON line.
fn torch_clients(a: &Args, n: usize, connect: Option<SocketAddr>) -> Result<(u64, f64), String> {
    let mut cmd = Command::new(&a.python);
    cmd.arg(&a.script)
        .args(["--clients", &n.to_string(), "--seconds", &a.seconds.to_string()])
        .args(["--value-bytes", &a.value_bytes.to_string()]);
    if let Some(c) = connect {
        cmd.args(["--connect", &c.to_string()]);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", a.python))?;
    if !out.status.success() {
        return Err(format!("torch bench failed: {}", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("no JSON line from the torch bench")?;
    let num = |key: &str| -> Option<f64> {
        let i = line.find(&format!("\"{key}\":"))? + key.len() + 3;
        line[i..].trim_start().split([',', '}']).next()?.trim().parse().ok()
    };
    match (num("pairs"), num("seconds")) {
        (Some(p), Some(s)) => Ok((p as u64, s)),
        _ => Err(format!("cannot parse {line:?}")),
    }
}

fn row(server: &str, client: &str, n: usize, r: Result<(u64, f64), String>) {
    match r {
        Ok((pairs, secs)) => {
            let rate = pairs as f64 / secs;
            let lat_us = if pairs > 0 {
                secs * 1e6 * n as f64 / pairs as f64
            } else {
                f64::NAN
            };
            println!("| {server:<6} | {client:<6} | {n:>7} | {rate:>12.0} | {lat_us:>14.1} |");
        }
        Err(e) => println!("| {server:<6} | {client:<6} | {n:>7} | error: {e} |"),
    }
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("symm-store-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let has_torch = a.torch
        && Command::new(&a.python)
            .args(["-c", "import torch.distributed"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
    println!(
        "set/get pairs per second ({} s per row, {}-byte values)",
        a.seconds, a.value_bytes
    );
    println!("| server | client | clients | pairs/s      | us/pair/client |");
    println!("| ------ | ------ | ------: | -----------: | -------------: |");
    let ours = match TcpServer::bind(SocketAddr::from(([127, 0, 0, 1], 0))) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("symm-store-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let our_addr = ours.local_addr();
    // A torch server for our clients (python --serve), if torch is there.
    let mut torch_srv = None;
    if has_torch {
        let child = Command::new(&a.python)
            .arg(&a.script)
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        if let Ok(mut child) = child {
            let port = child.stdout.take().and_then(|o| {
                let mut line = String::new();
                BufReader::new(o).read_line(&mut line).ok()?;
                line.strip_prefix("PORT ")?.trim().parse::<u16>().ok()
            });
            match port {
                Some(p) => torch_srv = Some((child, SocketAddr::from(([127, 0, 0, 1], p)))),
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }
    for &n in &a.clients {
        row("ours", "ours", n, our_clients(our_addr, n, a.seconds, a.value_bytes));
        if has_torch {
            row("torch", "torch", n, torch_clients(&a, n, None));
            row("ours", "torch", n, torch_clients(&a, n, Some(our_addr)));
            if let Some((_, addr)) = &torch_srv {
                row("torch", "ours", n, our_clients(*addr, n, a.seconds, a.value_bytes));
            }
        }
    }
    if !has_torch {
        println!(
            "torch rows skipped: `{} -c 'import torch.distributed'` failed (use --python)",
            a.python
        );
    }
    if let Some((mut child, _)) = torch_srv {
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.flush();
        }
        let _ = child.wait();
    }
    ExitCode::SUCCESS
}
