//! Why admission refuses a request: its headers, its tenant's and the gateway's budgets, the
//! queue, the ladder, its deadline, or a model nobody serves.

use std::time::Duration;

use axum::http::StatusCode;
use sluice_core::ModelName;

use crate::error::{Answerable, Expired, Origin};

/// A request admission refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum AdmitError {
    /// A request header admission reads is malformed.
    #[error("Invalid header '{header}': {detail}")]
    InvalidHeader {
        header: &'static str,
        detail: String,
    },
    /// The tenant's requests or tokens per minute are spent for now.
    #[error("Rate limit reached for {what} per minute of tenant '{tenant}'; retry after {retry_after:?}")]
    RateLimited {
        tenant: String,
        what: &'static str,
        retry_after: Duration,
    },
    /// More tokens than the tenant's whole budget: it can never be admitted.
    #[error("Request too large for tenant '{tenant}': it may use {needs} tokens, more than its limit of {limit} tokens per minute; lower max_tokens or the prompt")]
    RequestTooLarge {
        tenant: String,
        needs: u64,
        limit: u64,
    },
    #[error("Tenant '{tenant}' has {limit} requests in flight, its limit")]
    TenantConcurrency { tenant: String, limit: u32 },
    /// `--max-concurrent-requests` or `--rate-limit-tokens-per-second`, with no room to wait.
    #[error("The gateway is at {why}; retry shortly")]
    GatewayFull {
        why: &'static str,
        retry_after: Duration,
    },
    /// The limits are shared through Redis, Redis is away, and `--redis-fail-open` is off.
    #[error("The gateway cannot check its shared limits right now; retry shortly")]
    SharedStateUnavailable,
    /// The gateway queue is full of requests at least as urgent.
    #[error("The gateway's queue is full; retry shortly")]
    QueueFull { retry_after: Duration },
    /// A more urgent request took this one's place in the queue.
    #[error(
        "The request was waiting in the gateway's queue and gave its place to a more urgent one"
    )]
    QueueEvicted { retry_after: Duration },
    /// Its tier's queue timeout passed before a worker had room.
    #[error("No worker had room within {waited:?} of waiting in the gateway's queue")]
    QueueTimeout {
        waited: Duration,
        retry_after: Duration,
    },
    /// CoDel is cutting its tier's standing queue: it was the head (it had waited longest), or
    /// it arrived expecting to wait past the tier's target.
    #[error("The gateway's queue for this request's tier has stood past its target; the request was refused to shorten it")]
    CodelDrop { retry_after: Duration },
    /// The degradation ladder's hard shedding refuses this tier at the level in force.
    #[error("The gateway is shedding {tier} requests under load; retry later")]
    DegradationShed {
        tier: &'static str,
        retry_after: Duration,
    },
    #[error("'model' is required: this gateway serves {served} models")]
    ModelRequired { served: usize },
    #[error("The model '{model}' does not exist")]
    ModelNotFound { model: String },
    #[error("No worker is available for model '{model}'{detail}")]
    NoAvailableWorkers { model: ModelName, detail: String },
    /// `--worker-overload-shed`: every worker the request could use is overloaded.
    #[error("All workers for model '{model}' are overloaded")]
    WorkerOverloadShed {
        model: ModelName,
        retry_after: Duration,
    },
    #[error(transparent)]
    Expired(#[from] Expired),
}

