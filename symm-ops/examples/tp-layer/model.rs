//! The layer's shapes, how its tensors are sharded over tensor-parallel ranks, and the values
//! of its weights (host side; no GPU).
//!
//! Every tensor is defined globally, as at TP = 1: element `(row, col)` of tensor `t` is
//! `offset + scale * uniform(seed_of(t), row * cols + col)`, rounded to bf16. A rank's shard is a
//! list of [`Segment`]s of global rows and columns, stacked by rows, so TP = t and TP = 1 hold
//! the same numbers and the host reference can rebuild any shard. The device generates the
//! same values with the same hash (`tp_init` in `kernels.cu` cites NOTE [tp-uniform]).

use half::bf16;

/// A Llama decoder layer's dimensions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: usize,
    pub inter: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Layers of the whole model (per-token model time is per-layer time times this).
    pub layers: usize,
    pub eps: f32,
    pub rope_theta: f32,
}

/// Llama-3-8B.
pub const LLAMA3_8B: Shape = Shape {
    name: "8b",
    hidden: 4096,
    inter: 14336,
    q_heads: 32,
    kv_heads: 8,
    head_dim: 128,
    layers: 32,
    eps: 1e-5,
    rope_theta: 500_000.0,
};

/// Llama-3-70B.
pub const LLAMA3_70B: Shape = Shape {
    name: "70b",
    hidden: 8192,
    inter: 28672,
    q_heads: 64,
    kv_heads: 8,
    head_dim: 128,
    layers: 80,
    eps: 1e-5,
    rope_theta: 500_000.0,
};

/// A small layer of the same structure (GQA groups of 2, 8 KV heads so TP 8 divides it) that
/// the float64 reference computes in milliseconds.
pub const TINY: Shape = Shape {
    name: "tiny",
    hidden: 1024,
    inter: 2048,
    q_heads: 16,
    kv_heads: 8,
    head_dim: 128,
    layers: 2,
    eps: 1e-5,
    rope_theta: 10_000.0,
};

/// The only head size the attention kernel is written for (both Llama-3 models use it).
pub const HEAD_DIM: usize = 128;

/// Rows of the KV cache reserved per head in the global index space, so a cache value does
/// not depend on how long a run's cache is.
pub const CACHE_STRIDE: usize = 1 << 20;

impl Shape {
    pub fn by_name(name: &str) -> Option<Shape> {
        [LLAMA3_8B, LLAMA3_70B, TINY].into_iter().find(|s| s.name == name)
    }

    /// Whether `tp` ranks can split this layer the Megatron way.
    pub fn check_tp(&self, tp: usize) -> Result<(), String> {
        let ok = tp >= 1
            && self.kv_heads.is_multiple_of(tp)
            && self.q_heads.is_multiple_of(tp)
            && self.inter.is_multiple_of(tp);
        if !ok {
            return Err(format!(
                "{}: TP {tp} does not divide {} KV heads, {} query heads and intermediate {}",
                self.name, self.kv_heads, self.q_heads, self.inter
            ));
        }
        if self.head_dim != HEAD_DIM || !self.q_heads.is_multiple_of(self.kv_heads) || self.q_heads / self.kv_heads > 8
        {
            return Err(format!(
                "{}: the attention kernel takes head dim 128 and GQA groups up to 8",
                self.name
            ));
        }
        Ok(())
    }

    /// One rank's share of the heads and of the intermediate size.
    pub fn local(&self, tp: usize) -> LocalDims {
        LocalDims {
            q_heads: self.q_heads / tp,
            kv_heads: self.kv_heads / tp,
            inter: self.inter / tp,
        }
    }

    /// Weight bytes of one layer (bf16), all ranks together.
    pub fn weight_bytes(&self) -> usize {
        2 * ((self.q_heads + 2 * self.kv_heads) * self.head_dim * self.hidden
            + self.hidden * self.q_heads * self.head_dim
            + 2 * self.inter * self.hidden
            + self.hidden * self.inter
            + 2 * self.hidden)
    }
}

/// Per-rank head counts and intermediate size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalDims {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub inter: usize,
}

/// The layer's tensors, each drawn from its own stream of the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tensor {
    /// The residual stream entering the layer: tokens x hidden.
    Input,
    /// RMSNorm weight before attention (and, as the next layer's, after the MLP).
    InNorm,
    /// Fused QKV projection, `[q heads; k heads; v heads] x hidden` (PyTorch `Linear` layout).
    Qkv,
    /// Output projection, `hidden x (q heads * head dim)`.
    O,
    /// RMSNorm weight after attention.
    PostNorm,
    /// Fused gate and up projections, `[gate; up] x hidden`.
    GateUp,
    /// Down projection, `hidden x inter`.
    Down,
    /// Keys already in the cache: row `head * CACHE_STRIDE + position`, head dim columns.
    KCache,
    /// Values already in the cache, laid out as the keys.
    VCache,
}

