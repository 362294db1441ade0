//! The comparison figure (`bench.svg`, the first one): per collective, `auto`
//! and `torch symm_mem` against NCCL, latency and time relative to NCCL.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::meta::{mode_text, Meta};
use super::panel::{empty_panel, x_range, y_range, Panel, YScale, CELL_W, ML, PW, ROW_H};
use super::records::{modes_of, ordered, series_name, Point, AUTO, NCCL, TORCH_NCCL, TORCH_SYMM};
use super::style::{comparison_style, Style, NCCL_COLOR};
use super::svg::{header, legend_row, text_w, Svg};

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

/// Sorted (bytes, time) of the positive points; the fastest time where a size repeats.
fn curve<'a>(pts: impl Iterator<Item = &'a Point>) -> Vec<(f64, f64)> {
    // Keyed by the bits of a positive size, which sort as the sizes do.
    let mut by: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for p in pts.filter(|p| p.bytes > 0.0 && p.time_us > 0.0) {
        let e = by.entry(p.bytes.to_bits()).or_insert((p.bytes, p.time_us));
        e.1 = e.1.min(p.time_us);
    }
    by.into_values().collect()
}

/// A latency line per mode of the points of `in_op` whose algorithm `pick`
/// selects, labelled `name (mode)`; graph first.
fn lines(in_op: &[&Point], name: &str, pick: impl Fn(&str) -> bool) -> Vec<Line> {
    let mine: Vec<&Point> = in_op.iter().copied().filter(|p| pick(&p.algo)).collect();
    modes_of(mine.iter().copied())
        .into_iter()
        .filter_map(|mode| {
            let xy = curve(mine.iter().copied().filter(|p| p.mode == mode));
            (!xy.is_empty()).then(|| Line {
                algo: name.into(),
                label: series_name(name, mode.as_deref()),
                mode,
                xy,
            })
        })
        .collect()
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
            for l in lines(&in_op, name, pick) {
                if let Some(r) = &reference {
                    let base = curve(in_op.iter().copied().filter(|p| &p.algo == r && p.mode == l.mode));
                    let rxy: Vec<(f64, f64)> =
                        l.xy.iter()
                            .filter_map(|(b, t)| base.iter().find(|(rb, _)| rb == b).map(|(_, rt)| (*b, t / rt)))
                            .collect();
                    if !rxy.is_empty() {
                        ratio.push(Line { xy: rxy, ..l.clone() });
                    }
                }
                latency.push(l);
            }
        }
        if let Some(r) = &reference {
            latency.extend(lines(&in_op, r, |a| a == r));
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
    let mut s = Svg::new(width);
    let y = header(&mut s, &title, &sub);
    let rows_y = legend_row(&mut s, 14.0, y, width - 28.0, &legend) + 10.0;
    let height = rows_y + ROW_H * nrows as f64 + 10.0;
    if cmp.is_empty() {
        s.text(14.0, rows_y + 20.0, "", "no data points");
        return s.finish(height);
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
            r#"<g class="ref-line" data-value="1"><line x1="{x1:.1}" y1="{y1:.1}" x2="{:.1}" y2="{y1:.1}" stroke="{NCCL_COLOR}" stroke-width="1.6"/><text x="{:.1}" y="{:.1}" font-size="12" font-weight="bold" fill="{NCCL_COLOR}">NCCL</text></g>"#,
            x1 + PW,
            x1 + PW + 4.0,
            y1 + 4.0
        );
        for l in c.ratio.iter().rev() {
            let st = comparison_style(&l.algo, l.mode.as_deref());
            p.series(&mut s, &l.label, &format!("{}: {} / {r}", c.op, l.label), &l.xy, &st);
        }
    }
    s.finish(height)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::Value;

    use super::*;
    use crate::plot::records::{anchors, records};
    use crate::plot::tests::{attr_values, finite, gpu_like, mk};

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
}
