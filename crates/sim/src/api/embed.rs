//! `POST /v1/embeddings`: enough of an embedding endpoint for a gateway to route to. Vectors are
//! a hash of the input (same input, same vector); the scheduler is not involved, as embedding
//! models run apart from generation.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::errors::ApiError;
use super::{authorize, ApiState};

/// Dimensions of the returned vectors.
const DIMENSIONS: usize = 8;

#[derive(Deserialize)]
struct EmbeddingRequest {
    model: Option<String>,
    input: Value,
}

fn vector(text: &str) -> Vec<f64> {
    (0..DIMENSIONS)
        .map(|i| {
            let mut h = DefaultHasher::new();
            (text, i).hash(&mut h);
            (h.finish() % 2000) as f64 / 1000.0 - 1.0
        })
        .collect()
}

pub(super) async fn embeddings(
    State(st): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let engine = &st.engine;
    let cfg = engine.config();
    engine
        .totals()
        .requests_received
        .fetch_add(1, Ordering::Relaxed);
    if let Err(e) = authorize(cfg, &headers) {
        return e.respond(cfg.flavor);
    }
    let request: EmbeddingRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return ApiError::BadRequest(e.to_string()).respond(cfg.flavor),
    };
    let model = request.model.unwrap_or_else(|| cfg.model.clone());
    if model != cfg.model {
        return ApiError::ModelNotFound(model).respond(cfg.flavor);
    }
    let inputs: Vec<String> = match request.input {
        Value::String(s) => vec![s],
        Value::Array(items) => items.iter().map(|v| v.to_string()).collect(),
        _ => {
            return ApiError::BadRequest("input must be a string or an array".into())
                .respond(cfg.flavor)
        }
    };
    let tokens: usize = inputs.iter().map(|s| s.len().div_ceil(4)).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| json!({"object": "embedding", "index": index, "embedding": vector(text)}))
        .collect();
    axum::Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}
