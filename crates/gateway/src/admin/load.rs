//! Load and veto views: `GET /loads` (every worker's last report and vetoes, plus an aggregate),
//! the `engine_load` and `vetoes` of `GET /workers`, and `GET/POST /busy_threshold`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Response};
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{Map, Value};
use sluice_core::liveness::{LivenessVeto, TrialVerdict};
use sluice_core::load::RankLoad;
use sluice_core::overload::{BusyThresholds, OverloadCause};
use tokio::time::Instant;

use super::AdminError;
use super::{authorized_body, Admin};
use crate::control::busy_thresholds;
use crate::fleet::Worker;

/// A worker's last load report as shown.
#[derive(Serialize)]
pub(crate) struct LoadView {
    source: &'static str,
    age_secs: f64,
    /// Waiting for room in the batch (the queue the ceiling reads).
    waiting: u64,
    /// Waiting for anything else: a KV transfer, a bootstrap (not overload).
    deferred: u64,
    running: u64,
    token_usage: f64,
    overload: Option<OverloadCause>,
    busy: bool,
    /// The most requests it was seen running while others waited (`learned_window`).
    running_window: Option<u64>,
    /// The share of the KV cache a running request settles at on it, learnt from its reports
    /// over about a minute of its busy time: the interactive reserve counts its room in it, so
    /// requests started lately are counted as grown to it.
    kv_per_request: Option<f64>,
    /// Its LoRA adapter slots, when it serves adapters: `max` slots, the adapters `running` and
    /// `waiting` by name (vLLM) or the slots `used` (SGLang).
    #[serde(skip_serializing_if = "Option::is_none")]
    adapters: Option<sluice_core::lora::AdapterSlots>,
    ranks: Vec<RankLoad>,
}

impl LoadView {
    pub(crate) fn of(worker: &Worker) -> Option<Self> {
        let load = worker.vetoes.load()?;
        Some(Self {
            source: load.source,
            age_secs: Instant::now()
                .saturating_duration_since(load.at)
                .as_secs_f64(),
            waiting: load.report.waiting(),
            deferred: load.report.deferred(),
            running: load.report.running(),
            token_usage: load.report.mean_kv_usage(),
            overload: load.overload,
            busy: load.busy,
            running_window: worker.vetoes.window(),
            kv_per_request: load.kv_per_request,
            adapters: load.report.adapters.clone(),
            ranks: load.report.ranks.clone(),
        })
    }
}

/// A worker's adaptive concurrency limit as shown (`--adaptive-concurrency`).
#[derive(Serialize)]
pub(crate) struct LimitView {
    limit: u64,
    /// It takes no new request now.
    at_limit: bool,
    /// The last window judged, once one is.
    last_window: Option<WindowView>,
}

#[derive(Serialize)]
struct WindowView {
    /// `increase`, `decrease`, `hold`, `unused` (healthy, limit not approached) or
    /// `too_few_samples`.
    decision: &'static str,
    /// The limit before the decision.
    from: u64,
    ttft_p95_ms: Option<f64>,
    itl_p95_ms: Option<f64>,
    /// Responses measured in the window.
    samples: u64,
    peak_in_flight: u64,
    age_secs: f64,
}