impl Tensor {
    fn id(self) -> u64 {
        self as u64 + 1
    }

    /// The seed of this tensor's values under the run's seed.
    pub fn seed(self, seed: u64) -> u64 {
        splitmix(seed ^ (self.id() << 56))
    }

    /// Columns of the global tensor (its row length in the index the values hash).
    pub fn global_cols(self, s: &Shape) -> usize {
        match self {
            Tensor::Input | Tensor::InNorm | Tensor::PostNorm | Tensor::Qkv | Tensor::GateUp => s.hidden,
            Tensor::O => s.q_heads * s.head_dim,
            Tensor::Down => s.inter,
            Tensor::KCache | Tensor::VCache => s.head_dim,
        }
    }

    /// `(scale, offset)`: values are `offset + scale * u` for `u` uniform in `[-1, 1)`.
    /// Projections have unit-variance outputs; the cached keys are wider than the new ones so
    /// that the softmax is far from flat.
    pub fn dist(self, s: &Shape) -> (f32, f32) {
        let fan_in = |n: usize| (3.0 / n as f64).sqrt() as f32;
        match self {
            Tensor::Input | Tensor::VCache => (1.0, 0.0),
            Tensor::InNorm | Tensor::PostNorm => (0.25, 1.0),
            Tensor::Qkv | Tensor::GateUp => (fan_in(s.hidden), 0.0),
            Tensor::O => (fan_in(s.q_heads * s.head_dim), 0.0),
            Tensor::Down => (fan_in(s.inter), 0.0),
            Tensor::KCache => (3.0, 0.0),
        }
    }

    /// The global element `(row, col)` as the device writes it.
    pub fn value(self, s: &Shape, seed: u64, row: usize, col: usize) -> bf16 {
        let (scale, offset) = self.dist(s);
        let u = uniform(self.seed(seed), (row * self.global_cols(s) + col) as u64);
        bf16::from_f32(offset + scale * u)
    }
}

/// splitmix64's finaliser.
pub fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// NOTE [tp-uniform]: element `i` of a tensor seeded `seed` is uniform in `[-1, 1)` on a grid of
/// 2^-23: `(splitmix(seed + (i + 1) * golden) >> 40) * 2^-23 - 1`, exact in f32. `tp_uniform` in
/// `kernels.cu` is the same function; the scale and offset are applied with one rounding each
/// (no fused multiply-add) on both sides.
pub fn uniform(seed: u64, i: u64) -> f32 {
    let z = splitmix(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    (z >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
}

/// Global rows `global_row..+rows`, columns `global_col..+cols`, stored at local rows
/// `local_row..+rows` (columns `0..cols`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub local_row: usize,
    pub global_row: usize,
    pub rows: usize,
    pub global_col: usize,
    pub cols: usize,
}

/// A rank's shard of one tensor: a row-major `rows x cols` matrix made of segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub tensor: Tensor,
    pub rows: usize,
    pub cols: usize,
    pub segments: Vec<Segment>,
}

impl Shard {
    /// Rank `rank`'s shard of `tensor` under `tp`-way tensor parallelism (Megatron: QKV and
    /// gate/up split by output rows, head-aligned; O and down split by input columns; norms
    /// and the input replicated; the KV cache split by heads, `lmax` positions per head).
    /// `tokens` sizes the input.
    pub fn new(tensor: Tensor, s: &Shape, tp: usize, rank: usize, tokens: usize, lmax: usize) -> Shard {
        let l = s.local(tp);
        let hd = s.head_dim;
        let seg = |local_row, global_row, rows, global_col, cols| Segment {
            local_row,
            global_row,
            rows,
            global_col,
            cols,
        };
        let (rows, cols, segments) = match tensor {
            Tensor::Input => (tokens, s.hidden, vec![seg(0, 0, tokens, 0, s.hidden)]),
            Tensor::InNorm | Tensor::PostNorm => (1, s.hidden, vec![seg(0, 0, 1, 0, s.hidden)]),
            Tensor::Qkv => {
                let (q, kv) = (l.q_heads * hd, l.kv_heads * hd);
                let k0 = s.q_heads * hd;
                let v0 = k0 + s.kv_heads * hd;
                (
                    q + 2 * kv,
                    s.hidden,
                    vec![
                        seg(0, rank * q, q, 0, s.hidden),
                        seg(q, k0 + rank * kv, kv, 0, s.hidden),
                        seg(q + kv, v0 + rank * kv, kv, 0, s.hidden),
                    ],
                )
            }
            Tensor::O => {
                let q = l.q_heads * hd;
                (s.hidden, q, vec![seg(0, 0, s.hidden, rank * q, q)])
            }
            Tensor::GateUp => (
                2 * l.inter,
                s.hidden,
                vec![
                    seg(0, rank * l.inter, l.inter, 0, s.hidden),
                    seg(l.inter, s.inter + rank * l.inter, l.inter, 0, s.hidden),
                ],
            ),
            Tensor::Down => (s.hidden, l.inter, vec![seg(0, 0, s.hidden, rank * l.inter, l.inter)]),
            Tensor::KCache | Tensor::VCache => (
                l.kv_heads * lmax,
                hd,
                (0..l.kv_heads)
                    .map(|h| seg(h * lmax, (rank * l.kv_heads + h) * CACHE_STRIDE, lmax, 0, hd))
                    .collect(),
            ),
        };
        Shard {
            tensor,
            rows,
            cols,
            segments,
        }
    }

