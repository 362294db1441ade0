//! The layer in float64 on the CPU, from the same bf16 weights the device holds: the
//! reference the device runs are checked against. It computes each rank's shard as the device
//! does and sums the row-parallel partials, so at any TP it is the same function (the unit
//! tests check that, which checks the sharding).

use crate::model::{Shape, Shard, Tensor};

/// The layer's outputs, tokens x hidden: the residual stream after the layer and its RMSNorm
/// with the next layer's input-norm weight (this layer's, as every layer here shares weights).
#[derive(Clone, Debug)]
pub struct Outputs {
    pub residual: Vec<f64>,
    pub norm: Vec<f64>,
}

/// One layer over `tokens` new tokens at positions `kv_len..kv_len + tokens`, attending
/// causally to the `kv_len` cached positions and to each other.
pub fn layer(s: &Shape, seed: u64, tokens: usize, kv_len: usize, tp: usize) -> Outputs {
    layer_with(s, seed, tokens, kv_len, tp, Faults::default())
}

/// Mistakes a device kernel could make, injected into the reference so that the unit tests can
/// show the checks see them (NOTE [tp-tolerance]).
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    /// Token t also attends to the next new token (the causal mask off by one).
    mask_off_by_one: bool,
    /// The new keys rotated for position + 1.
    key_position_plus_one: bool,
}

fn layer_with(s: &Shape, seed: u64, tokens: usize, kv_len: usize, tp: usize, f: Faults) -> Outputs {
    let h = s.hidden;
    let lmax = kv_len + tokens;
    let whole = |t: Tensor| Shard::new(t, s, 1, 0, tokens, lmax);
    let input: Vec<Vec<f64>> = (0..tokens).map(|r| whole(Tensor::Input).row(s, seed, r)).collect();
    let in_norm = whole(Tensor::InNorm).row(s, seed, 0);
    let post_norm = whole(Tensor::PostNorm).row(s, seed, 0);
    let normed: Vec<Vec<f64>> = input.iter().map(|x| rms_norm(x, &in_norm, s.eps)).collect();

    let mut attn_out = vec![vec![0.0; h]; tokens];
    for rank in 0..tp {
        let shard = |t: Tensor| Shard::new(t, s, tp, rank, tokens, lmax);
        let l = s.local(tp);
        let hd = s.head_dim;
        let mut qkv = linear(&shard(Tensor::Qkv), s, seed, &normed);
        for (t, row) in qkv.iter_mut().enumerate() {
            for head in 0..l.q_heads + l.kv_heads {
                let shift = usize::from(f.key_position_plus_one && head >= l.q_heads);
                rope(&mut row[head * hd..(head + 1) * hd], kv_len + t + shift, s.rope_theta);
            }
        }
        let (kc, vc) = (shard(Tensor::KCache), shard(Tensor::VCache));
        let mut attn = vec![vec![0.0; l.q_heads * hd]; tokens];
        for kvh in 0..l.kv_heads {
            // Keys and values of every position this rank's head sees: cached, then new.
            let new = |t: usize, which: usize| -> Vec<f64> {
                let at = (l.q_heads + which * l.kv_heads + kvh) * hd;
                qkv[t][at..at + hd].to_vec()
            };
            let keys: Vec<Vec<f64>> = (0..kv_len)
                .map(|p| kc.row(s, seed, kvh * lmax + p))
                .chain((0..tokens).map(|t| new(t, 0)))
                .collect();
            let values: Vec<Vec<f64>> = (0..kv_len)
                .map(|p| vc.row(s, seed, kvh * lmax + p))
                .chain((0..tokens).map(|t| new(t, 1)))
                .collect();
            let group = l.q_heads / l.kv_heads;
            for t in 0..tokens {
                for g in 0..group {
                    let qh = kvh * group + g;
                    let q = &qkv[t][qh * hd..(qh + 1) * hd];
                    let seen = (kv_len + t + usize::from(f.mask_off_by_one)).min(kv_len + tokens - 1);
                    let o = attend(q, &keys[..=seen], &values[..=seen]);
                    attn[t][qh * hd..(qh + 1) * hd].copy_from_slice(&o);
                }
            }
        }
        add(&mut attn_out, &linear(&shard(Tensor::O), s, seed, &attn));
    }
    let mid: Vec<Vec<f64>> = input.iter().zip(&attn_out).map(|(x, o)| sum(x, o)).collect();
    let normed2: Vec<Vec<f64>> = mid.iter().map(|x| rms_norm(x, &post_norm, s.eps)).collect();

    let mut mlp_out = vec![vec![0.0; h]; tokens];
    for rank in 0..tp {
        let shard = |t: Tensor| Shard::new(t, s, tp, rank, tokens, lmax);
        let inter = s.local(tp).inter;
        let gu = linear(&shard(Tensor::GateUp), s, seed, &normed2);
        let act: Vec<Vec<f64>> = gu
            .iter()
            .map(|r| (0..inter).map(|i| silu(r[i]) * r[inter + i]).collect())
            .collect();
        add(&mut mlp_out, &linear(&shard(Tensor::Down), s, seed, &act));
    }
    let out: Vec<Vec<f64>> = mid.iter().zip(&mlp_out).map(|(x, m)| sum(x, m)).collect();
    let norm: Vec<Vec<f64>> = out.iter().map(|x| rms_norm(x, &in_norm, s.eps)).collect();
    Outputs {
        residual: out.concat(),
        norm: norm.concat(),
    }
}

