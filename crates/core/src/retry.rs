//! When a failed attempt may be tried again, and how long to wait first.
//!
//! Why so narrow? An LLM request is not idempotent in cost: a request a live worker received may
//! already be prefilling, and sending it again doubles the work on a fleet that is probably
//! struggling. So only failures where no worker is doing the work are retried: the connection
//! never carried the request; the connection died before any answer (the worker process went
//! away, and its work with it — a retry costs a prefill, never a second answer); the worker
//! said explicitly that it is at capacity (429 or 529) and did nothing; or the worker answered
//! with an error status (500, 502, 503, 504 by default) — it has finished with the request, so
//! nothing runs twice, and a sick worker that fails part of its requests would otherwise hand
//! each of those failures to a client; or the worker was judged unresponsive while the request
//! waited (see `liveness`: its engine's reports did not account for the request, so nobody is
//! working on it). A timeout is not retried (the worker may still be
//! working), nor is any other answer. Everything after the first byte reached the client is
//! final.
//!
//! The budget that bounds retries across requests (so a fleet-wide outage does not become a
//! retry storm) is tower's `TpsBudget`, used by the gateway; this module decides per attempt.

use std::time::Duration;

/// How one attempt ended, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptFailure {
    /// The connection could not be made: the request never left the gateway.
    Connect,
    /// The connection was lost before any response byte: the worker died with the request.
    Dropped,
    /// The worker answered 429 or 529: it is full and did not start the request.
    AtCapacity,
    /// The worker answered an error status it is done with (a configured 5xx), before any byte
    /// reached the client.
    ServerError,
    /// The worker answered, but not as HTTP/1.1 allows or within the client's bounds (a
    /// malformed head or framing, a head or line that stalled), before any byte reached the
    /// client: its failure, and nothing of it was relayed, so another worker may have it.
    BadAnswer,
    /// The worker was judged unresponsive while the request waited: its engine's own reports did
    /// not account for the request, so no one is working on it.
    Unresponsive,
    /// Anything else (a timeout): the worker may still be doing the work.
    Other,
}

/// Exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Wait before the first retry.
    pub initial: Duration,
    /// Growth per retry.
    pub multiplier: f64,
    /// Longest wait.
    pub max: Duration,
    /// Share of the wait drawn at random (0 = none, 1 = anywhere in [0, wait]).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(50),
            multiplier: 2.0,
            max: Duration::from_secs(5),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The wait before retry number `retry` (1-based). `unit` is a uniform draw in [0, 1): the
    /// wait is `base * (1 - jitter * unit)`, so jitter only ever shortens it and never exceeds
    /// `max`.
    pub fn delay(&self, retry: u32, unit: f64) -> Duration {
        let exponent = retry.saturating_sub(1).min(63) as i32;
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let base = base.min(self.max.as_secs_f64());
        let unit = unit.clamp(0.0, 1.0);
        Duration::from_secs_f64(base * (1.0 - self.jitter.clamp(0.0, 1.0) * unit))
    }
}

/// Whether a failed attempt may be retried: the failure is a safe kind and retries are left.
/// The budget is checked separately (it is shared state).
pub fn may_retry(failure: AttemptFailure, retries_done: u32, max_retries: u32) -> bool {
    retries_done < max_retries && failure != AttemptFailure::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            multiplier: 2.0,
            max: Duration::from_millis(500),
            jitter: 0.0,
        };
        let waits: Vec<_> = (1..=5).map(|n| b.delay(n, 0.7).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 500, 500]);
    }

    #[test]
    fn jitter_only_shortens() {
        let b = Backoff {
            jitter: 0.5,
            ..Backoff::default()
        };
        let full = b.delay(3, 0.0);
        assert_eq!(full, Duration::from_millis(200));
        assert_eq!(b.delay(3, 0.999_999).as_millis(), 100);
        for u in [0.1, 0.5, 0.9] {
            let d = b.delay(3, u);
            assert!(d < full && d >= full / 2, "{d:?}");
        }
    }

    #[test]
    fn huge_retry_numbers_do_not_overflow() {
        assert_eq!(
            Backoff::default().delay(u32::MAX, 0.0),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn only_safe_failures_are_retried() {
        assert!(may_retry(AttemptFailure::Connect, 0, 2));
        assert!(may_retry(AttemptFailure::AtCapacity, 1, 2));
        assert!(may_retry(AttemptFailure::Dropped, 0, 1));
        assert!(may_retry(AttemptFailure::BadAnswer, 0, 1));
        assert!(!may_retry(AttemptFailure::BadAnswer, 1, 1));
        assert!(!may_retry(AttemptFailure::Connect, 2, 2));
        assert!(!may_retry(AttemptFailure::Other, 0, 2));
    }
}
