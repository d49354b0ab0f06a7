//! What a generation request passes before it enters the engine, in a real engine's order, and
//! how a refusal is answered and counted: shared by the plain path (`generate`) and the
//! disaggregated one (`pd`).

use std::sync::atomic::Ordering;

use axum::http::HeaderMap;
use axum::response::Response;

use super::errors::ApiError;
use super::{authorize, ApiState};
use crate::engine::{GateTicket, SeqSpec, Submission, SubmitError};
use crate::request::{GenerationRequest, Route};

/// The answer to a request that failed, counted when the engine itself refused it.
pub(super) fn refuse(st: &ApiState, error: ApiError) -> Response {
    count_refusal(st, &error);
    error.respond(st.engine.config().flavor)
}

/// Counts a refusal as the engine's own when it is (not the caller's mistake).
pub(crate) fn count_refusal(st: &ApiState, error: &ApiError) {
    if matches!(
        error,
        ApiError::QueueFull | ApiError::AtCapacity | ApiError::Internal | ApiError::Failed(_)
    ) {
        st.engine.totals().rejected.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) fn submit(st: &ApiState, choices: &[SeqSpec]) -> Result<Submission, ApiError> {
    st.engine.submit(choices).map_err(|e| match e {
        SubmitError::QueueFull { .. } => ApiError::QueueFull,
        SubmitError::ShutDown => ApiError::Internal,
    })
}

/// The checks a real engine makes before a request enters it, in its order (auth, body,
/// model, context length), then the injected errors and the worker-side cap.
pub(super) async fn checked(
    route: Route,
    st: &ApiState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(GenerationRequest, Option<GateTicket>), ApiError> {
    let engine = &st.engine;
    let cfg = engine.config();
    authorize(cfg, headers)?;
    engine.saw_trace_context(headers.get("traceparent").and_then(|v| v.to_str().ok()));
    let mut request = GenerationRequest::parse_with(route, body, st.tokenizer.as_ref())
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    request.adapter = resolve_model(engine, &request)?;
    check_context(&request, cfg.max_model_len, cfg.flavor)?;
    if st.inject_error() {
        return Err(ApiError::Internal);
    }
    let mut ticket = match engine.gate() {
        Some(gate) => Some(gate.try_enter().ok_or(ApiError::AtCapacity)?),
        None => None,
    };
    if let Some(ticket) = ticket.as_mut() {
        engine.notify_changed();
        ticket.slot().await;
        engine.notify_changed();
    }
    Ok((request, ticket))
}

/// The adapter a request names, if any; an unknown model is a 404. vLLM takes a loaded
/// adapter's name as the `model` (vllm/entrypoints/openai/engine/serving.py,
/// `_maybe_get_adapters`); SGLang reads `base-model:adapter` in `model`, else the body's
/// `lora_path`, and refuses an adapter it has not loaded with a 400
/// (python/sglang/srt/entrypoints/openai/serving_base.py `_resolve_lora_path`;
/// python/sglang/srt/lora/lora_registry.py `acquire`).
fn resolve_model(
    engine: &crate::engine::Engine,
    request: &GenerationRequest,
) -> Result<Option<crate::scheduler::Adapter>, ApiError> {
    let cfg = engine.config();
    let not_found = || ApiError::ModelNotFound(request.model.clone());
    match cfg.flavor {
        crate::config::Flavor::Vllm if request.model == cfg.model => Ok(None),
        crate::config::Flavor::Vllm => engine
            .adapter(&request.model)
            .map(Some)
            .ok_or_else(not_found),
        crate::config::Flavor::Sglang => {
            let (base, named) = match request.model.split_once(':') {
                Some((base, adapter)) => {
                    (base.trim(), Some(adapter.trim()).filter(|a| !a.is_empty()))
                }
                None => (request.model.as_str(), None),
            };
            if base != cfg.model {
                return Err(not_found());
            }
            let Some(name) = named.or(request.lora_path.as_deref()) else {
                return Ok(None);
            };
            engine.adapter(name).map(Some).ok_or_else(|| {
                ApiError::BadRequest(crate::lora::not_loaded(name, &engine.loaded_adapters()))
            })
        }
    }
}

/// A prompt longer than the context, or a prompt plus `max_tokens` over it, is a 400.
fn check_context(
    request: &GenerationRequest,
    max_model_len: u32,
    flavor: crate::config::Flavor,
) -> Result<(), ApiError> {
    let prompt = request.longest_prompt();
    let total = u64::from(prompt) + u64::from(request.max_tokens.unwrap_or(0));
    if prompt < max_model_len && total <= u64::from(max_model_len) {
        return Ok(());
    }
    let message = match (flavor, request.max_tokens) {
        (crate::config::Flavor::Sglang, _) => format!(
            "The input ({prompt} tokens) is longer than the model's context length ({max_model_len} tokens)."
        ),
        (_, Some(max_tokens)) if prompt < max_model_len => format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested \
             {total} tokens ({prompt} in the messages, {max_tokens} in the completion). Please \
             reduce the length of the messages or completion."
        ),
        _ => format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request \
             has {prompt} input tokens. Please reduce the length of the input messages."
        ),
    };
    Err(ApiError::ContextTooLong(message))
}
