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

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::util::Result;

// ------------------------------------------------------------------ records

/// One measured point.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub op: String,
    pub algo: String,
    pub mode: Option<String>,
    /// `algo (mode)`, or `algo` without a mode.
    pub series: String,
    pub bytes: f64,
    pub time_us: f64,
    pub busbw: Option<f64>,
    /// What ran (symm-bench's `path`: the algorithm `auto` picked), or empty.
    pub path: String,
}

impl Point {
    pub fn new(op: &str, algo: &str, mode: Option<&str>, bytes: f64, time_us: f64, busbw: Option<f64>) -> Point {
        Point {
            op: op.to_string(),
            algo: algo.to_string(),
            mode: mode.map(String::from),
            series: series_name(algo, mode),
            bytes,
            time_us,
            busbw,
            path: String::new(),
        }
    }
}

pub fn series_name(algo: &str, mode: Option<&str>) -> String {
    match mode {
        Some(m) => format!("{algo} ({m})"),
        None => algo.to_string(),
    }
}

fn num(o: &Map<String, Value>, keys: &[&str]) -> Option<f64> {
    keys.iter()
        .find_map(|k| o.get(*k).and_then(Value::as_f64))
        .filter(|v| v.is_finite())
}

fn text(o: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| o.get(*k).and_then(Value::as_str))
        .map(String::from)
}

const SIZE_KEYS: &[&str] = &["bytes", "size_bytes", "size"];
const TIME_KEYS: &[&str] = &["time_us", "median_us", "latency_us", "us"];

/// The benchmark records of a document, and how many were left out.
#[derive(Debug, Default, Clone)]
pub struct Records {
    pub points: Vec<Point>,
    /// Records marked `"ok": false` or with a null time.
    pub failed: usize,
}

/// Every record in `v` (depth-first, in order), failed ones left out.
pub fn records(v: &Value) -> Records {
    let mut r = Records::default();
    walk(v, &mut r);
    r
}

fn walk(v: &Value, out: &mut Records) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
        Value::Object(o) => {
            let bytes = num(o, SIZE_KEYS);
            let time = num(o, TIME_KEYS);
            match (bytes, time) {
                (Some(bytes), Some(time_us)) => {
                    if o.get("ok").and_then(Value::as_bool) == Some(false) {
                        out.failed += 1;
                        return;
                    }
                    let algo = text(o, &["algo", "algorithm", "impl", "engine"]).unwrap_or_else(|| "symm".into());
                    let mode = text(o, &["mode"]).or_else(|| {
                        o.get("graph")
                            .and_then(Value::as_bool)
                            .map(|g| if g { "graph" } else { "eager" }.to_string())
                    });
                    let op = text(o, &["op", "collective"]).unwrap_or_else(|| "all_reduce".into());
                    let mut p = Point::new(
                        &op,
                        &algo,
                        mode.as_deref(),
                        bytes,
                        time_us,
                        num(o, &["busbw", "busbw_gbps", "busbw_GBps"]),
                    );
                    p.path = text(o, &["path"]).unwrap_or_default();
                    out.points.push(p);
                }
                // A symm-bench row that did not run: `"time_us": null`.
                (Some(_), None) if TIME_KEYS.iter().any(|k| o.get(*k).is_some_and(Value::is_null)) => {
                    out.failed += 1;
                }
                _ => o.values().for_each(|x| walk(x, out)),
            }
        }
        _ => {}
    }
}

/// The PyTorch anchors found in a document.
#[derive(Debug, Default, Clone)]
pub struct Anchors {
    pub points: Vec<Point>,
    /// `world_size` of the anchors run.
    pub world: Option<u64>,
    /// e.g. `PyTorch 2.11, NCCL 2.27.5`.
    pub versions: String,
}

fn is_anchor_row(v: &Value) -> bool {
    v.as_object().is_some_and(|o| {
        num(o, &["bytes"]).is_some() && o.keys().any(|k| k.ends_with("_graph_us") || k.ends_with("_eager_us"))
    })
}

fn is_anchor_doc(o: &Map<String, Value>) -> bool {
    ["rows", "gather_scatter"].iter().any(|k| {
        o.get(*k)
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(is_anchor_row))
    })
}

fn find_anchor_docs<'a>(v: &'a Value, out: &mut Vec<&'a Map<String, Value>>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| find_anchor_docs(x, out)),
        Value::Object(o) if is_anchor_doc(o) => out.push(o),
        Value::Object(o) => o.values().for_each(|x| find_anchor_docs(x, out)),
        _ => {}
    }
}

/// (op, algo, mode) of an anchors column such as `one_shot_graph_us` or
/// `nccl_reduce_scatter_eager_us`.
fn anchor_column(key: &str) -> Option<(&'static str, String, &'static str)> {
    let (rest, mode) = if let Some(r) = key.strip_suffix("_graph_us") {
        (r, "graph")
    } else {
        (key.strip_suffix("_eager_us")?, "eager")
    };
    let (op, who) = if let Some(w) = rest.strip_suffix("_all_gather") {
        ("all_gather", w)
    } else if let Some(w) = rest.strip_suffix("_reduce_scatter") {
        ("reduce_scatter", w)
    } else {
        ("all_reduce", rest)
    };
    if who.is_empty() {
        return None;
    }
    let algo = if who == "symm" {
        "torch symm_mem".to_string()
    } else {
        format!("torch {who}")
    };
    Some((op, algo, mode))
}

/// nccl-tests' bus-bandwidth factor.
fn bus_factor(op: &str, world: u64) -> f64 {
    let n = world.max(1) as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        _ => (n - 1.0) / n,
    }
}

/// The PyTorch anchors anywhere in `v` (see the module doc).
pub fn anchors(v: &Value) -> Anchors {
    let mut docs = Vec::new();
    find_anchor_docs(v, &mut docs);
    let mut a = Anchors::default();
    for d in docs {
        let world = d.get("world_size").and_then(Value::as_u64);
        a.world = a.world.or(world);
        if a.versions.is_empty() {
            let t = text(d, &["torch"]).map(|t| format!("PyTorch {t}"));
            let n = text(d, &["nccl"]).map(|n| format!("NCCL {n}"));
            a.versions = [t, n].into_iter().flatten().collect::<Vec<_>>().join(", ");
        }
        for key in ["rows", "gather_scatter"] {
            for row in d.get(key).and_then(Value::as_array).into_iter().flatten() {
                let Some(o) = row.as_object() else { continue };
                let Some(bytes) = num(o, &["bytes"]) else { continue };
                for (k, val) in o {
                    let (Some((op, algo, mode)), Some(t)) = (anchor_column(k), val.as_f64()) else {
                        continue;
                    };
                    if !(t.is_finite() && t > 0.0) {
                        continue;
                    }
                    let busbw = world.map(|w| bytes / (t * 1e-6) / 1e9 * bus_factor(op, w));
                    a.points.push(Point::new(op, &algo, Some(mode), bytes, t, busbw));
                }
            }
        }
    }
    a
}

// ------------------------------------------------------------------ the comparison

/// One line of the comparison figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub algo: String,
    pub mode: Option<String>,
    pub label: String,
    /// (bytes, value), sorted by size, one value per size.
    pub xy: Vec<(f64, f64)>,
}

/// What the comparison figure draws for one collective.
#[derive(Debug, Clone, PartialEq)]
pub struct OpComparison {
    pub op: String,
    /// The NCCL series the ratios divide by: `nccl` (symm-bench's), else
    /// `torch nccl` (the anchors'); None when NCCL did not run.
    pub reference: Option<String>,
    /// Latency (us) lines: the contenders, then the reference.
    pub latency: Vec<Line>,
    /// Contender time / reference time, same size and mode.
    pub ratio: Vec<Line>,
}

pub const AUTO: &str = "auto";
pub const NCCL: &str = "nccl";
pub const TORCH_NCCL: &str = "torch nccl";
pub const TORCH_SYMM: &str = "torch symm_mem";

fn ordered<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = Vec::new();
    for x in items {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

fn mode_rank(m: &Option<String>) -> usize {
    match m.as_deref() {
        Some("graph") => 0,
        Some("eager") => 1,
        None => 3,
        Some(_) => 2,
    }
}

/// The modes of `pts`, graph first, then eager, then the others.
fn modes_of<'a>(pts: impl Iterator<Item = &'a Point>) -> Vec<Option<String>> {
    let mut m = ordered(pts.map(|p| p.mode.clone()));
    m.sort_by_key(mode_rank);
    m
}

