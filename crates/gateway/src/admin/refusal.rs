//! What the admin API refuses: a worker spec it cannot take, a worker that exists or does not.

use axum::http::StatusCode;
use sluice_core::WorkerId;

use std::time::Duration;

use crate::error::{answered_as_is, Answerable, Origin};
use crate::http::RequestError;

/// A request the admin API refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub(crate) enum AdminError {
    #[error("Invalid worker spec: {message}")]
    InvalidWorkerSpec { field: String, message: String },
    #[error(
        "A worker with URL {url} is already registered as {id}; change it with PUT /workers/{id}"
    )]
    WorkerExists { url: String, id: WorkerId },
    #[error("No worker with id '{id}'")]
    WorkerNotFound { id: String },
    /// Its key, or its body.
    #[error(transparent)]
    Request(#[from] RequestError),
}

impl Answerable for AdminError {
    fn status(&self) -> StatusCode {
        match self {
            AdminError::InvalidWorkerSpec { .. } => StatusCode::BAD_REQUEST,
            AdminError::WorkerExists { .. } => StatusCode::CONFLICT,
            AdminError::WorkerNotFound { .. } => StatusCode::NOT_FOUND,
            AdminError::Request(e) => e.status(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            AdminError::InvalidWorkerSpec { .. } => "invalid_worker_spec",
            AdminError::WorkerExists { .. } => "worker_exists",
            AdminError::WorkerNotFound { .. } => "worker_not_found",
            AdminError::Request(e) => e.code(),
        }
    }

    fn origin(&self) -> Origin {
        match self {
            AdminError::InvalidWorkerSpec { .. }
            | AdminError::WorkerExists { .. }
            | AdminError::WorkerNotFound { .. } => Origin::Client,
            AdminError::Request(e) => e.origin(),
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            AdminError::InvalidWorkerSpec { field, .. } => Some(field),
            AdminError::Request(e) => e.param(),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            AdminError::Request(e) => e.retry_after(),
            _ => None,
        }
    }
}

answered_as_is!(AdminError);
