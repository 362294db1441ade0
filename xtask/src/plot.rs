//! A hand-written SVG plot of benchmark results: per collective, latency and
//! bus bandwidth against message size on log axes, one line per
//! (algorithm, mode), NCCL dashed.
//!
//! The input is symm-bench's JSON. Records are found anywhere in it: any
//! object with a size (`bytes`, `size_bytes` or `size`) and a time (`time_us`,
//! `median_us`, `latency_us` or `us`). Optional fields: `op` (or
//! `collective`), `algo` (or `algorithm`, `impl`, `engine`), `mode` (or a
//! boolean `graph`), `busbw` (or `busbw_gbps`, GB/s).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::util::Result;

/// One measured point.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub op: String,
    pub series: String,
    pub bytes: f64,
    pub time_us: f64,
    pub busbw: Option<f64>,
}

fn num(o: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<f64> {
    keys.iter()
        .find_map(|k| o.get(*k).and_then(Value::as_f64))
        .filter(|v| v.is_finite())
}

fn text(o: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| o.get(*k).and_then(Value::as_str))
        .map(String::from)
}

/// Every record in `v` (depth-first, in order).
pub fn points(v: &Value) -> Vec<Point> {
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

fn walk(v: &Value, out: &mut Vec<Point>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
        Value::Object(o) => {
            let bytes = num(o, &["bytes", "size_bytes", "size"]);
            let time = num(o, &["time_us", "median_us", "latency_us", "us"]);
            if let (Some(bytes), Some(time_us)) = (bytes, time) {
                let algo = text(o, &["algo", "algorithm", "impl", "engine"]).unwrap_or_else(|| "symm".into());
                let mode = text(o, &["mode"]).or_else(|| {
                    o.get("graph")
                        .and_then(Value::as_bool)
                        .map(|g| if g { "graph" } else { "eager" }.to_string())
                });
                let series = match mode {
                    Some(m) => format!("{algo} ({m})"),
                    None => algo,
                };
                out.push(Point {
                    op: text(o, &["op", "collective"]).unwrap_or_else(|| "all_reduce".into()),
                    series,
                    bytes,
                    time_us,
                    busbw: num(o, &["busbw", "busbw_gbps", "busbw_GBps"]),
                });
            } else {
                o.values().for_each(|x| walk(x, out));
            }
        }
        _ => {}
    }
}

/// A log-scale axis over `[lo, hi]` (both > 0) mapped onto `[a, b]` pixels.
#[derive(Debug, Clone, Copy)]
pub struct LogAxis {
    lo: f64,
    hi: f64,
    a: f64,
    b: f64,
}

