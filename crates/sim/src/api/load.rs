//! Health, model list, metrics, load and server-info endpoints, per flavor.
//!
//! The load endpoints (`/metrics`, `/load`, `/v1/loads`, `/get_load`) obey the `load-endpoint`
//! fault and report the `report` fault's pinned values instead of the real ones, so gateway tests
//! can drive their overload verdicts deterministically.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::errors::ApiError;
use super::{authorize, ApiState};
use crate::config::{EngineConfig, Flavor};
use crate::engine::{EventKind, RankView, SeqSpec};
use crate::faults::{LoadEndpointMode, PinnedLoad, SleepLevel, WedgedPolls};
use crate::pd::PdRole;
use crate::scheduler::FinishReason;

/// The version string each flavor reports.
pub const VLLM_VERSION: &str = "0.11.0";
pub const SGLANG_VERSION: &str = "0.5.4";

/// SGLang's health check fails after this long without output (divided by the time scale).
pub(crate) const SGLANG_HEALTH_TIMEOUT: Duration = Duration::from_secs(20);

/// Applies the `load-endpoint` fault: `Some` is the answer to give instead of the real one.
async fn load_fault(st: &ApiState) -> Option<Response> {
    match st.engine.faults().load_endpoint? {
        LoadEndpointMode::Error => Some(ApiError::Internal.respond(st.engine.config().flavor)),
        LoadEndpointMode::Empty => Some(StatusCode::OK.into_response()),
        LoadEndpointMode::Timeout => std::future::pending().await,
    }
}

/// Waits while the scheduler is wedged and its release asks it for its loads
/// (`WedgedPolls::Unanswered`): the answer comes once it steps again, if ever.
async fn asked_of_scheduler(st: &ApiState) {
    let mut faults = st.engine.fault_watch();
    let _ = faults
        .wait_for(|f| f.wedged != Some(WedgedPolls::Unanswered))
        .await;
}

