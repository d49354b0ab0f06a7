//! What a poll means: the report (or its absence) turned into the worker's overload, busy and
//! engine-silence verdicts, published in its vetoes and gauges and logged when they change.

use sluice_core::admission::drain::{AtReport, Starts};
use sluice_core::liveness::{stalled_since, PollShowed, Reading};
use sluice_core::load::LoadReport;
use sluice_core::overload::{
    overload_verdict, worker_busy, Ceilings, OverloadCause, QueueGate, RankActivity, RunningSize,
    StartRoom,
};
use tokio::time::Instant;
use tracing::{info, warn};

use super::poll::Polled;
use super::PollError;
use crate::control::Control;
use crate::fleet::{EngineLoad, Fleet, Worker};

/// What has been said in the log of one worker's reports: a degraded read is logged the first
/// time and counted every time.
#[derive(Debug, Default)]
pub(super) struct Told {
    fallback: bool,
    dropped: bool,
}

impl Told {
    /// Counts how the report came out less than whole, and logs it the first time.
    fn degraded(&mut self, worker: &Worker, polled: &Polled) {
        let m = &worker.metrics;
        if polled.fell_back {
            m.report_fallback.inc();
            if !std::mem::replace(&mut self.fallback, true) {
                warn!(
                    worker = %worker.id,
                    source = polled.source,
                    "load report read from an older endpoint: /v1/loads gave none (counted in sluice_engine_load_report_issues_total; said once)"
                );
            }
        }
        if !polled.report.dropped.is_empty() {
            m.report_dropped_field.inc();
            if !std::mem::replace(&mut self.dropped, true) {
                warn!(
                    worker = %worker.id,
                    source = polled.source,
                    fields = ?polled.report.dropped,
                    "load report fields of the wrong type left out, the rest kept (counted in sluice_engine_load_report_issues_total; said once)"
                );
            }
        }
    }
}

/// What one worker's monitor keeps from report to report.
pub(super) struct Kept<'a> {
    pub(crate) told: &'a mut Told,
    /// The size its running requests settle at, in which the reserve counts room.
    pub(crate) size: &'a mut RunningSize,
    /// Its poll interval: the most of its life one report stands for.
    pub(crate) interval: std::time::Duration,
}

/// What the busy checks read from a report. The prompt tokens waiting for prefill are the
/// engine's own figure where it reports one (SGLang's `num_waiting_uncached_tokens`, which counts
/// every replica's prompts and the request in chunked prefill), else the gateway's own estimate
/// spread over its ranks. `max_num_batched_tokens` is the worker spec's, else what the engine
/// said (SGLang's `chunked_prefill_size`); without it the fractional prefill check cannot hold.
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
            prefill_tokens: r
                .pending_prefill_tokens
                .unwrap_or(pending_prefill_tokens / ranks),
            max_num_batched_tokens,
        })
        .collect()
}

/// A poll without a report: what it says of the link, and no opinion on the load.
fn no_report(fleet: &Fleet, worker: &Worker, e: &PollError, now: Instant) {
    let pending = worker.traffic.pending_requests() > 0;
    if e.is_transport() {
        worker.signals.transport_failure(now);
        worker.signals.polled(now, PollShowed::Unanswered, pending);
    } else if e.is_timeout() {
        worker.signals.timeout(now);
        worker.signals.polled(now, PollShowed::Unanswered, pending);
    } else if e.answered() {
        worker.signals.contact(now);
    }
    tracing::debug!(worker = %worker.id, error = %e, "load poll gave no report");
    worker.signals.set_engine_stalled_since(None);
    fleet.load_cleared(worker, "a poll gave no report");
}

/// One log line for each of a report's verdicts that changed: (asleep, overloaded, busy) before
/// and after.
fn say_changes(
    worker: &Worker,
    (was_asleep, was_overloaded, was_busy): (bool, bool, bool),
    (asleep, overload, busy): (bool, Option<OverloadCause>, bool),
) {
    match (was_asleep, asleep) {
        (false, true) => warn!(worker = %worker.id, "worker vetoed: its engine is asleep"),
        (true, false) => info!(worker = %worker.id, "asleep veto cleared: its engine is awake"),
        _ => {}
    }
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
}

/// What the engine reported of itself: its queue and KV usage as the worker's gauges show
/// them, and what its prefix cache found since `previous` (the credit of the prefix claims sent
/// to it).
fn engine_figures(worker: &Worker, report: &LoadReport, previous: Option<&LoadReport>) {
    let m = &worker.metrics;
    m.engine_waiting.set(report.waiting() as i64);
    m.engine_running.set(report.running() as i64);
    m.engine_token_usage.set(report.mean_kv_usage());
    worker
        .latency
        .engine_found(report.prefix_found_since(previous));
}

