//! How a relayed response ends early: its worker failed mid-body, or its time ran out.

use axum::http::StatusCode;
use sluice_core::WorkerId;

use std::time::Duration;

use crate::error::{Answerable, Expired, Origin};

/// A response cut short, told to an event-stream client as one last event.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub(crate) enum StreamError {
    #[error("Worker {worker} failed in the middle of the response")]
    StreamInterrupted { worker: WorkerId },
    /// The worker's event stream held a line or an event past the gateway's cap
    /// (`sluice_core::sse::MAX_EVENT_BYTES`): not read on.
    #[error(
        "Worker {worker} sent an event-stream {what} over {limit} bytes; the response was cut"
    )]
    StreamEventTooLarge {
        worker: WorkerId,
        what: &'static str,
        limit: usize,
    },
    #[error(transparent)]
    Expired(#[from] Expired),
}

impl Answerable for StreamError {
    fn status(&self) -> StatusCode {
        match self {
            StreamError::StreamInterrupted { .. } | StreamError::StreamEventTooLarge { .. } => {
                StatusCode::BAD_GATEWAY
            }
            StreamError::Expired(e) => e.status(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            StreamError::StreamInterrupted { .. } => "upstream_stream_interrupted",
            StreamError::StreamEventTooLarge { .. } => "upstream_event_too_large",
            StreamError::Expired(e) => e.code(),
        }
    }

    fn origin(&self) -> Origin {
        match self {
            StreamError::StreamInterrupted { .. } | StreamError::StreamEventTooLarge { .. } => {
                Origin::Upstream
            }
            StreamError::Expired(e) => e.origin(),
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            StreamError::Expired(e) => e.param(),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            StreamError::Expired(e) => e.retry_after(),
            _ => None,
        }
    }
}
