//! The tensor-parallel layer's figure (`tp-layer --json`): one row per model and execution.
//! Left, whole-model time per generated token against tokens per step (log-log); right, each
//! mode's layer time over NCCL + norm at the same TP and tokens (linear, so a few percent show),
//! the compute floor (`none`) among them. One line per (TP, communication mode): colour by
//! mode, dash by TP size.

use serde_json::Value;

use super::axes::{decade_bounds, num_label, ticks, LogAxis};
use super::svg::{header, Svg};

/// Whether `v` is a tp-layer JSON document.
pub fn is_tp_layer(v: &Value) -> bool {
    v["bench"] == "tp-layer"
}

/// One colour per communication mode (in `MODES` order), one dash per TP size (ascending).
const COLORS: [&str; 6] = ["#7f7f7f", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"];
const MODES: [&str; 6] = ["none", "nccl", "symm", "fused", "auto", "barrier"];
const DASHES: [&str; 4] = [
    "",
    r#" stroke-dasharray="6 3""#,
    r#" stroke-dasharray="2 2""#,
    r#" stroke-dasharray="8 2 2 2""#,
];

struct Pt {
    model: String,
    exec: String,
    tp: u64,
    mode: String,
    kv: u64,
    tokens: f64,
    us_per_token: f64,
}

fn points(v: &Value) -> Vec<Pt> {
    v["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let model_us = r["model_us_per_step"].as_f64()?;
            let tokens = r["tokens"].as_f64()?;
            Some(Pt {
                model: r["model"].as_str()?.to_string(),
                exec: r["exec"].as_str()?.to_string(),
                tp: r["tp"].as_u64()?,
                mode: r["mode"].as_str()?.to_string(),
                kv: r["kv_len"].as_u64()?,
                tokens,
                us_per_token: model_us / tokens,
            })
        })
        .collect()
}