impl LimitView {
    pub(crate) fn of(worker: &Worker) -> Option<Self> {
        let limit = worker.adaptive.limit()?;
        let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        Some(Self {
            limit,
            at_limit: worker.at_limit(1),
            last_window: worker.adaptive.last().map(|w| WindowView {
                decision: w.decision.as_str(),
                from: w.from,
                ttft_p95_ms: ms(w.stats.ttft_p95),
                itl_p95_ms: ms(w.stats.itl_p95),
                samples: w.stats.samples,
                peak_in_flight: w.stats.peak_in_flight,
                age_secs: Instant::now().saturating_duration_since(w.at).as_secs_f64(),
            }),
        })
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Every veto in force on a worker.
#[derive(Serialize)]
pub(crate) struct VetoView {
    overloaded: bool,
    /// The waiting queue as projected now from the last report and the requests sent and
    /// started since, this gateway's and (with `--redis-url`) the other replicas' — what the
    /// ceiling is judged on, request by request.
    projected_waiting: u64,
    /// The same as the gateway queue judges it: sent since the last report beyond the room that
    /// report showed in the running window (`Projection::Wary`).
    projected_waiting_wary: u64,
    /// This gateway's requests on the worker with no first byte yet.
    pending_requests: u64,
    /// The other replicas', as Redis last said (`--redis-url`; refreshed four times a second).
    #[serde(skip_serializing_if = "is_zero")]
    pending_elsewhere: u64,
    /// The other replicas' requests in flight on the worker, likewise.
    #[serde(skip_serializing_if = "is_zero")]
    in_flight_elsewhere: u64,
    /// Requests it could still start by its last report, less those sent it since (the
    /// interactive reserve is judged on it: `--interactive-reserve`); absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    start_room: Option<u64>,
    /// Seconds since an interactive request on it last had its first token: for 60 s after,
    /// the interactive reserve is kept on every worker of its model.
    #[serde(skip_serializing_if = "Option::is_none")]
    interactive_answered_secs_ago: Option<f64>,
    busy: bool,
    at_capacity: bool,
    /// Its engine says it is asleep: out of routing until a report says it is awake.
    asleep: bool,
    liveness: Option<LivenessVeto>,
    /// The last liveness trial (`--disable-liveness-trials` turns them off): its verdict and
    /// how long ago it came.
    #[serde(skip_serializing_if = "Option::is_none")]
    liveness_trial: Option<TrialView>,
}

#[derive(Serialize)]
struct TrialView {
    verdict: TrialVerdict,
    secs_ago: f64,
}

impl VetoView {
    pub(crate) fn of(worker: &Worker) -> Self {
        let v = &worker.vetoes;
        Self {
            overloaded: v.overloaded(),
            projected_waiting: v
                .queue_gate()
                .projected(worker.traffic.pending_everywhere()),
            projected_waiting_wary: v
                .queue_gate()
                .projected_wary(worker.traffic.pending_everywhere()),
            pending_requests: worker.traffic.pending_requests(),
            pending_elsewhere: worker.traffic.pending_elsewhere(),
            in_flight_elsewhere: worker.traffic.in_flight_elsewhere(),
            start_room: v.start_room().left(worker.load_everywhere()),
            interactive_answered_secs_ago: worker
                .signals
                .interactive_answered_at()
                .map(|at| at.elapsed().as_secs_f64()),
            busy: v.busy(),
            at_capacity: v.at_capacity(),
            asleep: v.asleep(),
            liveness: v.liveness(),
            liveness_trial: worker.signals.last_trial().map(|(at, verdict)| TrialView {
                verdict,
                secs_ago: at.elapsed().as_secs_f64(),
            }),
        }
    }
}

#[derive(Serialize)]
struct WorkerLoad {
    id: String,
    status: &'static str,
    vetoes: VetoView,
    load: Option<LoadView>,
    in_flight: u64,
    /// Its adaptive concurrency limit, when on.
    #[serde(skip_serializing_if = "Option::is_none")]
    concurrency: Option<LimitView>,
}

#[derive(Serialize, Default)]
struct Aggregate {
    workers: usize,
    reporting: usize,
    vetoed: usize,
    waiting: u64,
    running: u64,
    mean_token_usage: f64,
}

pub(crate) async fn loads(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> Response<Body> {
    if let Err(e) = admin.check_read(&headers) {
        return e.into_response();
    }
    let snapshot = admin.fleet.snapshot();
    let mut aggregate = Aggregate {
        workers: snapshot.workers.len(),
        ..Aggregate::default()
    };
    let mut usage_sum = 0.0;
    let workers: Vec<WorkerLoad> = snapshot
        .workers
        .iter()
        .map(|w| {
            let load = LoadView::of(w);
            if let Some(l) = &load {
                aggregate.reporting += 1;
                aggregate.waiting += l.waiting;
                aggregate.running += l.running;
                usage_sum += l.token_usage;
            }
            if w.veto_class().is_some() {
                aggregate.vetoed += 1;
            }
            WorkerLoad {
                id: w.id.to_string(),
                status: w.status().as_str(),
                vetoes: VetoView::of(w),
                load,
                in_flight: w.in_flight(),
                concurrency: LimitView::of(w),
            }
        })
        .collect();
    if aggregate.reporting > 0 {
        aggregate.mean_token_usage = usage_sum / aggregate.reporting as f64;
    }
    axum::Json(serde_json::json!({"workers": workers, "aggregate": aggregate})).into_response()
}

pub(crate) async fn busy_get(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
) -> Response<Body> {
    if let Err(e) = admin.check_read(&headers) {
        return e.into_response();
    }
    axum::Json(admin.control.busy_thresholds()).into_response()
}

/// Changes the busy thresholds: a field given sets it, `null` turns that check off, a field left
/// out stays. Each worker's verdict follows at its next load report.
pub(crate) async fn busy_post(State(admin): State<Arc<Admin>>, request: Request) -> Response<Body> {
    let result = async {
        let body = authorized_body(&admin, request).await?;
        let current = admin.control.busy_thresholds();
        let next = merge(current, &body)?;
        admin.control.set_busy_thresholds(next);
        Ok::<_, AdminError>(next)
    }
    .await;
    match result {
        Ok(next) => axum::Json(next).into_response(),
        Err(e) => e.into_response(),
    }
}

fn invalid(field: &str, message: impl Into<String>) -> AdminError {
    AdminError::InvalidWorkerSpec {
        field: field.to_string(),
        message: message.into(),
    }
}

fn merge(current: BusyThresholds, body: &[u8]) -> Result<BusyThresholds, AdminError> {
    const FIELDS: [&str; 3] = [
        "active_decode_blocks_threshold",
        "active_prefill_tokens_threshold",
        "active_prefill_tokens_threshold_frac",
    ];
    let object: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => o,
        _ => return Err(invalid("body", "must be a JSON object")),
    };
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(invalid(
            unknown,
            format!("unknown field (known: {})", FIELDS.join(", ")),
        ));
    }
    let number = |name: &str, keep: Option<f64>| match object.get(name) {
        None => Ok(keep),
        Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| invalid(name, "must be a number or null")),
    };
    let decode = number(FIELDS[0], current.active_decode_blocks_threshold)?;
    let prefill = match object.get(FIELDS[1]) {
        None => current.active_prefill_tokens_threshold,
        Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| invalid(FIELDS[1], "must be a whole number or null"))?,
        ),
    };
    let frac = number(FIELDS[2], current.active_prefill_tokens_threshold_frac)?;
    busy_thresholds(decode, prefill, frac)
        .map_err(|(flag, message)| invalid(&flag.replace('-', "_"), message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Answerable;

    #[test]
    fn busy_thresholds_merge_field_by_field() {
        let current = BusyThresholds {
            active_decode_blocks_threshold: Some(0.9),
            active_prefill_tokens_threshold: Some(1000),
            active_prefill_tokens_threshold_frac: None,
        };
        let next = merge(
            current,
            br#"{"active_prefill_tokens_threshold":null,"active_prefill_tokens_threshold_frac":1.5}"#,
        )
        .unwrap();
        assert_eq!(
            next.active_decode_blocks_threshold,
            Some(0.9),
            "left out: kept"
        );
        assert_eq!(next.active_prefill_tokens_threshold, None, "null: off");
        assert_eq!(next.active_prefill_tokens_threshold_frac, Some(1.5));
        let param = |body: &[u8]| merge(current, body).unwrap_err().param().map(String::from);
        assert_eq!(
            param(br#"{"active_decode_blocks_threshold":1.5}"#).as_deref(),
            Some("active_decode_blocks_threshold")
        );
        assert_eq!(
            param(br#"{"active_prefill_tokens_threshold":-1}"#).as_deref(),
            Some("active_prefill_tokens_threshold")
        );
        assert_eq!(param(br#"{"decode":0.5}"#).as_deref(), Some("decode"));
        assert_eq!(param(b"[]").as_deref(), Some("body"));
    }
}