impl LogAxis {
    pub fn new(lo: f64, hi: f64, a: f64, b: f64) -> Self {
        let (lo, hi) = if hi > lo { (lo, hi) } else { (lo / 2.0, lo * 2.0) };
        LogAxis { lo, hi, a, b }
    }
    pub fn map(&self, v: f64) -> f64 {
        let t = (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        self.a + t * (self.b - self.a)
    }
}

/// Ticks for a base-`base` log axis: every power of `base` in `[lo, hi]`.
fn ticks(lo: f64, hi: f64, base: f64) -> Vec<f64> {
    let mut v = Vec::new();
    let mut t = base.powf((lo.ln() / base.ln()).floor());
    while t <= hi * 1.0001 {
        if t >= lo * 0.9999 {
            v.push(t);
        }
        t *= base;
    }
    v
}

pub fn size_label(bytes: f64) -> String {
    let b = bytes.round() as u64;
    match b {
        _ if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        _ if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        _ if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        _ => format!("{b}"),
    }
}

fn num_label(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
];
const PW: f64 = 420.0; // panel width
const PH: f64 = 280.0; // panel height
const ML: f64 = 64.0; // left margin inside a panel cell
const MT: f64 = 30.0;
const CELL_W: f64 = PW + ML + 20.0;
const CELL_H: f64 = PH + MT + 50.0;
const LEGEND_W: f64 = 230.0;

/// (y label, value of a point, log base of the y axis).
type Panel = (&'static str, fn(&Point) -> Option<f64>, f64);

/// Renders `pts` as an SVG document.
pub fn svg(pts: &[Point], title: &str) -> String {
    let mut ops: Vec<String> = Vec::new();
    let mut series: Vec<String> = Vec::new();
    for p in pts {
        if !ops.contains(&p.op) {
            ops.push(p.op.clone());
        }
        if !series.contains(&p.series) {
            series.push(p.series.clone());
        }
    }
    let color = |s: &str| COLORS[series.iter().position(|x| x == s).unwrap_or(0) % COLORS.len()];
    let width = 2.0 * CELL_W + LEGEND_W;
    let height = 40.0 + CELL_H * ops.len().max(1) as f64;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="10" y="24" font-size="16" font-weight="bold">{}</text>"#,
        esc(title)
    );
    if pts.is_empty() {
        let _ = writeln!(o, r#"<text x="10" y="60">no data points</text></svg>"#);
        return o;
    }
    for (row, op) in ops.iter().enumerate() {
        let y0 = 40.0 + CELL_H * row as f64;
        let in_op: Vec<&Point> = pts.iter().filter(|p| &p.op == op).collect();
        let panels: [Panel; 2] = [
            ("latency (us)", |p: &Point| Some(p.time_us), 10.0),
            ("busbw (GB/s)", |p: &Point| p.busbw, 10.0),
        ];
        for (col, (ylabel, get, ybase)) in panels.iter().enumerate() {
            let x0 = CELL_W * col as f64 + ML;
            let top = y0 + MT;
            let vals: Vec<(f64, f64)> = in_op
                .iter()
                .filter_map(|p| get(p).map(|y| (p.bytes, y)))
                .filter(|(x, y)| *x > 0.0 && *y > 0.0)
                .collect();
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{}" font-size="13" font-weight="bold">{} — {}</text>"#,
                x0,
                top - 10.0,
                esc(op),
                esc(ylabel)
            );
            let _ = writeln!(
                o,
                r##"<rect x="{x0}" y="{top}" width="{PW}" height="{PH}" fill="none" stroke="#444"/>"##
            );
            if vals.is_empty() {
                let _ = writeln!(o, r#"<text x="{}" y="{}">no data</text>"#, x0 + 10.0, top + 20.0);
                continue;
            }
            let (xmin, xmax) = vals
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), (x, _)| (a.min(*x), b.max(*x)));
            let (ymin, ymax) = vals
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), (_, y)| (a.min(*y), b.max(*y)));
            let (ylo, yhi) = (
                ybase.powf((ymin.ln() / ybase.ln()).floor()),
                ybase.powf((ymax.ln() / ybase.ln()).ceil()),
            );
            let xa = LogAxis::new(xmin, xmax, x0 + 8.0, x0 + PW - 8.0);
            let ya = LogAxis::new(ylo, yhi, top + PH, top);
            // grid + ticks
            let xt = ticks(xmin, xmax, 4.0);
            let step = xt.len().div_ceil(8).max(1);
            for (i, t) in xt.iter().enumerate() {
                let x = xa.map(*t);
                let _ = writeln!(
                    o,
                    r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{}" stroke="#ddd"/>"##,
                    top + PH
                );
                if i % step == 0 {
                    let _ = writeln!(
                        o,
                        r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
                        top + PH + 14.0,
                        size_label(*t)
                    );
                }
            }
            for t in ticks(ylo, yhi, *ybase) {
                let y = ya.map(t);
                let _ = writeln!(
                    o,
                    r##"<line x1="{x0}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##,
                    x0 + PW
                );
                let _ = writeln!(
                    o,
                    r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                    x0 - 4.0,
                    y + 4.0,
                    num_label(t)
                );
            }
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{}" text-anchor="middle">message size (bytes)</text>"#,
                x0 + PW / 2.0,
                top + PH + 30.0
            );
            // one line per series
            let mut by_series: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
            for p in &in_op {
                if let Some(y) = get(p).filter(|y| *y > 0.0 && p.bytes > 0.0) {
                    let i = series.iter().position(|s| s == &p.series).unwrap_or(0);
                    by_series.entry(i).or_default().push((p.bytes, y));
                }
            }
            for (i, mut line) in by_series {
                line.sort_by(|a, b| a.0.total_cmp(&b.0));
                let s = &series[i];
                let dash = if s.to_lowercase().contains("nccl") {
                    r#" stroke-dasharray="6,3""#
                } else {
                    ""
                };
                let pts_attr: Vec<String> = line
                    .iter()
                    .map(|(x, y)| format!("{:.1},{:.1}", xa.map(*x), ya.map(*y)))
                    .collect();
                let _ = writeln!(
                    o,
                    r#"<polyline fill="none" stroke="{}" stroke-width="1.8"{dash} points="{}"><title>{}</title></polyline>"#,
                    color(s),
                    pts_attr.join(" "),
                    esc(s)
                );
                for (x, y) in &line {
                    let _ = writeln!(
                        o,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="2.2" fill="{}"/>"#,
                        xa.map(*x),
                        ya.map(*y),
                        color(s)
                    );
                }
            }
        }
        // legend
        let lx = 2.0 * CELL_W + 10.0;
        let mut ly = y0 + MT + 10.0;
        for s in series.iter().filter(|s| in_op.iter().any(|p| &p.series == *s)) {
            let dash = if s.to_lowercase().contains("nccl") {
                r#" stroke-dasharray="6,3""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/>"#,
                lx + 24.0,
                color(s)
            );
            let _ = writeln!(o, r#"<text x="{}" y="{}">{}</text>"#, lx + 30.0, ly + 4.0, esc(s));
            ly += 16.0;
        }
    }
    o.push_str("</svg>\n");
    o
}