/// The SVG, or `None` when the document holds no timed rows.
pub fn tp_svg(v: &Value, title: &str) -> Option<String> {
    let pts = points(v);
    if pts.is_empty() {
        return None;
    }
    // One panel per (model, exec) at the longest KV length timed.
    let mut panels: Vec<(String, String)> = Vec::new();
    for p in &pts {
        let k = (p.model.clone(), p.exec.clone());
        if !panels.contains(&k) {
            panels.push(k);
        }
    }
    let (pw, ph, margin) = (420.0, 300.0, 60.0);
    let mut s = Svg::new(2.0 * (pw + margin) + margin);
    let device = v["meta"]["device"].as_str().unwrap_or("?");
    let sub = vec![
        format!("{device}; whole-model time per generated token (layers x per-layer median), log-log"),
        "colour: mode (grey none = compute floor, red nccl, blue symm, green fused, orange auto, purple barrier); dash: TP size (solid = smallest)"
            .into(),
        "right: layer time over NCCL + norm at the same TP and tokens (below 1: faster than NCCL)".into(),
    ];
    let top = header(&mut s, title, &sub) + 10.0;
    for (i, (model, exec)) in panels.iter().enumerate() {
        let kv = pts
            .iter()
            .filter(|p| &p.model == model && &p.exec == exec)
            .map(|p| p.kv)
            .max()
            .unwrap_or(0);
        let mine: Vec<&Pt> = pts
            .iter()
            .filter(|p| &p.model == model && &p.exec == exec && p.kv == kv)
            .collect();
        let x0 = margin;
        let y0 = top + i as f64 * (ph + margin);
        let (tlo, thi) = mine
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.tokens), b.max(p.tokens)));
        let (ylo, yhi) = mine.iter().fold((f64::MAX, 0f64), |(a, b), p| {
            (a.min(p.us_per_token), b.max(p.us_per_token))
        });
        let (ylo, yhi) = decade_bounds(ylo, yhi);
        let xa = LogAxis::new(tlo / 1.3, thi * 1.3, x0, x0 + pw);
        let ya = LogAxis::new(ylo, yhi, y0 + ph, y0);
        s.text(
            x0,
            y0 - 8.0,
            r#" font-weight="bold""#,
            &format!("{model}, {exec}, KV {kv}"),
        );
        s.line(x0, y0 + ph, x0 + pw, y0 + ph, r##" stroke="#444""##);
        s.line(x0, y0, x0, y0 + ph, r##" stroke="#444""##);
        for t in ticks(ylo, yhi, 10.0) {
            let y = ya.map(t);
            s.line(x0, y, x0 + pw, y, r##" stroke="#ddd""##);
            s.text(x0 - 6.0, y + 4.0, r#" text-anchor="end""#, &num_label(t));
        }
        for t in ticks(tlo, thi, 2.0) {
            let x = xa.map(t);
            s.text(x, y0 + ph + 15.0, r#" text-anchor="middle""#, &num_label(t));
        }
        s.text(
            x0 + pw / 2.0,
            y0 + ph + 32.0,
            r#" text-anchor="middle""#,
            "tokens per step",
        );
        s.text(x0 - 45.0, y0 - 8.0, "", "us/token");
        let mut series: Vec<(u64, String)> = Vec::new();
        for p in &mine {
            if !series.contains(&(p.tp, p.mode.clone())) {
                series.push((p.tp, p.mode.clone()));
            }
        }
        let mut tps: Vec<u64> = series.iter().map(|s| s.0).collect();
        tps.sort_unstable();
        tps.dedup();
        for (tp, mode) in &series {
            let m = MODES.iter().position(|x| x == mode).unwrap_or(0);
            let color = COLORS[m % COLORS.len()];
            let dash = DASHES[tps.iter().position(|t| t == tp).unwrap_or(0) % DASHES.len()];
            let mut line: Vec<(f64, f64)> = mine
                .iter()
                .filter(|p| p.tp == *tp && &p.mode == mode)
                .map(|p| (xa.map(p.tokens), ya.map(p.us_per_token)))
                .collect();
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            draw_series(&mut s, &line, color, dash, &format!("tp{tp} {mode}"));
        }
        ratio_panel(&mut s, (x0 + pw + margin, y0, pw, ph), &mine, (tlo, thi), &tps);
    }
    Some(s.finish(top + panels.len() as f64 * (ph + margin) + 20.0))
}

/// One series: its polyline, a circle at each point, `label` after the last one.
fn draw_series(s: &mut Svg, line: &[(f64, f64)], color: &str, dash: &str, label: &str) {
    let path: Vec<String> = line.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    s.o.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.4\"{dash}/>\n",
        path.join(" ")
    ));
    for (x, y) in line {
        s.o.push_str(&format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2.6\" fill=\"none\" stroke=\"{color}\"/>\n"
        ));
    }
    if let Some((x, y)) = line.last() {
        s.text(x + 6.0, y + 3.0, &format!(r#" fill="{color}" font-size="9""#), label);
    }
}

/// The right panel of a row: each (TP > 1, mode)'s time over NCCL's at the same TP and tokens,
/// on a linear axis with a tick every 0.05 and the 1x line drawn.
fn ratio_panel(s: &mut Svg, (x0, y0, pw, ph): (f64, f64, f64, f64), mine: &[&Pt], (tlo, thi): (f64, f64), tps: &[u64]) {
    let nccl = |tp: u64, tokens: f64| {
        mine.iter()
            .find(|q| q.tp == tp && q.mode == "nccl" && q.tokens == tokens)
            .map(|q| q.us_per_token)
    };
    // (TP, mode, (tokens, ratio) points).
    type Series = (u64, String, Vec<(f64, f64)>);
    let mut series: Vec<Series> = Vec::new();
    for p in mine.iter().filter(|p| p.tp > 1 && p.mode != "nccl") {
        let Some(n) = nccl(p.tp, p.tokens).filter(|n| *n > 0.0) else {
            continue;
        };
        let r = (p.tokens, p.us_per_token / n);
        match series.iter_mut().find(|(tp, m, _)| *tp == p.tp && *m == p.mode) {
            Some((_, _, v)) => v.push(r),
            None => series.push((p.tp, p.mode.clone(), vec![r])),
        }
    }
    s.text(x0, y0 - 8.0, r#" font-weight="bold""#, "over NCCL + norm");
    s.line(x0, y0 + ph, x0 + pw, y0 + ph, r##" stroke="#444""##);
    s.line(x0, y0, x0, y0 + ph, r##" stroke="#444""##);
    if series.is_empty() {
        s.text(x0 + 10.0, y0 + 20.0, "", "no NCCL rows to compare with");
        return;
    }
    let (lo, hi) = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().map(|p| p.1))
        .fold((1.0f64, 1.0f64), |(a, b), r| (a.min(r), b.max(r)));
    let (lo, hi) = ((lo * 20.0).floor() / 20.0 - 0.05, (hi * 20.0).ceil() / 20.0 + 0.05);
    let ymap = |r: f64| y0 + ph - (r - lo) / (hi - lo) * ph;
    let xa = LogAxis::new(tlo / 1.3, thi * 1.3, x0, x0 + pw);
    let mut t = lo;
    while t <= hi + 1e-9 {
        let y = ymap(t);
        let one = (t - 1.0).abs() < 1e-9;
        s.line(
            x0,
            y,
            x0 + pw,
            y,
            if one {
                r##" stroke="#444""##
            } else {
                r##" stroke="#ddd""##
            },
        );
        s.text(x0 - 6.0, y + 4.0, r#" text-anchor="end""#, &format!("{t:.2}"));
        t += 0.05;
    }
    for t in ticks(tlo, thi, 2.0) {
        s.text(xa.map(t), y0 + ph + 15.0, r#" text-anchor="middle""#, &num_label(t));
    }
    s.text(
        x0 + pw / 2.0,
        y0 + ph + 32.0,
        r#" text-anchor="middle""#,
        "tokens per step",
    );
    for (tp, mode, mut v) in series {
        let m = MODES.iter().position(|x| *x == mode).unwrap_or(0);
        let color = COLORS[m % COLORS.len()];
        let dash = DASHES[tps.iter().position(|t| *t == tp).unwrap_or(0) % DASHES.len()];
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line: Vec<(f64, f64)> = v.iter().map(|(x, r)| (xa.map(*x), ymap(*r))).collect();
        let last = v.last().map_or(f64::NAN, |p| p.1);
        draw_series(s, &line, color, dash, &format!("tp{tp} {mode} {last:.3}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_timed_rows_only() {
        let row = |tp: u64, mode: &str, tokens: u64, us: Option<f64>| {
            serde_json::json!({"model": "8b", "exec": if us.is_some() { Some("graph") } else { None },
                "tp": tp, "mode": mode, "kv_len": 1024, "tokens": tokens, "model_us_per_step": us})
        };
        let v = serde_json::json!({"bench": "tp-layer", "meta": {"device": "H200"}, "rows": [
            row(1, "none", 1, Some(3000.0)), row(1, "none", 8, Some(3200.0)),
            row(2, "nccl", 1, Some(2000.0)), row(2, "fused", 1, Some(1700.0)),
            row(4, "fused", 1, None),
        ]});
        assert!(is_tp_layer(&v));
        let svg = tp_svg(&v, "t").unwrap();
        assert!(svg.contains("tp1 none") && svg.contains("tp2 fused") && !svg.contains("tp4"));
        // Three absolute lines, and the ratio panel's tp2 fused (1700 / 2000).
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("tp2 fused 0.850"), "the ratio to NCCL is labelled");
        let empty = serde_json::json!({"bench": "tp-layer", "rows": [row(4, "fused", 1, None)]});
        assert!(tp_svg(&empty, "t").is_none());
    }
}
