//! The panel grid: a panel's size and margins, and [`Panel`], a frame with
//! log axes, grid, ticks and titles that draws series.

use std::fmt::Write as _;

use super::axes::{decade_bounds, num_label, ratio_bounds, ratio_label, ratio_ticks, size_label, ticks, LogAxis};
use super::style::Style;
use super::svg::{dash_attr, esc, wrap, Svg};

pub(super) const PW: f64 = 440.0; // panel width
const PH: f64 = 270.0; // panel height
pub(super) const ML: f64 = 58.0; // left margin of a cell: the y tick labels
const MR: f64 = 44.0; // right margin of a cell: room for the NCCL label of the 1x line
pub(super) const CELL_W: f64 = ML + PW + MR;
pub(super) const ROW_H: f64 = 28.0 + PH + 50.0;
pub(super) const LINE_H: f64 = 17.0;

/// One panel: a frame with log axes.
pub(super) struct Panel {
    x0: f64,
    top: f64,
    xa: LogAxis,
    pub(super) ya: LogAxis,
}

/// (min, max) of the positive finite values, None when there are none.
fn range(vals: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    vals.filter(|v| *v > 0.0 && v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((a, b)) => Some((a.min(v), b.max(v))),
        })
}

/// The x range of a set of lines (sizes).
pub(super) fn x_range<'a>(xy: impl Iterator<Item = &'a (f64, f64)>) -> Option<(f64, f64)> {
    range(xy.map(|p| p.0))
}

/// The y range of a set of lines (values).
pub(super) fn y_range<'a>(xy: impl Iterator<Item = &'a (f64, f64)>) -> Option<(f64, f64)> {
    range(xy.map(|p| p.1))
}

/// A panel's title, above its frame.
fn draw_title(s: &mut Svg, x0: f64, top: f64, title: &str) {
    s.text(x0, top - 9.0, r#" font-size="13" font-weight="bold""#, title);
}

#[derive(Clone, Copy)]
/// How a panel's y axis is scaled and labelled.
pub(super) enum YScale {
    /// Decades, labelled as plain numbers.
    Decades,
    /// Ratios around 1x.
    Ratio,
}

impl Panel {
    /// Draws the frame, title (which names the y unit: no rotated text, which
    /// some renderers draw wrongly), grid, ticks and x title; returns the panel.
    pub(super) fn draw(
        s: &mut Svg,
        x0: f64,
        top: f64,
        title: &str,
        (xmin, xmax): (f64, f64),
        (ymin, ymax): (f64, f64),
        scale: YScale,
    ) -> Panel {
        draw_title(s, x0, top, title);
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

    /// One series, a line with markers, in `st`; `tip` is its hover text.
    pub(super) fn series(&self, s: &mut Svg, label: &str, tip: &str, xy: &[(f64, f64)], st: &Style) {
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

    /// A message in the panel's top left corner.
    pub(super) fn no_data(&self, s: &mut Svg, msg: &str) {
        s.text(self.x0 + 12.0, self.top + 22.0, r##" fill="#666""##, msg);
    }
}

/// An empty panel frame with a message.
pub(super) fn empty_panel(s: &mut Svg, x0: f64, top: f64, title: &str, msg: &str) {
    draw_title(s, x0, top, title);
    let _ = writeln!(
        s.o,
        r##"<rect x="{x0}" y="{top}" width="{PW}" height="{PH}" fill="#fafafa" stroke="#999"/>"##
    );
    for (i, l) in wrap(msg, ((PW - 30.0) / 6.5) as usize).iter().enumerate() {
        s.text(x0 + 14.0, top + 24.0 + 16.0 * i as f64, r##" fill="#555""##, l);
    }
}
