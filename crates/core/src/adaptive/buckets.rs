//! Latency samples as counts in log-linear buckets, so the request path records a sample with
//! one counter increment (no lock, no allocation) and a window's p95 is read from the counts.
//!
//! A value in microseconds falls in a bucket by its power of two and the next three bits below
//! it: eight buckets per doubling, so a bucket's bounds differ by at most 12.5%. A quantile is
//! reported as the upper bound of its bucket: it may overstate the true figure by that much, and
//! never understates it (a limit errs towards the latency users feel, not away from it). Values
//! under 8 µs have a bucket each; values past about 4.5 minutes share the last.

use std::time::Duration;

/// Sub-buckets per doubling, as a power of two.
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// The highest power of two (of microseconds) with buckets of its own: 2^28 µs ≈ 268 s.
const TOP_POWER: u32 = 28;
/// Buckets in all: the linear ones under 8 µs, eight per doubling above.
pub const BUCKETS: usize = SUB + (TOP_POWER - SUB_BITS + 1) as usize * SUB;

/// The bucket of `value`.
pub fn bucket_of(value: Duration) -> usize {
    let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
    if micros < SUB as u64 {
        return micros as usize;
    }
    let power = 63 - micros.leading_zeros();
    if power > TOP_POWER {
        return BUCKETS - 1;
    }
    let sub = (micros >> (power - SUB_BITS)) as usize & (SUB - 1);
    SUB + (power - SUB_BITS) as usize * SUB + sub
}

/// The smallest value that falls past bucket `index`: its upper bound.
pub fn upper_bound(index: usize) -> Duration {
    if index < SUB {
        return Duration::from_micros(index as u64 + 1);
    }
    let power = (index - SUB) / SUB + SUB_BITS as usize;
    let sub = ((index - SUB) % SUB) as u64;
    let step = 1u64 << (power - SUB_BITS as usize);
    Duration::from_micros((1u64 << power) + (sub + 1) * step)
}

/// One window's samples of one latency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
        }
    }
}

impl Histogram {
    /// From counts per bucket (as the gateway's counters held them); missing buckets are empty.
    pub fn from_counts(counts: impl IntoIterator<Item = u64>) -> Self {
        let mut histogram = Self::default();
        for (slot, count) in histogram.counts.iter_mut().zip(counts) {
            *slot = count;
        }
        histogram
    }

    /// `times` samples of `value`.
    pub fn record(&mut self, value: Duration, times: u64) {
        self.counts[bucket_of(value)] += times;
    }

    pub fn len(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `q` quantile (nearest rank), as its bucket's upper bound; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.len();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(upper_bound(index));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn every_value_is_under_its_buckets_bound_and_within_an_eighth_of_it() {
        let mut last = 0;
        for micros in (0..100_000u64).chain([1 << 27, (1 << 28) + 12_345]) {
            let value = Duration::from_micros(micros);
            let index = bucket_of(value);
            assert!(index >= last, "buckets rise with the value");
            last = index;
            let bound = upper_bound(index);
            assert!(value < bound, "{value:?} under {bound:?}");
            if micros >= 8 {
                assert!(
                    bound.as_secs_f64() <= value.as_secs_f64() * 1.125 + 1e-6,
                    "{value:?} within 12.5% of {bound:?}"
                );
            }
            if index > 0 {
                assert!(upper_bound(index - 1) <= value, "past the bucket before");
            }
        }
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS - 1);
    }

    #[test]
    fn the_p95_is_the_nearest_ranks_bucket() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.95), None);
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms), 1);
        }
        let p95 = h.quantile(0.95).unwrap();
        assert!(
            p95 > Duration::from_millis(95) && p95 <= Duration::from_micros(95_000 * 9 / 8),
            "{p95:?}"
        );
        let mut one = Histogram::default();
        one.record(Duration::from_millis(7), 3);
        assert_eq!(one.len(), 3);
        assert_eq!(one.quantile(0.95), Some(upper_bound(bucket_of(7000 * US))));
        assert_eq!(Histogram::from_counts(h.counts.clone()), h);
    }
}
