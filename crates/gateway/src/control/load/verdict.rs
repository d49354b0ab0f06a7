//! What a poll means: the report (or its absence) turned into the worker's overload, busy and
//! engine-silence verdicts, published in its vetoes and gauges and logged when they change.

use sluice_core::liveness::{engine_silent, report_short, stalled_since, Reading};
use sluice_core::load::LoadReport;
use sluice_core::overload::{overload_verdict, worker_busy, QueueGate, RankActivity};
use tokio::time::Instant;
use tracing::{info, warn};

use super::PollError;
use crate::control::Control;
use crate::fleet::{EngineLoad, Fleet, Worker};

/// What the busy checks read from a report, with the gateway's own estimate of the prompt
/// tokens waiting for prefill on the worker spread over its ranks (engines do not report it).
/// `max_num_batched_tokens` is the worker spec's, else what the engine said (SGLang's
/// `chunked_prefill_size`); without it the fractional prefill check cannot hold.
pub fn activity(
    report: &LoadReport,
    pending_prefill_tokens: u64,
    max_num_batched_tokens: Option<u64>,
) -> Vec<RankActivity> {
    let ranks = report.ranks.len().max(1) as u64;
    report
        .ranks
        .iter()
        .map(|r| RankActivity {
            decode_blocks: r.kv_usage,
            prefill_tokens: pending_prefill_tokens / ranks,
            max_num_batched_tokens,
        })
        .collect()
}

impl Control {
    /// A poll of `worker` ended: its verdicts follow the report, or clear without one.
    pub(super) fn load_polled(
        &self,
        fleet: &Fleet,
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
                worker.signals.report_judged(None, now);
                fleet.load_cleared(worker, "a poll gave no report");
                return;
            }
        };
        worker.signals.contact(now);
        let unanswered = worker.traffic.pending_requests();
        worker.signals.report_judged(
            Some(report_short(report.running(), report.waiting(), unanswered)),
            now,
        );
        let silent_since = self.engine_silent_since(worker, &report, now);
        let ceilings = self
            .settings
            .load
            .ceilings_for(&worker.live().spec.overload);
        let overload = overload_verdict(&report, &ceilings);
        let window = worker.vetoes.learn_window(&report);
        let gate = QueueGate::new(
            &report,
            &ceilings,
            worker.traffic.pending_everywhere(),
            window,
        );
        let batch = worker.live().spec.max_num_batched_tokens.or(engine_batch);
        let activity = activity(&report, worker.traffic.pending_prefill_tokens(), batch);
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
        fleet.announce();
    }

    /// Since when the engine's token counters (generated and prompt) have stood still while it
    /// reported requests in hand (two reports at least); sets the engine-silence signal once that
    /// spans the wedge bound.
    fn engine_silent_since(
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
        // Without liveness checks no wedge bound applies: a zero bound never calls it silent.
        let wedge = self
            .settings
            .liveness
            .map_or(std::time::Duration::ZERO, |l| l.wedge);
        worker
            .signals
            .set_engine_silent(engine_silent(since, now, wedge));
        since
    }
}
