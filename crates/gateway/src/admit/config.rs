//! What admission is configured with, checked (`config` builds it from the settings).

use axum::http::HeaderName;
use sluice_core::admission::Tier;
use sluice_core::TenantId;

/// The name of the tenant of requests no configured tenant claims.
pub const DEFAULT_TENANT: &str = "default";

/// A tenant, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantConfig {
    pub id: TenantId,
    pub api_keys: Vec<String>,
    pub tier: Tier,
    pub weight: f64,
    pub tokens_per_minute: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub max_concurrent: Option<u32>,
}

/// The admission configuration, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// The configured tenants (the default tenant is not among them).
    pub tenants: Vec<TenantConfig>,
    /// `--trust-tenant-header`: the header naming the tenant.
    pub(crate) tenant_header: Option<HeaderName>,
    pub default_tier: Tier,
    pub(crate) default_max_tokens: u64,
    pub max_concurrent: Option<u32>,
    /// Requests per second, gateway-wide.
    pub request_rate: Option<f64>,
    /// `--default-deadline-ms-by-tier`: the deadline of a request of each tier that gives none.
    pub(crate) tier_deadlines: [Option<std::time::Duration>; 3],
    /// The gateway queue, when `--queue-size` is above 0.
    pub queue: Option<super::queue::QueueConfig>,
    /// `--request-timeout-secs`: the longest a request may take, its deadline unless it sets an
    /// earlier one.
    pub request_timeout: std::time::Duration,
    /// `--model-alias`: alias -> the served model it names, resolved by the admit stage.
    pub aliases: std::collections::HashMap<String, sluice_core::ModelName>,
}