    /// The global `(row, first column)` behind local row `r`.
    pub fn global_row(&self, r: usize) -> (usize, usize) {
        let g = self
            .segments
            .iter()
            .find(|g| (g.local_row..g.local_row + g.rows).contains(&r))
            .unwrap_or_else(|| panic!("{:?}: local row {r} outside the shard", self.tensor));
        (g.global_row + (r - g.local_row), g.global_col)
    }

    /// Local row `r` as the device holds it, widened to f64.
    pub fn row(&self, s: &Shape, seed: u64, r: usize) -> Vec<f64> {
        let (gr, gc) = self.global_row(r);
        (0..self.cols)
            .map(|c| self.tensor.value(s, seed, gr, gc + c).to_f64())
            .collect()
    }
}

/// How far apart two outputs are: the largest `|a - b| / (rms + |b|)`, `rms` the RMS of `b`'s
/// row (NOTE [tp-tolerance]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Diff {
    pub worst: f64,
    pub row: usize,
    pub col: usize,
    pub a: f64,
    pub b: f64,
}

/// NOTE [tp-tolerance]: two runs of the layer agree when every element satisfies
/// `|a - b| <= 2^-4 * (rms(row of b) + |b|)`. A chain of about a dozen bf16 roundings (QKV,
/// rotary, attention, O, residual, norm, gate/up, SiLU, down, residual, norm), each off by up to
/// 2^-8 relative (bf16's unit roundoff), moves an element by a few of its own units (the `|b|`
/// term: one unit of an element four times the row's RMS is already 2^-5 of the RMS) and a small
/// element by a little of the row's scale (the `rms` term); docs/benchmarks.md gives the measured
/// worst. A wrong shard or head moves typical elements by about the row's RMS. A wrong position
/// or mask shows where the new tokens carry the softmax, so the GPU run checks a one-position
/// cache: there the unit test `the_checks_see_mask_and_position_mistakes` measures 8 and 27
/// times the bound; behind long caches of wider keys such a mistake can hide under it.
pub const TOLERANCE: f64 = 1.0 / 16.0;

impl Diff {
    /// `a` against `b` (the reference), rows of `hidden`.
    pub fn of(a: &[f64], b: &[f64], hidden: usize) -> Diff {
        assert_eq!(a.len(), b.len(), "outputs of different lengths");
        let mut d = Diff::default();
        for (row, (ra, rb)) in a.chunks(hidden).zip(b.chunks(hidden)).enumerate() {
            let rms = (rb.iter().map(|v| v * v).sum::<f64>() / hidden as f64).sqrt();
            for (col, (&x, &y)) in ra.iter().zip(rb).enumerate() {
                let e = (x - y).abs() / (rms + y.abs()).max(1e-30);
                if e > d.worst || e.is_nan() {
                    d = Diff {
                        worst: if e.is_nan() { f64::INFINITY } else { e },
                        row,
                        col,
                        a: x,
                        b: y,
                    };
                }
            }
        }
        d
    }

    pub fn ok(&self) -> bool {
        self.worst <= TOLERANCE
    }
}

