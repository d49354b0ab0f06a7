//! A worker's circuit breaker, as the gateway runs it.
//!
//! The decisions are `sluice_core::breaker::Breaker`'s; this wraps one in a short-lived lock
//! (never held across an `.await`), publishes its state in an atomic for lock-free reads by the
//! route stage, counts transitions, and runs the timer that moves an open circuit to half-open
//! exactly when its timeout passes — so metrics, `/workers` and readiness never show a circuit
//! as open after it has stopped refusing.

use std::sync::Arc;

use axum::http::HeaderValue;
use sluice_core::breaker::{Breaker, BreakerConfig, BreakerState, Outcome, Ticket, Transition};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

use super::atomic::AtomicEnum;
use crate::metrics::{Metrics, TransitionLabels};

/// One worker's breaker. `None` config: circuit breaking is off and every request is admitted.
#[derive(Debug)]
pub struct WorkerBreaker {
    worker: String,
    inner: Option<parking_lot::Mutex<Breaker>>,
    /// The state, for readers that must not lock.
    state: AtomicEnum<BreakerState>,
    /// Wakes the timer when the circuit opens.
    opened: Notify,
    metrics: Arc<Metrics>,
    /// The fleet's change signal, bumped on every transition.
    changed: Arc<watch::Sender<u64>>,
}

/// Permission to send one request to the worker; hand it back through `record` or `release`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Permit(Option<Ticket>);

impl WorkerBreaker {
    pub fn new(
        worker: &str,
        cfg: Option<BreakerConfig>,
        metrics: Arc<Metrics>,
        changed: Arc<watch::Sender<u64>>,
    ) -> Self {
        Self {
            worker: worker.to_string(),
            inner: cfg.map(|cfg| parking_lot::Mutex::new(Breaker::new(cfg))),
            state: AtomicEnum::new(BreakerState::Closed),
            opened: Notify::new(),
            metrics,
            changed,
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.state.load()
    }

    /// Consecutive failures counted while closed.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.inner
            .as_ref()
            .map_or(0, |b| b.lock().consecutive_failures())
    }

    pub(crate) fn try_admit(&self) -> Option<Permit> {
        match &self.inner {
            None => Some(Permit(None)),
            Some(b) => b.lock().try_admit().map(|t| Permit(Some(t))),
        }
    }

    /// Counts a request's outcome; `request` (its id) is named in the log line of a transition
    /// it causes.
    pub(crate) fn record(&self, permit: Permit, outcome: Outcome, request: Option<&HeaderValue>) {
        let (Some(b), Some(ticket)) = (&self.inner, permit.0) else {
            return;
        };
        let transition = b.lock().record(ticket, outcome, Instant::now());
        self.publish(transition, request);
    }

    pub(crate) fn release(&self, permit: Permit) {
        if let (Some(b), Some(ticket)) = (&self.inner, permit.0) {
            b.lock().release(ticket);
        }
    }

    /// A health promotion: open -> half-open at once, closed forgets its failures.
    pub(crate) fn readmit(&self) {
        if let Some(b) = &self.inner {
            let transition = b.lock().readmit();
            self.publish(transition, None);
        }
    }

    fn publish(&self, transition: Option<Transition>, request: Option<&HeaderValue>) {
        let Some(t) = transition else {
            return;
        };
        self.state.store(t.to);
        self.changed.send_modify(|v| *v += 1);
        self.metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                worker: self.worker.clone(),
                from: t.from.as_str(),
                to: t.to.as_str(),
            })
            .inc();
        let request_id = request.and_then(|id| id.to_str().ok());
        match t.to {
            BreakerState::Open => {
                warn!(worker = %self.worker, from = t.from.as_str(), request_id, "circuit opened");
                self.opened.notify_one();
            }
            _ => {
                info!(worker = %self.worker, from = t.from.as_str(), to = t.to.as_str(), request_id, "circuit changed")
            }
        }
    }

    /// Moves the circuit to half-open whenever its open timeout passes. Runs for the worker's
    /// lifetime (the registry aborts it on removal).
    pub(crate) async fn run_timer(self: Arc<Self>) {
        let Some(b) = &self.inner else {
            return;
        };
        loop {
            let opened = self.opened.notified();
            let until = b.lock().open_until();
            match until {
                Some(until) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => {
                            let transition = b.lock().poll_timeout(Instant::now());
                            self.publish(transition, None);
                        }
                        () = opened => {}
                    }
                }
                None => opened.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use prometheus_client::registry::Registry;

    #[tokio::test(start_paused = true)]
    async fn the_timer_moves_open_to_half_open_on_time() {
        let metrics = Metrics::register(&mut Registry::default());
        let cfg = BreakerConfig {
            failure_threshold: 2,
            success_threshold: 1,
            open_timeout: Duration::from_secs(30),
            half_open_trials: 1,
            failure_rate: None,
        };
        let changed = Arc::new(watch::channel(0).0);
        let breaker = Arc::new(WorkerBreaker::new(
            "w1",
            Some(cfg),
            metrics.clone(),
            changed,
        ));
        let timer = tokio::spawn(breaker.clone().run_timer());
        for _ in 0..2 {
            let p = breaker.try_admit().unwrap();
            breaker.record(p, Outcome::Failure, None);
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        tokio::time::sleep(Duration::from_millis(29_990)).await;
        assert_eq!(breaker.state(), BreakerState::Open);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            breaker.state(),
            BreakerState::HalfOpen,
            "no request was needed to notice the timeout"
        );
        let p = breaker.try_admit().unwrap();
        breaker.record(p, Outcome::Success, None);
        assert_eq!(breaker.state(), BreakerState::Closed);
        let opened = metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                worker: "w1".into(),
                from: "closed",
                to: "open",
            });
        assert_eq!(opened.get(), 1);
        timer.abort();
    }

    #[tokio::test]
    async fn a_disabled_breaker_admits_everything() {
        let metrics = Metrics::register(&mut Registry::default());
        let breaker = WorkerBreaker::new("w1", None, metrics, Arc::new(watch::channel(0).0));
        for _ in 0..100 {
            let p = breaker.try_admit().unwrap();
            breaker.record(p, Outcome::Failure, None);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}
