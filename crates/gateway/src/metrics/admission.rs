//! Admission's metrics: refusals by tier and reason, and each tenant's requests, tokens and
//! waiters evicted from the gateway queue. The
//! tenant label takes configured names only (`default`, and `other` for names a trusted header
//! gives), so no client can grow a family.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_core::admission::Tier;

/// A label value shared rather than copied: a configured tenant's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct Label(Arc<str>);

impl Label {
    pub fn new(s: &str) -> Self {
        Self(Arc::from(s))
    }
}

impl EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&&*self.0, encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RejectedLabels {
    pub(crate) tier: &'static str,
    /// The refusal's code (`rate_limit_exceeded`, `queue_full`, ...).
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantTokenLabels {
    pub(crate) tenant: Label,
    /// `prompt` or `completion`.
    pub(crate) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantRequestLabels {
    pub(crate) tenant: Label,
    pub(crate) tier: &'static str,
    /// `admitted` or `rejected`.
    pub(crate) outcome: &'static str,
}

/// Every reason admission refuses for (the refusals' error codes).
pub(crate) const REASONS: [&str; 11] = [
    "invalid_header",
    "deadline_exceeded",
    "queue_full",
    "queue_evicted",
    "queue_timeout",
    "codel_drop",
    "degradation_shed",
    "worker_overload_shed",
    "tenant_concurrency_exceeded",
    "rate_limit_exceeded",
    "shared_state_unavailable",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantTierLabels {
    pub(crate) tenant: Label,
    pub(crate) tier: &'static str,
}

/// Admission's families.
#[derive(Debug, Default)]
pub(crate) struct AdmissionMetrics {
    pub(crate) rejected: Family<RejectedLabels, Counter>,
    pub(crate) tenant_tokens: Family<TenantTokenLabels, Counter>,
    pub(crate) tenant_requests: Family<TenantRequestLabels, Counter>,
    pub(crate) queue_evictions: Family<TenantTierLabels, Counter>,
}

impl AdmissionMetrics {
    /// Registers the families, each known tenant's series at zero so they exist from startup.
    pub(crate) fn register(registry: &mut Registry, tenants: &[Label]) -> Arc<Self> {
        let m = Self::default();
        for tenant in tenants {
            for kind in ["prompt", "completion"] {
                let _ = m.tenant_tokens.get_or_create(&TenantTokenLabels {
                    tenant: tenant.clone(),
                    kind,
                });
            }
            for tier in Tier::ALL {
                let _ = m.queue_evictions.get_or_create(&TenantTierLabels {
                    tenant: tenant.clone(),
                    tier: tier.name(),
                });
                for outcome in ["admitted", "rejected"] {
                    let _ = m.tenant_requests.get_or_create(&TenantRequestLabels {
                        tenant: tenant.clone(),
                        tier: tier.name(),
                        outcome,
                    });
                }
            }
        }
        for tier in Tier::ALL {
            for reason in REASONS {
                let _ = m.rejected.get_or_create(&RejectedLabels {
                    tier: tier.name(),
                    reason,
                });
            }
        }
        registry.register(
            "admission_rejected",
            "Requests refused by admission, by tier and reason (the refusal's error code)",
            m.rejected.clone(),
        );
        registry.register(
            "tenant_tokens",
            "Tokens tenants used, prompt and completion, as their responses reported them",
            m.tenant_tokens.clone(),
        );
        registry.register(
            "tenant_requests",
            "Requests by tenant, tier and admission outcome",
            m.tenant_requests.clone(),
        );
        registry.register(
            "queue_evictions",
            "Waiters evicted from the gateway queue to make room for a more urgent request or a \
             tenant under its share, by the evicted request's tenant and tier",
            m.queue_evictions.clone(),
        );
        Arc::new(m)
    }

    /// A tenant's request counters, resolved once so no request builds a label set.
    pub(crate) fn for_tenant(&self, tenant: &Label) -> Arc<TenantCounters> {
        let counter = |tier: Tier, outcome| {
            self.tenant_requests
                .get_or_create(&TenantRequestLabels {
                    tenant: tenant.clone(),
                    tier: tier.name(),
                    outcome,
                })
                .clone()
        };
        let evictions = |tier: Tier| {
            self.queue_evictions
                .get_or_create(&TenantTierLabels {
                    tenant: tenant.clone(),
                    tier: tier.name(),
                })
                .clone()
        };
        Arc::new(TenantCounters {
            requests: Tier::ALL.map(|tier| [counter(tier, "admitted"), counter(tier, "rejected")]),
            evictions: Tier::ALL.map(evictions),
        })
    }
}

/// One tenant's `sluice_tenant_requests_total` series: by tier, admitted and rejected.
#[derive(Debug)]
pub(crate) struct TenantCounters {
    requests: [[Counter; 2]; 3],
    /// `sluice_queue_evictions_total`, by tier.
    evictions: [Counter; 3],
}

impl TenantCounters {
    pub(crate) fn count(&self, tier: Tier, admitted: bool) {
        self.requests[tier.index()][usize::from(!admitted)].inc();
    }

    /// One of the tenant's waiters of `tier` gave up its place in the gateway queue.
    pub(crate) fn evicted(&self, tier: Tier) {
        self.evictions[tier.index()].inc();
    }
}