impl std::fmt::Display for Diff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "worst |a-b|/(rms+|b|) {:.2e} at token {} column {} ({} against {})",
            self.worst, self.row, self.col, self.a, self.b
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Tensor; 9] = [
        Tensor::Input,
        Tensor::InNorm,
        Tensor::Qkv,
        Tensor::O,
        Tensor::PostNorm,
        Tensor::GateUp,
        Tensor::Down,
        Tensor::KCache,
        Tensor::VCache,
    ];

    /// Every global element of a split tensor is held by exactly one rank; replicated tensors
    /// are whole on every rank; TP 1 is the global tensor in order.
    #[test]
    fn shards_partition_the_global_tensors() {
        // TINY's structure with small matrices, so every element can be counted.
        let s = Shape {
            hidden: 32,
            inter: 64,
            head_dim: 4,
            ..TINY
        };
        let (tokens, lmax) = (3, 5);
        for tp in [1, 2, 4, 8] {
            TINY.check_tp(tp).unwrap();
            for t in ALL {
                let mut seen = std::collections::HashMap::<(usize, usize), usize>::new();
                for rank in 0..tp {
                    let sh = Shard::new(t, &s, tp, rank, tokens, lmax);
                    let covered: usize = sh.segments.iter().map(|g| g.rows).sum();
                    assert_eq!(covered, sh.rows, "{t:?} tp {tp}: segments cover the local rows");
                    for g in &sh.segments {
                        assert_eq!(g.cols, sh.cols, "{t:?}: a segment is a full local row");
                        for r in 0..g.rows {
                            for c in 0..g.cols {
                                *seen.entry((g.global_row + r, g.global_col + c)).or_default() += 1;
                            }
                        }
                    }
                }
                let replicated = matches!(t, Tensor::Input | Tensor::InNorm | Tensor::PostNorm);
                let want = if replicated { tp } else { 1 };
                assert!(seen.values().all(|&n| n == want), "{t:?} tp {tp}: held {want} times");
                let whole = Shard::new(t, &s, 1, 0, tokens, lmax);
                assert_eq!(
                    seen.len(),
                    whole.rows * whole.cols,
                    "{t:?} tp {tp}: every global element held"
                );
                assert_eq!(whole.segments.iter().map(|g| g.global_col).max(), Some(0));
            }
        }
    }

    #[test]
    fn local_shapes() {
        let s = LLAMA3_70B;
        let qkv = Shard::new(Tensor::Qkv, &s, 8, 3, 1, 16);
        assert_eq!((qkv.rows, qkv.cols), ((8 + 2) * 128, 8192));
        assert_eq!(
            qkv.global_row(8 * 128),
            (64 * 128 + 3 * 128, 0),
            "rank 3's first key row"
        );
        assert_eq!(
            qkv.global_row(9 * 128 + 5),
            (72 * 128 + 3 * 128 + 5, 0),
            "rank 3's value rows"
        );
        let o = Shard::new(Tensor::O, &s, 8, 3, 1, 16);
        assert_eq!((o.rows, o.cols, o.global_row(7)), (8192, 1024, (7, 3 * 1024)));
        let gu = Shard::new(Tensor::GateUp, &s, 4, 1, 1, 16);
        assert_eq!(gu.global_row(7168), (28672 + 7168, 0), "rank 1's first up row");
        let kc = Shard::new(Tensor::KCache, &s, 4, 1, 1, 16);
        assert_eq!((kc.rows, kc.global_row(17)), (32, (3 * CACHE_STRIDE + 1, 0)));
        assert!(s.check_tp(3).is_err());
        assert!(LLAMA3_8B.check_tp(16).is_err());
        assert_eq!(LLAMA3_8B.weight_bytes(), 2 * (218_103_808 + 8192));
    }

    #[test]
    fn values_are_deterministic_and_spread() {
        let s = TINY;
        let a: Vec<f32> = (0..4096)
            .map(|i| Tensor::Qkv.value(&s, 7, i / 64, i % 64).to_f32())
            .collect();
        let b: Vec<f32> = (0..4096)
            .map(|i| Tensor::Qkv.value(&s, 7, i / 64, i % 64).to_f32())
            .collect();
        assert_eq!(a, b);
        let other = Tensor::Qkv.value(&s, 8, 0, 0).to_f32();
        assert_ne!(a[0], other, "the seed matters");
        let scale = Tensor::Qkv.dist(&s).0;
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        let var = a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.05 * scale, "mean {mean}");
        assert!((var / (scale * scale / 3.0) - 1.0).abs() < 0.1, "variance {var}");
        for i in 0..10_000u64 {
            let u = uniform(3, i);
            assert!((-1.0..1.0).contains(&u));
        }
    }

    #[test]
    fn diff_finds_the_worst_element() {
        let b = [1.0, -1.0, 1.0, -1.0, 2.0, 2.0, 2.0, 2.0];
        let mut a = b;
        a[6] += 0.5;
        a[1] += 0.1;
        let d = Diff::of(&a, &b, 4);
        assert_eq!((d.row, d.col), (1, 2));
        assert!((d.worst - 0.5 / 4.0).abs() < 1e-12 && !d.ok());
        a[6] = 2.2;
        assert!(Diff::of(&a, &b, 4).ok(), "0.2 of rms + |b| = 4 is within 2^-4");
        a[6] = f64::NAN;
        assert!(!Diff::of(&a, &b, 4).ok(), "NaN never agrees");
        assert!(Diff::of(&b, &b, 4).ok());
    }
}
