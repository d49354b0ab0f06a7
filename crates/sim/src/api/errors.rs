//! The engine's error answers, in the JSON shape of the flavor it imitates.
//!
//! vLLM wraps its errors (`{"error":{"message","type","param","code"}}`, code the HTTP status as an
//! integer); SGLang answers flat (`{"object":"error","message",...}`); both answer unknown routes
//! the way FastAPI does (`{"detail":"Not Found"}`), and a missing API key with
//! `{"error":"Unauthorized"}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::config::Flavor;

/// Status 529, which Dynamo-style workers use for "at capacity".
pub const STATUS_OVERLOADED: u16 = 529;

/// Why the engine refused or failed a request.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    #[error("{0}")]
    ContextTooLong(String),
    /// `--max-queued-requests`: SGLang's `_abort_on_queued_limit`
    /// (python/sglang/srt/managers/scheduler.py, main as quoted 2026-09-19).
    #[error("The request queue is full.")]
    QueueFull,
    /// The `error-event` fault: the engine failed the request (5xx) or refused what it was
    /// given (4xx) after it had started.
    #[error("{}", if *.0 < 500 { "Failed to parse the tool call: unexpected token" } else { "Internal server error" })]
    Failed(u16),
    #[error("Server overloaded: worker at capacity")]
    AtCapacity,
    #[error("Internal server error")]
    Internal,
    #[error("Unauthorized")]
    Unauthorized,
    /// A disaggregated request whose halves did not meet.
    #[error("KV transfer failed: {0}")]
    Disaggregation(crate::pd::Failure),
}

impl ApiError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::ContextTooLong(_) => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::QueueFull => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::AtCapacity => {
                StatusCode::from_u16(STATUS_OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
            ApiError::Internal | ApiError::Disaggregation(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Failed(code) => {
                StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// The `type` field. SGLang's `create_error_response` names the status's phrase
    /// (serving_base.py, read at c5695a4), as its queue-full refusal shows.
    fn kind(&self, flavor: Flavor) -> &'static str {
        match self {
            ApiError::QueueFull if flavor == Flavor::Sglang => "Service Unavailable",
            ApiError::Failed(code) if *code < 500 => "BadRequestError",
            ApiError::Failed(_) => "InternalServerError",
            ApiError::BadRequest(_) | ApiError::ContextTooLong(_) => "BadRequestError",
            ApiError::ModelNotFound(_) => "NotFoundError",
            ApiError::QueueFull => "ServiceUnavailableError",
            ApiError::AtCapacity => "OverloadedError",
            ApiError::Internal | ApiError::Disaggregation(_) => "InternalServerError",
            ApiError::Unauthorized => "AuthenticationError",
        }
    }

    /// The body, for the error object of a stream too.
    pub fn body(&self, flavor: Flavor) -> serde_json::Value {
        let code = self.status().as_u16();
        match (self, flavor) {
            (ApiError::Unauthorized, _) => json!({"error": "Unauthorized"}),
            (_, Flavor::Vllm) => json!({"error": {
                "message": self.to_string(), "type": self.kind(flavor), "param": null, "code": code,
            }}),
            (_, Flavor::Sglang) => json!({
                "object": "error", "message": self.to_string(), "type": self.kind(flavor),
                "param": null, "code": code,
            }),
        }
    }

    /// The error event that ends a failed stream (before `data: [DONE]`): vLLM's nested error
    /// object (vllm/entrypoints/openai/serving_engine.py, `create_streaming_error_response`),
    /// SGLang's flat one nested the same way (serving_base.py, read at c5695a4).
    pub fn event(&self, flavor: Flavor) -> serde_json::Value {
        match flavor {
            Flavor::Vllm => self.body(flavor),
            Flavor::Sglang => json!({ "error": self.body(flavor) }),
        }
    }

    pub fn respond(&self, flavor: Flavor) -> Response {
        (self.status(), axum::Json(self.body(flavor))).into_response()
    }
}

/// FastAPI's answer to an unknown route.
pub fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"detail": "Not Found"})),
    )
        .into_response()
}

/// FastAPI's answer to a known route with the wrong method.
pub fn method_not_allowed() -> Response {
    let mut response = (
        StatusCode::METHOD_NOT_ALLOWED,
        axum::Json(json!({"detail": "Method Not Allowed"})),
    )
        .into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
