//! How series are drawn: markers, colours, dashes; a distinct [`Style`] per
//! series of the detail figure, a fixed one per line of the comparison.

use std::collections::HashSet;

use super::records::{modes_of, ordered, series_name, Point, AUTO, NCCL, TORCH_SYMM};

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
    /// The `data-style` attribute of a drawn series.
    pub(super) fn data(&self) -> String {
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
pub(super) const NCCL_COLOR: &str = "#222222";
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
        let modes = modes_of(pts.iter().filter(|p| &p.algo == algo));
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
pub(super) fn comparison_style(algo: &str, mode: Option<&str>) -> Style {
    let (color, marker, width) = match algo {
        AUTO => (AUTO_COLOR, Marker::Circle, 2.4),
        TORCH_SYMM => ("#ff7f0e", Marker::TriangleUp, 2.0),
        _ => (NCCL_COLOR, Marker::Square, 2.0),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::tests::mk;

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
}
