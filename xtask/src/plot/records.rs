//! The benchmark records of a symm-bench JSON ([`records`]) and the PyTorch
//! anchors ([`anchors`]), as [`Point`]s; the names and modes of their series.

use serde_json::{Map, Value};

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

/// The tables of an anchors document that hold anchor rows.
const ANCHOR_TABLES: [&str; 2] = ["rows", "gather_scatter"];

fn is_anchor_doc(o: &Map<String, Value>) -> bool {
    ANCHOR_TABLES.iter().any(|k| {
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
        for key in ANCHOR_TABLES {
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

/// The algorithms the figures treat apart.
pub const AUTO: &str = "auto";
pub const NCCL: &str = "nccl";
pub const TORCH_NCCL: &str = "torch nccl";
pub const TORCH_SYMM: &str = "torch symm_mem";

/// The distinct items, in the order they first come.
pub(super) fn ordered<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = Vec::new();
    for x in items {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// Graph first, then eager, then the other modes, then none.
fn mode_rank(m: &Option<String>) -> usize {
    match m.as_deref() {
        Some("graph") => 0,
        Some("eager") => 1,
        None => 3,
        Some(_) => 2,
    }
}

/// The modes of `pts`, graph first, then eager, then the others.
pub(super) fn modes_of<'a>(pts: impl Iterator<Item = &'a Point>) -> Vec<Option<String>> {
    let mut m = ordered(pts.map(|p| p.mode.clone()));
    m.sort_by_key(mode_rank);
    m
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
}