/// Sorted (bytes, time) of the positive points; the fastest time where a size repeats.
fn curve<'a>(pts: impl Iterator<Item = &'a Point>) -> Vec<(f64, f64)> {
    let mut by: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for p in pts.filter(|p| p.bytes > 0.0 && p.time_us > 0.0) {
        let e = by.entry(p.bytes.to_bits()).or_insert((p.bytes, p.time_us));
        e.1 = e.1.min(p.time_us);
    }
    let mut v: Vec<(f64, f64)> = by.into_values().collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

fn is_torch_symm(algo: &str) -> bool {
    algo.starts_with("torch ") && !algo.contains("nccl")
}

/// Which algorithms make up a contender of the comparison.
type Pick = fn(&str) -> bool;

/// Per collective: `auto` and `torch symm_mem` against NCCL.
pub fn comparison(pts: &[Point]) -> Vec<OpComparison> {
    let ops = ordered(pts.iter().map(|p| p.op.clone()));
    let mut out = Vec::new();
    for op in ops {
        let in_op: Vec<&Point> = pts.iter().filter(|p| p.op == op).collect();
        let has = |a: &str| in_op.iter().any(|p| p.algo == a);
        let reference = [NCCL, TORCH_NCCL].into_iter().find(|a| has(a)).map(String::from);
        let mut latency = Vec::new();
        let mut ratio = Vec::new();
        let contenders: [(&str, Pick); 2] = [(AUTO, |a| a == AUTO), (TORCH_SYMM, is_torch_symm)];
        for (name, pick) in contenders {
            let mine: Vec<&Point> = in_op.iter().copied().filter(|p| pick(&p.algo)).collect();
            for mode in modes_of(mine.iter().copied()) {
                let xy = curve(mine.iter().copied().filter(|p| p.mode == mode));
                if xy.is_empty() {
                    continue;
                }
                let label = series_name(name, mode.as_deref());
                if let Some(r) = &reference {
                    let base = curve(in_op.iter().copied().filter(|p| &p.algo == r && p.mode == mode));
                    let rxy: Vec<(f64, f64)> = xy
                        .iter()
                        .filter_map(|(b, t)| base.iter().find(|(rb, _)| rb == b).map(|(_, rt)| (*b, t / rt)))
                        .collect();
                    if !rxy.is_empty() {
                        ratio.push(Line {
                            algo: name.into(),
                            mode: mode.clone(),
                            label: label.clone(),
                            xy: rxy,
                        });
                    }
                }
                latency.push(Line {
                    algo: name.into(),
                    mode,
                    label,
                    xy,
                });
            }
        }
        if let Some(r) = &reference {
            let mine: Vec<&Point> = in_op.iter().copied().filter(|p| &p.algo == r).collect();
            for mode in modes_of(mine.iter().copied()) {
                let xy = curve(mine.iter().copied().filter(|p| p.mode == mode));
                if !xy.is_empty() {
                    let label = series_name(r, mode.as_deref());
                    latency.push(Line {
                        algo: r.clone(),
                        mode,
                        label,
                        xy,
                    });
                }
            }
        }
        out.push(OpComparison {
            op,
            reference,
            latency,
            ratio,
        });
    }
    out
}

// ------------------------------------------------------------------ axes

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
    if !(lo > 0.0 && hi >= lo && base > 1.0 && lo.is_finite() && hi.is_finite()) {
        return v;
    }
    let mut t = base.powf((lo.ln() / base.ln()).floor());
    while t <= hi * 1.0001 && v.len() < 200 {
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
    if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn ratio_label(v: f64) -> String {
    let s = format!("{v:.3}");
    format!("{}×", s.trim_end_matches('0').trim_end_matches('.'))
}

/// A log axis range over `[min, max]` from the 1-2-5 value at or below to the
/// one at or above.
fn decade_bounds(min: f64, max: f64) -> (f64, f64) {
    if !(min > 0.0 && max >= min && max.is_finite()) {
        return (1.0, 10.0);
    }
    let nice = |v: f64, up: bool| {
        let d = 10f64.powf(v.log10().floor());
        let c = [d, 2.0 * d, 5.0 * d, 10.0 * d];
        let eps = 1e-9 * v;
        if up {
            c.into_iter().find(|x| *x >= v - eps).unwrap_or(10.0 * d)
        } else {
            c.into_iter().rev().find(|x| *x <= v + eps).unwrap_or(d)
        }
    };
    let (lo, hi) = (nice(min, false), nice(max, true));
    if hi > lo {
        (lo, hi)
    } else {
        (lo, nice(lo * 1.01, true))
    }
}

/// The range of a ratio axis showing `[min, max]` and 1x with some room: from
/// a tick below to a tick above (powers of two and 1.5 times them).
fn ratio_bounds(min: f64, max: f64) -> (f64, f64) {
    let (min, max) = (min.min(1.0) / 1.08, max.max(1.0) * 1.08);
    let nice = |v: f64, up: bool| {
        let p = 2f64.powf(v.log2().floor());
        let c = [p, 1.5 * p, 2.0 * p];
        if up {
            c.into_iter().find(|x| *x >= v).unwrap_or(2.0 * p)
        } else {
            c.into_iter().rev().find(|x| *x <= v).unwrap_or(p)
        }
    };
    if min > 0.0 && max.is_finite() {
        (nice(min, false), nice(max, true))
    } else {
        (0.5, 2.0)
    }
}

/// The ticks of a ratio axis over `[lo, hi]`: powers of two, and 0.75, 1.5,
/// 3 when the range is narrow.
fn ratio_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut t = ticks(lo, hi, 2.0);
    if t.len() > 9 {
        t = ticks(lo, hi, 4.0);
        if !t.iter().any(|x| (*x - 1.0).abs() < 1e-9) && lo <= 1.0 && hi >= 1.0 {
            t.push(1.0);
        }
    } else if hi / lo < 12.0 {
        // 1.5 times each power of two: 0.375, 0.75, 1.5, 3
        let extra: Vec<f64> = t.iter().map(|x| x * 1.5).chain(t.first().map(|x| x * 0.75)).collect();
        t.extend(extra.into_iter().filter(|x| *x >= lo * 0.9999 && *x <= hi * 1.0001));
    }
    t.sort_by(|a, b| a.total_cmp(b));
    t
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A rough width of `s` in pixels at `size` px sans-serif.
fn text_w(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.58
}

/// `s` broken into lines of at most `chars` characters, at spaces.
fn wrap(s: &str, chars: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for w in s.split(' ') {
        if !cur.is_empty() && cur.chars().count() + 1 + w.chars().count() > chars {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

// ------------------------------------------------------------------ styles

/// A marker shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    Circle,
    Square,
    TriangleUp,
    Diamond,
    TriangleDown,
    Cross,
    Plus,
    Star,
}

impl Marker {
    pub const ALL: [Marker; 8] = [
        Marker::Circle,
        Marker::Square,
        Marker::TriangleUp,
        Marker::Diamond,
        Marker::TriangleDown,
        Marker::Cross,
        Marker::Plus,
        Marker::Star,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Marker::Circle => "circle",
            Marker::Square => "square",
            Marker::TriangleUp => "triangle-up",
            Marker::Diamond => "diamond",
            Marker::TriangleDown => "triangle-down",
            Marker::Cross => "cross",
            Marker::Plus => "plus",
            Marker::Star => "star",
        }
    }
}

/// How one series is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Style {
    pub color: &'static str,
    pub marker: Marker,
    /// SVG `stroke-dasharray`, empty for solid.
    pub dash: &'static str,
    /// Filled marker (graph) or hollow (eager).
    pub filled: bool,
    pub width: f64,
}

impl Style {
    /// What tells this series apart from another: (colour, marker, dash).
    pub fn key(&self) -> (&'static str, Marker, &'static str) {
        (self.color, self.marker, self.dash)
    }
    fn data(&self) -> String {
        format!(
            "{} {} {} {}",
            self.color,
            self.marker.name(),
            if self.dash.is_empty() { "solid" } else { self.dash },
            if self.filled { "filled" } else { "hollow" }
        )
    }
}

/// Colours of the detail figure: `auto` blue and `nccl` near-black, theirs
/// alone; the other algorithms take the others in turn (Tableau 10 and a few
/// more, told apart by marker too when they wrap).
const AUTO_COLOR: &str = "#1f77b4";
const NCCL_COLOR: &str = "#222222";
const OTHER_COLORS: &[&str] = &[
    "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#393b79",
    "#637939", "#7b4173", "#e7ba52",
];
/// Solid (graph), dashed (eager), then the dashes of other modes.
const DASHES: &[&str] = &["", "7,4", "2,3", "10,3,2,3", "1,2", "12,3,3,3"];

/// (dash, filled) of a mode: graph solid and filled, eager dashed and hollow.
fn mode_look(mode: Option<&str>, others: &[String]) -> (&'static str, bool) {
    match mode {
        None | Some("graph") => ("", true),
        Some("eager") => ("7,4", false),
        Some(m) => {
            let k = others.iter().position(|x| x == m).unwrap_or(0);
            let other = &DASHES[2..];
            (other[k % other.len()], k % 2 == 0)
        }
    }
}

/// The algorithms in drawing order: `auto`, `nccl`, the others as they come,
/// the PyTorch anchors last.
fn algo_order(pts: &[Point]) -> Vec<String> {
    let mut algos = ordered(pts.iter().map(|p| p.algo.clone()));
    algos.sort_by_key(|a| match a.as_str() {
        AUTO => 0,
        NCCL => 1,
        a if a.starts_with("torch ") => 3,
        _ => 2,
    });
    algos
}

/// A distinct style for every series of `pts` (keyed by `Point::series`):
/// colour and marker by algorithm, dash and fill by mode; no two share
/// (colour, marker, dash).
pub fn detail_styles(pts: &[Point]) -> Vec<(String, Style)> {
    let algos = algo_order(pts);
    let other_modes: Vec<String> = ordered(
        pts.iter()
            .filter_map(|p| p.mode.clone())
            .filter(|m| m != "graph" && m != "eager"),
    );
    let mut used: HashSet<(&'static str, Marker, &'static str)> = HashSet::new();
    let mut out = Vec::new();
    let mut others = 0usize;
    for algo in &algos {
        let mut modes = ordered(pts.iter().filter(|p| &p.algo == algo).map(|p| p.mode.clone()));
        modes.sort_by_key(mode_rank);
        let (color, marker) = match algo.as_str() {
            AUTO => (AUTO_COLOR, Marker::Circle),
            NCCL => (NCCL_COLOR, Marker::Square),
            _ => {
                let (j, n) = (others, OTHER_COLORS.len());
                others += 1;
                // Where colours repeat (every n), the marker moves on: no two of
                // the first 8 n share both.
                (
                    OTHER_COLORS[j % n],
                    Marker::ALL[(2 + j % n + j / n) % Marker::ALL.len()],
                )
            }
        };
        let width = if algo == AUTO || algo == NCCL { 2.4 } else { 1.6 };
        for mode in modes {
            let (dash, filled) = mode_look(mode.as_deref(), &other_modes);
            let mut st = Style {
                color,
                marker,
                dash,
                filled,
                width,
            };
            if used.contains(&st.key()) {
                // More algorithms or modes than the table tells apart: the first free style.
                let colors = [AUTO_COLOR, NCCL_COLOR].into_iter().chain(OTHER_COLORS.iter().copied());
                let free = colors.flat_map(|c| {
                    Marker::ALL
                        .iter()
                        .flat_map(move |m| DASHES.iter().map(move |d| (c, *m, *d)))
                });
                if let Some((c, m, d)) = free.into_iter().find(|k| !used.contains(k)) {
                    st = Style {
                        color: c,
                        marker: m,
                        dash: d,
                        filled,
                        width,
                    };
                }
            }
            used.insert(st.key());
            out.push((series_name(algo, mode.as_deref()), st));
        }
    }
    out
}

/// The style of a comparison series: colour and marker by implementation,
/// dash and fill by mode.
fn comparison_style(algo: &str, mode: Option<&str>) -> Style {
    let (color, marker, width) = match algo {
        AUTO => ("#1f77b4", Marker::Circle, 2.4),
        TORCH_SYMM => ("#ff7f0e", Marker::TriangleUp, 2.0),
        _ => ("#222222", Marker::Square, 2.0),
    };
    let (dash, filled) = mode_look(mode, &[]);
    Style {
        color,
        marker,
        dash,
        filled,
        width,
    }
}

// ------------------------------------------------------------------ drawing

const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";
const PW: f64 = 440.0; // panel width
const PH: f64 = 270.0; // panel height
const ML: f64 = 58.0; // left margin of a cell: the y tick labels
const MR: f64 = 44.0; // right margin of a cell: room for the NCCL label of the 1x line
const CELL_W: f64 = ML + PW + MR;
const ROW_H: f64 = 28.0 + PH + 50.0;
const LINE_H: f64 = 17.0;

struct Svg {
    o: String,
}

impl Svg {
    fn new(width: f64, height: f64) -> Svg {
        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="{FONT}" font-size="11">"#
        );
        let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
        Svg { o }
    }
    fn text(&mut self, x: f64, y: f64, attrs: &str, s: &str) {
        let _ = writeln!(self.o, r#"<text x="{x:.1}" y="{y:.1}"{attrs}>{}</text>"#, esc(s));
    }
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, attrs: &str) {
        let _ = writeln!(
            self.o,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}"{attrs}/>"#
        );
    }
    fn marker(&mut self, m: Marker, x: f64, y: f64, st: &Style) {
        let fill = if st.filled { st.color } else { "white" };
        let paint = format!(r#" fill="{fill}" stroke="{}" stroke-width="1.3""#, st.color);
        let poly = |pts: &[(f64, f64)]| {
            pts.iter()
                .map(|(dx, dy)| format!("{:.1},{:.1}", x + dx, y + dy))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let r = 3.6;
        let _ = match m {
            Marker::Circle => writeln!(self.o, r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}"{paint}/>"#),
            Marker::Square => writeln!(
                self.o,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"{paint}/>"#,
                x - r * 0.9,
                y - r * 0.9,
                r * 1.8,
                r * 1.8
            ),
            Marker::TriangleUp => writeln!(
                self.o,
                r#"<polygon points="{}"{paint}/>"#,
                poly(&[(0.0, -r * 1.15), (-r, r * 0.75), (r, r * 0.75)])
            ),
            Marker::TriangleDown => writeln!(
                self.o,
                r#"<polygon points="{}"{paint}/>"#,
                poly(&[(0.0, r * 1.15), (-r, -r * 0.75), (r, -r * 0.75)])
            ),
            Marker::Diamond => writeln!(
                self.o,
                r#"<polygon points="{}"{paint}/>"#,
                poly(&[(0.0, -r * 1.2), (r, 0.0), (0.0, r * 1.2), (-r, 0.0)])
            ),
            Marker::Star => {
                let pts: Vec<(f64, f64)> = (0..10)
                    .map(|k| {
                        let a = std::f64::consts::PI * (k as f64) / 5.0 - std::f64::consts::FRAC_PI_2;
                        let rr = if k % 2 == 0 { r * 1.35 } else { r * 0.6 };
                        (rr * a.cos(), rr * a.sin())
                    })
                    .collect();
                writeln!(self.o, r#"<polygon points="{}"{paint}/>"#, poly(&pts))
            }
            Marker::Cross | Marker::Plus => {
                let d = if m == Marker::Cross { r * 0.85 } else { r * 1.15 };
                let (a, b) = if m == Marker::Cross {
                    (poly(&[(-d, -d), (d, d)]), poly(&[(-d, d), (d, -d)]))
                } else {
                    (poly(&[(-d, 0.0), (d, 0.0)]), poly(&[(0.0, -d), (0.0, d)]))
                };
                let w = if st.filled { 2.2 } else { 1.4 };
                writeln!(
                    self.o,
                    r#"<polyline points="{a}" stroke="{c}" stroke-width="{w}" fill="none"/><polyline points="{b}" stroke="{c}" stroke-width="{w}" fill="none"/>"#,
                    c = st.color
                )
            }
        };
    }
    /// A legend swatch: a short line in the style, with its marker.
    fn swatch(&mut self, x: f64, y: f64, st: &Style) {
        let dash = dash_attr(st.dash);
        self.line(
            x,
            y,
            x + 30.0,
            y,
            &format!(r#" stroke="{}" stroke-width="{}"{dash}"#, st.color, st.width),
        );
        self.marker(st.marker, x + 15.0, y, st);
    }
    fn finish(mut self) -> String {
        self.o.push_str("</svg>\n");
        self.o
    }
}

fn dash_attr(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(r#" stroke-dasharray="{d}""#)
    }
}

/// One panel: a frame with log axes.
struct Panel {
    x0: f64,
    top: f64,
    xa: LogAxis,
    ya: LogAxis,
}

/// The x range of a set of lines (sizes).
fn x_range<'a>(xy: impl Iterator<Item = &'a (f64, f64)>) -> Option<(f64, f64)> {
    xy.map(|p| p.0)
        .filter(|x| *x > 0.0 && x.is_finite())
        .fold(None, |acc, x| match acc {
            None => Some((x, x)),
            Some((a, b)) => Some((a.min(x), b.max(x))),
        })
}

fn y_range<'a>(xy: impl Iterator<Item = &'a (f64, f64)>) -> Option<(f64, f64)> {
    x_range(xy.map(|p| (p.1, p.0)).collect::<Vec<_>>().iter())
}

#[derive(Clone, Copy)]
enum YScale {
    /// Decades, labelled as plain numbers.
    Decades,
    /// Ratios around 1x.
    Ratio,
}

impl Panel {
    /// Draws the frame, title (which names the y unit: no rotated text, which
    /// some renderers draw wrongly), grid, ticks and x title; returns the panel.
    fn draw(
        s: &mut Svg,
        x0: f64,
        top: f64,
        title: &str,
        (xmin, xmax): (f64, f64),
        (ymin, ymax): (f64, f64),
        scale: YScale,
    ) -> Panel {
        s.text(x0, top - 9.0, r#" font-size="13" font-weight="bold""#, title);
        let xa = LogAxis::new(xmin, xmax, x0 + 10.0, x0 + PW - 10.0);
        let (ylo, yhi, yticks): (f64, f64, Vec<(f64, String, bool)>) = match scale {
            YScale::Decades => {
                let (lo, hi) = decade_bounds(ymin, ymax);
                // Decades labelled; 2x and 5x a lighter grid, labelled when
                // there are few decades or at the ends of the axis.
                let decades = ticks(lo / 10.0, hi, 10.0);
                let few = decades.iter().filter(|d| **d >= lo * 0.9999).count() <= 2;
                let mut t: Vec<(f64, String, bool)> = Vec::new();
                for d in decades {
                    for (m, major) in [(1.0, true), (2.0, false), (5.0, false)] {
                        let v = d * m;
                        if v >= lo * 0.9999 && v <= hi * 1.0001 {
                            let end = (v / lo - 1.0).abs() < 1e-6 || (v / hi - 1.0).abs() < 1e-6;
                            let label = if major || few || end {
                                num_label(v)
                            } else {
                                String::new()
                            };
                            t.push((v, label, major));
                        }
                    }
                }
                (lo, hi, t)
            }
            YScale::Ratio => {
                let (lo, hi) = ratio_bounds(ymin, ymax);
                let t = ratio_ticks(lo, hi)
                    .into_iter()
                    .map(|v| (v, ratio_label(v), true))
                    .collect();
                (lo, hi, t)
            }
        };
        let ya = LogAxis::new(ylo, yhi, top + PH, top);
        let p = Panel { x0, top, xa, ya };
        for (v, label, major) in &yticks {
            let y = ya.map(*v);
            let color = if *major { "#d8d8d8" } else { "#eeeeee" };
            s.line(x0, y, x0 + PW, y, &format!(r#" stroke="{color}""#));
            if !label.is_empty() {
                let grey = if *major { "" } else { r##" fill="#666""## };
                s.text(x0 - 5.0, y + 4.0, &format!(r#" text-anchor="end"{grey}"#), label);
            }
        }
        let xt = ticks(xa.lo, xa.hi, 4.0);
        let step = if xt.len() > 11 { 2 } else { 1 };
        for (i, t) in xt.iter().enumerate() {
            let x = xa.map(*t);
            s.line(x, top, x, top + PH, r##" stroke="#e4e4e4""##);
            if i % step == 0 {
                s.text(x, top + PH + 15.0, r#" text-anchor="middle""#, &size_label(*t));
            }
        }
        let _ = writeln!(
            s.o,
            r##"<rect x="{x0}" y="{top}" width="{PW}" height="{PH}" fill="none" stroke="#444"/>"##
        );
        let xtitle = match scale {
            YScale::Decades => "message size (bytes, whole tensor)",
            // The reading hint goes here, where no data can hide it.
            YScale::Ratio => "message size (bytes, whole tensor) — below 1× is faster than NCCL",
        };
        s.text(x0 + PW / 2.0, top + PH + 33.0, r#" text-anchor="middle""#, xtitle);
        p
    }

    fn series(&self, s: &mut Svg, label: &str, tip: &str, xy: &[(f64, f64)], st: &Style) {
        let pts: Vec<(f64, f64)> = xy
            .iter()
            .filter(|(x, y)| *x > 0.0 && *y > 0.0 && x.is_finite() && y.is_finite())
            .map(|(x, y)| (self.xa.map(*x), self.ya.map(*y)))
            .collect();
        if pts.is_empty() {
            return;
        }
        let _ = writeln!(
            s.o,
            r#"<g class="series" data-series="{}" data-style="{}"><title>{}</title>"#,
            esc(label),
            st.data(),
            esc(tip)
        );
        let attr: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            s.o,
            r#"<polyline fill="none" stroke="{}" stroke-width="{}" stroke-linejoin="round"{} points="{}"/>"#,
            st.color,
            st.width,
            dash_attr(st.dash),
            attr.join(" ")
        );
        for (x, y) in pts {
            s.marker(st.marker, x, y, st);
        }
        s.o.push_str("</g>\n");
    }

    fn no_data(&self, s: &mut Svg, msg: &str) {
        s.text(self.x0 + 12.0, self.top + 22.0, r##" fill="#666""##, msg);
    }
}

/// An empty panel frame with a message.
fn empty_panel(s: &mut Svg, x0: f64, top: f64, title: &str, msg: &str) {
    s.text(x0, top - 9.0, r#" font-size="13" font-weight="bold""#, title);
    let _ = writeln!(
        s.o,
        r##"<rect x="{x0}" y="{top}" width="{PW}" height="{PH}" fill="#fafafa" stroke="#999"/>"##
    );
    for (i, l) in wrap(msg, ((PW - 30.0) / 6.5) as usize).iter().enumerate() {
        s.text(x0 + 14.0, top + 24.0 + 16.0 * i as f64, r##" fill="#555""##, l);
    }
}

/// What the titles say about the run.
#[derive(Debug, Default, Clone)]
pub struct Meta {
    pub backend: Option<String>,
    pub world: Option<u64>,
    pub dtype: Option<String>,
    pub redop: Option<String>,
    /// The JSON's file name.
    pub source: String,
    /// `anchors.json (PyTorch 2.11, NCCL 2.27.5)` when anchors were read.
    pub anchors: Option<String>,
    /// The detail figure's file name, for the comparison's subtitle.
    pub detail: Option<String>,
}

impl Meta {
    fn from_json(v: &Value, source: &str) -> Meta {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(String::from);
        Meta {
            backend: s("backend"),
            world: v.get("world").and_then(Value::as_u64),
            dtype: s("dtype"),
            redop: s("redop"),
            source: source.to_string(),
            anchors: None,
            detail: None,
        }
    }
    fn run(&self) -> String {
        let mut parts = Vec::new();
        if let Some(b) = &self.backend {
            parts.push(b.clone());
        }
        if let Some(w) = self.world {
            parts.push(format!("{w} ranks"));
        }
        let ty: Vec<&str> = [&self.dtype, &self.redop]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        if !ty.is_empty() {
            parts.push(ty.join(" "));
        }
        parts.join(", ")
    }
    fn sources(&self) -> String {
        let mut s = format!("data: {}", self.source);
        if let Some(a) = &self.anchors {
            s.push_str(&format!(", PyTorch anchors: {a}"));
        }
        s
    }
}

/// What line styles mean, for the modes present.
fn mode_text(pts: &[Point]) -> &'static str {
    let modes = modes_of(pts.iter());
    let has = |m: &str| modes.iter().any(|x| x.as_deref() == Some(m));
    match (has("graph"), has("eager")) {
        (true, true) => "Solid line, filled marker = CUDA graph replay; dashed line, hollow marker = eager launches.",
        (true, false) => "CUDA graph replay only.",
        (false, true) => "Eager launches only.",
        (false, false) => "",
    }
}

/// Title and wrapped subtitle lines; returns the y below them.
fn header(s: &mut Svg, width: f64, title: &str, sub: &[String]) -> f64 {
    s.text(14.0, 26.0, r#" font-size="17" font-weight="bold""#, title);
    let mut y = 46.0;
    let chars = ((width - 28.0) / (12.0 * 0.56)) as usize;
    for para in sub {
        for l in wrap(para, chars.max(20)) {
            s.text(14.0, y, r##" font-size="12" fill="#333""##, &l);
            y += 16.0;
        }
    }
    y
}

/// A horizontal legend (wrapped to `width`); returns the y below it.
fn legend_row(s: &mut Svg, x0: f64, y0: f64, width: f64, items: &[(String, Style)]) -> f64 {
    let (mut x, mut y) = (x0, y0 + 8.0);
    for (label, st) in items {
        let w = 40.0 + text_w(label, 12.0) + 22.0;
        if x > x0 && x + w > x0 + width {
            x = x0;
            y += 20.0;
        }
        s.swatch(x, y, st);
        s.text(x + 38.0, y + 4.0, r#" font-size="12""#, label);
        x += w;
    }
    y + 14.0
}

/// The comparison figure (the first one): `auto` against NCCL per collective.
pub fn comparison_svg(pts: &[Point], meta: &Meta) -> String {
    let cmp = comparison(pts);
    let any_ref = cmp.iter().any(|c| c.reference.is_some());
    // With NCCL: a row per collective, latency and ratio side by side. Without: the
    // latency panels alone, two to a row.
    let ncols = if any_ref || cmp.len() > 1 { 2 } else { 1 };
    let nrows = if any_ref { cmp.len() } else { cmp.len().div_ceil(2) }.max(1);
    let run = meta.run();
    let title = if any_ref { "symm vs NCCL" } else { "symm (auto)" };
    let title = if run.is_empty() {
        title.to_string()
    } else {
        format!("{title} — {run}")
    };
    let width = (ncols as f64 * CELL_W + 20.0)
        .max(640.0)
        .max(text_w(&title, 17.0) * 1.1 + 40.0);

    // Legend: every line drawn, in order (auto, torch, NCCL; graph before eager).
    let mut legend: Vec<(String, Style)> = Vec::new();
    for c in &cmp {
        for l in &c.latency {
            if !legend.iter().any(|(x, _)| x == &l.label) {
                legend.push((l.label.clone(), comparison_style(&l.algo, l.mode.as_deref())));
            }
        }
    }
    let detail = meta.detail.clone().unwrap_or_else(|| "the detail figure".into());
    let mut sub = vec![meta.sources()];
    let torch_ref = cmp.iter().any(|c| c.reference.as_deref() == Some(TORCH_NCCL));
    if !any_ref {
        let host = meta.backend.as_deref().is_some_and(|b| b.contains("host"));
        sub.push(if host {
            "NCCL did not run (host backend): auto alone, no ratio to NCCL.".to_string()
        } else {
            "NCCL did not run (no nccl records in this JSON): auto alone, no ratio to NCCL.".to_string()
        });
    } else if torch_ref {
        sub.push("NCCL as measured by the PyTorch anchors (torch nccl) where symm-bench has no nccl rows.".into());
    }
    sub.push(format!(
        "auto = symm's per-size algorithm choice (which one ran, and every algorithm: {detail}). {}",
        mode_text(pts)
    ));
    if legend.iter().any(|(l, _)| l.starts_with(TORCH_SYMM)) {
        sub.push("torch symm_mem = the faster of PyTorch's symmetric-memory implementations at each size.".into());
    }
    // Measure the header first to size the document.
    let mut probe = Svg::new(width, 100.0);
    let top_y = header(&mut probe, width, &title, &sub);
    let mut probe_legend = Svg::new(width, 100.0);
    let legend_h = legend_row(&mut probe_legend, 14.0, 0.0, width - 28.0, &legend);
    let rows_y = top_y + legend_h + 10.0;
    let height = rows_y + ROW_H * nrows as f64 + 10.0;

    let mut s = Svg::new(width, height);
    let y = header(&mut s, width, &title, &sub);
    legend_row(&mut s, 14.0, y, width - 28.0, &legend);
    if cmp.is_empty() {
        s.text(14.0, rows_y + 20.0, "", "no data points");
        return s.finish();
    }
    for (k, c) in cmp.iter().enumerate() {
        let (row, col) = if any_ref { (k, 0) } else { (k / 2, k % 2) };
        let top = rows_y + ROW_H * row as f64 + 28.0;
        let x0 = CELL_W * col as f64 + ML;
        let contenders = c
            .latency
            .iter()
            .filter(|l| Some(&l.algo) != c.reference.as_ref())
            .count();
        let all = c.latency.iter().flat_map(|l| l.xy.iter());
        match (x_range(all.clone()), y_range(all)) {
            (Some(xr), Some(yr)) => {
                let p = Panel::draw(
                    &mut s,
                    x0,
                    top,
                    &format!("{} — latency, us per op (lower is better)", c.op),
                    xr,
                    yr,
                    YScale::Decades,
                );
                // NCCL first, auto last: auto on top where they meet.
                for l in c.latency.iter().rev() {
                    let st = comparison_style(&l.algo, l.mode.as_deref());
                    p.series(&mut s, &l.label, &format!("{}: {}", c.op, l.label), &l.xy, &st);
                }
                if contenders == 0 {
                    p.no_data(&mut s, &format!("no auto records for this collective (see {detail})"));
                }
            }
            _ => empty_panel(&mut s, x0, top, &format!("{} — latency, us per op", c.op), "no data"),
        }
        if !any_ref {
            continue;
        }
        let x1 = CELL_W + ML;
        let rtitle = format!("{} — time / NCCL time, same size and mode", c.op);
        let Some(r) = &c.reference else {
            empty_panel(
                &mut s,
                x1,
                top,
                &rtitle,
                "NCCL did not run for this collective: no ratio.",
            );
            continue;
        };
        let all = c.ratio.iter().flat_map(|l| l.xy.iter());
        let (Some(xr), Some(yr)) = (x_range(all.clone()), y_range(all)) else {
            empty_panel(
                &mut s,
                x1,
                top,
                &rtitle,
                "no size and mode measured by both auto and NCCL.",
            );
            continue;
        };
        let rtitle = if r == NCCL {
            rtitle
        } else {
            format!("{} — time / NCCL time ({r}), same size and mode", c.op)
        };
        let p = Panel::draw(&mut s, x1, top, &rtitle, xr, yr, YScale::Ratio);
        // The 1x line: NCCL itself.
        let y1 = p.ya.map(1.0);
        let _ = writeln!(
            s.o,
            r##"<g class="ref-line" data-value="1"><line x1="{x1:.1}" y1="{y1:.1}" x2="{:.1}" y2="{y1:.1}" stroke="#222222" stroke-width="1.6"/><text x="{:.1}" y="{:.1}" font-size="12" font-weight="bold" fill="#222222">NCCL</text></g>"##,
            x1 + PW,
            x1 + PW + 4.0,
            y1 + 4.0
        );
        for l in c.ratio.iter().rev() {
            let st = comparison_style(&l.algo, l.mode.as_deref());
            p.series(&mut s, &l.label, &format!("{}: {} / {r}", c.op, l.label), &l.xy, &st);
        }
    }
    s.finish()
}

/// The value a panel plots for a point.
type Getter = fn(&Point) -> Option<f64>;

/// The detail figure: every (algorithm, mode) series, latency and busbw.
pub fn detail_svg(pts: &[Point], meta: &Meta) -> String {
    let styles = detail_styles(pts);
    let style_of = |series: &str| styles.iter().find(|(s, _)| s == series).map(|(_, st)| *st);
    let ops = ordered(pts.iter().map(|p| p.op.clone()));
    let legend_w = styles.iter().map(|(s, _)| 44.0 + text_w(s, 12.0)).fold(160.0, f64::max) + 16.0;
    let width = 2.0 * CELL_W + legend_w;
    let row_h: Vec<f64> = ops
        .iter()
        .map(|op| {
            let n = styles
                .iter()
                .filter(|(s, _)| pts.iter().any(|p| &p.op == op && &p.series == s))
                .count();
            ROW_H.max(40.0 + LINE_H * n as f64)
        })
        .collect();
    let mut sub = Vec::new();
    let run = meta.run();
    sub.push(meta.sources());
    sub.push(format!(
        "Every algorithm symm-bench ran: colour and marker per algorithm (auto blue, nccl black, both thicker). {} \
         Hover a line for its name.",
        mode_text(pts)
    ));
    let mut probe = Svg::new(width, 100.0);
    let rows_y = header(&mut probe, width, "", &sub) + 8.0;
    let height = rows_y + row_h.iter().sum::<f64>().max(ROW_H) + 10.0;
    let mut s = Svg::new(width, height);
    let title = if run.is_empty() {
        "symm benchmark: every algorithm".to_string()
    } else {
        format!("symm benchmark: every algorithm — {run}")
    };
    header(&mut s, width, &title, &sub);
    if pts.is_empty() {
        s.text(14.0, rows_y + 20.0, "", "no data points");
        return s.finish();
    }
    let mut y0 = rows_y;
    for (row, op) in ops.iter().enumerate() {
        let top = y0 + 28.0;
        let in_op: Vec<&Point> = pts.iter().filter(|p| &p.op == op).collect();
        let panels: [(&str, Getter); 2] = [
            ("latency, us per op (lower is better)", |p| Some(p.time_us)),
            ("bus bandwidth, GB/s (nccl-tests busbw, higher is better)", |p| p.busbw),
        ];
        for (col, (name, get)) in panels.iter().enumerate() {
            let x0 = CELL_W * col as f64 + ML;
            let title = format!("{op} — {name}");
            let vals: Vec<(f64, f64)> = in_op
                .iter()
                .filter_map(|p| get(p).map(|y| (p.bytes, y)))
                .filter(|(x, y)| *x > 0.0 && *y > 0.0)
                .collect();
            let (Some(xr), Some(yr)) = (x_range(vals.iter()), y_range(vals.iter())) else {
                empty_panel(&mut s, x0, top, &title, "no data");
                continue;
            };
            let p = Panel::draw(&mut s, x0, top, &title, xr, yr, YScale::Decades);
            // auto and nccl last, on top of the others.
            for (series, st) in styles.iter().rev() {
                let mine: Vec<&Point> = in_op.iter().copied().filter(|p| &p.series == series).collect();
                let mut xy: Vec<(f64, f64)> = mine
                    .iter()
                    .filter_map(|p| get(p).map(|y| (p.bytes, y)))
                    .filter(|(x, y)| *x > 0.0 && *y > 0.0)
                    .collect();
                xy.sort_by(|a, b| a.0.total_cmp(&b.0));
                p.series(&mut s, series, &format!("{op}: {series}"), &xy, st);
            }
        }
        // Legend of this row.
        let lx = 2.0 * CELL_W + 4.0;
        let mut ly = top + 8.0;
        for (series, _) in &styles {
            if !in_op.iter().any(|p| &p.series == series) {
                continue;
            }
            if let Some(st) = style_of(series) {
                s.swatch(lx, ly, &st);
                s.text(lx + 38.0, ly + 4.0, r#" font-size="12""#, series);
                ly += LINE_H;
            }
        }
        y0 += row_h.get(row).copied().unwrap_or(ROW_H);
    }
    s.finish()
}

/// A table of a note figure: name, column names, rows of cells.
pub struct Table {
    pub name: String,
    pub cols: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// A figure for a JSON without benchmark records: a note and its tables.
pub fn note_svg(title: &str, note: &[String], tables: &[Table]) -> String {
    const CH: f64 = 12.0 * 0.6;
    let table_w = |cols: &[String], rows: &[Vec<String>]| -> Vec<f64> {
        (0..cols.len())
            .map(|i| {
                let w = rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .chain(std::iter::once(&cols[i]))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0);
                w as f64 * CH + 18.0
            })
            .collect()
    };
    let widest = tables
        .iter()
        .map(|t| table_w(&t.cols, &t.rows).iter().sum::<f64>())
        .fold(0.0, f64::max);
    let width = (widest + 40.0).clamp(720.0, 1800.0);
    let mut probe = Svg::new(width, 100.0);
    let below = header(&mut probe, width, "", note);
    let height = below
        + 20.0
        + tables
            .iter()
            .map(|t| 40.0 + 18.0 * (t.rows.len() + 1) as f64)
            .sum::<f64>();
    let mut s = Svg::new(width, height);
    let mut y = header(&mut s, width, title, note) + 16.0;
    for Table { name, cols, rows } in tables {
        s.text(14.0, y, r#" font-size="13" font-weight="bold""#, name);
        y += 10.0;
        let ws = table_w(cols, rows);
        let total: f64 = ws.iter().sum();
        let _ = writeln!(
            s.o,
            r##"<rect x="14" y="{y:.1}" width="{total:.1}" height="18" fill="#e4e4e4" stroke="none"/>"##
        );
        let mut x = 14.0;
        for (c, w) in cols.iter().zip(&ws) {
            s.text(x + 6.0, y + 13.0, r#" font-size="12" font-weight="bold""#, c);
            x += w;
        }
        y += 18.0;
        for (i, r) in rows.iter().enumerate() {
            if i % 2 == 1 {
                let _ = writeln!(
                    s.o,
                    r##"<rect x="14" y="{y:.1}" width="{total:.1}" height="18" fill="#f4f4f4" stroke="none"/>"##
                );
            }
            let mut x = 14.0;
            for (c, w) in r.iter().zip(&ws) {
                s.text(x + 6.0, y + 13.0, r#" font-size="12""#, c);
                x += w;
            }
            y += 18.0;
        }
        y += 22.0;
    }
    s.finish()
}

/// The arrays of flat objects at the top of `v` (e.g. symm-bench's `setup`),
/// as tables: the first 8 columns, the first 60 rows.
fn tables(v: &Value) -> Vec<Table> {
    let Some(o) = v.as_object() else { return Vec::new() };
    let mut out = Vec::new();
    for (name, val) in o {
        let Some(a) = val.as_array() else { continue };
        let objs: Vec<&Map<String, Value>> = a.iter().filter_map(Value::as_object).collect();
        if objs.is_empty() {
            continue;
        }
        let mut cols: Vec<String> = ordered(objs.iter().flat_map(|r| {
            r.iter()
                .filter(|(_, v)| !v.is_object() && !v.is_array())
                .map(|(k, _)| k.clone())
        }));
        // Names (text) first, then the numbers.
        cols.sort_by_key(|c| !objs.iter().any(|r| r.get(c).is_some_and(Value::is_string)));
        cols.truncate(8);
        let mut rows: Vec<Vec<String>> = objs
            .iter()
            .take(60)
            .map(|r| {
                cols.iter()
                    .map(|c| match r.get(c) {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
                            (Some(u), _) if c.contains("bytes") && u >= 1024 => size_label(u as f64),
                            (Some(u), _) => u.to_string(),
                            (_, Some(f)) => format!("{f:.3}"),
                            _ => n.to_string(),
                        },
                        Some(Value::Null) | None => "-".to_string(),
                        Some(x) => x.to_string(),
                    })
                    .collect()
            })
            .collect();
        if objs.len() > rows.len() {
            rows.push(vec![format!("... {} more", objs.len() - rows.len())]);
        }
        out.push(Table {
            name: name.clone(),
            cols,
            rows,
        });
    }
    out
}

// ------------------------------------------------------------------ files

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
            anc.versions = more.versions.clone();
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
        let name = meta.anchors.clone().unwrap_or_else(|| file_name(json));
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
        let t = tables(&v);
        let symm_bench = v.get("tool").and_then(Value::as_str) == Some("symm-bench") || v.get("results").is_some();
        if !symm_bench && t.is_empty() {
            return Err(format!(
                "{} holds no benchmark records (objects with `bytes` and `time_us`)",
                json.display()
            ));
        }
        let run = meta.run();
        let mut note = vec![
            if run.is_empty() {
                meta.sources()
            } else {
                format!("{run}; {}", meta.sources())
            },
            "This JSON holds no per-collective benchmark rows: a symm-bench --probe or --probe-bw run, whose \
             tables go to stdout (bench.log), not to the JSON."
                .to_string(),
        ];
        if rec.failed > 0 {
            note.push(format!("{} row(s) failed their check or did not run.", rec.failed));
        }
        if t.is_empty() {
            note.push("Nor does it hold any other table.".into());
        }
        write(svg_path, &note_svg("symm-bench: no benchmark rows to plot", &note, &t))?;
        // A detail figure from an earlier run would sit next to this note as if it were this run's.
        if detail.is_file() {
            std::fs::remove_file(&detail).map_err(|e| format!("remove stale {}: {e}", detail.display()))?;
        }
        let what = if t.is_empty() {
            "a note".to_string()
        } else {
            format!("a note and {} table(s)", t.len())
        };
        return Ok(Plotted {
            points: 0,
            failed: rec.failed,
            files: vec![svg_path.to_path_buf()],
            note: Some(format!(
                "{} holds no benchmark records (a --probe run?): {what}",
                json.display()
            )),
            nccl: false,
        });
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
    use super::*;

    fn mk(op: &str, algo: &str, mode: &str, bytes: f64, t: f64) -> Point {
        Point::new(op, algo, Some(mode), bytes, t, Some(bytes / t / 1000.0))
    }

    /// A GPU-like run: auto, nccl and four algorithms, graph and eager, 1K..256M.
    fn gpu_like() -> Vec<Point> {
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
    fn finite(svg: &str) -> bool {
        !["NaN", "inf\"", "inf,", "inf ", "=\"-inf"]
            .iter()
            .any(|b| svg.contains(b))
    }

    fn attr_values(svg: &str, attr: &str) -> Vec<String> {
        let pat = format!("{attr}=\"");
        svg.match_indices(&pat)
            .filter_map(|(i, _)| {
                let rest = &svg[i + pat.len()..];
                rest.find('"').map(|j| rest[..j].to_string())
            })
            .collect()
    }

    #[test]
    fn finds_records_anywhere() {
        let v: Value = serde_json::from_str(
            r#"{"machine":"x","results":[
                {"op":"all_reduce","algo":"one_shot","mode":"graph","bytes":1024,"time_us":2.5,"busbw":0.4},
                {"op":"all_reduce","algo":"nccl","graph":false,"bytes":1024,"time_us":30.0},
                {"op":"all_reduce","algo":"two_shot","mode":"graph","bytes":1024,"time_us":3.0,"ok":false},
                {"op":"all_reduce","algo":"ce","mode":"graph","bytes":1024,"time_us":null,"ok":false},
                {"nested":{"collective":"all_gather","engine":"nccl","size":4096,"median_us":11}}
            ]}"#,
        )
        .unwrap();
        let r = records(&v);
        let p = r.points;
        assert_eq!(p.len(), 3);
        assert_eq!(r.failed, 2);
        assert_eq!(p[0].series, "one_shot (graph)");
        assert_eq!(p[0].busbw, Some(0.4));
        assert_eq!(p[1].series, "nccl (eager)");
        assert_eq!(p[1].mode.as_deref(), Some("eager"));
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
        assert!(ticks(0.0, 10.0, 10.0).is_empty());
        assert!(ticks(f64::NAN, 10.0, 10.0).is_empty());
        assert_eq!(size_label(4096.0), "4K");
        assert_eq!(size_label(256.0 * 1048576.0), "256M");
        assert_eq!(size_label(1000.0), "1000");
        assert_eq!(ratio_label(0.5), "0.5×");
        assert_eq!(ratio_label(1.0), "1×");
        let rt = ratio_ticks(0.3, 1.25);
        assert!(rt.contains(&1.0) && rt.contains(&0.5) && rt.contains(&0.75), "{rt:?}");
        assert!(ratio_ticks(1e-3, 1e3).contains(&1.0));
    }

    #[test]
    fn comparison_figure_holds_exactly_auto_and_nccl() {
        let pts = gpu_like();
        let s = comparison_svg(
            &pts,
            &Meta {
                source: "bench.json".into(),
                ..Meta::default()
            },
        );
        let series: HashSet<String> = attr_values(&s, "data-series").into_iter().collect();
        let want: HashSet<String> = ["auto (graph)", "auto (eager)", "nccl (graph)", "nccl (eager)"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(series, want);
        // The lines hold exactly the auto and nccl records, nothing of the
        // other algorithms (lamport is faster than auto at small sizes here).
        for c in comparison(&pts) {
            for l in &c.latency {
                let want: Vec<(f64, f64)> = pts
                    .iter()
                    .filter(|p| p.op == c.op && p.algo == l.algo && p.mode == l.mode)
                    .map(|p| (p.bytes, p.time_us))
                    .collect();
                assert_eq!(l.xy, want, "{} {}", c.op, l.label);
            }
        }
        // Per collective: 4 latency lines + 2 ratio lines.
        assert_eq!(s.matches(r#"class="series""#).count(), 2 * (4 + 2));
        assert!(!s.contains("one_shot") && !s.contains("lamport") && !s.contains("copy_engine"));
        assert!(!s.contains("NCCL did not run"));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(finite(&s));
    }

    #[test]
    fn ratio_panel_divides_by_nccl_and_marks_the_1x_line() {
        let pts = vec![
            mk("all_reduce", "auto", "graph", 1024.0, 2.0),
            mk("all_reduce", "nccl", "graph", 1024.0, 8.0),
            mk("all_reduce", "auto", "eager", 1024.0, 3.0),
            mk("all_reduce", "nccl", "eager", 1024.0, 6.0),
            mk("all_reduce", "auto", "graph", 4096.0, 9.0),
            mk("all_reduce", "nccl", "graph", 4096.0, 6.0),
            // no NCCL at 16K: no ratio there
            mk("all_reduce", "auto", "graph", 16384.0, 9.0),
        ];
        let c = comparison(&pts);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].reference.as_deref(), Some("nccl"));
        let graph = c[0].ratio.iter().find(|l| l.label == "auto (graph)").unwrap();
        assert_eq!(graph.xy, vec![(1024.0, 0.25), (4096.0, 1.5)]);
        let eager = c[0].ratio.iter().find(|l| l.label == "auto (eager)").unwrap();
        assert_eq!(eager.xy, vec![(1024.0, 0.5)]);
        let s = comparison_svg(&pts, &Meta::default());
        assert_eq!(s.matches(r#"class="ref-line" data-value="1""#).count(), 1);
        let i = s.find(r#"class="ref-line""#).unwrap();
        let tail = &s[i..s[i..].find("</g>").map(|j| i + j).unwrap()];
        assert!(tail.contains(">NCCL</text>"), "{tail}");
        // The 1x line lies at the height of the 1× tick label.
        let y_of = |from: usize| -> f64 {
            let at = s[from..].find("y1=\"").map(|k| from + k + 4).unwrap();
            s[at..at + s[at..].find('"').unwrap()].parse().unwrap()
        };
        let line_y = y_of(i);
        let label = s.find(">1×</text>").unwrap();
        let start = s[..label].rfind("<text").unwrap();
        let ys = attr_values(&s[start..label], "y");
        let label_y: f64 = ys[0].parse().unwrap();
        assert!(
            (label_y - 4.0 - line_y).abs() < 0.11,
            "1x line at {line_y}, 1× label at {label_y}"
        );
    }

    #[test]
    fn without_nccl_the_first_figure_shows_auto_alone_and_says_so() {
        let pts: Vec<Point> = gpu_like().into_iter().filter(|p| p.algo != "nccl").collect();
        let s = comparison_svg(&pts, &Meta::default());
        let series: HashSet<String> = attr_values(&s, "data-series").into_iter().collect();
        assert_eq!(series.len(), 2);
        assert!(series.iter().all(|x| x.starts_with("auto")));
        assert!(s.contains("NCCL did not run"));
        assert!(!s.contains("ref-line"));
        // The title and subtitle sit above everything else.
        assert!(s.find("NCCL did not run").unwrap() < s.find("class=\"series\"").unwrap());
    }

    #[test]
    fn detail_figure_gives_every_series_its_own_style() {
        let pts = gpu_like();
        let s = detail_svg(&pts, &Meta::default());
        let names = attr_values(&s, "data-series");
        let styles = attr_values(&s, "data-style");
        assert_eq!(names.len(), styles.len());
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for (n, st) in names.iter().zip(&styles) {
            if let Some(prev) = seen.insert(n.clone(), st.clone()) {
                assert_eq!(&prev, st, "{n} drawn in two styles");
            }
        }
        assert_eq!(seen.len(), 12, "6 algorithms x 2 modes: {seen:?}");
        let looks: HashSet<String> = seen
            .values()
            .map(|st| st.rsplit_once(' ').map(|(a, _)| a.to_string()).unwrap_or_default())
            .collect();
        assert_eq!(
            looks.len(),
            seen.len(),
            "two series share (colour, marker, dash): {seen:?}"
        );
        // the legend names every series
        for n in seen.keys() {
            assert!(s.contains(&format!(">{}</text>", esc(n))), "{n} not in the legend");
        }
    }

    #[test]
    fn detail_styles_stay_distinct_for_many_series() {
        // 40 algorithms x 7 modes: far past the palette and the dash patterns,
        // where the first free style has to step in.
        let modes = ["graph", "eager", "replay", "m1", "m2", "m3", "m4"];
        let mut pts = Vec::new();
        for i in 0..40 {
            for m in modes {
                pts.push(mk("all_reduce", &format!("algo{i}"), m, 1024.0, 1.0 + i as f64));
            }
        }
        pts.push(mk("all_reduce", "auto", "graph", 1024.0, 1.0));
        pts.push(Point::new("all_reduce", "nccl", None, 1024.0, 1.0, None));
        let st = detail_styles(&pts);
        assert_eq!(st.len(), 40 * modes.len() + 2);
        let keys: HashSet<_> = st.iter().map(|(_, s)| s.key()).collect();
        assert_eq!(keys.len(), st.len());
        assert!(keys.len() >= 16);
        assert_eq!(st[0].0, "auto (graph)");
        assert_eq!(st[0].1.color, "#1f77b4");
        assert_eq!(st[1].0, "nccl");
        // graph and eager of one algorithm differ in dash and fill, share colour and marker
        let g = st.iter().find(|(n, _)| n == "algo3 (graph)").unwrap().1;
        let e = st.iter().find(|(n, _)| n == "algo3 (eager)").unwrap().1;
        assert_eq!((g.color, g.marker), (e.color, e.marker));
        assert!(g.dash.is_empty() && g.filled && !e.dash.is_empty() && !e.filled);
    }

    #[test]
    fn svg_escapes_text_and_handles_empty_input() {
        let pts = vec![
            mk("all_reduce", "auto", "graph", 1024.0, 2.0),
            mk("all_reduce", "a<b", "graph", 1024.0, 3.0),
        ];
        let meta = Meta {
            backend: Some("x & y".into()),
            ..Meta::default()
        };
        let d = detail_svg(&pts, &meta);
        assert!(d.contains("x &amp; y"));
        assert!(d.contains("a&lt;b"));
        assert!(!d.contains("a<b"));
        assert!(detail_svg(&[], &meta).contains("no data points"));
        assert!(comparison_svg(&[], &meta).contains("no data points"));
        // one size only, zero and negative sizes: no NaN, no panic
        let odd = vec![
            mk("all_reduce", "auto", "graph", 0.0, 2.0),
            mk("all_reduce", "auto", "graph", -5.0, 2.0),
            mk("all_reduce", "auto", "graph", 4096.0, 2.0),
            mk("all_reduce", "nccl", "graph", 4096.0, 0.0),
        ];
        for s in [comparison_svg(&odd, &meta), detail_svg(&odd, &meta)] {
            assert!(finite(&s), "{s}");
        }
    }

    #[test]
    fn anchors_become_torch_series_and_the_best_symm_mem_in_the_comparison() {
        let v: Value = serde_json::from_str(
            r#"{"world_size": 2, "torch": "2.11.0", "nccl": "2.27.5", "rows": [
                {"size": "1K", "bytes": 1024, "nccl_relerr": 0.0, "nccl_eager_us": 20.0, "one_shot_eager_us": 9.0,
                 "two_shot_eager_us": 12.0, "nccl_graph_us": 8.0, "one_shot_graph_us": 4.0, "two_shot_graph_us": 6.0},
                {"size": "1M", "bytes": 1048576, "nccl_eager_us": 30.0, "one_shot_eager_us": 40.0,
                 "two_shot_eager_us": 25.0, "nccl_graph_us": null}],
              "gather_scatter": [{"bytes": 4096, "nccl_all_gather_graph_us": 7.0, "symm_reduce_scatter_eager_us": 5.0}],
              "ar_rms_norm": [{"hidden": 4096, "tokens": 1, "bytes": 8192, "nccl_graph_us": 99.0}]}"#,
        )
        .unwrap();
        assert!(records(&v).points.is_empty(), "anchors rows are not symm-bench records");
        let a = anchors(&v);
        assert_eq!(a.world, Some(2));
        assert_eq!(a.versions, "PyTorch 2.11.0, NCCL 2.27.5");
        assert_eq!(a.points.len(), 6 + 3 + 2, "{:?}", a.points);
        assert!(
            a.points.iter().all(|p| p.time_us != 99.0),
            "ar_rms_norm is not an all-reduce row"
        );
        assert!(a.points.iter().any(|p| p.op == "all_gather" && p.algo == "torch nccl"));
        assert!(a
            .points
            .iter()
            .any(|p| p.op == "reduce_scatter" && p.algo == "torch symm_mem"));
        let ar = a.points.iter().find(|p| p.series == "torch one_shot (graph)").unwrap();
        assert_eq!(ar.busbw, Some(1024.0 / 4e-6 / 1e9));

        let mut pts = vec![
            mk("all_reduce", "auto", "eager", 1024.0, 5.0),
            mk("all_reduce", "nccl", "eager", 1024.0, 10.0),
            mk("all_reduce", "auto", "eager", 1048576.0, 20.0),
            mk("all_reduce", "nccl", "eager", 1048576.0, 25.0),
            mk("all_reduce", "one_shot", "eager", 1024.0, 5.0),
        ];
        pts.extend(a.points);
        let c = comparison(&pts);
        let ar = c.iter().find(|c| c.op == "all_reduce").unwrap();
        assert_eq!(ar.reference.as_deref(), Some("nccl"), "symm-bench's NCCL first");
        let t = ar.ratio.iter().find(|l| l.label == "torch symm_mem (eager)").unwrap();
        assert_eq!(
            t.xy,
            vec![(1024.0, 0.9), (1048576.0, 1.0)],
            "the faster of one_shot / two_shot"
        );
        // all_gather: only the anchors' NCCL, which becomes the reference
        let ag = c.iter().find(|c| c.op == "all_gather").unwrap();
        assert_eq!(ag.reference.as_deref(), Some("torch nccl"));
        let s = comparison_svg(&pts, &Meta::default());
        let series: HashSet<String> = attr_values(&s, "data-series").into_iter().collect();
        assert!(series.contains("torch symm_mem (eager)") && series.contains("auto (eager)"));
        assert!(!series.iter().any(|x| x.contains("one_shot")), "{series:?}");
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-plot-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn probe_only_json_gives_a_note_not_an_error() {
        let d = tmp("probe");
        let json = d.join("bench.json");
        std::fs::write(
            &json,
            r#"{"tool": "symm-bench", "backend": "2 x NVIDIA H200", "world": 2, "dtype": "bf16", "redop": "sum",
                "rounds": 7, "results": [], "setup": [
                {"what": "symmetric alloc + rendezvous", "size_bytes": 1048576, "median_ms": 0.404}]}"#,
        )
        .unwrap();
        // a stale detail figure from an earlier run goes
        std::fs::write(d.join("bench-detail.svg"), "<svg/>").unwrap();
        let svg = d.join("bench.svg");
        let r = plot_file(&json, None, &svg).unwrap();
        assert_eq!(r.points, 0);
        assert!(r.note.is_some());
        assert_eq!(r.files, vec![svg.clone()]);
        assert!(!d.join("bench-detail.svg").exists());
        let s = std::fs::read_to_string(&svg).unwrap();
        assert!(s.contains("no per-collective benchmark rows"));
        assert!(s.contains("symmetric alloc + rendezvous") && s.contains(">1M</text>"));
        // with --no-setup: nothing but an empty results array
        std::fs::write(
            &json,
            r#"{"tool": "symm-bench", "world": 2, "results": [], "setup": []}"#,
        )
        .unwrap();
        assert!(plot_file(&json, None, &svg).is_ok());
        // not a symm-bench document at all: still an error
        std::fs::write(&json, r#"{"hello": 1}"#).unwrap();
        assert!(plot_file(&json, None, &svg).is_err());
        std::fs::write(&json, "not json").unwrap();
        assert!(plot_file(&json, None, &svg).unwrap_err().contains("is not JSON"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn plot_file_writes_both_figures_and_checks_the_anchors() {
        let d = tmp("files");
        let json = d.join("run.json");
        std::fs::write(
            &json,
            r#"{"tool": "symm-bench", "backend": "2 x GPU", "world": 2, "results": [
                {"op":"all_reduce","algo":"auto","mode":"graph","bytes":1024,"time_us":2.5,"busbw":0.4,"ok":true},
                {"op":"all_reduce","algo":"nccl","mode":"graph","bytes":1024,"time_us":6.0,"busbw":0.2,"ok":true},
                {"op":"all_reduce","algo":"one_shot","mode":"graph","bytes":1024,"time_us":3.0,"ok":false}]}"#,
        )
        .unwrap();
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
