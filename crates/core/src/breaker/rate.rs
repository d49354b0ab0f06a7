//! The failure-rate rule of a closed circuit: a sliding window of outcomes, in ten buckets of a
//! tenth of the window each, so it costs a fixed few words and an outcome is forgotten at most a
//! tenth of the window late.

use std::time::Duration;

use tokio::time::Instant;

/// Opens a closed circuit when at least `rate` of at least `min_requests` outcomes within
/// `window` were failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailureRate {
    pub rate: f64,
    pub min_requests: u32,
    pub window: Duration,
}

impl Default for FailureRate {
    fn default() -> Self {
        Self {
            rate: 0.5,
            min_requests: 20,
            window: Duration::from_secs(120),
        }
    }
}

/// Buckets of the failure-rate window.
const BUCKETS: usize = 10;

/// Outcomes of the last window, in `BUCKETS` buckets; each knows which tenth of time it counts.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Window {
    /// Where bucket numbers count from (the circuit's last close).
    epoch: Option<Instant>,
    /// (bucket number, successes, failures).
    buckets: [(u64, u32, u32); BUCKETS],
}

impl Window {
    fn width(window: Duration) -> Duration {
        (window / BUCKETS as u32).max(Duration::from_millis(1))
    }

    /// Counts one outcome at `now`; whether the outcomes within the window now meet `rule`.
    pub(super) fn add(&mut self, rule: &FailureRate, failed: bool, now: Instant) -> bool {
        let epoch = *self.epoch.get_or_insert(now);
        let width = Self::width(rule.window).as_nanos();
        let number =
            u64::try_from(now.saturating_duration_since(epoch).as_nanos() / width).unwrap_or(0) + 1;
        let bucket = &mut self.buckets[(number % BUCKETS as u64) as usize];
        if bucket.0 != number {
            *bucket = (number, 0, 0);
        }
        if failed {
            bucket.2 += 1;
        } else {
            bucket.1 += 1;
        }
        let (all, failed) = self
            .buckets
            .iter()
            .filter(|(n, _, _)| *n != 0 && *n + BUCKETS as u64 > number)
            .fold((0, 0), |(all, bad), (_, ok, failed)| {
                (all + ok + failed, bad + failed)
            });
        all >= rule.min_requests && f64::from(failed) >= rule.rate * f64::from(all)
    }
}
