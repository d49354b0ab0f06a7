//! A worker's adaptive concurrency limit (`--adaptive-concurrency`): the cap on this gateway's
//! requests in flight on it, and the latency samples the cap is learned from.
//!
//! Two writers: the request path records samples as responses pass (one counter increment per
//! sample, into log-linear buckets: `sluice_core::adaptive::buckets`) and takes a place under the
//! limit for each request (`Traffic::enter`); the limiter loop (`control::adaptive`) takes the
//! window's samples once per window and publishes the new limit and what it was decided on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use sluice_core::adaptive::buckets::{bucket_of, BUCKETS};
use sluice_core::adaptive::{Decision, Histogram, WindowSamples, WindowStats};
use tokio::time::Instant;

/// One latency's counts for the window in progress.
#[derive(Debug)]
struct Counts(Box<[AtomicU64]>);

impl Default for Counts {
    fn default() -> Self {
        Self((0..BUCKETS).map(|_| AtomicU64::new(0)).collect())
    }
}

impl Counts {
    fn record(&self, value: Duration, times: u64) {
        self.0[bucket_of(value)].fetch_add(times, Ordering::Relaxed);
    }

    /// The counts so far, reset: a sample recorded meanwhile lands in one window or the next.
    fn take(&self) -> Histogram {
        Histogram::from_counts(self.0.iter().map(|c| c.swap(0, Ordering::Relaxed)))
    }
}

/// The last window judged, for `/workers` and `/loads`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitWindow {
    pub(crate) stats: WindowStats,
    pub(crate) decision: Decision,
    /// The limit before the decision.
    pub(crate) from: u64,
    pub(crate) at: Instant,
}

/// One worker's limit and samples.
#[derive(Debug, Default)]
pub(crate) struct AdaptiveLimit {
    /// The limit in force; 0 while none is (adaptive concurrency off, or not started yet).
    limit: AtomicU64,
    ttft: Counts,
    itl: Counts,
    responses: AtomicU64,
    /// The most requests in flight at once this window.
    peak: AtomicU64,
    last: ArcSwapOption<LimitWindow>,
}

impl AdaptiveLimit {
    /// The limit in force, if any.
    pub(crate) fn limit(&self) -> Option<u64> {
        Some(self.limit.load(Ordering::Relaxed)).filter(|l| *l > 0)
    }

    /// Whether responses are measured (a limit is in force).
    pub(crate) fn measuring(&self) -> bool {
        self.limit().is_some()
    }

    /// Whether a request of `weight` more may go to a worker with `in_flight` now.
    pub(crate) fn admits(&self, in_flight: u64, weight: u64) -> bool {
        sluice_core::adaptive::admits(self.limit(), in_flight, weight)
    }

    /// `in_flight` of this gateway's requests are on the worker now (a request just entered).
    pub(crate) fn in_flight_now(&self, in_flight: u64) {
        self.peak.fetch_max(in_flight, Ordering::Relaxed);
    }

    /// A streamed response's first token came `ttft` after it was sent.
    pub(crate) fn first_token(&self, ttft: Duration) {
        self.ttft.record(ttft, 1);
        self.responses.fetch_add(1, Ordering::Relaxed);
    }

    /// `tokens` tokens came `gap` apart on average.
    pub(crate) fn token_gaps(&self, gap: Duration, tokens: u64) {
        if tokens > 0 {
            self.itl.record(gap, tokens);
        }
    }

    /// A whole (non-streamed) response of `tokens` tokens took `total`.
    pub(crate) fn whole_response(&self, total: Duration, tokens: u64) {
        if tokens > 0 {
            self.token_gaps(total / u32::try_from(tokens).unwrap_or(u32::MAX), tokens);
            self.responses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The window's samples, reset for the next, which starts with `in_flight` (the limiter
    /// loop).
    pub(crate) fn take_window(&self, in_flight: u64) -> WindowSamples {
        WindowSamples {
            ttft: self.ttft.take(),
            itl: self.itl.take(),
            responses: self.responses.swap(0, Ordering::Relaxed),
            peak_in_flight: self.peak.swap(in_flight, Ordering::Relaxed).max(in_flight),
        }
    }

    /// Puts `limit` in force (the limiter loop).
    pub(crate) fn set_limit(&self, limit: u64) {
        self.limit.store(limit.max(1), Ordering::Relaxed);
    }

    /// A window was judged (the limiter loop).
    pub(crate) fn judged(&self, window: LimitWindow, limit: u64) {
        self.set_limit(limit);
        self.last.store(Some(Arc::new(window)));
    }

    pub(crate) fn last(&self) -> Option<Arc<LimitWindow>> {
        self.last.load_full()
    }
}
