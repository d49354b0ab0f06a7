//! Health, model list, metrics, load and server-info endpoints, per flavor.
//!
//! The load endpoints (`/metrics`, `/load`, `/v1/loads`, `/get_load`) obey the `load-endpoint`
//! fault and report the `report` fault's pinned values instead of the real ones, so gateway tests
//! can drive their overload verdicts deterministically.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::errors::ApiError;
use super::{authorize, ApiState};
use crate::config::Flavor;
use crate::engine::{EventKind, RankView, SeqSpec};
use crate::faults::{LoadEndpointMode, PinnedLoad};
use crate::scheduler::FinishReason;

/// The version string each flavor reports.
pub const VLLM_VERSION: &str = "0.11.0";
pub const SGLANG_VERSION: &str = "0.5.4";

/// SGLang's health check fails after this long without output (divided by the time scale).
const SGLANG_HEALTH_TIMEOUT: Duration = Duration::from_secs(20);

/// Applies the `load-endpoint` fault: `Some` is the answer to give instead of the real one.
async fn load_fault(st: &ApiState) -> Option<Response> {
    match st.engine.faults().load_endpoint? {
        LoadEndpointMode::Error => Some(ApiError::Internal.respond(st.engine.config().flavor)),
        LoadEndpointMode::Empty => Some(StatusCode::OK.into_response()),
        LoadEndpointMode::Timeout => std::future::pending().await,
    }
}

/// Each rank's load as the engine reports it: real, unless a `report` fault pinned it.
fn reported(st: &ApiState) -> Vec<(RankView, PinnedLoad)> {
    let pins = st.engine.faults().report;
    st.engine
        .ranks()
        .into_iter()
        .enumerate()
        .map(|(i, view)| (view, pins.get(i).copied().unwrap_or_default()))
        .collect()
}

