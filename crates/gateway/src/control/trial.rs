//! Liveness trials: while a worker is out for a veto that awaits progress (wedged, engine
//! silent, unresponsive), nothing is routed to it, so no request of a client's can show that it
//! is back. A trial asks instead: a one-token completion (`max_tokens` 1, not streamed, on the
//! worker's own model, marked `X-Sluice-Liveness-Trial: 1`), at most one in flight per worker
//! and one every `every`. Not streamed, so its answer comes only once the engine has generated
//! (an API process sends a stream's 200 head before its engine steps). An answer readmits the worker (`Signals::trial` is a sign of
//! life); any other verdict leaves it out. Trials pass through no stage of the request path:
//! they are charged to no tenant and count in no goodput or SLO figure, only in
//! `sluice_worker_liveness_trials_total`, `/workers` and the log.
//!
//! Cost: one one-token generation per `every` per vetoed worker, and none while every worker
//! serves. gRPC workers are not tried (their veto lifts on the stream's own progress).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use bytes::Bytes;
use sluice_core::liveness::TrialVerdict;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::info;

use crate::fleet::{Fleet, Worker};
use crate::upstream::{self, Upstream};

/// The header that marks a trial, so an engine's access log (and the simulator's count of its
/// clients' requests) can tell trials apart.
pub(crate) const TRIAL_HEADER: &str = "x-sluice-liveness-trial";

/// A worker's trial: when it began, and the task that runs it.
struct Trying {
    began: Instant,
    task: JoinHandle<()>,
}

/// The spacing and the time allowed of trials: `--worker-stall-secs`, at least a second.
pub(crate) fn trial_every(stall: Duration) -> Duration {
    stall.max(Duration::from_secs(1))
}

/// The trials in flight, kept by the liveness checker, which looks at each worker after judging
/// it (`consider`): one writer, one tick.
pub(super) struct Trials {
    upstream: Upstream,
    every: Duration,
    trying: HashMap<u64, Trying>,
}

impl Trials {
    pub(super) fn new(upstream: Upstream, every: Duration) -> Self {
        Self {
            upstream,
            every,
            trying: HashMap::new(),
        }
    }

    /// Forgets the workers no longer in the fleet.
    pub(super) fn retain(&mut self, present: impl Fn(u64) -> bool) {
        self.trying.retain(|key, _| present(*key));
    }

    /// Starts a trial on `worker` if it is out for a veto that awaits progress, is not a gRPC
    /// worker, and its last trial ended and began `every` ago or more.
    pub(super) fn consider(&mut self, fleet: &Arc<Fleet>, worker: &Arc<Worker>, now: Instant) {
        let out = worker
            .vetoes
            .liveness()
            .is_some_and(|v| v.awaits_progress());
        if !out || worker.endpoint.grpc() {
            return;
        }
        let due = self.trying.get(&worker.key).is_none_or(|t| {
            t.task.is_finished() && now.saturating_duration_since(t.began) >= self.every
        });
        if due {
            let task = tokio::spawn(trial(
                fleet.clone(),
                worker.clone(),
                self.upstream.clone(),
                self.every,
            ));
            self.trying.insert(worker.key, Trying { began: now, task });
        }
    }
}

/// One trial on `worker`, within `timeout`: its verdict recorded, counted and logged.
async fn trial(fleet: Arc<Fleet>, worker: Arc<Worker>, upstream: Upstream, timeout: Duration) {
    let Some(model) = worker.models().into_iter().next() else {
        return;
    };
    let body = serde_json::json!({
        "model": model.as_str(),
        "prompt": "ping",
        "max_tokens": 1,
        "stream": false,
    });
    let began = Instant::now();
    let authorization = worker.live().authorization.clone();
    let answer = upstream::post_json(
        &upstream,
        &worker.endpoint,
        authorization.as_ref(),
        "/v1/completions",
        (
            Bytes::from(body.to_string()),
            (
                HeaderName::from_static(TRIAL_HEADER),
                HeaderValue::from_static("1"),
            ),
        ),
        timeout,
    )
    .await;
    let now = Instant::now();
    let verdict = match answer {
        Ok((status, _)) if status.is_success() => TrialVerdict::Answered,
        Err(e) if e.is_timeout() => TrialVerdict::Timeout,
        Err(e) if e.is_transport() => {
            worker.signals.transport_failure(now);
            TrialVerdict::Unreachable
        }
        Ok(_) | Err(_) => TrialVerdict::Refused,
    };
    let pending = worker.traffic.pending_requests() > 0;
    worker.signals.trial(now, verdict, pending);
    fleet.metrics().count_trial(worker.id.as_str(), verdict);
    info!(
        worker = %worker.id,
        verdict = verdict.label(),
        took_ms = now.saturating_duration_since(began).as_millis() as u64,
        "liveness trial"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trials_are_spaced_by_the_stall_bound_and_never_under_a_second() {
        assert_eq!(trial_every(Duration::from_secs(2)), Duration::from_secs(2));
        assert_eq!(trial_every(Duration::ZERO), Duration::from_secs(1));
    }
}
