//! Hand-written SVG plots of benchmark results (no plotting crate).
//!
//! From one symm-bench JSON, [`plot_file`] writes two figures:
//!
//! - `bench.svg`, the comparison a reader looks for first: per collective,
//!   `auto` (symm's per-size choice) against NCCL, and against PyTorch
//!   symmetric memory when the PyTorch anchors are given, in CUDA-graph and
//!   eager mode. Left: latency against size (log-log). Right: time relative to
//!   NCCL at each size and mode (log y), with the 1x line marked `NCCL`. When
//!   no NCCL record exists (the host backend), `auto` alone, and the subtitle
//!   says that NCCL did not run.
//! - `bench-detail.svg` next to it: every (algorithm, mode) series, latency and
//!   bus bandwidth, each series in its own style (colour, marker, dash).
//!
//! A JSON without benchmark records (a `--probe` / `--probe-bw` run: their
//! tables go to stdout only) gets a note, with the JSON's other tables (setup
//! costs) drawn as tables, in `bench.svg` instead.
//!
//! Records are found anywhere in the JSON: any object with a size (`bytes`,
//! `size_bytes` or `size`) and a time (`time_us`, `median_us`, `latency_us` or
//! `us`). Optional fields: `op` (or `collective`), `algo` (or `algorithm`,
//! `impl`, `engine`), `mode` (or a boolean `graph`), `busbw` (or `busbw_gbps`,
//! GB/s), `path` (what `auto` ran). Records with `"ok": false` or a null time
//! (failed their check, did not run) are left out and counted.
//!
//! PyTorch anchors (`anchors_torch.py --out anchors.json`, its own file, or
//! nested anywhere in the main JSON) are wide rows: `bytes` and one
//! `<impl>_<mode>_us` column per implementation, under `rows` (all-reduce:
//! `nccl`, `one_shot`, `two_shot`, `nccl_win`) and `gather_scatter`
//! (`nccl_all_gather`, `nccl_reduce_scatter`, `symm_reduce_scatter`). They
//! become the series `torch nccl`, `torch one_shot`, ... and, in the
//! comparison, `torch symm_mem`: the faster of PyTorch's symmetric-memory
//! implementations at each size.
//!
//! The parts: `records` (the JSON's records and anchors), `comparison` (the
//! first figure), `detail` (the second), `note` (the probe-only note); under
//! them `meta` (what the titles say), `style` (colours, markers, dashes),
//! `panel` (a frame with log axes), `axes` (log axes, ticks, labels) and `svg`
//! (the SVG writer).

mod axes;
mod comparison;
mod detail;
mod meta;
mod note;
mod panel;
mod records;
mod style;
mod svg;
mod tp;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::Result;
use comparison::comparison_svg;
use detail::detail_svg;
use meta::Meta;
use records::{anchors, records, NCCL, TORCH_NCCL};

/// `bench.svg` -> `bench-detail.svg`, in the same folder.
pub fn detail_path(svg: &Path) -> PathBuf {
    let stem = svg
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bench".into());
    svg.with_file_name(format!("{stem}-detail.svg"))
}

/// What [`plot_file`] did.
#[derive(Debug, Clone, Default)]
pub struct Plotted {
    /// Records plotted (symm-bench and anchors).
    pub points: usize,
    /// Records left out (failed their check, did not run).
    pub failed: usize,
    /// The figures written, the comparison first.
    pub files: Vec<PathBuf>,
    /// Set when the JSON had no benchmark records and a note was written instead.
    pub note: Option<String>,
    /// Whether the comparison has NCCL to compare with.
    pub nccl: bool,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))
}

