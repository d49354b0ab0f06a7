//! Loading and unloading LoRA adapters at run time, each flavor's way.
//!
//! vLLM serves `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` only with
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (vllm/entrypoints/openai/api_server.py); success is a
//! 200 with a plain-text sentence, a refusal its error object with 400 (`InvalidUserInput`) or
//! 404 (`NotFoundError`) (vllm/entrypoints/openai/models/serving.py). SGLang serves
//! `POST /load_lora_adapter` and `/unload_lora_adapter` and answers `LoRAUpdateOutput` —
//! `success`, `error_message`, `loaded_adapters` (name to path) — with 200 or 400
//! (python/sglang/srt/entrypoints/http_server.py). SGLang's refusal sentences are not copied:
//! the simulator words them as vLLM does.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{authorize, ApiError, ApiState};
use crate::config::Flavor;
use crate::lora::AdapterError;

/// The body both flavors take.
#[derive(Deserialize, Default)]
pub(super) struct AdapterRequest {
    #[serde(default)]
    lora_name: String,
    #[serde(default)]
    lora_path: String,
}

pub(super) async fn load(
    State(st): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let request = match parsed(&st, &headers, &body) {
        Ok(request) => request,
        Err(e) => return e.respond(st.engine.config().flavor),
    };
    let done = st
        .engine
        .load_adapter(&request.lora_name, &request.lora_path)
        .map(|r| r.map(|_| "added"));
    answer(&st, &request.lora_name, done)
}

pub(super) async fn unload(
    State(st): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let request = match parsed(&st, &headers, &body) {
        Ok(request) => request,
        Err(e) => return e.respond(st.engine.config().flavor),
    };
    let done = st
        .engine
        .unload_adapter(&request.lora_name)
        .map(|r| r.map(|_| "removed"));
    answer(&st, &request.lora_name, done)
}

/// The body, once the caller may ask; a body that is not the request's JSON is a 400.
fn parsed(st: &ApiState, headers: &HeaderMap, body: &[u8]) -> Result<AdapterRequest, ApiError> {
    authorize(st.engine.config(), headers)?;
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The flavor's answer to a load or unload; `done` is `None` when the engine serves no adapters.
fn answer(st: &ApiState, name: &str, done: Option<Result<&str, AdapterError>>) -> Response {
    let Some(done) = done else {
        return super::errors::not_found();
    };
    match (st.engine.config().flavor, done) {
        (Flavor::Vllm, Ok(verb)) => (
            StatusCode::OK,
            format!("Success: LoRA adapter '{name}' {verb} successfully."),
        )
            .into_response(),
        (Flavor::Vllm, Err(e)) => {
            let (status, kind) = match e {
                AdapterError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFoundError"),
                _ => (StatusCode::BAD_REQUEST, "InvalidUserInput"),
            };
            let error = json!({"error": {
                "message": e.to_string(), "type": kind, "param": null, "code": status.as_u16(),
            }});
            (status, axum::Json(error)).into_response()
        }
        (Flavor::Sglang, done) => {
            let loaded: serde_json::Map<String, serde_json::Value> = st
                .engine
                .loaded_adapters()
                .into_iter()
                .map(|l| (l.adapter.name.to_string(), json!(l.path)))
                .collect();
            let (status, message) = match &done {
                Ok(_) => (StatusCode::OK, String::new()),
                Err(e) => (StatusCode::BAD_REQUEST, e.to_string()),
            };
            let output = json!({
                "success": done.is_ok(), "error_message": message, "loaded_adapters": loaded,
            });
            (status, axum::Json(output)).into_response()
        }
    }
}
