//! The one statistic the side-by-side examples report: the median of a subject's repetitions (and
//! of per-repetition ratios), shared by `compare`, `redis_compare` and `http_compare`.

/// The median of `v` (the mean of the middle two for an even count); `v` is not reordered.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