/// Reads `json`, writes the plot to `svg_path`; returns the number of points.
pub fn plot_file(json: &Path, svg_path: &Path) -> Result<usize> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("read {}: {e}", json.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", json.display()))?;
    let pts = points(&v);
    if pts.is_empty() {
        return Err(format!(
            "{} holds no benchmark records (objects with `bytes` and `time_us`)",
            json.display()
        ));
    }
    let mut title = "symm benchmark".to_string();
    if let Some(b) = v.get("backend").and_then(Value::as_str) {
        title.push_str(&format!(" — {b}"));
    }
    if let Some(w) = v.get("world").and_then(Value::as_u64) {
        title.push_str(&format!(", {w} ranks"));
    }
    if let Some(f) = json.file_name() {
        title.push_str(&format!(" — {}", f.to_string_lossy()));
    }
    std::fs::write(svg_path, svg(&pts, &title)).map_err(|e| format!("write {}: {e}", svg_path.display()))?;
    Ok(pts.len())
}

/// `cargo xtask plot BENCH.json [--out PLOT.svg]`.
pub fn main(args: &[String]) -> Result<()> {
    let mut json = None;
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = Some(it.next().ok_or("--out needs a file")?.clone()),
            s if json.is_none() && !s.starts_with('-') => json = Some(s.to_string()),
            other => {
                return Err(format!(
                    "plot: unexpected argument {other:?} (usage: plot BENCH.json [--out PLOT.svg])"
                ))
            }
        }
    }
    let json = json.ok_or("usage: plot BENCH.json [--out PLOT.svg]")?;
    let out = out.unwrap_or_else(|| Path::new(&json).with_extension("svg").to_string_lossy().into_owned());
    let n = plot_file(Path::new(&json), Path::new(&out))?;
    println!("plot: {n} points -> {out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_records_anywhere() {
        let v: Value = serde_json::from_str(
            r#"{"machine":"x","results":[
                {"op":"all_reduce","algo":"one_shot","mode":"graph","bytes":1024,"time_us":2.5,"busbw":0.4},
                {"op":"all_reduce","algo":"nccl","graph":false,"bytes":1024,"time_us":30.0},
                {"nested":{"collective":"all_gather","engine":"nccl","size":4096,"median_us":11}}
            ]}"#,
        )
        .unwrap();
        let p = points(&v);
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].series, "one_shot (graph)");
        assert_eq!(p[0].busbw, Some(0.4));
        assert_eq!(p[1].series, "nccl (eager)");
        assert_eq!(p[1].busbw, None);
        assert_eq!(p[2].op, "all_gather");
        assert_eq!(p[2].time_us, 11.0);
    }

    #[test]
    fn log_axis_maps_decades_evenly() {
        let a = LogAxis::new(1.0, 100.0, 0.0, 200.0);
        assert!((a.map(1.0) - 0.0).abs() < 1e-9);
        assert!((a.map(10.0) - 100.0).abs() < 1e-9);
        assert!((a.map(100.0) - 200.0).abs() < 1e-9);
        // inverted pixel range (y axes)
        let y = LogAxis::new(1.0, 100.0, 300.0, 0.0);
        assert!((y.map(10.0) - 150.0).abs() < 1e-9);
        assert_eq!(ticks(1024.0, 65536.0, 4.0), vec![1024.0, 4096.0, 16384.0, 65536.0]);
        assert_eq!(size_label(4096.0), "4K");
        assert_eq!(size_label(256.0 * 1048576.0), "256M");
        assert_eq!(size_label(1000.0), "1000");
    }

    #[test]
    fn svg_has_a_line_per_series_and_escapes_text() {
        let mk = |series: &str, bytes: f64, t: f64| Point {
            op: "all_reduce".into(),
            series: series.into(),
            bytes,
            time_us: t,
            busbw: Some(bytes / t / 1000.0),
        };
        let pts = vec![
            mk("one_shot", 1024.0, 2.0),
            mk("one_shot", 4096.0, 2.5),
            mk("nccl", 1024.0, 10.0),
            mk("nccl", 4096.0, 11.0),
            mk("a<b", 1024.0, 3.0),
        ];
        let s = svg(&pts, "t & t");
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        // 3 series x 2 panels
        assert_eq!(s.matches("<polyline").count(), 6);
        assert_eq!(s.matches("stroke-dasharray").count(), 2 + 1); // nccl in 2 panels + legend
        assert!(s.contains("t &amp; t"));
        assert!(s.contains("a&lt;b"));
        assert!(!s.contains("NaN"));
        assert!(svg(&[], "empty").contains("no data points"));
    }
}
