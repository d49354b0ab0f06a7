//! Learning what a worker serves: `GET /v1/models` at registration, the models and the flavor
//! (`owned_by`: `vllm`, `sglang`, ...). A worker that cannot be reached stays registered and
//! `Pending`, and is asked again every `--worker-startup-check-interval-secs` until it answers.
//! Once registered, an HTTP worker is asked again every `--worker-models-refresh-secs`: LoRA
//! adapters come and go at run time (vLLM's `/v1/load_lora_adapter`, SGLang's
//! `/load_lora_adapter`), and its pools follow what it lists now.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Deserialize;
use sluice_core::ModelName;
use tracing::{debug, warn};

use super::{get, Control};
use crate::fleet::{Fleet, ModelCard, Worker, WorkerInfo};
use crate::upstream::{GetError, Upstream};

/// How long one `/v1/models` call may take.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);
/// A models list larger than this is not a models list.
const MODELS_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Why a worker's models could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiscoverError {
    #[error(transparent)]
    Get(#[from] GetError),
    #[error("GET /v1/models answered {0}")]
    Status(u16),
    #[error("the /v1/models body is not a models list: {0}")]
    Json(#[from] serde_json::Error),
    #[error("GET /v1/models lists no model")]
    NoModels,
    #[error("GetModelInfo failed: {0}")]
    Grpc(tonic::Status),
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<serde_json::Value>,
}

/// Reads a worker's models until it answers, then tells the fleet.
pub(super) async fn register(fleet: Weak<Fleet>, worker: Arc<Worker>, control: Arc<Control>) {
    let upstream = &control.upstream;
    let interval = control.settings.startup_check_interval;
    let expires = control
        .settings
        .startup_timeout
        .map(|timeout| (tokio::time::Instant::now() + timeout, timeout));
    let mut expired = false;
    let mut attempts = 0u32;
    if !control.settings.startup_delay.is_zero() {
        tokio::time::sleep(control.settings.startup_delay).await;
    }
    loop {
        if let Some((at, timeout)) =
            expires.filter(|(at, _)| !expired && tokio::time::Instant::now() >= *at)
        {
            let _ = at;
            expired = true;
            if let Some(fleet) = fleet.upgrade() {
                startup_expired(&fleet, &control, &worker, timeout);
            }
        }
        match fetch(upstream, &worker).await {
            Ok(info) => {
                let Some(fleet) = fleet.upgrade() else {
                    return;
                };
                fleet.learned(&worker, info);
                drop(fleet);
                break;
            }
            Err(e) => {
                attempts += 1;
                if attempts == 1 {
                    warn!(worker = %worker.id, error = %e, "worker not reachable yet; it stays pending and will be asked again");
                } else {
                    debug!(worker = %worker.id, error = %e, attempts, "worker still not reachable");
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
    if let Some(every) = control.settings.models_refresh {
        if !worker.endpoint.grpc() {
            refresh(fleet, worker, upstream, every).await;
        }
    }
}

/// Asks a registered worker what it serves every `every`, and tells the fleet when that changed.
/// A failed ask changes nothing: whether the worker is up is the prober's to say.
async fn refresh(fleet: Weak<Fleet>, worker: Arc<Worker>, upstream: &Upstream, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        match fetch(upstream, &worker).await {
            Ok(info) => {
                let Some(fleet) = fleet.upgrade() else {
                    return;
                };
                if worker.info().is_none_or(|now| !now.same_models(&info)) {
                    fleet.models_changed(&worker, info);
                }
            }
            Err(e) => debug!(worker = %worker.id, error = %e, "models not re-read"),
        }
    }
}

/// `--worker-startup-timeout-secs` passed with the worker still unregistered: it is Failed (and
/// removed under auto-recovery); registration keeps asking, so it can still join later.
fn startup_expired(fleet: &Arc<Fleet>, control: &Control, worker: &Arc<Worker>, timeout: Duration) {
    let Some(t) = worker
        .health
        .change(|h| h.startup_expired(timeout, tokio::time::Instant::now()))
    else {
        return;
    };
    fleet.health_changed(worker, t);
    if control.settings.health.remove_unhealthy {
        tracing::info!(worker = %worker.id, "removing the worker that never registered (--remove-unhealthy-workers)");
        fleet.remove_now(worker);
    }
}

/// One `GET /v1/models`, or a gRPC worker's `GetModelInfo`.
pub(crate) async fn fetch(
    upstream: &Upstream,
    worker: &Worker,
) -> Result<WorkerInfo, DiscoverError> {
    if worker.endpoint.grpc() {
        let info = upstream
            .grpc()
            .model_info(&worker.endpoint, MODELS_TIMEOUT)
            .await
            .map_err(DiscoverError::Grpc)?;
        // With no model directory on the command line, the worker's own tokenizer (as SMG
        // loads it); a worker that cannot serve one still registers, and its requests are
        // refused with 503 tokenizer_unavailable until some worker has.
        if let Err(e) = upstream.grpc().fetch_tokenizer(&worker.endpoint).await {
            warn!(worker = %worker.id, error = %e, "the worker's tokenizer could not be loaded");
        }
        return grpc_models(&info);
    }
    let (status, body) = get(
        upstream,
        worker,
        "/v1/models",
        MODELS_MAX_BYTES,
        MODELS_TIMEOUT,
    )
    .await?;
    if !status.is_success() {
        return Err(DiscoverError::Status(status.as_u16()));
    }
    parse_models(&body)
}

/// A gRPC worker's model as a models-list card: the served name (the model path when it gives
/// none), SGLang's flavor (the service is SGLang's scheduler), its context.
fn grpc_models(
    info: &sluice_proto::sglang_scheduler::GetModelInfoResponse,
) -> Result<WorkerInfo, DiscoverError> {
    let id = [&info.served_model_name, &info.model_path]
        .into_iter()
        .find(|name| !name.is_empty())
        .ok_or(DiscoverError::NoModels)?;
    let card = serde_json::json!({
        "id": id,
        "object": "model",
        "owned_by": "sglang",
        "root": info.model_path,
        "max_model_len": info.max_context_length,
    });
    Ok(WorkerInfo {
        flavor: "sglang".into(),
        models: vec![ModelCard {
            id: ModelName::new(id.clone()),
            card,
        }],
    })
}

/// The models and flavor in an OpenAI models list.
pub(crate) fn parse_models(body: &[u8]) -> Result<WorkerInfo, DiscoverError> {
    let list: ModelList = serde_json::from_slice(body)?;
    let models: Vec<ModelCard> = list
        .data
        .into_iter()
        .filter_map(|card| {
            let id = card.get("id")?.as_str()?.to_string();
            Some(ModelCard {
                id: ModelName::new(id),
                card,
            })
        })
        .collect();
    let flavor = models
        .iter()
        .find_map(|m| m.card.get("owned_by")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".to_string());
    if models.is_empty() {
        return Err(DiscoverError::NoModels);
    }
    Ok(WorkerInfo { flavor, models })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_and_sglang_model_lists() {
        let vllm = br#"{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1,"owned_by":"vllm","root":"/models/x","parent":null,"max_model_len":8192}]}"#;
        let info = parse_models(vllm).unwrap();
        assert_eq!(info.flavor, "vllm");
        assert_eq!(
            info.models[0].id.as_str(),
            "meta-llama/Llama-3.1-8B-Instruct"
        );
        assert_eq!(info.models[0].card["max_model_len"], 8192);
        let sglang = br#"{"object":"list","data":[{"id":"a","owned_by":"sglang"},{"id":"b","owned_by":"sglang"}]}"#;
        assert_eq!(parse_models(sglang).unwrap().models.len(), 2);
    }

    #[test]
    fn rejects_what_is_not_a_models_list() {
        assert!(matches!(parse_models(b"{}"), Err(DiscoverError::Json(_))));
        assert!(matches!(
            parse_models(br#"{"data":[]}"#),
            Err(DiscoverError::NoModels)
        ));
        assert_eq!(
            parse_models(br#"{"data":[{"id":"m"}]}"#).unwrap().flavor,
            "unknown"
        );
    }
}
