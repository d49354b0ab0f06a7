//! This gateway's requests on a worker: the counts (`Traffic`), moved only by each request's
//! hold on the worker (`lease`), through the `pub(super)` calls below.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::adaptive::AdaptiveLimit;

/// This gateway's requests on a worker, moved only by `Lease` (the request path).
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    /// Requests in flight.
    in_flight: AtomicU64,
    /// Estimated prompt tokens of requests that have no first byte yet (waiting or in prefill).
    pending_prefill: AtomicU64,
    /// Requests that have no first byte yet: the overload veto projects the engine's queue with
    /// it between load reports.
    pending_requests: AtomicU64,
    /// The other replicas' requests with no first byte on this worker, and in flight on it, as
    /// Redis last said (`--redis-url`). Written only by the shared state's task, not by `Lease`.
    pending_elsewhere: AtomicU64,
    in_flight_elsewhere: AtomicU64,
    /// Requests sent to it and requests ended on it, ever (by weight): what a load report is
    /// compared with to see room freeing (`sluice_core::admission::drain::AtReport`).
    sent: AtomicU64,
    ended: AtomicU64,
    /// Told, fleet-wide, whenever a request stops waiting on a worker or ends: room may have
    /// opened for a request waiting in the gateway queue.
    freed: Arc<tokio::sync::Notify>,
}

impl Traffic {
    /// No request yet; `freed` is told whenever one stops waiting or ends.
    pub fn new(freed: Arc<tokio::sync::Notify>) -> Self {
        Self {
            freed,
            ..Self::default()
        }
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn pending_prefill_tokens(&self) -> u64 {
        self.pending_prefill.load(Ordering::Relaxed)
    }

    pub(crate) fn pending_requests(&self) -> u64 {
        self.pending_requests.load(Ordering::Relaxed)
    }

    /// The other replicas' requests with no first byte on the worker.
    pub(crate) fn pending_elsewhere(&self) -> u64 {
        self.pending_elsewhere.load(Ordering::Relaxed)
    }

    /// The other replicas' requests in flight on the worker.
    pub(crate) fn in_flight_elsewhere(&self) -> u64 {
        self.in_flight_elsewhere.load(Ordering::Relaxed)
    }

    /// Every replica's requests with no first byte on the worker: what its queue is projected
    /// with between reports.
    pub(crate) fn pending_everywhere(&self) -> u64 {
        self.pending_requests() + self.pending_elsewhere()
    }

    /// Requests sent to the worker so far, and ended on it.
    pub(crate) fn sent_and_ended(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.ended.load(Ordering::Relaxed),
        )
    }

    /// The shared state's task heard how many requests the other replicas have pending and in
    /// flight on the worker; whether that changed.
    pub(crate) fn set_elsewhere(&self, pending: u64, in_flight: u64) -> bool {
        let was_pending = self.pending_elsewhere.swap(pending, Ordering::Relaxed);
        let was_in_flight = self.in_flight_elsewhere.swap(in_flight, Ordering::Relaxed);
        (was_pending, was_in_flight) != (pending, in_flight)
    }

    /// Counts `weight` more in flight, unless `limits` refuses them (atomically: two requests
    /// cannot both take the last place).
    pub(super) fn enter(&self, weight: u64, limits: &AdaptiveLimit) -> bool {
        if !limits.measuring() {
            self.in_flight.fetch_add(weight, Ordering::Relaxed);
            self.sent.fetch_add(weight, Ordering::Relaxed);
            return true;
        }
        match self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                limits.admits(n, weight).then_some(n + weight)
            }) {
            Ok(before) => {
                limits.in_flight_now(before + weight);
                self.sent.fetch_add(weight, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// `weight` fewer in flight: room may have opened.
    pub(super) fn leave(&self, weight: u64) {
        self.in_flight.fetch_sub(weight, Ordering::AcqRel);
        self.ended.fetch_add(weight, Ordering::Relaxed);
        self.freed.notify_one();
    }

    /// A request of `weight` starts waiting for its first byte: the pending count before it.
    pub(super) fn pending_added(&self, weight: u64) -> u64 {
        self.pending_requests.fetch_add(weight, Ordering::Relaxed)
    }

    /// A request of `weight` stops waiting for its first byte, which frees room for a waiter:
    /// the pending count before it.
    pub(super) fn pending_removed(&self, weight: u64) -> u64 {
        let before = self.pending_requests.fetch_sub(weight, Ordering::Relaxed);
        self.freed.notify_one();
        before
    }

    /// Prompt tokens start, or stop, waiting for prefill.
    pub(super) fn prefill_added(&self, tokens: u64) {
        self.pending_prefill.fetch_add(tokens, Ordering::Relaxed);
    }

    pub(super) fn prefill_removed(&self, tokens: u64) {
        self.pending_prefill.fetch_sub(tokens, Ordering::Relaxed);
    }
}
