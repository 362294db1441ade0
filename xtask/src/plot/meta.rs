//! What the figures' titles say: the run ([`Meta`]) and what the line styles
//! mean.

use serde_json::Value;

use super::records::{modes_of, Point};

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
    /// The run as the JSON's top level describes it; `source` is its file name.
    pub(super) fn from_json(v: &Value, source: &str) -> Meta {
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
    /// `backend, N ranks, dtype redop`, what of it is known.
    pub(super) fn run(&self) -> String {
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
    /// `data: FILE`, and the anchors' file when there is one.
    pub(super) fn sources(&self) -> String {
        let mut s = format!("data: {}", self.source);
        if let Some(a) = &self.anchors {
            s.push_str(&format!(", PyTorch anchors: {a}"));
        }
        s
    }
}

/// What line styles mean, for the modes present.
pub(super) fn mode_text(pts: &[Point]) -> &'static str {
    let modes = modes_of(pts.iter());
    let has = |m: &str| modes.iter().any(|x| x.as_deref() == Some(m));
    match (has("graph"), has("eager")) {
        (true, true) => "Solid line, filled marker = CUDA graph replay; dashed line, hollow marker = eager launches.",
        (true, false) => "CUDA graph replay only.",
        (false, true) => "Eager launches only.",
        (false, false) => "",
    }
}
