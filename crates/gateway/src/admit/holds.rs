//! What admission takes for a request, given back when it ends (`context::Hold`).

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::queue::GatewayQueue;
use super::tenants::Tenant;
use crate::context::{Ending, Hold};
use crate::metrics::{AdmissionMetrics, TenantTokenLabels};

/// A place under `--max-concurrent-requests`; given back, it may let a queued request go.
pub struct GatewaySlot(pub OwnedSemaphorePermit, pub Option<Arc<GatewayQueue>>);

impl Hold for GatewaySlot {
    fn release(self: Box<Self>, _: &Ending) {
        drop(self.0);
        if let Some(queue) = &self.1 {
            queue.kick();
        }
    }
}

/// A place under the tenant's `max_concurrent`.
pub struct TenantSlot(pub Arc<Tenant>);

impl Hold for TenantSlot {
    fn release(self: Box<Self>, _: &Ending) {
        self.0.leave();
    }
}

/// A tenant's reservation: one request, and the tokens the request was estimated to use.
pub struct Spend {
    pub tenant: Arc<Tenant>,
    /// Tokens reserved: the prompt estimate plus the most it may generate.
    pub tokens: u64,
    pub prompt_estimate: u64,
    pub metrics: Arc<AdmissionMetrics>,
}

impl Spend {
    /// The tokens the request used: what its response said; else, for a stream, the prompt
    /// estimate and one token per event; else, when nothing says otherwise, all it reserved.
    /// A request the gateway answered alone used none, and a client that left pays for what
    /// was generated before it did.
    fn used(&self, ending: &Ending) -> u64 {
        if !ending.forwarded {
            return 0;
        }
        match ending.usage {
            Some(usage) => usage.prompt + usage.completion,
            None if ending.chunks > 0 => self.prompt_estimate + ending.chunks,
            None if ending.cancelled && ending.status.is_none() => self.prompt_estimate,
            None => self.tokens,
        }
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
