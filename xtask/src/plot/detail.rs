//! The detail figure (`bench-detail.svg`): every (algorithm, mode) series,
//! latency and bus bandwidth, each in its own style, a legend per row.

use super::meta::{mode_text, Meta};
use super::panel::{empty_panel, x_range, y_range, Panel, YScale, CELL_W, LINE_H, ML, ROW_H};
use super::records::{ordered, Point};
use super::style::detail_styles;
use super::svg::{header, text_w, Svg};

/// The value a panel plots for a point.
type Getter = fn(&Point) -> Option<f64>;

/// (bytes, value) of the points with a positive size and value.
fn xy_of<'a>(pts: impl Iterator<Item = &'a Point>, get: Getter) -> Vec<(f64, f64)> {
    pts.filter_map(|p| get(p).map(|y| (p.bytes, y)))
        .filter(|(x, y)| *x > 0.0 && *y > 0.0)
        .collect()
}

/// The detail figure: every (algorithm, mode) series, latency and busbw.
pub fn detail_svg(pts: &[Point], meta: &Meta) -> String {
    let styles = detail_styles(pts);
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
    let title = if run.is_empty() {
        "symm benchmark: every algorithm".to_string()
    } else {
        format!("symm benchmark: every algorithm — {run}")
    };
    let mut s = Svg::new(width);
    let rows_y = header(&mut s, &title, &sub) + 8.0;
    let height = rows_y + row_h.iter().sum::<f64>().max(ROW_H) + 10.0;
    if pts.is_empty() {
        s.text(14.0, rows_y + 20.0, "", "no data points");
        return s.finish(height);
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
            let vals = xy_of(in_op.iter().copied(), *get);
            let (Some(xr), Some(yr)) = (x_range(vals.iter()), y_range(vals.iter())) else {
                empty_panel(&mut s, x0, top, &title, "no data");
                continue;
            };
            let p = Panel::draw(&mut s, x0, top, &title, xr, yr, YScale::Decades);
            // auto and nccl last, on top of the others.
            for (series, st) in styles.iter().rev() {
                let mut xy = xy_of(in_op.iter().copied().filter(|p| &p.series == series), *get);
                xy.sort_by(|a, b| a.0.total_cmp(&b.0));
                p.series(&mut s, series, &format!("{op}: {series}"), &xy, st);
            }
        }
        // Legend of this row.
        let lx = 2.0 * CELL_W + 4.0;
        let mut ly = top + 8.0;
        for (series, st) in &styles {
            if !in_op.iter().any(|p| &p.series == series) {
                continue;
            }
            s.swatch(lx, ly, st);
            s.text(lx + 38.0, ly + 4.0, r#" font-size="12""#, series);
            ly += LINE_H;
        }
        y0 += row_h.get(row).copied().unwrap_or(ROW_H);
    }
    s.finish(height)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;
    use crate::plot::svg::esc;
    use crate::plot::tests::{attr_values, gpu_like};

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
}
