//! What the fleet does with each verdict about a worker: a probe result, a health transition,
//! a load report (or its absence). Each is applied under the worker's own state and announced
//! on the fleet's change signal, which readiness and waiters follow.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::health::{HealthState, HealthTransition, Probe, Thresholds};
use sluice_core::liveness::{engine_silent, stalled_since, Reading};
use sluice_core::load::LoadReport;
use sluice_core::overload::{overload_verdict, worker_busy, QueueGate};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{monitor, Effective, EngineLoad, Fleet, PollError, Worker};

impl Fleet {
    /// The health settings in force for `worker`.
    pub fn health_of(&self, worker: &Worker) -> Effective {
        self.settings
            .health
            .for_worker(&worker.live().spec.health, self.settings.drain_settle)
    }

    /// A probe of `worker` ended.
    pub(super) fn probed(
        self: &Arc<Self>,
        worker: &Arc<Worker>,
        probe: Probe,
        thresholds: Thresholds,
    ) {
        if probe == Probe::Pass {
            worker.signals.contact(Instant::now());
        }
        self.metrics.count_health_check(probe == Probe::Pass);
        if let Some(t) = worker.change_health(|h| h.probe(probe, thresholds, Instant::now())) {
            self.health_changed(worker, t);
        }
    }

    /// Probing is off for `worker`: nothing but probes could bring a NotReady or Failed worker
    /// back, so it is Ready again.
    pub(super) fn health_checks_disabled(self: &Arc<Self>, worker: &Arc<Worker>) {
        if let Some(t) = worker.change_health(|h| h.checks_disabled(Instant::now())) {
            self.health_changed(worker, t);
        }
    }

    /// How often `worker` is polled: the smallest interval asked by any worker of its pools (its
    /// own spec's, else the flag), never under a second.
    pub(super) fn poll_interval_of(&self, worker: &Worker) -> Duration {
        let own = |w: &Worker| {
            w.live()
                .spec
                .load_monitor_interval_secs
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or(self.settings.load.interval)
        };
        let snapshot = self.snapshot();
        let peers = worker
            .models()
            .into_iter()
            .filter_map(|m| snapshot.pools.get(&m))
            .flat_map(|p| p.workers.iter())
            .map(|w| own(w));
        peers
            .chain(std::iter::once(own(worker)))
            .min()
            .unwrap_or(self.settings.load.interval)
            .max(self.settings.load.min_interval)
    }

    /// A poll of `worker` ended: its verdicts follow the report, or clear without one.
    pub(super) fn load_polled(
        &self,
        worker: &Worker,
        result: Result<(LoadReport, &'static str), PollError>,
        engine_batch: Option<u64>,
    ) {
        let now = Instant::now();
        let (report, source) = match result {
            Ok(answered) => answered,
            Err(e) => {
                if e.is_transport() {
                    worker.signals.transport_failure(now);
                } else if e.is_timeout() {
                    worker.signals.timeout(now);
                } else if e.answered() {
                    worker.signals.contact(now);
                }
                tracing::debug!(worker = %worker.id, error = %e, "load poll gave no report");
                worker.signals.set_engine_silent(false);
                self.load_cleared(worker, "a poll gave no report");
                return;
            }
        };
        worker.signals.contact(now);
        let silent_since = self.engine_silent_since(worker, &report, now);
        let ceilings = self
            .settings
            .load
            .ceilings_for(&worker.live().spec.overload);
        let overload = overload_verdict(&report, &ceilings);
        let gate = QueueGate::new(&report, &ceilings, worker.pending_requests());
        let batch = worker.live().spec.max_num_batched_tokens.or(engine_batch);
        let activity = monitor::activity(&report, worker.pending_prefill_tokens(), batch);
        let busy = worker_busy(&activity, &self.busy_thresholds());
        let m = &worker.metrics;
        m.engine_waiting.set(report.waiting() as i64);
        m.engine_running.set(report.running() as i64);
        m.engine_token_usage.set(report.mean_kv_usage());
        let (was_overloaded, was_busy) = worker.vetoes.report(
            EngineLoad {
                report,
                source,
                at: now,
                overload,
                busy,
                silent_since,
            },
            gate,
        );
        match (was_overloaded, overload) {
            (false, Some(cause)) => warn!(worker = %worker.id, %cause, "worker vetoed: overloaded"),
            (true, None) => {
                info!(worker = %worker.id, "overload veto cleared: a report under every ceiling")
            }
            _ => {}
        }
        match (was_busy, busy) {
            (false, true) => warn!(worker = %worker.id, "worker vetoed: every rank busy"),
            (true, false) => info!(worker = %worker.id, "busy veto cleared"),
            _ => {}
        }
        self.changed.send_modify(|v| *v += 1);
    }

    /// Since when the engine's token counters (generated and prompt) have stood still while it
    /// reported requests in hand (two reports at least); sets the engine-silence signal once that
    /// spans the wedge bound.
    pub(super) fn engine_silent_since(
        &self,
        worker: &Worker,
        report: &LoadReport,
        now: Instant,
    ) -> Option<Instant> {
        let previous = worker.vetoes.load().map(|p| Reading {
            tokens: p.report.progress_tokens(),
            at: p.at,
            stalled_since: p.silent_since,
        });
        let in_hand = report.running() + report.waiting() > 0;
        let since = stalled_since(previous.as_ref(), report.progress_tokens(), in_hand);
        worker
            .signals
            .set_engine_silent(engine_silent(since, now, self.settings.liveness.wedge));
        since
    }

    /// No opinion on `worker`'s load any more.
    pub(super) fn load_cleared(&self, worker: &Worker, why: &'static str) {
        let (was_overloaded, was_busy) = worker.vetoes.clear_load();
        if was_overloaded || was_busy {
            info!(worker = %worker.id, why, "overload veto cleared");
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Acts on a health transition: log, gauge, breaker readmission on promotion, removal of a
    /// failed worker under auto-recovery, and a change signal for readiness and waiters.
    pub(super) fn health_changed(self: &Arc<Self>, worker: &Arc<Worker>, t: HealthTransition) {
        let (from, to) = (t.from.as_str(), t.to.as_str());
        match t.to {
            HealthState::Ready => {
                info!(worker = %worker.id, from, to, cause = %t.cause, "worker health changed")
            }
            _ => warn!(worker = %worker.id, from, to, cause = %t.cause, "worker health changed"),
        }
        worker
            .metrics
            .health
            .set(i64::from(t.to == HealthState::Ready));
        if t.is_promotion() {
            worker.breaker.readmit();
        }
        if t.from == HealthState::Ready {
            self.load_cleared(worker, "it left Ready");
        }
        self.changed.send_modify(|v| *v += 1);
        if t.to == HealthState::Failed && self.settings.health.remove_unhealthy {
            info!(worker = %worker.id, "removing the failed worker (--remove-unhealthy-workers)");
            self.remove_now(worker);
        }
    }
}