pub(super) async fn metrics(State(st): State<Arc<ApiState>>) -> Response {
    if let Some(answer) = load_fault(&st).await {
        return answer;
    }
    let pins = st.engine.faults().report;
    let text = st.engine.metrics().render(&st.engine.ranks(), &pins);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

pub(super) async fn models(State(st): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    let cfg = st.engine.config();
    if let Err(e) = authorize(cfg, &headers) {
        return e.respond(cfg.flavor);
    }
    let mut model = json!({
        "id": cfg.model,
        "object": "model",
        "created": st.created,
        "owned_by": cfg.flavor.owner(),
        "root": cfg.model,
        "parent": null,
        "max_model_len": cfg.max_model_len,
    });
    if cfg.flavor == Flavor::Vllm {
        model["permission"] = json!([]);
    }
    axum::Json(json!({"object": "list", "data": [model]})).into_response()
}

/// vLLM: 200 with an empty body while the process lives, even when the scheduler is stuck.
pub(super) async fn vllm_health() -> StatusCode {
    StatusCode::OK
}

/// SGLang: healthy if the engine produced output recently; otherwise it runs a one-token
/// generation and answers 503 if none comes within 20 s.
pub(super) async fn sglang_health(State(st): State<Arc<ApiState>>) -> StatusCode {
    let engine = &st.engine;
    let timeout = SGLANG_HEALTH_TIMEOUT.div_f64(engine.config().time_scale);
    if engine.last_progress().elapsed() < timeout && !engine.faults().frozen {
        return StatusCode::OK;
    }
    let probe = [SeqSpec {
        prompt: Arc::from([]),
        prompt_tokens: 1,
        output_tokens: 1,
        finish: FinishReason::Length,
        preloaded: 0,
    }];
    let Ok(mut submission) = engine.submit(&probe) else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    let first = tokio::time::timeout(timeout, submission.events.recv()).await;
    match first {
        Ok(Some(event)) if event.kind == EventKind::Token => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

pub(super) async fn vllm_load(State(st): State<Arc<ApiState>>) -> Response {
    if let Some(answer) = load_fault(&st).await {
        return answer;
    }
    axum::Json(json!({"server_load": st.engine.server_load()})).into_response()
}

pub(super) async fn vllm_version() -> Response {
    axum::Json(json!({"version": VLLM_VERSION})).into_response()
}

/// One rank's load in SGLang's `/v1/loads` shape.
fn sglang_rank_load(
    st: &ApiState,
    rank: usize,
    view: &RankView,
    pin: &PinnedLoad,
) -> serde_json::Value {
    let cfg = st.engine.config();
    let total_tokens = u64::from(cfg.num_gpu_blocks) * u64::from(cfg.block_size);
    let usage = pin.kv_usage.unwrap_or_else(|| view.kv_usage());
    json!({
        "dp_rank": rank,
        "num_running_reqs": pin.running.unwrap_or(view.running),
        "num_waiting_reqs": pin.waiting.unwrap_or(view.waiting),
        "num_used_tokens": (usage * total_tokens as f64).round() as u64,
        "num_total_tokens": total_tokens,
        "max_total_num_tokens": total_tokens,
        "token_usage": usage,
        "gen_throughput": view.gen_throughput,
        "cache_hit_rate": view.cache_hit_rate,
        "max_running_requests": cfg.max_num_seqs,
    })
}

fn rfc3339_now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

pub(super) async fn sglang_loads(State(st): State<Arc<ApiState>>) -> Response {
    if let Some(answer) = load_fault(&st).await {
        return answer;
    }
    let ranks = reported(&st);
    let loads: Vec<serde_json::Value> = ranks
        .iter()
        .enumerate()
        .map(|(i, (view, pin))| sglang_rank_load(&st, i, view, pin))
        .collect();
    let sum = |field: &str| loads.iter().filter_map(|l| l[field].as_u64()).sum::<u64>();
    let avg_usage = loads
        .iter()
        .filter_map(|l| l["token_usage"].as_f64())
        .sum::<f64>()
        / loads.len().max(1) as f64;
    let aggregate = json!({
        "total_running_reqs": sum("num_running_reqs"),
        "total_waiting_reqs": sum("num_waiting_reqs"),
        "total_reqs": sum("num_running_reqs") + sum("num_waiting_reqs"),
        "avg_token_usage": avg_usage,
        "avg_throughput": loads.iter().filter_map(|l| l["gen_throughput"].as_f64()).sum::<f64>(),
        "avg_utilization": avg_usage,
    });
    axum::Json(json!({
        "timestamp": rfc3339_now(),
        "version": SGLANG_VERSION,
        "dp_rank_count": loads.len(),
        "loads": loads,
        "aggregate": aggregate,
    }))
    .into_response()
}

pub(super) async fn sglang_get_load(State(st): State<Arc<ApiState>>) -> Response {
    if let Some(answer) = load_fault(&st).await {
        return answer;
    }
    let cfg = st.engine.config();
    let total_tokens = u64::from(cfg.num_gpu_blocks) * u64::from(cfg.block_size);
    let loads: Vec<serde_json::Value> = reported(&st)
        .iter()
        .enumerate()
        .map(|(i, (view, pin))| {
            let running = pin.running.unwrap_or(view.running);
            let waiting = pin.waiting.unwrap_or(view.waiting);
            let usage = pin.kv_usage.unwrap_or_else(|| view.kv_usage());
            json!({
                "dp_rank": i,
                "num_reqs": running + waiting,
                "num_waiting_reqs": waiting,
                "num_tokens": (usage * total_tokens as f64).round() as u64,
                "cache_hit_rate": view.cache_hit_rate,
            })
        })
        .collect();
    axum::Json(loads).into_response()
}

pub(super) async fn sglang_server_info(State(st): State<Arc<ApiState>>) -> Response {
    let cfg = st.engine.config();
    let total_tokens = u64::from(cfg.num_gpu_blocks) * u64::from(cfg.block_size);
    axum::Json(json!({
        "model_path": cfg.model,
        "served_model_name": cfg.model,
        "context_length": cfg.max_model_len,
        "max_running_requests": cfg.max_num_seqs,
        "max_total_tokens": total_tokens,
        "max_total_num_tokens": total_tokens,
        "chunked_prefill_size": cfg.max_num_batched_tokens,
        "page_size": cfg.block_size,
        "dp_size": cfg.dp_size,
        "schedule_policy": "fcfs",
        "version": SGLANG_VERSION,
    }))
    .into_response()
}