fn write(path: &Path, s: &str) -> Result<()> {
    std::fs::write(path, s).map_err(|e| format!("write {}: {e}", path.display()))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Reads `json` (and the PyTorch anchors in `anchors`, if given), writes the
/// comparison to `svg_path` and the detail next to it ([`detail_path`]). A JSON
/// from symm-bench without benchmark records (`--probe`) gets a note in
/// `svg_path` instead, and is not an error.
pub fn plot_file(json: &Path, anchors_json: Option<&Path>, svg_path: &Path) -> Result<Plotted> {
    let v = read_json(json)?;
    if tp::is_tp_layer(&v) {
        // The tensor-parallel layer's JSON: one figure of its own.
        let svg = tp::tp_svg(&v, &format!("tp-layer: {}", file_name(json)))
            .ok_or_else(|| format!("{} holds no timed tp-layer rows", json.display()))?;
        write(svg_path, &svg)?;
        return Ok(Plotted {
            points: v["rows"].as_array().map_or(0, |r| r.len()),
            failed: 0,
            files: vec![svg_path.to_path_buf()],
            note: Some("tensor-parallel layer rows".into()),
            nccl: false,
        });
    }
    let rec = records(&v);
    let mut meta = Meta::from_json(&v, &file_name(json));
    let mut pts = rec.points;
    let mut anc = anchors(&v);
    if let Some(a) = anchors_json {
        let av = read_json(a)?;
        let more = anchors(&av);
        if more.points.is_empty() {
            return Err(format!(
                "{} holds no PyTorch anchors (`rows` of `<impl>_<mode>_us` columns, as anchors_torch.py writes)",
                a.display()
            ));
        }
        anc.world = anc.world.or(more.world);
        if anc.versions.is_empty() {
            anc.versions = more.versions;
        }
        anc.points.extend(more.points);
        meta.anchors = Some(file_name(a));
    }
    if !anc.points.is_empty() {
        if let (Some(w), Some(aw)) = (meta.world, anc.world) {
            if w != aw {
                return Err(format!(
                    "the anchors ran on {aw} ranks, {} on {w}: not comparable",
                    file_name(json)
                ));
            }
        }
        let name = meta.anchors.take().unwrap_or_else(|| file_name(json));
        meta.anchors = Some(if anc.versions.is_empty() {
            name
        } else {
            format!("{name} ({})", anc.versions)
        });
        meta.world = meta.world.or(anc.world);
        pts.extend(anc.points);
    }
    let detail = detail_path(svg_path);
    meta.detail = Some(file_name(&detail));
    if pts.is_empty() {
        return note::plot_note(&v, json, svg_path, &detail, &meta, rec.failed);
    }
    write(svg_path, &comparison_svg(&pts, &meta))?;
    write(&detail, &detail_svg(&pts, &meta))?;
    Ok(Plotted {
        points: pts.len(),
        failed: rec.failed,
        files: vec![svg_path.to_path_buf(), detail],
        note: None,
        nccl: pts.iter().any(|p| p.algo == NCCL || p.algo == TORCH_NCCL),
    })
}

const USAGE: &str = "usage: plot BENCH.json [--anchors ANCHORS.json] [--out PLOT.svg]";

/// `cargo xtask plot BENCH.json [--anchors ANCHORS.json] [--out PLOT.svg]`:
/// PLOT.svg (default: BENCH.svg) and PLOT-detail.svg.
pub fn main(args: &[String]) -> Result<()> {
    let mut json = None;
    let mut out = None;
    let mut anchors_json = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = Some(it.next().ok_or("--out needs a file")?.clone()),
            "--anchors" => anchors_json = Some(it.next().ok_or("--anchors needs a file")?.clone()),
            s if json.is_none() && !s.starts_with('-') => json = Some(s.to_string()),
            other => return Err(format!("plot: unexpected argument {other:?} ({USAGE})")),
        }
    }
    let json = json.ok_or(USAGE)?;
    let out = out.unwrap_or_else(|| Path::new(&json).with_extension("svg").to_string_lossy().into_owned());
    let r = plot_file(
        Path::new(&json),
        anchors_json.as_deref().map(Path::new),
        Path::new(&out),
    )?;
    println!("{}", summary(&r));
    Ok(())
}

