//! How fast the gateway queue drains, and what follows from it: how long an arrival may expect
//! to wait, whether waiting is hopeless (under shedding), and when a refused client should come
//! back.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::tier::Tier;

/// Dispatches remembered for the rate.
const WINDOW: usize = 64;

/// A refused client is told to come back after the queue's length over its rate, within these.
const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// The queue's recent dispatches.
#[derive(Debug, Clone, Default)]
pub struct DrainRate {
    recent: VecDeque<Instant>,
}

impl DrainRate {
    /// A waiter was sent out at `at`.
    pub fn record(&mut self, at: Instant) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(at);
    }

    /// Requests sent out per second over the remembered dispatches; `None` until two were.
    pub fn per_sec(&self, now: Instant) -> Option<f64> {
        let oldest = *self.recent.front()?;
        let span = now.saturating_duration_since(oldest).as_secs_f64();
        (self.recent.len() >= 2 && span > 0.0).then(|| self.recent.len() as f64 / span)
    }
}

/// How long an arrival with `ahead` waiters before it may expect to wait, at `rate` a second.
pub fn expected_wait(ahead: usize, rate: Option<f64>) -> Option<Duration> {
    let rate = rate.filter(|r| *r > 0.0)?;
    Some(Duration::from_secs_f64((ahead + 1) as f64 / rate))
}

/// Under shedding, whether an arrival of `tier` that would have to wait is refused rather than
/// queued: a batch request always; a more urgent one when its expected wait outlives its tier's
/// `timeout` (unknown before the queue has drained at all: it waits).
pub fn hopeless(tier: Tier, expected: Option<Duration>, timeout: Duration) -> bool {
    match tier {
        Tier::Batch => true,
        _ => expected.is_some_and(|wait| wait > timeout),
    }
}

/// When a client refused by the queue should come back: the waiters over the drain rate, within
/// 1 to 60 s (1 s before there is a rate).
pub fn retry_after(waiting: usize, rate: Option<f64>) -> Duration {
    rate.filter(|r| *r > 0.0).map_or(RETRY_AFTER_MIN, |r| {
        Duration::from_secs_f64(waiting as f64 / r).clamp(RETRY_AFTER_MIN, RETRY_AFTER_MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rate_is_the_remembered_dispatches_over_their_span() {
        let t0 = Instant::now();
        let mut rate = DrainRate::default();
        assert_eq!(rate.per_sec(t0), None);
        rate.record(t0);
        assert_eq!(rate.per_sec(t0 + 100 * MS), None, "one dispatch is no rate");
        for i in 1..100 {
            rate.record(t0 + i * 10 * MS);
        }
        // The last 64, sent 10 ms apart, seen 10 ms after the last: 64 over 640 ms.
        let r = rate.per_sec(t0 + 1000 * MS).unwrap();
        assert!((r - 100.0).abs() < 1e-9, "{r}");
    }

    #[test]
    fn waiting_is_hopeless_for_batch_or_past_the_tiers_timeout() {
        let wait = expected_wait(9, Some(20.0));
        assert_eq!(wait, Some(500 * MS), "ten in line at 20 a second");
        assert!(hopeless(Tier::Batch, None, Duration::from_secs(60)));
        assert!(hopeless(Tier::Agent, wait, 400 * MS));
        assert!(!hopeless(Tier::Agent, wait, 500 * MS));
        assert!(
            !hopeless(Tier::Interactive, None, MS),
            "no rate yet: it waits"
        );
    }

    #[test]
    fn a_refused_client_comes_back_when_the_queue_has_drained() {
        assert_eq!(retry_after(100, Some(10.0)), Duration::from_secs(10));
        assert_eq!(retry_after(1, Some(10.0)), Duration::from_secs(1));
        assert_eq!(retry_after(100_000, Some(1.0)), Duration::from_secs(60));
        assert_eq!(retry_after(5, None), Duration::from_secs(1));
    }
}