/// The room `report` leaves on `worker` to start requests, set on its vetoes (tight when what is
/// left is the interactive reserve), and the gate its engine's queue puts on new ones.
fn room_after(
    fleet: &Fleet,
    worker: &Worker,
    (report, previous): (&LoadReport, Option<&LoadReport>),
    ceilings: &Ceilings,
    settled: Option<f64>,
) -> QueueGate {
    let window = worker.vetoes.learn_window(report);
    let gate = QueueGate::new(
        report,
        ceilings,
        worker.traffic.pending_everywhere(),
        window,
    );
    let room = StartRoom::new(report, ceilings, window, worker.load_everywhere(), settled)
        .after_preemptions(report.preempted_since(previous));
    worker
        .vetoes
        .set_start_room(room, room.tight(fleet.interactive_reserve()));
    gate
}

impl Control {
    /// A poll of `worker` ended: its verdicts follow the report, or clear without one.
    pub(super) fn load_polled(
        &self,
        fleet: &Fleet,
        worker: &Worker,
        result: Result<Polled, PollError>,
        engine_batch: Option<u64>,
        kept: Kept<'_>,
    ) {
        let now = Instant::now();
        let polled = match result {
            Ok(polled) => polled,
            Err(e) => return no_report(fleet, worker, &e, now),
        };
        kept.told.degraded(worker, &polled);
        let Polled { report, source, .. } = polled;
        worker.signals.contact(now);
        let previous = worker.vetoes.load();
        worker.signals.polled(
            now,
            PollShowed::between(previous.as_ref().map(|p| &p.report), &report),
            worker.traffic.pending_requests() > 0,
        );
        let silent_since = self.engine_silent_since(worker, previous.as_deref(), &report);
        let ceilings = self
            .settings
            .load
            .ceilings_for(&worker.live().spec.overload);
        let overload = overload_verdict(&report, previous.as_ref().map(|p| &p.report), &ceilings);
        let asleep = report.asleep();
        kept.size.observe(&report, now, kept.interval);
        let settled = kept.size.remembered();
        let previous_report = previous.as_ref().map(|p| &p.report);
        let gate = room_after(
            fleet,
            worker,
            (&report, previous_report),
            &ceilings,
            settled,
        );
        let batch = worker.live().spec.max_num_batched_tokens.or(engine_batch);
        let activity = activity(&report, worker.traffic.pending_prefill_tokens(), batch);
        let busy = worker_busy(&activity, &self.busy_thresholds());
        engine_figures(worker, &report, previous_report);
        let was_asleep = worker.vetoes.set_asleep(asleep);
        let at_report = AtReport::new(report.waiting(), worker.traffic.sent_and_ended(), now);
        let starts = previous
            .as_ref()
            .map_or(Starts::first(at_report), |p| p.starts.next(at_report));
        let (was_overloaded, was_busy) = worker.vetoes.report(
            EngineLoad {
                report,
                source,
                at: now,
                overload,
                busy,
                silent_since,
                kv_per_request: settled,
                starts,
            },
            gate,
        );
        say_changes(
            worker,
            (was_asleep, was_overloaded, was_busy),
            (asleep, overload, busy),
        );
        fleet.announce();
    }

    /// Since when the engine's reports have shown no step (its token counters and the KV usage
    /// its scheduler republishes every step) while it reported requests in hand, two reports at
    /// least; published for the liveness checker, which judges it against the wedge bound.
    fn engine_silent_since(
        &self,
        worker: &Worker,
        previous: Option<&EngineLoad>,
        report: &LoadReport,
    ) -> Option<Instant> {
        let previous = previous.map(|p| Reading {
            stepping: p.report.stepping(),
            at: p.at,
            stalled_since: p.silent_since,
        });
        let since = stalled_since(previous.as_ref(), report.stepping(), report.in_hand() > 0);
        let judged = self.settings.liveness.is_some_and(|l| !l.wedge.is_zero());
        worker
            .signals
            .set_engine_stalled_since(since.filter(|_| judged));
        since
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::load::RankLoad;

    use super::*;

    #[test]
    fn the_engines_own_pending_prefill_wins_over_the_gateways_estimate() {
        let report = LoadReport {
            ranks: vec![
                RankLoad {
                    pending_prefill_tokens: Some(9_000),
                    ..RankLoad::default()
                },
                RankLoad {
                    rank: 1,
                    ..RankLoad::default()
                },
            ],
            ..LoadReport::default()
        };
        let ranks = activity(&report, 400, Some(8192));
        let tokens: Vec<u64> = ranks.iter().map(|r| r.prefill_tokens).collect();
        assert_eq!(tokens, [9_000, 200], "reported, else this gateway's share");
    }
}
