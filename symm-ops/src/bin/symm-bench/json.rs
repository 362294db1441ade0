//! symm-bench's JSON (`--json PATH`): the document of one run, written with serde_json. Its
//! shape is what xtask's plot reads (docs/benchmarks.md, "symm-bench's interface"): `tool`,
//! `backend`, `world`, `dtype`, `redop`, `rounds`, one object per row under `results`, the setup
//! costs under `setup`. Times that did not come out (NaN) are `null`.

use serde::Serialize;

use super::*;

/// The whole document.
#[derive(Debug, Serialize)]
struct Document<'a> {
    tool: &'static str,
    backend: &'a str,
    world: usize,
    dtype: &'static str,
    redop: &'static str,
    rounds: usize,
    results: Vec<Record<'a>>,
    setup: Vec<Setup<'a>>,
}

/// One row of the tables.
#[derive(Debug, Serialize)]
struct Record<'a> {
    op: &'static str,
    bytes: usize,
    count: usize,
    dtype: &'static str,
    redop: &'static str,
    algo: &'a str,
    path: &'a str,
    mode: &'static str,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    max_err: f64,
    ok: bool,
    note: &'a str,
}

/// One setup cost.
#[derive(Debug, Serialize)]
struct Setup<'a> {
    what: &'a str,
    size_bytes: usize,
    median_ms: f64,
}

/// The document of a run (pretty-printed, ending in a newline).
pub(crate) fn document(
    backend: &str,
    world: usize,
    args: &Args,
    rows: &[Row],
    setup: &[SetupCost],
) -> serde_json::Result<String> {
    let doc = Document {
        tool: "symm-bench",
        backend,
        world,
        dtype: args.dtype.name(),
        redop: args.redop.name(),
        rounds: args.rounds,
        results: rows
            .iter()
            .map(|r| Record {
                op: r.op.name(),
                bytes: r.bytes,
                count: r.count,
                dtype: r.dtype.name(),
                redop: r.redop.name(),
                algo: &r.algo,
                path: &r.path,
                mode: r.mode.name(),
                time_us: r.time_us,
                algbw: r.algbw(),
                busbw: r.busbw(),
                max_err: r.max_err,
                ok: r.ok,
                note: &r.note,
            })
            .collect(),
        setup: setup
            .iter()
            .map(|c| Setup {
                what: &c.what,
                size_bytes: c.bytes,
                median_ms: c.median_ms,
            })
            .collect(),
    };
    let mut s = serde_json::to_string_pretty(&doc)?;
    s.push('\n');
    Ok(s)
}

/// Writes the document of a run to `path`.
pub(crate) fn write(
    path: &Path,
    backend: &str,
    world: usize,
    args: &Args,
    rows: &[Row],
    setup: &[SetupCost],
) -> BoxResult<()> {
    std::fs::write(path, document(backend, world, args, rows, setup)?)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(())
}
