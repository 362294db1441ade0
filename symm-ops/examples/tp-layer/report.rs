//! The results: a row per timed (model, TP, mode, execution, tokens, KV length), the table
//! printed from them, and the JSON file.

use crate::group::Record;
use crate::model::{Shape, TOLERANCE};
use crate::rank::{Exec, Mode};

/// One timed configuration, or one checked-only configuration (ranks sharing a GPU).
#[derive(Clone, Debug)]
pub struct Row {
    pub model: &'static str,
    pub layers: usize,
    pub tp: usize,
    pub shared: bool,
    pub mode: Mode,
    pub algo: String,
    pub exec: Option<Exec>,
    pub tokens: usize,
    pub kv_len: usize,
    /// Median and minimum microseconds per layer (rank 0), when timed.
    pub layer_us: Option<(f64, f64)>,
    /// Worst difference from the TP 1 output (and from the float64 reference where run).
    pub vs_tp1: Option<f64>,
    pub vs_reference: Option<f64>,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}

impl Row {
    pub fn from_record(shape: &Shape, tp: usize, shared: bool, r: &Record) -> Vec<Row> {
        let base = Row {
            model: shape.name,
            layers: shape.layers,
            tp,
            shared,
            mode: r.mode,
            algo: r.algo.clone(),
            exec: None,
            tokens: r.tokens,
            kv_len: r.kv_len,
            layer_us: None,
            vs_tp1: None,
            vs_reference: None,
        };
        if r.times.is_empty() {
            return vec![base];
        }
        r.times
            .iter()
            .map(|(e, t)| Row {
                exec: Some(*e),
                layer_us: Some((median(t), t.iter().cloned().fold(f64::INFINITY, f64::min))),
                ..base.clone()
            })
            .collect()
    }

    /// Microseconds per step of the whole model (every layer; embeddings and LM head excluded).
    pub fn model_us(&self) -> Option<f64> {
        self.layer_us.map(|(m, _)| m * self.layers as f64)
    }

    pub fn tokens_per_s(&self) -> Option<f64> {
        self.model_us().map(|us| self.tokens as f64 / (us * 1e-6))
    }

    fn same_point(&self, o: &Row) -> bool {
        self.model == o.model
            && self.tp == o.tp
            && self.exec == o.exec
            && self.tokens == o.tokens
            && self.kv_len == o.kv_len
    }

    /// The share of the step the collectives and their epilogues add over the compute floor
    /// (the same TP without collectives).
    pub fn collective_share(&self, rows: &[Row]) -> Option<f64> {
        let floor = rows.iter().find(|o| o.mode == Mode::None && self.same_point(o))?;
        let (t, f) = (self.layer_us?.0, floor.layer_us?.0);
        (self.mode != Mode::None && self.tp > 1).then(|| (t - f) / t)
    }

    /// Time per layer relative to NCCL + separate norm at the same point.
    pub fn vs_nccl(&self, rows: &[Row]) -> Option<f64> {
        let n = rows.iter().find(|o| o.mode == Mode::Nccl && self.same_point(o))?;
        Some(self.layer_us?.0 / n.layer_us?.0)
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// The table, one block per (model, execution); checked-only rows at the end.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let mut blocks: Vec<(&str, Option<Exec>)> = Vec::new();
    for r in rows.iter().filter(|r| r.exec.is_some()) {
        if !blocks.contains(&(r.model, r.exec)) {
            blocks.push((r.model, r.exec));
        }
    }
    for (model, exec) in blocks {
        let layers = rows.iter().find(|r| r.model == model).map_or(0, |r| r.layers);
        s += &format!(
            "\n{model} ({layers} layers), {}; per layer: median us (min); model: whole-model time per step\n",
            exec.map_or("", |e| e.name())
        );
        s += &format!(
            "{:>3} {:>5} {:>4} {:>5} {:>16} {:>9} {:>10} {:>9} {:>6} {:>6} {:>8}  {}\n",
            "tp",
            "mode",
            "tok",
            "kv",
            "layer us",
            "model ms",
            "us/token",
            "tok/s",
            "coll%",
            "/nccl",
            "vs tp1",
            "epilogue"
        );
        for r in rows.iter().filter(|r| r.model == model && r.exec == exec) {
            let (med, min) = r.layer_us.unwrap_or((f64::NAN, f64::NAN));
            let model_ms = r.model_us().map(|u| u / 1e3);
            s += &format!(
                "{:>3} {:>5} {:>4} {:>5} {:>8.1} ({:>6.1}) {:>9} {:>10} {:>9} {:>6} {:>6} {:>8}  {}\n",
                r.tp,
                r.mode.name(),
                r.tokens,
                r.kv_len,
                med,
                min,
                opt(model_ms, |v| format!("{v:.3}")),
                opt(model_ms.map(|m| m * 1e3 / r.tokens as f64), |v| format!("{v:.1}")),
                opt(r.tokens_per_s(), |v| format!("{v:.0}")),
                opt(r.collective_share(rows), |v| format!("{:.1}", v * 100.0)),
                opt(r.vs_nccl(rows), |v| format!("{v:.3}")),
                opt(r.vs_tp1, |v| format!("{v:.1e}")),
                r.algo,
            );
        }
    }
    let checked: Vec<&Row> = rows.iter().filter(|r| r.exec.is_none()).collect();
    if !checked.is_empty() {
        s += &format!(
            "\nchecked, not timed (the tiny layer, and ranks sharing one GPU); worst |a-b|/(rms+|b|), tolerance {TOLERANCE:.3}\n"
        );
        s += &format!(
            "{:>5} {:>3} {:>5} {:>4} {:>5} {:>9} {:>9}  epilogue\n",
            "model", "tp", "mode", "tok", "kv", "vs tp1", "vs f64"
        );
        for r in checked {
            s += &format!(
                "{:>5} {:>3} {:>5} {:>4} {:>5} {:>9} {:>9}  {}\n",
                r.model,
                r.tp,
                r.mode.name(),
                r.tokens,
                r.kv_len,
                opt(r.vs_tp1, |v| format!("{v:.1e}")),
                opt(r.vs_reference, |v| format!("{v:.1e}")),
                r.algo
            );
        }
    }
    s
}

/// The JSON document: the run's settings and every row with its derived figures.
pub fn json(rows: &[Row], meta: serde_json::Value) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "model": r.model,
                "layers": r.layers,
                "tp": r.tp,
                "shared_gpu": r.shared,
                "mode": r.mode.name(),
                "epilogue": r.algo,
                "exec": r.exec.map(|e| e.name()),
                "tokens": r.tokens,
                "kv_len": r.kv_len,
                "layer_us_median": r.layer_us.map(|t| t.0),
                "layer_us_min": r.layer_us.map(|t| t.1),
                "model_us_per_step": r.model_us(),
                "tokens_per_s": r.tokens_per_s(),
                "collective_share": r.collective_share(rows),
                "vs_nccl": r.vs_nccl(rows),
                "diff_vs_tp1": r.vs_tp1,
                "diff_vs_f64_reference": r.vs_reference,
            })
        })
        .collect();
    serde_json::json!({ "bench": "tp-layer", "tolerance": TOLERANCE, "meta": meta, "rows": rows })
}
