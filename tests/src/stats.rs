//! Percentiles of measurements: one definition for every bench (`tests/src/bin/bench-*`).
//!
//! The `q` percentile of `n` samples is their nearest rank: the ⌈q·n⌉-th smallest (at least
//! the first), always a value that was measured, never an interpolation. `q = 0` is the
//! minimum and `q = 1` the maximum; the median of an odd count is the middle sample, of an
//! even count the lower of the two middle ones. No samples: `None`, which a bench prints as
//! `none` ([`show`]) -- never a panic, never NaN.

/// The index of the `q` percentile (`q` in 0..=1) among `n` sorted samples; `None` for none.
pub fn rank(n: usize, q: f64) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let r = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    Some(r.clamp(1, n) - 1)
}

/// The `q` percentile of samples already sorted ascending.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    rank(sorted.len(), q).map(|i| sorted[i])
}

/// Sorts `v` (ascending) and returns its `q` percentile (`q` in 0..=1).
pub fn percentile(v: &mut [f64], q: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    percentile_sorted(v, q)
}

/// The median: the 0.5 percentile (sorts `v`).
pub fn median(v: &mut [f64]) -> Option<f64> {
    percentile(v, 0.5)
}

/// The smallest and the largest sample.
pub fn spread(v: &[f64]) -> Option<(f64, f64)> {
    let first = *v.first()?;
    Some(v.iter().fold((first, first), |(lo, hi), &x| {
        (
            if x.total_cmp(&lo).is_lt() { x } else { lo },
            if x.total_cmp(&hi).is_gt() { x } else { hi },
        )
    }))
}

/// What a bench prints of a series: its median and its spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub p50: f64,
    pub min: f64,
    pub max: f64,
}

/// The median and spread of `v` (sorts it).
pub fn summary(v: &mut [f64]) -> Option<Summary> {
    let p50 = median(v)?;
    let (min, max) = spread(v)?;
    Some(Summary { p50, min, max })
}

/// [`summary`] of a series a bench owns, or an error naming what had no samples.
pub fn summary_of(what: &str, mut v: Vec<f64>) -> anyhow::Result<Summary> {
    summary(&mut v).ok_or_else(|| anyhow::anyhow!("no samples of {what}"))
}

/// Prints `<name>_p50<unit>=`, `<name>_min<unit>=` and `<name>_max<unit>=` (`unit` such as
/// `_ms`, or empty) with `decimals` digits, `none` each when there are no samples; returns
/// the median.
pub fn print_summary(name: &str, unit: &str, decimals: usize, v: &mut [f64]) -> Option<f64> {
    let s = summary(v);
    for (what, x) in [
        ("p50", s.map(|s| s.p50)),
        ("min", s.map(|s| s.min)),
        ("max", s.map(|s| s.max)),
    ] {
        println!("{name}_{what}{unit}={}", show(x, decimals));
    }
    s.map(|s| s.p50)
}

/// A figure as the benches print it: `decimals` digits, or `none` when it could not be
/// measured.
pub fn show(x: Option<f64>, decimals: usize) -> String {
    match x {
        Some(x) => format!("{x:.decimals$}"),
        None => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_the_nearest_rank() {
        let mut v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), Some(5.0));
        assert_eq!(percentile(&mut v, 0.99), Some(10.0));
        assert_eq!(percentile(&mut v, 0.0), Some(1.0));
        assert_eq!(percentile(&mut v, 1.0), Some(10.0));
        assert_eq!(percentile(&mut v, 0.1), Some(1.0));
        assert_eq!(percentile(&mut v, 0.11), Some(2.0));
        // Out of range is the nearest end.
        assert_eq!(percentile(&mut v, 7.0), Some(10.0));
        assert_eq!(percentile(&mut v, -1.0), Some(1.0));
        let mut odd = vec![3.0, 1.0, 2.0];
        assert_eq!(median(&mut odd), Some(2.0));
        let mut hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut hundred, 0.99), Some(99.0));
        assert_eq!(percentile(&mut hundred, 0.999), Some(100.0));
    }

    #[test]
    fn no_samples_is_none_never_a_panic_or_nan() {
        assert_eq!(percentile(&mut [], 0.5), None);
        assert_eq!(median(&mut []), None);
        assert_eq!(spread(&[]), None);
        assert_eq!(summary(&mut []), None);
        assert_eq!(rank(0, 0.99), None);
        assert_eq!(show(None, 3), "none");
        assert_eq!(print_summary("x", "_ms", 0, &mut []), None);
    }

    #[test]
    fn a_summary_is_median_and_spread() {
        let mut v = vec![4.0, 1.5, 9.0, 2.0, 7.0];
        assert_eq!(
            summary(&mut v),
            Some(Summary {
                p50: 4.0,
                min: 1.5,
                max: 9.0
            })
        );
        assert_eq!(spread(&[2.0, -1.0, 0.5]), Some((-1.0, 2.0)));
        assert_eq!(show(Some(1.23456), 2), "1.23");
        assert_eq!(print_summary("x", "", 1, &mut v), Some(4.0));
    }
}
