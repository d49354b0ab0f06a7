//! A request for a LoRA adapter placed on a worker that does not list it yet (its spec lets the
//! gateway load it there): the adapter is loaded first (`control::AdapterLoads`), within the
//! request's deadline, and a load that fails is that worker's failure, judged as any other.

use std::sync::Arc;

use sluice_core::breaker::Outcome;
use sluice_core::retry::AttemptFailure;
use tokio::time::Instant;

use super::failed::{Failed, Left};
use super::refusal::ForwardError;
use super::{Attempt, Forwarder};
use crate::control::{AdapterLoads, LoadError};
use crate::error::Expired;
use crate::fleet::Lease;

impl Forwarder {
    /// Loads the adapters requests name onto the workers their specs allow.
    pub(crate) fn with_adapter_loads(mut self, loads: Arc<AdapterLoads>) -> Self {
        self.adapter_loads = Some(loads);
        self
    }

    /// The adapter loader, for a dispatch of another kind (`ToDataPlane`).
    pub(crate) fn adapter_loads(&self) -> Option<&AdapterLoads> {
        self.adapter_loads.as_deref()
    }

    /// The lease's adapter on its worker, loaded there first when it must be.
    pub(super) async fn adapter_ready(
        &self,
        at: &Attempt<'_>,
        lease: &mut Lease,
    ) -> Result<(), Failed> {
        let Some(loads) = &self.adapter_loads else {
            return Ok(());
        };
        let worker = lease.worker().clone();
        let error = match load_for(loads, lease, at.terms.deadline).await {
            Ok(()) => return Ok(()),
            Err(Some(error)) => error,
            // The request's own time ran out: nobody's failure.
            Err(None) => {
                let expired = if at.terms.cut_by_client() {
                    Expired::DeadlineExceeded { budget: at.timeout }
                } else {
                    Expired::RequestTimeout {
                        timeout: at.timeout,
                    }
                };
                return Err(Failed::refused(worker.key, expired.into()));
            }
        };
        let kind = match error {
            LoadError::Unreachable { connect } => {
                worker.signals.transport_failure(Instant::now());
                if connect {
                    AttemptFailure::Connect
                } else {
                    AttemptFailure::Dropped
                }
            }
            LoadError::Timeout(_) | LoadError::Status(_) => AttemptFailure::ServerError,
        };
        lease.settle(Outcome::Failure);
        self.metrics
            .upstream_error(worker.id.as_str(), "adapter_load");
        Err(Failed {
            worker: worker.key,
            kind,
            left: Left::Refuse(load_failed(lease)),
        })
    }
}

/// The lease's adapter on its worker, loaded there first when it must be, by `deadline`. `Err`:
/// why it was not loaded, or `None` when the deadline came first.
pub(super) async fn load_for(
    loads: &AdapterLoads,
    lease: &Lease,
    deadline: Instant,
) -> Result<(), Option<LoadError>> {
    let Some(adapter) = lease.adapter().cloned() else {
        return Ok(());
    };
    let worker = lease.worker().clone();
    match tokio::time::timeout_at(deadline, loads.ensure(&worker, &adapter)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(Some(error)),
        Err(_) => Err(None),
    }
}

/// The client's error for a load that failed on the lease's worker.
pub(super) fn load_failed(lease: &Lease) -> ForwardError {
    ForwardError::AdapterLoadFailed {
        worker: lease.worker().id.clone(),
        adapter: lease.adapter().map_or_else(String::new, |a| a.to_string()),
    }
}