/// Each rank's load as the engine reports it: real, unless a `report` fault pinned it.
pub(crate) fn reported(st: &ApiState) -> Vec<(RankView, PinnedLoad)> {
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
    let faults = st.engine.faults();
    let mut text = st
        .engine
        .metrics()
        .render(&st.engine.ranks(), &faults.report, faults.asleep);
    let cfg = st.engine.config();
    if let (Some(stats), Some(lora)) = (st.engine.adapter_stats(), cfg.scheduler().lora) {
        text.push_str(&stats.render(cfg.flavor, &cfg.model, lora.max_loras));
    }
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
    let mut data = vec![model];
    data.extend(
        st.engine
            .loaded_adapters()
            .iter()
            .map(|l| adapter_card(&st, l)),
    );
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// A loaded adapter in `/v1/models`, after the base model: its name, the path it was loaded
/// from as `root`, the base model as `parent`, no `max_model_len` (vLLM's
/// `show_available_models` in vllm/entrypoints/openai/models/serving.py; SGLang's
/// `available_models` in python/sglang/srt/entrypoints/http_server.py).
fn adapter_card(st: &ApiState, loaded: &crate::lora::Loaded) -> serde_json::Value {
    let cfg = st.engine.config();
    let mut card = json!({
        "id": loaded.adapter.name.as_ref(),
        "object": "model",
        "created": st.created,
        "owned_by": cfg.flavor.owner(),
        "root": loaded.path,
        "parent": cfg.model,
        "max_model_len": null,
    });
    if cfg.flavor == Flavor::Vllm {
        card["permission"] = json!([]);
    }
    card
}

/// vLLM: 200 with an empty body while the process lives, even when the scheduler is stuck.
pub(super) async fn vllm_health() -> StatusCode {
    StatusCode::OK
}

/// SGLang: 503 while starting (`ServerStatus.Starting`); then healthy if the engine produced
/// output recently, otherwise it runs a one-token generation and answers 503 if none comes
/// within 20 s (python/sglang/srt/entrypoints/http_server.py, `health_generate`).
pub(super) async fn sglang_health(State(st): State<Arc<ApiState>>) -> StatusCode {
    let engine = &st.engine;
    if engine.starting() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let timeout = SGLANG_HEALTH_TIMEOUT.div_f64(engine.config().time_scale);
    if engine.last_progress().elapsed() < timeout && !engine.faults().paused {
        return StatusCode::OK;
    }
    let probe = [SeqSpec {
        prompt: Arc::from([]),
        prompt_tokens: 1,
        output_tokens: 1,
        finish: FinishReason::Length,
        preloaded: 0,
        adapter: None,
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

/// vLLM's development endpoints (`VLLM_SERVER_DEV_MODE=1`): `POST /sleep?level=1|2`.
pub(super) async fn vllm_sleep(
    State(st): State<Arc<ApiState>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let level = query.get("level").map_or(Some(1), |l| l.parse().ok());
    match level.and_then(SleepLevel::from_level) {
        Some(level) => {
            st.engine.set_sleep(Some(level));
            StatusCode::OK.into_response()
        }
        None => ApiError::BadRequest("level must be 1 or 2".into()).respond(Flavor::Vllm),
    }
}

/// `POST /wake_up`.
pub(super) async fn vllm_wake_up(State(st): State<Arc<ApiState>>) -> StatusCode {
    st.engine.set_sleep(None);
    StatusCode::OK
}

/// `GET /is_sleeping`.
pub(super) async fn vllm_is_sleeping(State(st): State<Arc<ApiState>>) -> Response {
    axum::Json(json!({"is_sleeping": st.engine.faults().asleep.is_some()})).into_response()
}

pub(super) async fn vllm_version() -> Response {
    axum::Json(json!({"version": VLLM_VERSION})).into_response()
}

/// The sections `GET /v1/loads?include=...` asks for (`all`, or a list of `queues`, `disagg`).
#[derive(Debug, Default, Clone, Copy)]
struct Include {
    queues: bool,
    disagg: bool,
    lora: bool,
}

impl Include {
    fn of(query: &HashMap<String, String>) -> Self {
        let mut include = Include::default();
        for part in query.get("include").into_iter().flat_map(|v| v.split(',')) {
            match part.trim() {
                "all" => (include.queues, include.disagg, include.lora) = (true, true, true),
                "queues" => include.queues = true,
                "disagg" => include.disagg = true,
                "lora" => include.lora = true,
                _ => {}
            }
        }
        include
    }
}

/// One rank's load as SGLang's scheduler reports it (`get_loads`, read late 2026), the figures
/// both its `/v1/loads` and the gRPC `GetLoads` carry: `num_waiting_reqs` counts the
/// disaggregation queues too, the request in chunked prefill is in neither count, and
/// `num_waiting_uncached_tokens` holds what is left to prefill.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SglangLoad {
    pub running: u64,
    pub waiting: u64,
    pub waiting_uncached_tokens: u64,
    pub used_tokens: u64,
    pub total_tokens: u64,
    pub token_usage: f64,
    pub gen_throughput: f64,
    pub cache_hit_rate: f64,
    pub max_running: u32,
    /// The `queues` section's `waiting`: every queue a request can wait in.
    pub queued: u64,
    pub retracted: u64,
}

impl SglangLoad {
    pub(crate) fn of(cfg: &EngineConfig, view: &RankView, pin: &PinnedLoad) -> Self {
        let total_tokens = u64::from(cfg.num_gpu_blocks) * u64::from(cfg.block_size);
        let usage = pin.kv_usage.unwrap_or_else(|| view.kv_usage());
        Self {
            running: pin
                .running
                .unwrap_or(view.running - view.chunked.min(view.running)),
            waiting: pin.waiting.unwrap_or(view.waiting),
            waiting_uncached_tokens: view.pending_prefill_tokens,
            used_tokens: (usage * total_tokens as f64).round() as u64,
            total_tokens,
            token_usage: usage,
            gen_throughput: view.gen_throughput,
            cache_hit_rate: view.cache_hit_rate,
            max_running: cfg.max_num_seqs,
            queued: pin.waiting.unwrap_or(view.queued()),
            retracted: view.retracted,
        }
    }
}

/// One rank's load in SGLang's `/v1/loads` shape.
fn sglang_rank_load(
    st: &ApiState,
    rank: usize,
    view: &RankView,
    pin: &PinnedLoad,
    include: Include,
) -> serde_json::Value {
    let cfg = st.engine.config();
    let l = SglangLoad::of(cfg, view, pin);
    let mut load = json!({
        "dp_rank": rank,
        "num_running_reqs": l.running,
        "num_waiting_reqs": l.waiting,
        "num_waiting_uncached_tokens": l.waiting_uncached_tokens,
        "num_used_tokens": l.used_tokens,
        "num_total_tokens": l.used_tokens,
        "max_total_num_tokens": l.total_tokens,
        "token_usage": l.token_usage,
        "gen_throughput": l.gen_throughput,
        "cache_hit_rate": l.cache_hit_rate,
        "utilization": l.token_usage,
        "max_running_requests": l.max_running,
    });
    if include.queues {
        load["queues"] = json!({
            "waiting": l.queued,
            "grammar": 0,
            "paused": 0,
            "retracted": l.retracted,
        });
    }
    let slots = st.engine.adapter_stats().and_then(|s| s.slots(rank));
    if let (true, Some(slots)) = (include.lora, slots) {
        load["lora"] = json!({
            "slots_used": slots.used,
            "slots_total": slots.total,
            "utilization": slots.utilization(),
        });
    }
    if let (true, Some(role)) = (include.disagg, cfg.pd_role) {
        load["disaggregation"] = json!({
            "mode": match role { PdRole::Prefill => "prefill", PdRole::Decode => "decode" },
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": view.prealloc,
            "decode_transfer_queue_reqs": view.transfer,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        });
    }
    load
}

fn rfc3339_now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

pub(super) async fn sglang_loads(
    State(st): State<Arc<ApiState>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Some(answer) = load_fault(&st).await {
        return answer;
    }
    asked_of_scheduler(&st).await;
    let include = Include::of(&query);
    let ranks = reported(&st);
    let loads: Vec<serde_json::Value> = ranks
        .iter()
        .enumerate()
        .map(|(i, (view, pin))| sglang_rank_load(&st, i, view, pin, include))
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
    asked_of_scheduler(&st).await;
    let cfg = st.engine.config();
    let total_tokens = u64::from(cfg.num_gpu_blocks) * u64::from(cfg.block_size);
    let loads: Vec<serde_json::Value> = reported(&st)
        .iter()
        .enumerate()
        .map(|(i, (view, pin))| {
            let running = pin.running.unwrap_or(view.running);
            let waiting = pin.waiting.unwrap_or(view.waiting);
            let usage = pin.kv_usage.unwrap_or_else(|| view.kv_usage());
            // The deprecated shim names no rank when there is only one.
            let dp_rank = (cfg.dp_size > 1).then_some(i);
            json!({
                "dp_rank": dp_rank,
                "num_reqs": running + waiting,
                "num_waiting_reqs": waiting,
                "num_tokens": (usage * total_tokens as f64).round() as u64,
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
