//! The tenants at run time: who a request belongs to, and the budgets each tenant spends from.
//!
//! Each configured tenant's buckets and concurrency count have one writer at a time: a bucket is
//! changed only under its own lock, in one step per reservation or settlement, and the count only
//! by compare-and-swap — so requests admitted at once can never together pass a limit. With
//! `--redis-url` the budgets and the cap are shared with the other replicas (`admit::budget`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName};
use sluice_core::admission::{Level, Tier};
use sluice_core::TenantId;
use tokio::time::Instant;

use super::budget::{Budget, Cap};
use super::config::{AdmissionConfig, TenantConfig, DEFAULT_TENANT};
use crate::http::KeyOwner;
use crate::metrics::{AdmissionMetrics, Label, TenantCounters};
use crate::shared::{Shared, Short};

/// The label of tenants named by a trusted header but not configured: the metric families take
/// configured names only, so a header cannot grow them without bound.
pub(crate) const OTHER_TENANT: &str = "other";

/// The longest tenant name a trusted header may give.
const MAX_HEADER_TENANT: usize = 128;

const MINUTE: Duration = Duration::from_secs(60);

/// One tenant: its tier, its weight, and what it may spend.
#[derive(Debug)]
pub(crate) struct Tenant {
    pub(crate) id: TenantId,
    pub(crate) tier: Tier,
    pub(crate) weight: f64,
    /// Its metric label: its name when configured, `other` otherwise.
    pub(crate) label: Label,
    pub(crate) tokens: Option<Budget>,
    pub(crate) requests: Option<Budget>,
    pub(crate) max_concurrent: Option<u32>,
    cap: Option<Cap>,
    /// Its requests in flight on this gateway.
    in_flight: AtomicU32,
    /// Its `sluice_tenant_requests_total` series.
    pub(crate) counters: Arc<TenantCounters>,
}

impl Tenant {
    fn configured(
        cfg: &TenantConfig,
        now: Instant,
        metrics: &AdmissionMetrics,
        shared: Option<&Shared>,
    ) -> Self {
        let label = Label::new(cfg.id.as_str());
        let bucket = |kind: &str, per_minute: Option<u64>| {
            let name = format!("tenant:{}:{kind}", cfg.id);
            per_minute.map(|n| Budget::new(shared, &name, n, MINUTE, now))
        };
        Self {
            id: cfg.id.clone(),
            tier: cfg.tier,
            weight: cfg.weight,
            counters: metrics.for_tenant(&label),
            label,
            tokens: bucket("tokens", cfg.tokens_per_minute),
            requests: bucket("requests", cfg.requests_per_minute),
            max_concurrent: cfg.max_concurrent,
            cap: cfg
                .max_concurrent
                .map(|n| Cap::new(shared, &format!("tenant:{}:concurrent", cfg.id), n)),
            in_flight: AtomicU32::new(0),
        }
    }

    /// A tenant without limits: the default one, or one a trusted header names.
    fn unlimited(id: TenantId, tier: Tier, label: Label, counters: Arc<TenantCounters>) -> Self {
        Self {
            id,
            tier,
            weight: 1.0,
            label,
            counters,
            tokens: None,
            requests: None,
            max_concurrent: None,
            cap: None,
            in_flight: AtomicU32::new(0),
        }
    }

    /// Whether any budget applies (then its answers carry `x-ratelimit-*`).
    pub(crate) fn limited(&self) -> bool {
        self.tokens.is_some() || self.requests.is_some()
    }

    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Takes a concurrency slot, unless the tenant is at its limit.
    pub(crate) async fn enter(&self) -> Result<bool, Short> {
        if let Some(cap) = &self.cap {
            if !cap.enter().await? {
                return Ok(false);
            }
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    pub(crate) fn leave(&self) {
        if let Some(cap) = &self.cap {
            cap.leave();
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Takes `amount` from `budget`, if the tenant has that budget.
    pub(crate) async fn reserve(
        budget: &Option<Budget>,
        amount: u64,
        now: Instant,
    ) -> Result<(), Short> {
        match budget {
            Some(b) => b.reserve(amount, now).await,
            None => Ok(()),
        }
    }

    pub(crate) fn settle(budget: &Option<Budget>, reserved: u64, used: u64, now: Instant) {
        if let Some(b) = budget {
            b.settle(reserved, used, now);
        }
    }

    pub(crate) fn level(budget: &Option<Budget>, now: Instant) -> Option<Level> {
        budget.as_ref().map(|b| b.level(now))
    }
}

/// Every tenant, and how a request finds its own.
#[derive(Debug)]
pub(crate) struct Tenants {
    configured: Vec<Arc<Tenant>>,
    by_name: HashMap<TenantId, Arc<Tenant>>,
    default: Arc<Tenant>,
    header: Option<HeaderName>,
    default_tier: Tier,
    other: Label,
    other_counters: Arc<TenantCounters>,
}

impl Tenants {
    pub fn new(
        config: &AdmissionConfig,
        now: Instant,
        metrics: &AdmissionMetrics,
        shared: Option<&Shared>,
    ) -> Self {
        let configured: Vec<Arc<Tenant>> = config
            .tenants
            .iter()
            .map(|t| Arc::new(Tenant::configured(t, now, metrics, shared)))
            .collect();
        let default = Label::new(DEFAULT_TENANT);
        let other = Label::new(OTHER_TENANT);
        Self {
            by_name: configured
                .iter()
                .map(|t| (t.id.clone(), t.clone()))
                .collect(),
            configured,
            default: Arc::new(Tenant::unlimited(
                TenantId::new(DEFAULT_TENANT),
                config.default_tier,
                default.clone(),
                metrics.for_tenant(&default),
            )),
            header: config.tenant_header.clone(),
            default_tier: config.default_tier,
            other_counters: metrics.for_tenant(&other),
            other,
        }
    }

    /// Whose request this is: the tenant a trusted header names, else the owner of its key, else
    /// the default tenant.
    pub(crate) fn of(&self, headers: &HeaderMap, owner: KeyOwner) -> Arc<Tenant> {
        let named = self
            .header
            .as_ref()
            .and_then(|h| headers.get(h))
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|n| !n.is_empty() && n.len() <= MAX_HEADER_TENANT);
        if let Some(name) = named {
            return match self.by_name.get(name) {
                Some(t) => t.clone(),
                None => Arc::new(Tenant::unlimited(
                    TenantId::new(name),
                    self.default_tier,
                    self.other.clone(),
                    self.other_counters.clone(),
                )),
            };
        }
        match owner {
            KeyOwner::Tenant(i) => self
                .configured
                .get(i)
                .cloned()
                .unwrap_or_else(|| self.default.clone()),
            KeyOwner::Anyone => self.default.clone(),
        }
    }

    /// The configured tenants and the default one.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.configured.iter().chain(std::iter::once(&self.default))
    }

    /// The metric labels the tenants of `config` may take.
    pub(crate) fn labels(config: &AdmissionConfig) -> Vec<Label> {
        config
            .tenants
            .iter()
            .map(|t| Label::new(t.id.as_str()))
            .chain([Label::new(DEFAULT_TENANT)])
            .chain(
                config
                    .tenant_header
                    .is_some()
                    .then(|| Label::new(OTHER_TENANT)),
            )
            .collect()
    }
}
