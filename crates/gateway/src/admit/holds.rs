//! What admission takes for a request, given back when it ends (`context::Hold`).

use std::sync::Arc;

use sluice_core::admission::{tokens_used, Spent};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::queue::GatewayQueue;
use super::tenants::Tenant;
use crate::context::{Ending, Hold};
use crate::metrics::{AdmissionMetrics, TenantTokenLabels};
use crate::shared::SharedSlots;

/// A place under `--max-concurrent-requests`; given back, it may let a queued request go.
pub(crate) struct GatewaySlot(pub OwnedSemaphorePermit, pub Option<Arc<GatewayQueue>>);

impl Hold for GatewaySlot {
    fn release(self: Box<Self>, _: &Ending) {
        drop(self.0);
        if let Some(queue) = &self.1 {
            queue.kick();
        }
    }
}

/// A place under `--max-concurrent-requests` shared with the other replicas.
pub(crate) struct SharedGatewaySlot(pub Arc<SharedSlots>, pub Option<Arc<GatewayQueue>>);

impl Hold for SharedGatewaySlot {
    fn release(self: Box<Self>, _: &Ending) {
        self.0.leave();
        if let Some(queue) = &self.1 {
            queue.kick();
        }
    }
}

/// A place under the tenant's `max_concurrent`.
pub(crate) struct TenantSlot(pub Arc<Tenant>);

impl Hold for TenantSlot {
    fn release(self: Box<Self>, _: &Ending) {
        self.0.leave();
    }
}

/// A tenant's reservation: one request, and the tokens the request was estimated to use.
pub(crate) struct Spend {
    pub(crate) tenant: Arc<Tenant>,
    /// Tokens reserved: the prompt estimate plus the most it may generate.
    pub(crate) tokens: u64,
    pub(crate) prompt_estimate: u64,
    pub(crate) metrics: Arc<AdmissionMetrics>,
}

impl Spend {
    /// The tokens the request is charged (`sluice_core::admission::tokens_used`).
    fn used(&self, ending: &Ending) -> u64 {
        let spent = Spent {
            forwarded: ending.forwarded,
            reported: ending.usage.map(|u| u.prompt + u.completion),
            events: ending.chunks,
            left_unanswered: ending.cancelled && ending.status.is_none(),
        };
        tokens_used(self.tokens, self.prompt_estimate, spent)
    }
}

impl Hold for Spend {
    fn release(self: Box<Self>, ending: &Ending) {
        let now = Instant::now();
        let used = self.used(ending);
        Tenant::settle(&self.tenant.tokens, self.tokens, used, now);
        if !ending.forwarded {
            // Refused by the gateway after admission: the request is not counted either.
            Tenant::settle(&self.tenant.requests, 1, 0, now);
        }
        if let Some(usage) = ending.usage {
            for (kind, n) in [("prompt", usage.prompt), ("completion", usage.completion)] {
                self.metrics
                    .tenant_tokens
                    .get_or_create(&TenantTokenLabels {
                        tenant: self.tenant.label.clone(),
                        kind,
                    })
                    .inc_by(n);
            }
        }
    }
}
