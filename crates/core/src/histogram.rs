//! Quantiles of a cumulative bucketed histogram, read the way PromQL's `histogram_quantile`
//! reads one, so the status page and a Grafana panel over the same buckets agree.

/// The `q` quantile (0..=1) of observations counted in `buckets`: `(upper bound, cumulative
/// count)` in ascending bound order, the last bound possibly `+Inf`. Linear within a bucket, the
/// first bucket starting at 0; a quantile in the `+Inf` bucket is the last finite bound. `None`
/// when nothing was observed.
pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 || !q.is_finite() {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(upper, count) in buckets {
        if count >= rank && count > below {
            if upper.is_infinite() {
                return Some(lower);
            }
            return Some(lower + (upper - lower) * (rank - below) / (count - below));
        }
        lower = upper;
        below = count;
    }
    Some(lower)
}

/// Bucket counts from `later` less those of `earlier` (same bounds), for a quantile over the
/// observations between two readings; a counter that went back (a restart) reads as new.
pub fn since(later: &[(f64, f64)], earlier: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let reset = later
        .iter()
        .zip(earlier)
        .any(|(l, e)| l.0 != e.0 || l.1 < e.1);
    later
        .iter()
        .zip(earlier.iter().map(Some).chain(std::iter::repeat(None)))
        .map(|(&(bound, count), before)| match before {
            Some(&(_, before)) if !reset => (bound, count - before),
            _ => (bound, count),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    #[test]
    fn interpolates_within_the_bucket_like_promql() {
        let b = [(0.1, 50.0), (0.2, 100.0), (INF, 100.0)];
        assert_eq!(quantile(0.5, &b), Some(0.1));
        let q = quantile(0.75, &b).unwrap();
        assert!((q - 0.15).abs() < 1e-9, "{q}");
        assert_eq!(
            quantile(0.25, &b),
            Some(0.05),
            "the first bucket starts at 0"
        );
    }

    #[test]
    fn a_quantile_past_the_last_bound_is_that_bound() {
        let b = [(1.0, 1.0), (2.0, 2.0), (INF, 10.0)];
        assert_eq!(quantile(0.95, &b), Some(2.0));
    }

    #[test]
    fn nothing_observed_has_no_quantile() {
        assert_eq!(quantile(0.5, &[(1.0, 0.0), (INF, 0.0)]), None);
        assert_eq!(quantile(0.5, &[]), None);
    }

    #[test]
    fn since_subtracts_and_a_reset_starts_over() {
        let earlier = [(1.0, 3.0), (INF, 4.0)];
        let later = [(1.0, 5.0), (INF, 9.0)];
        assert_eq!(since(&later, &earlier), vec![(1.0, 2.0), (INF, 5.0)]);
        let restarted = [(1.0, 1.0), (INF, 1.0)];
        assert_eq!(since(&restarted, &earlier), restarted.to_vec());
        assert_eq!(since(&later, &[]), later.to_vec(), "no earlier reading");
    }
}
