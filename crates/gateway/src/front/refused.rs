//! What the client is told when a stage refuses its request: every stage's refusal in one type,
//! and the status an overload refusal is answered with (`--overload-status-code`), which only the
//! edge knows (`Answers::status`); the front stage writes the answer with `error::respond`.

use std::time::Duration;

use axum::http::StatusCode;

use crate::admit::AdmitError;
use crate::error::{Answerable, Origin, NO_WORKERS_RETRY_AFTER};
use crate::forward::ForwardError;
use crate::http::RequestError;
use crate::route::RouteError;

/// A request refused on its way through the stages, by the stage that refused it.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum GatewayError {
    /// Refused as it was sent (the front stage).
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Admit(#[from] AdmitError),
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error(transparent)]
    Forward(#[from] ForwardError),
}

impl GatewayError {
    fn inner(&self) -> &dyn Answerable {
        match self {
            GatewayError::Request(e) => e,
            GatewayError::Admit(e) => e,
            GatewayError::Route(e) => e,
            GatewayError::Forward(e) => e,
        }
    }
}

impl Answerable for GatewayError {
    fn status(&self) -> StatusCode {
        self.inner().status()
    }

    fn code(&self) -> &'static str {
        self.inner().code()
    }

    fn origin(&self) -> Origin {
        self.inner().origin()
    }

    fn param(&self) -> Option<&str> {
        self.inner().param()
    }

    fn retry_after(&self) -> Option<Duration> {
        self.inner().retry_after()
    }

    fn is_shed(&self) -> bool {
        self.inner().is_shed()
    }

    fn is_overload(&self) -> bool {
        self.inner().is_overload()
    }
}

/// How the edge answers a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answers {
    /// `--overload-status-code`: an overload refusal's status.
    pub overload: StatusCode,
}

impl Default for Answers {
    fn default() -> Self {
        Self {
            overload: StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl Answers {
    /// The status `error` is answered with.
    pub(crate) fn status(&self, error: &dyn Answerable) -> StatusCode {
        if error.is_overload() {
            self.overload
        } else {
            error.status()
        }
    }
}

/// The route stage's refusals as a client hears them (the route stage says nothing of HTTP).
impl Answerable for RouteError {
    /// 503; an overload refusal's is `--overload-status-code` in the answer (`Answers`).
    fn status(&self) -> StatusCode {
        StatusCode::SERVICE_UNAVAILABLE
    }

    fn code(&self) -> &'static str {
        match self {
            RouteError::NoAvailableWorkers { .. } => "no_available_workers",
            RouteError::WorkerOverloadShed { .. } | RouteError::OverloadedBeforeDispatch { .. } => {
                "worker_overload_shed"
            }
            RouteError::PredictedLate { .. } => "predicted_late",
        }
    }

    fn origin(&self) -> Origin {
        Origin::Gateway
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            RouteError::WorkerOverloadShed { retry_after, .. }
            | RouteError::OverloadedBeforeDispatch { retry_after, .. }
            | RouteError::PredictedLate { retry_after, .. } => Some(*retry_after),
            RouteError::NoAvailableWorkers { .. } => Some(NO_WORKERS_RETRY_AFTER),
        }
    }

    fn is_shed(&self) -> bool {
        matches!(
            self,
            RouteError::WorkerOverloadShed { .. }
                | RouteError::OverloadedBeforeDispatch { .. }
                | RouteError::PredictedLate { .. }
        )
    }

    fn is_overload(&self) -> bool {
        matches!(
            self,
            RouteError::WorkerOverloadShed { .. }
                | RouteError::OverloadedBeforeDispatch { .. }
                | RouteError::PredictedLate { .. }
        )
    }
}
