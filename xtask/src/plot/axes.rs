//! Log axes: mapping values to pixels, tick positions, axis ranges and tick
//! labels (sizes, plain numbers, ratios).

/// A log-scale axis over `[lo, hi]` (both > 0) mapped onto `[a, b]` pixels.
#[derive(Debug, Clone, Copy)]
pub struct LogAxis {
    pub(super) lo: f64,
    pub(super) hi: f64,
    a: f64,
    b: f64,
}

impl LogAxis {
    pub fn new(lo: f64, hi: f64, a: f64, b: f64) -> Self {
        let (lo, hi) = if hi > lo { (lo, hi) } else { (lo / 2.0, lo * 2.0) };
        LogAxis { lo, hi, a, b }
    }
    pub fn map(&self, v: f64) -> f64 {
        let t = (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        self.a + t * (self.b - self.a)
    }
}

/// Ticks for a base-`base` log axis: every power of `base` in `[lo, hi]`.
pub(super) fn ticks(lo: f64, hi: f64, base: f64) -> Vec<f64> {
    let mut v = Vec::new();
    if !(lo > 0.0 && hi >= lo && base > 1.0 && lo.is_finite() && hi.is_finite()) {
        return v;
    }
    let mut t = base.powf((lo.ln() / base.ln()).floor());
    while t <= hi * 1.0001 && v.len() < 200 {
        if t >= lo * 0.9999 {
            v.push(t);
        }
        t *= base;
    }
    v
}

/// A size tick label: `4K`, `256M`, `1000`.
pub fn size_label(bytes: f64) -> String {
    let b = bytes.round() as u64;
    match b {
        _ if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{}G", b >> 30),
        _ if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{}M", b >> 20),
        _ if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{}K", b >> 10),
        _ => format!("{b}"),
    }
}

/// A y tick label: `2`, `500`, `20k`, `0.05`.
pub(super) fn num_label(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A ratio tick label: `0.5×`, `1×`.
pub(super) fn ratio_label(v: f64) -> String {
    let s = format!("{v:.3}");
    format!("{}×", s.trim_end_matches('0').trim_end_matches('.'))
}

/// A log axis range over `[min, max]` from the 1-2-5 value at or below to the
/// one at or above.
pub(super) fn decade_bounds(min: f64, max: f64) -> (f64, f64) {
    if !(min > 0.0 && max >= min && max.is_finite()) {
        return (1.0, 10.0);
    }
    let nice = |v: f64, up: bool| {
        let d = 10f64.powf(v.log10().floor());
        let c = [d, 2.0 * d, 5.0 * d, 10.0 * d];
        let eps = 1e-9 * v;
        if up {
            c.into_iter().find(|x| *x >= v - eps).unwrap_or(10.0 * d)
        } else {
            c.into_iter().rev().find(|x| *x <= v + eps).unwrap_or(d)
        }
    };
    let (lo, hi) = (nice(min, false), nice(max, true));
    if hi > lo {
        (lo, hi)
    } else {
        (lo, nice(lo * 1.01, true))
    }
}

/// The range of a ratio axis showing `[min, max]` and 1x with some room: from
/// a tick below to a tick above (powers of two and 1.5 times them).
pub(super) fn ratio_bounds(min: f64, max: f64) -> (f64, f64) {
    let (min, max) = (min.min(1.0) / 1.08, max.max(1.0) * 1.08);
    let nice = |v: f64, up: bool| {
        let p = 2f64.powf(v.log2().floor());
        let c = [p, 1.5 * p, 2.0 * p];
        if up {
            c.into_iter().find(|x| *x >= v).unwrap_or(2.0 * p)
        } else {
            c.into_iter().rev().find(|x| *x <= v).unwrap_or(p)
        }
    };
    if min > 0.0 && max.is_finite() {
        (nice(min, false), nice(max, true))
    } else {
        (0.5, 2.0)
    }
}

/// The ticks of a ratio axis over `[lo, hi]`: powers of two, and 0.75, 1.5,
/// 3 when the range is narrow.
pub(super) fn ratio_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut t = ticks(lo, hi, 2.0);
    if t.len() > 9 {
        t = ticks(lo, hi, 4.0);
        if !t.iter().any(|x| (*x - 1.0).abs() < 1e-9) && lo <= 1.0 && hi >= 1.0 {
            t.push(1.0);
        }
    } else if hi / lo < 12.0 {
        // 1.5 times each power of two: 0.375, 0.75, 1.5, 3
        let extra: Vec<f64> = t.iter().map(|x| x * 1.5).chain(t.first().map(|x| x * 0.75)).collect();
        t.extend(extra.into_iter().filter(|x| *x >= lo * 0.9999 && *x <= hi * 1.0001));
    }
    t.sort_by(|a, b| a.total_cmp(b));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axis_maps_decades_evenly() {
        let a = LogAxis::new(1.0, 100.0, 0.0, 200.0);
        assert!((a.map(1.0) - 0.0).abs() < 1e-9);
        assert!((a.map(10.0) - 100.0).abs() < 1e-9);
        assert!((a.map(100.0) - 200.0).abs() < 1e-9);
        // inverted pixel range (y axes)
        let y = LogAxis::new(1.0, 100.0, 300.0, 0.0);
        assert!((y.map(10.0) - 150.0).abs() < 1e-9);
        assert_eq!(ticks(1024.0, 65536.0, 4.0), vec![1024.0, 4096.0, 16384.0, 65536.0]);
        assert!(ticks(0.0, 10.0, 10.0).is_empty());
        assert!(ticks(f64::NAN, 10.0, 10.0).is_empty());
        assert_eq!(size_label(4096.0), "4K");
        assert_eq!(size_label(256.0 * 1048576.0), "256M");
        assert_eq!(size_label(1000.0), "1000");
        assert_eq!(ratio_label(0.5), "0.5×");
        assert_eq!(ratio_label(1.0), "1×");
        let rt = ratio_ticks(0.3, 1.25);
        assert!(rt.contains(&1.0) && rt.contains(&0.5) && rt.contains(&0.75), "{rt:?}");
        assert!(ratio_ticks(1e-3, 1e3).contains(&1.0));
    }
}
