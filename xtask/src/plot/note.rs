//! The figure for a JSON without benchmark records (a `--probe` /
//! `--probe-bw` run): a note, and the JSON's other tables (setup costs).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Map, Value};

use super::axes::size_label;
use super::meta::Meta;
use super::records::ordered;
use super::svg::{header, Svg};
use super::{write, Plotted};
use crate::util::Result;

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
    let widths: Vec<Vec<f64>> = tables.iter().map(|t| table_w(&t.cols, &t.rows)).collect();
    let widest = widths.iter().map(|ws| ws.iter().sum::<f64>()).fold(0.0, f64::max);
    let width = (widest + 40.0).clamp(720.0, 1800.0);
    let mut s = Svg::new(width);
    let below = header(&mut s, title, note);
    let height = below
        + 20.0
        + tables
            .iter()
            .map(|t| 40.0 + 18.0 * (t.rows.len() + 1) as f64)
            .sum::<f64>();
    let mut y = below + 16.0;
    for (Table { name, cols, rows }, ws) in tables.iter().zip(&widths) {
        s.text(14.0, y, r#" font-size="13" font-weight="bold""#, name);
        y += 10.0;
        let total: f64 = ws.iter().sum();
        let _ = writeln!(
            s.o,
            r##"<rect x="14" y="{y:.1}" width="{total:.1}" height="18" fill="#e4e4e4" stroke="none"/>"##
        );
        let mut x = 14.0;
        for (c, w) in cols.iter().zip(ws) {
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
            for (c, w) in r.iter().zip(ws) {
                s.text(x + 6.0, y + 13.0, r#" font-size="12""#, c);
                x += w;
            }
            y += 18.0;
        }
        y += 22.0;
    }
    s.finish(height)
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

/// What [`plot_file`](super::plot_file) writes for the JSON `v` (read from
/// `json`) when it holds no benchmark records: a note and the JSON's tables in
/// `svg_path`; a stale `detail` figure goes. `failed` records were left out.
/// An error when `v` is no symm-bench document and holds no table either.
pub(super) fn plot_note(
    v: &Value,
    json: &Path,
    svg_path: &Path,
    detail: &Path,
    meta: &Meta,
    failed: usize,
) -> Result<Plotted> {
    let t = tables(v);
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
    if failed > 0 {
        note.push(format!("{} row(s) failed their check or did not run.", failed));
    }
    if t.is_empty() {
        note.push("Nor does it hold any other table.".into());
    }
    write(svg_path, &note_svg("symm-bench: no benchmark rows to plot", &note, &t))?;
    // A detail figure from an earlier run would sit next to this note as if it were this run's.
    if detail.is_file() {
        std::fs::remove_file(detail).map_err(|e| format!("remove stale {}: {e}", detail.display()))?;
    }
    let what = if t.is_empty() {
        "a note".to_string()
    } else {
        format!("a note and {} table(s)", t.len())
    };
    Ok(Plotted {
        points: 0,
        failed,
        files: vec![svg_path.to_path_buf()],
        note: Some(format!(
            "{} holds no benchmark records (a --probe run?): {what}",
            json.display()
        )),
        nccl: false,
    })
}

#[cfg(test)]
mod tests {
    use crate::plot::plot_file;
    use crate::plot::tests::tmp_file;

    #[test]
    fn probe_only_json_gives_a_note_not_an_error() {
        let (d, json) = tmp_file(
            "probe",
            "bench.json",
            r#"{"tool": "symm-bench", "backend": "2 x NVIDIA H200", "world": 2, "dtype": "bf16", "redop": "sum",
                "rounds": 7, "results": [], "setup": [
                {"what": "symmetric alloc + rendezvous", "size_bytes": 1048576, "median_ms": 0.404}]}"#,
        );
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
}