impl Answerable for AdmitError {
    fn status(&self) -> StatusCode {
        match self {
            AdmitError::InvalidHeader { .. } | AdmitError::ModelRequired { .. } => {
                StatusCode::BAD_REQUEST
            }
            AdmitError::RateLimited { .. }
            | AdmitError::RequestTooLarge { .. }
            | AdmitError::TenantConcurrency { .. } => StatusCode::TOO_MANY_REQUESTS,
            AdmitError::GatewayFull { .. }
            | AdmitError::SharedStateUnavailable
            | AdmitError::QueueFull { .. }
            | AdmitError::QueueEvicted { .. }
            | AdmitError::QueueTimeout { .. }
            | AdmitError::CodelDrop { .. }
            | AdmitError::DegradationShed { .. }
            | AdmitError::NoAvailableWorkers { .. }
            | AdmitError::WorkerOverloadShed { .. } => StatusCode::SERVICE_UNAVAILABLE,
            AdmitError::ModelNotFound { .. } => StatusCode::NOT_FOUND,
            AdmitError::Expired(e) => e.status(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            AdmitError::InvalidHeader { .. } => "invalid_header",
            AdmitError::RateLimited { .. } => "rate_limit_exceeded",
            AdmitError::RequestTooLarge { .. } => "rate_limit_exceeded",
            AdmitError::TenantConcurrency { .. } => "tenant_concurrency_exceeded",
            AdmitError::GatewayFull { .. } => "queue_full",
            AdmitError::SharedStateUnavailable => "shared_state_unavailable",
            AdmitError::QueueFull { .. } => "queue_full",
            AdmitError::QueueEvicted { .. } => "queue_evicted",
            AdmitError::QueueTimeout { .. } => "queue_timeout",
            AdmitError::CodelDrop { .. } => "codel_drop",
            AdmitError::DegradationShed { .. } => "degradation_shed",
            AdmitError::ModelRequired { .. } => "missing_required_parameter",
            AdmitError::ModelNotFound { .. } => "model_not_found",
            AdmitError::NoAvailableWorkers { .. } => "no_available_workers",
            AdmitError::WorkerOverloadShed { .. } => "worker_overload_shed",
            AdmitError::Expired(e) => e.code(),
        }
    }

    fn origin(&self) -> Origin {
        match self {
            AdmitError::GatewayFull { .. }
            | AdmitError::SharedStateUnavailable
            | AdmitError::QueueFull { .. }
            | AdmitError::QueueEvicted { .. }
            | AdmitError::QueueTimeout { .. }
            | AdmitError::CodelDrop { .. }
            | AdmitError::DegradationShed { .. }
            | AdmitError::NoAvailableWorkers { .. }
            | AdmitError::WorkerOverloadShed { .. } => Origin::Gateway,
            AdmitError::InvalidHeader { .. }
            | AdmitError::RateLimited { .. }
            | AdmitError::RequestTooLarge { .. }
            | AdmitError::TenantConcurrency { .. }
            | AdmitError::ModelRequired { .. }
            | AdmitError::ModelNotFound { .. } => Origin::Client,
            AdmitError::Expired(e) => e.origin(),
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            AdmitError::InvalidHeader { header, .. } => Some(header),
            AdmitError::ModelRequired { .. } => Some("model"),
            AdmitError::ModelNotFound { .. } => Some("model"),
            AdmitError::Expired(e) => e.param(),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            AdmitError::RateLimited { retry_after, .. }
            | AdmitError::GatewayFull { retry_after, .. }
            | AdmitError::QueueFull { retry_after, .. }
            | AdmitError::QueueEvicted { retry_after, .. }
            | AdmitError::QueueTimeout { retry_after, .. }
            | AdmitError::CodelDrop { retry_after, .. }
            | AdmitError::DegradationShed { retry_after, .. }
            | AdmitError::WorkerOverloadShed { retry_after, .. } => Some(*retry_after),
            AdmitError::TenantConcurrency { .. } => Some(Duration::from_secs(1)),
            AdmitError::SharedStateUnavailable => Some(Duration::from_secs(1)),
            AdmitError::NoAvailableWorkers { .. } => Some(crate::error::NO_WORKERS_RETRY_AFTER),
            AdmitError::Expired(e) => e.retry_after(),
            _ => None,
        }
    }

    fn is_shed(&self) -> bool {
        matches!(
            self,
            AdmitError::RateLimited { .. }
                | AdmitError::RequestTooLarge { .. }
                | AdmitError::TenantConcurrency { .. }
                | AdmitError::GatewayFull { .. }
                | AdmitError::QueueFull { .. }
                | AdmitError::QueueEvicted { .. }
                | AdmitError::QueueTimeout { .. }
                | AdmitError::CodelDrop { .. }
                | AdmitError::DegradationShed { .. }
                | AdmitError::WorkerOverloadShed { .. }
        )
    }

    fn is_overload(&self) -> bool {
        matches!(self, AdmitError::WorkerOverloadShed { .. })
    }
}
