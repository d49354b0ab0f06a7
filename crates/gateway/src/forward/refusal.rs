//! Why the forward stage gives up on a request: every worker it could try failed, or the time ran
//! out, or the request cannot go the way its worker takes it.

use std::time::Duration;

use axum::http::StatusCode;
use sluice_core::{ModelName, WorkerId};

use crate::error::{Answerable, Expired, Origin};
use crate::http::RequestError;
use crate::route::RouteError;

/// A request the forward stage could not get answered.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ForwardError {
    #[error("No worker for model '{model}' could be reached after {attempts} attempt(s)")]
    UpstreamUnreachable { model: ModelName, attempts: u32 },
    #[error("Worker {worker} failed before answering")]
    UpstreamFailed { worker: WorkerId },
    /// The worker the request was placed on could not load the LoRA adapter it names.
    #[error("Worker {worker} could not load adapter '{adapter}'")]
    AdapterLoadFailed { worker: WorkerId, adapter: String },
    /// The worker's answer broke HTTP/1.1's framing or the client's bounds (`upstream::wire`'s
    /// limits): its details stay in the log, since the bytes are the worker's.
    #[error("Worker {worker} sent a malformed response")]
    UpstreamBadAnswer { worker: WorkerId },
    #[error("Worker {worker} did not answer within {timeout:?}")]
    UpstreamTimeout { worker: WorkerId, timeout: Duration },
    /// A request a `grpc://` worker cannot take as it is (a field the token path cannot honour,
    /// a prompt the chat template refuses): the client's to change.
    #[error("{message}")]
    NotOnGrpc {
        param: Option<&'static str>,
        message: String,
    },
    /// A `grpc://` worker takes token ids and no tokenizer is loaded: none was named on the
    /// command line and no worker has served one yet.
    #[error("The model's tokenizer is not loaded: start the gateway with --model-path, or use workers that serve their tokenizer")]
    TokenizerUnavailable,
    /// Its body cannot be sent as its worker takes it.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// No worker left to try.
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error(transparent)]
    Expired(#[from] Expired),
}

impl Answerable for ForwardError {
    fn status(&self) -> StatusCode {
        match self {
            ForwardError::UpstreamUnreachable { .. }
            | ForwardError::UpstreamFailed { .. }
            | ForwardError::AdapterLoadFailed { .. }
            | ForwardError::UpstreamBadAnswer { .. } => StatusCode::BAD_GATEWAY,
            ForwardError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ForwardError::NotOnGrpc { .. } => StatusCode::BAD_REQUEST,
            ForwardError::TokenizerUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ForwardError::Request(e) => e.status(),
            ForwardError::Route(e) => e.status(),
            ForwardError::Expired(e) => e.status(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ForwardError::UpstreamUnreachable { .. } => "upstream_unreachable",
            ForwardError::UpstreamFailed { .. } => "upstream_failed",
            ForwardError::AdapterLoadFailed { .. } => "adapter_load_failed",
            ForwardError::UpstreamBadAnswer { .. } => "upstream_bad_response",
            ForwardError::UpstreamTimeout { .. } => "upstream_timeout",
            ForwardError::NotOnGrpc { param: Some(_), .. } => "unsupported_parameter",
            ForwardError::NotOnGrpc { param: None, .. } => "invalid_request",
            ForwardError::TokenizerUnavailable => "tokenizer_unavailable",
            ForwardError::Request(e) => e.code(),
            ForwardError::Route(e) => e.code(),
            ForwardError::Expired(e) => e.code(),
        }
    }

    fn origin(&self) -> Origin {
        match self {
            ForwardError::TokenizerUnavailable => Origin::Gateway,
            ForwardError::UpstreamUnreachable { .. }
            | ForwardError::UpstreamFailed { .. }
            | ForwardError::AdapterLoadFailed { .. }
            | ForwardError::UpstreamBadAnswer { .. }
            | ForwardError::UpstreamTimeout { .. } => Origin::Upstream,
            ForwardError::NotOnGrpc { .. } => Origin::Client,
            ForwardError::Request(e) => e.origin(),
            ForwardError::Route(e) => e.origin(),
            ForwardError::Expired(e) => e.origin(),
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            ForwardError::NotOnGrpc { param, .. } => *param,
            ForwardError::Request(e) => e.param(),
            ForwardError::Route(e) => e.param(),
            ForwardError::Expired(e) => e.param(),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ForwardError::UpstreamUnreachable { .. } => Some(crate::error::NO_WORKERS_RETRY_AFTER),
            ForwardError::Request(e) => e.retry_after(),
            ForwardError::Route(e) => e.retry_after(),
            ForwardError::Expired(e) => e.retry_after(),
            _ => None,
        }
    }

    fn is_shed(&self) -> bool {
        matches!(
            self,
            ForwardError::Route(e) if e.is_shed()
        )
    }

    fn is_overload(&self) -> bool {
        matches!(self, ForwardError::Route(e) if e.is_overload())
    }
}
