//! The SVG writer: text, lines, markers, legend swatches; text escaping,
//! width and wrapping; a figure's header and legend row.

use std::fmt::Write as _;

use super::style::{Marker, Style};

const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";

/// An SVG document being written: the body first, its height (known once the
/// body is laid out) at [`Svg::finish`].
pub(super) struct Svg {
    pub(super) o: String,
    width: f64,
}

impl Svg {
    pub(super) fn new(width: f64) -> Svg {
        Svg {
            o: String::new(),
            width,
        }
    }
    pub(super) fn text(&mut self, x: f64, y: f64, attrs: &str, s: &str) {
        let _ = writeln!(self.o, r#"<text x="{x:.1}" y="{y:.1}"{attrs}>{}</text>"#, esc(s));
    }
    pub(super) fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, attrs: &str) {
        let _ = writeln!(
            self.o,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}"{attrs}/>"#
        );
    }
    pub(super) fn marker(&mut self, m: Marker, x: f64, y: f64, st: &Style) {
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
    pub(super) fn swatch(&mut self, x: f64, y: f64, st: &Style) {
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
    /// The document, `height` pixels high.
    pub(super) fn finish(self, height: f64) -> String {
        let width = self.width;
        let mut o = String::with_capacity(self.o.len() + 400);
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="{FONT}" font-size="11">"#
        );
        let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
        o.push_str(&self.o);
        o.push_str("</svg>\n");
        o
    }
}

/// The `stroke-dasharray` attribute of a dash, none for solid.
pub(super) fn dash_attr(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(r#" stroke-dasharray="{d}""#)
    }
}

/// `s` escaped for SVG text and attributes.
pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A rough width of `s` in pixels at `size` px sans-serif.
pub(super) fn text_w(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.58
}

/// `s` broken into lines of at most `chars` characters, at spaces.
pub(super) fn wrap(s: &str, chars: usize) -> Vec<String> {
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

/// Title and wrapped subtitle lines; returns the y below them.
pub(super) fn header(s: &mut Svg, title: &str, sub: &[String]) -> f64 {
    s.text(14.0, 26.0, r#" font-size="17" font-weight="bold""#, title);
    let mut y = 46.0;
    let chars = ((s.width - 28.0) / (12.0 * 0.56)) as usize;
    for para in sub {
        for l in wrap(para, chars.max(20)) {
            s.text(14.0, y, r##" font-size="12" fill="#333""##, &l);
            y += 16.0;
        }
    }
    y
}

/// A horizontal legend (wrapped to `width`); returns the y below it.
pub(super) fn legend_row(s: &mut Svg, x0: f64, y0: f64, width: f64, items: &[(String, Style)]) -> f64 {
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

#[cfg(test)]
mod tests {
    use crate::plot::comparison::comparison_svg;
    use crate::plot::detail::detail_svg;
    use crate::plot::meta::Meta;
    use crate::plot::tests::{finite, mk};

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
}