/// `x W^T` for every token row of `x`, `W` the shard (rows generated once each, in parallel).
fn linear(w: &Shard, s: &Shape, seed: u64, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(32);
    let per = w.rows.div_ceil(threads);
    let cols: Vec<Vec<Vec<f64>>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                sc.spawn(move || {
                    (i * per..((i + 1) * per).min(w.rows))
                        .map(|r| {
                            let wr = w.row(s, seed, r);
                            x.iter().map(|xr| dot(&wr, xr)).collect::<Vec<f64>>()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a reference thread panicked"))
            .collect()
    });
    let by_row: Vec<Vec<f64>> = cols.into_iter().flatten().collect();
    (0..x.len()).map(|t| by_row.iter().map(|r| r[t]).collect()).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn sum(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn add(acc: &mut [Vec<f64>], x: &[Vec<f64>]) {
    for (a, r) in acc.iter_mut().zip(x) {
        for (v, y) in a.iter_mut().zip(r) {
            *v += y;
        }
    }
}

pub fn rms_norm(x: &[f64], w: &[f64], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, g)| v * inv * g).collect()
}

/// Rotary embedding, Llama's `rotate_half` pairing: element `i` with `i + d/2`, frequency
/// `theta^(-2i/d)`.
pub fn rope(x: &mut [f64], pos: usize, theta: f32) {
    let half = x.len() / 2;
    for i in 0..half {
        let freq = (theta as f64).powf(-2.0 * i as f64 / x.len() as f64);
        let (sin, cos) = (pos as f64 * freq).sin_cos();
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos - b * sin;
        x[i + half] = b * cos + a * sin;
    }
}

/// Softmax attention of one query over `keys` / `values`, scaled by `1/sqrt(d)`.
pub fn attend(q: &[f64], keys: &[Vec<f64>], values: &[Vec<f64>]) -> Vec<f64> {
    let scale = 1.0 / (q.len() as f64).sqrt();
    let scores: Vec<f64> = keys.iter().map(|k| dot(q, k) * scale).collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = p.iter().sum();
    let mut o = vec![0.0; q.len()];
    for (pj, v) in p.iter().zip(values) {
        for (od, vd) in o.iter_mut().zip(v) {
            *od += pj / z * vd;
        }
    }
    o
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Diff, TINY};

    /// The sharded computation is the same function at every TP: checks the shards.
    #[test]
    fn tp_splits_compute_the_same_layer() {
        let (tokens, kv) = (3, 9);
        let one = layer(&TINY, 11, tokens, kv, 1);
        for tp in [2, 4, 8] {
            let t = layer(&TINY, 11, tokens, kv, tp);
            for (a, b) in [(&t.residual, &one.residual), (&t.norm, &one.norm)] {
                let d = Diff::of(a, b, TINY.hidden);
                assert!(d.worst < 1e-12, "tp {tp}: {d}");
            }
        }
        let rms = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
        let x: Vec<f64> = (0..TINY.hidden)
            .map(|c| Tensor::Input.value(&TINY, 11, 0, c).to_f64())
            .collect();
        let moved = Diff::of(&one.residual[..TINY.hidden], &x, TINY.hidden);
        assert!(moved.worst > 0.1, "the layer changes the residual stream: {moved}");
        assert!(
            (rms(&one.norm[..TINY.hidden]) - 1.0).abs() < 0.2,
            "the norm output has RMS near 1"
        );
    }

    /// A token attends only to earlier positions: the first token's output does not depend
    /// on how many tokens follow it.
    #[test]
    fn attention_is_causal() {
        let a = layer(&TINY, 5, 1, 6, 1);
        let b = layer(&TINY, 5, 4, 6, 1);
        let d = Diff::of(&b.residual[..TINY.hidden], &a.residual, TINY.hidden);
        assert!(d.worst < 1e-12, "{d}");
        let d = Diff::of(&b.residual[TINY.hidden..2 * TINY.hidden], &a.residual, TINY.hidden);
        assert!(d.worst > 1e-3, "the second token differs from the first: {d}");
    }

    /// The checks see a mask or key-position mistake: on the tiny layer with a one-position
    /// cache (the configuration the GPU run checks for this: main.rs), either moves the output
    /// past the tolerance. With long caches of wider keys they hide (the cached keys dominate
    /// the softmax), which is why that configuration exists.
    #[test]
    fn the_checks_see_mask_and_position_mistakes() {
        let (tokens, kv) = (8, 1);
        let good = layer(&TINY, 3, tokens, kv, 1);
        for (what, f) in [
            (
                "mask off by one",
                Faults {
                    mask_off_by_one: true,
                    ..Faults::default()
                },
            ),
            (
                "keys at position + 1",
                Faults {
                    key_position_plus_one: true,
                    ..Faults::default()
                },
            ),
        ] {
            let bad = layer_with(&TINY, 3, tokens, kv, 1, f);
            let d = Diff::of(&bad.residual, &good.residual, TINY.hidden);
            let n = Diff::of(&bad.norm, &good.norm, TINY.hidden);
            assert!(!d.ok() || !n.ok(), "{what}: residual {d}; norm {n}");
        }
    }

    #[test]
    fn rope_and_attention_basics() {
        let mut x: Vec<f64> = (0..8).map(|i| i as f64).collect();
        let orig = x.clone();
        rope(&mut x, 0, 10_000.0);
        assert_eq!(x, orig, "position 0 is the identity");
        rope(&mut x, 7, 10_000.0);
        let n = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>();
        assert!((n(&x) - n(&orig)).abs() < 1e-9, "a rotation keeps the norm");
        assert!((x[0] - (0.0 * 7f64.cos() - 4.0 * 7f64.sin())).abs() < 1e-12);
        let v = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
        assert_eq!(
            attend(&[0.5, 0.5], &v[..1], &v[..1]),
            vec![1.0, 2.0],
            "one key: its value"
        );
        let o = attend(&[0.0, 0.0], &v, &v);
        assert!((o[0] - 2.0).abs() < 1e-12, "equal scores average the values");
        let w = rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0);
        let r = (12.5f64).sqrt();
        assert!((w[0] - 3.0 / r).abs() < 1e-12 && (w[1] - 8.0 / r).abs() < 1e-12);
    }
}
