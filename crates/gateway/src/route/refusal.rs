//! Why the route stage chose no worker.

use std::time::Duration;

use sluice_core::{ModelName, WorkerId};

/// Why no worker was chosen. What the client is told of it is the front stage's to say
/// (`front::GatewayError`): nothing here is HTTP.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum RouteError {
    #[error("No worker is available for model '{model}'{detail}")]
    NoAvailableWorkers { model: ModelName, detail: String },
    /// `--worker-overload-shed`: every worker the request could use is overloaded.
    #[error("All workers for model '{model}' are overloaded")]
    WorkerOverloadShed {
        model: ModelName,
        retry_after: Duration,
    },
    /// `--worker-overload-shed`: the chosen worker was flagged between selection and dispatch.
    #[error("Worker {worker} for model '{model}' became overloaded before dispatch")]
    OverloadedBeforeDispatch {
        worker: WorkerId,
        model: ModelName,
        retry_after: Duration,
    },
    /// `--policy predicted`: no worker the request could use is predicted to give its first
    /// token within its objective (its tier's, or its deadline).
    #[error(
        "No worker for model '{model}' is predicted to answer within the request's time to first \
         token of {} ms (the soonest: {} ms)",
        objective.as_millis(),
        predicted.as_millis()
    )]
    PredictedLate {
        model: ModelName,
        objective: Duration,
        predicted: Duration,
        retry_after: Duration,
    },
}