/// One line saying what was plotted and where the figures went.
pub fn summary(r: &Plotted) -> String {
    let files: Vec<String> = r.files.iter().map(|f| f.display().to_string()).collect();
    let failed = if r.failed > 0 {
        format!(" ({} failed or skipped rows left out)", r.failed)
    } else {
        String::new()
    };
    match &r.note {
        Some(n) => format!("plot: {n} -> {}", files.join(", ")),
        None => format!(
            "plot: {} points{failed} -> {} ({}), {} (every algorithm)",
            r.points,
            files.first().map(String::as_str).unwrap_or("-"),
            if r.nccl {
                "auto against NCCL"
            } else {
                "auto; no NCCL records"
            },
            files.get(1).map(String::as_str).unwrap_or("-")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::records::Point;
    use super::*;

    /// A point of `op`, `algo`, `mode`, with a busbw.
    pub(super) fn mk(op: &str, algo: &str, mode: &str, bytes: f64, t: f64) -> Point {
        Point::new(op, algo, Some(mode), bytes, t, Some(bytes / t / 1000.0))
    }

    /// A GPU-like run: auto, nccl and four algorithms, graph and eager, 1K..256M.
    pub(super) fn gpu_like() -> Vec<Point> {
        let mut v = Vec::new();
        for op in ["all_reduce", "all_gather"] {
            for k in 0..10 {
                let b = 1024.0 * 4f64.powi(k);
                for (algo, base, bw) in [
                    ("auto", 2.5, 300.0),
                    ("nccl", 6.0, 280.0),
                    ("one_shot", 5.0, 150.0),
                    ("two_shot", 8.0, 300.0),
                    ("lamport", 2.4, 120.0),
                    ("copy_engine", 12.0, 320.0),
                ] {
                    for (mode, extra) in [("graph", 0.0), ("eager", 1.5)] {
                        v.push(mk(op, algo, mode, b, base + extra + b / (bw * 1e3)));
                    }
                }
            }
        }
        v
    }

    /// No NaN or infinity printed as a coordinate.
    pub(super) fn finite(svg: &str) -> bool {
        !["NaN", "inf\"", "inf,", "inf ", "=\"-inf"]
            .iter()
            .any(|b| svg.contains(b))
    }

    /// The values of every `attr="..."` in `svg`, in order.
    pub(super) fn attr_values(svg: &str, attr: &str) -> Vec<String> {
        let pat = format!("{attr}=\"");
        svg.match_indices(&pat)
            .filter_map(|(i, _)| {
                let rest = &svg[i + pat.len()..];
                rest.find('"').map(|j| rest[..j].to_string())
            })
            .collect()
    }

    /// A fresh temporary folder for one test, holding `file` with `text` in it:
    /// (folder, file).
    pub(super) fn tmp_file(name: &str, file: &str, text: &str) -> (PathBuf, PathBuf) {
        let d = std::env::temp_dir().join(format!("xtask-plot-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join(file);
        std::fs::write(&f, text).unwrap();
        (d, f)
    }

    #[test]
    fn plot_file_writes_both_figures_and_checks_the_anchors() {
        let (d, json) = tmp_file(
            "files",
            "run.json",
            r#"{"tool": "symm-bench", "backend": "2 x GPU", "world": 2, "results": [
                {"op":"all_reduce","algo":"auto","mode":"graph","bytes":1024,"time_us":2.5,"busbw":0.4,"ok":true},
                {"op":"all_reduce","algo":"nccl","mode":"graph","bytes":1024,"time_us":6.0,"busbw":0.2,"ok":true},
                {"op":"all_reduce","algo":"one_shot","mode":"graph","bytes":1024,"time_us":3.0,"ok":false}]}"#,
        );
        let svg = d.join("out.svg");
        let r = plot_file(&json, None, &svg).unwrap();
        assert_eq!((r.points, r.failed), (2, 1));
        assert_eq!(r.files, vec![svg.clone(), d.join("out-detail.svg")]);
        assert!(r.files.iter().all(|f| f.is_file()));
        assert!(summary(&r).contains("out-detail.svg"));

        let anchors_json = d.join("anchors.json");
        std::fs::write(
            &anchors_json,
            r#"{"world_size": 2, "rows": [{"bytes": 1024, "nccl_graph_us": 7.0, "one_shot_graph_us": 3.0}]}"#,
        )
        .unwrap();
        let r = plot_file(&json, Some(&anchors_json), &svg).unwrap();
        assert_eq!(r.points, 4);
        let s = std::fs::read_to_string(&svg).unwrap();
        assert!(s.contains("torch symm_mem (graph)") && s.contains("anchors.json"));
        std::fs::write(
            &anchors_json,
            r#"{"world_size": 4, "rows": [{"bytes": 1024, "nccl_graph_us": 7.0}]}"#,
        )
        .unwrap();
        assert!(plot_file(&json, Some(&anchors_json), &svg)
            .unwrap_err()
            .contains("4 ranks"));
        std::fs::write(&anchors_json, r#"{"rows": []}"#).unwrap();
        assert!(plot_file(&json, Some(&anchors_json), &svg).is_err());
        assert_eq!(
            detail_path(Path::new("a/bench.svg")),
            PathBuf::from("a/bench-detail.svg")
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
