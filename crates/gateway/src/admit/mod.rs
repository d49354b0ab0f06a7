//! The admit stage: whether a request may go on now, may wait, or is refused — and what it holds
//! while it runs.
//!
//! Edge admission (seed 003, layer 1) lands here: tenant identity, token-aware rate limits,
//! priority tiers, deadlines and the gateway queue. Today it admits every request and gives it its
//! deadline (arrival plus `--request-timeout-secs`), which the forward and stream-back stages
//! hold the request to. A rule refuses with a typed `GatewayError`; whatever a rule takes for the
//! request (a permit, a reservation) goes into the context's `Admission` as a `Hold`, which the
//! context gives back when the request ends, however it ends.

use std::time::Duration;

use crate::context::RequestContext;
use crate::error::GatewayError;

/// The admit stage, shared by every request.
#[derive(Debug, Clone)]
pub struct Admit {
    /// `--request-timeout-secs`: the longest a request may take, answer and stream included.
    request_timeout: Duration,
}

impl Admit {
    pub fn new(request_timeout: Duration) -> Self {
        Self { request_timeout }
    }

    /// Admits `ctx` now, setting what admission decides for it.
    pub fn admit(&self, ctx: &mut RequestContext) -> Result<(), GatewayError> {
        ctx.admission.deadline = ctx.started + self.request_timeout;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::HeaderValue;
    use prometheus_client::registry::Registry;
    use tokio::time::Instant;

    use super::*;
    use crate::context::{Accounts, InFlight};
    use crate::metrics::Metrics;

    #[tokio::test(start_paused = true)]
    async fn every_request_is_admitted_with_the_request_timeout_as_its_deadline() {
        let accounts = Accounts {
            metrics: Metrics::register(&mut Registry::default()),
            access_log: None,
            in_flight: Arc::new(InFlight::default()),
        };
        let arrived = Instant::now();
        let mut ctx = RequestContext::new(&accounts, HeaderValue::from_static("r"), "/x", arrived);
        tokio::time::advance(Duration::from_secs(3)).await;
        let admit = Admit::new(Duration::from_secs(600));
        assert_eq!(admit.admit(&mut ctx), Ok(()));
        assert_eq!(
            ctx.admission.deadline,
            arrived + Duration::from_secs(600),
            "counted from arrival, not from admission"
        );
    }
}
