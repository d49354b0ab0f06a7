//! The admission settings (seed 003, layer 1): tenants and their budgets, tiers, the gateway-wide
//! caps. Flags where SMG has them, `[[tenants]]` tables in the config file for the rest.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use axum::http::HeaderName;
use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::adaptive::CodelConfig;
use sluice_core::admission::Tier;
use sluice_core::slo::Slos;
use sluice_core::TenantId;

use super::checks::{invalid, positive_seconds};
use super::ConfigError;
use crate::admit::QueueConfig;
pub use crate::admit::{AdmissionConfig, TenantConfig, DEFAULT_TENANT};
use crate::route::Shedding;

/// What admission's config takes from other sections.
pub(super) struct Joined<'a> {
    /// `--api-key`: a tenant's key may not be a client key.
    pub(super) client_keys: &'a [String],
    /// Whether and how a request with nowhere to go is shed (the queue sheds the same way).
    pub(super) shedding: Shedding,
    /// Per-tier CoDel targets, when adaptive limits are on.
    pub(super) codel: Option<[CodelConfig; 3]>,
    /// The tiers' objectives, which bound the queue's waits by default.
    pub(super) slos: &'a Slos,
    /// `--request-timeout-secs`.
    pub(super) request_timeout: Duration,
    /// `--model-alias`, checked.
    pub(super) aliases: HashMap<String, sluice_core::ModelName>,
}

/// One `[[tenants]]` table of the config file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    pub(crate) name: String,
    /// Keys that identify the tenant (as `Authorization: Bearer <key>`).
    #[serde(default)]
    pub(crate) api_keys: Vec<String>,
    /// The tier its requests get, and the most urgent they may ask for: 0 interactive, 1 agent,
    /// 2 batch. Default: `--default-priority`.
    #[serde(default)]
    pub(crate) priority: Option<u8>,
    /// Its share among the tenants of its tier.
    #[serde(default = "one")]
    pub(crate) weight: f64,
    #[serde(default)]
    pub(crate) tokens_per_minute: Option<u64>,
    #[serde(default)]
    pub(crate) requests_per_minute: Option<u64>,
    #[serde(default)]
    pub(crate) max_concurrent: Option<u32>,
}

/// The gateway queue's default size: deeper than any standing queue CoDel lets form in the
/// benchmarks' bursts (docs/benchmarks.md), so it bounds memory rather than shapes waits.
pub(crate) const DEFAULT_QUEUE_SIZE: usize = 1024;

fn one() -> f64 {
    1.0
}

/// Admission flags (`sluice serve --help`, "Admission") and the tenants of the config file.
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct AdmissionSettings {
    /// Tenants, from `[[tenants]]` tables of the config file (see docs/admission.md).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tenants: Vec<TenantSpec>,

    /// A key that identifies a tenant, `TENANT:KEY` (SMG's flag; repeatable). A tenant not in the
    /// config file is made with the defaults. Its requests need no --api-key.
    #[arg(
        long = "tenant-api-key",
        value_name = "TENANT:KEY",
        hide_env_values = true
    )]
    #[serde(default)]
    #[arg(help_heading = "Admission")]
    pub(crate) tenant_api_keys: Vec<String>,

    /// Take the tenant from --tenant-header-name when a request carries it (set by an
    /// authenticating proxy in front; SMG's flag). Keys are still checked.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Admission")]
    pub(crate) trust_tenant_header: bool,

    /// The header --trust-tenant-header reads (SMG's default).
    #[arg(long, default_value = "x-smg-tenant-id")]
    #[arg(help_heading = "Admission")]
    pub(crate) tenant_header_name: String,

    /// The tier of the default tenant and of tenants that set none, and the most urgent their
    /// requests may ask for: 0 interactive, 1 agent, 2 batch. At 0, a request is served as
    /// interactive unless it asks for less (`x-sluice-priority`, `x-smg-priority`), so tiers work
    /// with nothing configured; give tenants their tiers to keep clients from asking.
    #[arg(long, default_value_t = 0)]
    #[arg(help_heading = "Admission")]
    pub(crate) default_priority: u8,

    /// Output tokens reserved from a tenant's token budget for a request that sets no
    /// `max_tokens` (the real count is settled when the response ends).
    #[arg(long, default_value_t = 1024)]
    #[arg(help_heading = "Admission")]
    pub(crate) default_max_tokens_estimate: u64,

    /// Requests in flight through the gateway at most, each counted until its response ends
    /// (SMG's flag; -1: no cap). Past it a request is refused with 503 `queue_full`.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    #[arg(help_heading = "Admission")]
    pub(crate) max_concurrent_requests: i64,

    /// Requests admitted per second, gateway-wide, bursting up to --max-concurrent-requests
    /// (SMG's flag, whose name says tokens but which counts requests). Unset or 0: no limit.
    /// Past it a request is refused with 503 `queue_full`.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Admission")]
    pub(crate) rate_limit_tokens_per_second: Option<f64>,

    /// Requests that may wait in the gateway, when no worker of their model has room (or
    /// --max-concurrent-requests is reached), instead of being steered onto a full engine or
    /// refused (SMG's flag; on by default here, so a burst waits in the gateway rather than in
    /// the engines' queues: docs/migrating-from-smg.md). They leave in tier order, fair between
    /// tenants, to whichever worker frees first. 0: no queue (the all-vetoed rule applies at once).
    #[arg(long, default_value_t = DEFAULT_QUEUE_SIZE)]
    #[arg(help_heading = "Admission")]
    pub queue_size: usize,

    /// Longest wait in the gateway queue (SMG's flag); past it 503 `queue_timeout`. A tier with
    /// a first-token objective (--slo-ttft-ms-by-tier) waits at most that objective less 0.5 s
    /// for the engine's own first token: 1.5 s interactive, 4.5 s agent by default. SMG has one
    /// timeout for every class (--smg-defaults restores it).
    #[arg(long, default_value_t = 60.0)]
    #[arg(help_heading = "Admission")]
    pub(crate) queue_timeout_secs: f64,

    /// Per-tier default deadlines, `INTERACTIVE,AGENT,BATCH` milliseconds (0: none), for requests
    /// that send no `X-Request-Deadline-Ms`: they are then held to it as if they had.
    #[arg(long, value_delimiter = ',', value_name = "MS")]
    #[serde(default)]
    #[arg(help_heading = "Admission")]
    pub(crate) default_deadline_ms_by_tier: Vec<u64>,

    /// Per-tier queue timeouts, `INTERACTIVE,AGENT,BATCH` seconds (e.g. `5,30,120`), in place of
    /// the waits --queue-timeout-secs and the first-token objectives give.
    #[arg(long, value_delimiter = ',', value_name = "SECONDS")]
    #[serde(default)]
    #[arg(help_heading = "Admission")]
    pub(crate) queue_timeout_by_tier: Vec<f64>,
}

fn tier(setting: &'static str, n: u8) -> Result<Tier, ConfigError> {
    Tier::ALL
        .get(usize::from(n))
        .copied()
        .ok_or_else(|| invalid(setting, format!("{n} is not a tier: 0, 1 or 2")))
}

impl AdmissionSettings {
    pub(super) fn validate(&self, joined: Joined<'_>) -> Result<AdmissionConfig, ConfigError> {
        let default_tier = tier("default-priority", self.default_priority)?;
        let tenants = self.tenants(default_tier, joined.client_keys)?;
        let tenant_header = self
            .trust_tenant_header
            .then(|| {
                HeaderName::try_from(self.tenant_header_name.trim())
                    .map_err(|e| invalid("tenant-header-name", e.to_string()))
            })
            .transpose()?;
        Ok(AdmissionConfig {
            tier_deadlines: self.tier_deadlines()?,
            queue: self.queue(&joined.shedding, joined.codel, joined.slos)?,
            tenants,
            tenant_header,
            default_tier,
            default_max_tokens: self.default_max_tokens_estimate,
            max_concurrent: self.max_concurrent()?,
            request_rate: self.request_rate()?,
            request_timeout: joined.request_timeout,
            aliases: joined.aliases,
        })
    }

    /// The file's tenants and those `--tenant-api-key` adds, each name and key used once.
    fn tenants(
        &self,
        default_tier: Tier,
        client_keys: &[String],
    ) -> Result<Vec<TenantConfig>, ConfigError> {
        let mut tenants: Vec<TenantConfig> = Vec::new();
        for spec in &self.tenants {
            tenants.push(tenant(spec, default_tier)?);
        }
        let mut names = HashSet::new();
        for t in &tenants {
            if !names.insert(t.id.clone()) || t.id.as_str() == DEFAULT_TENANT {
                return Err(invalid(
                    "config",
                    format!(
                        "tenant '{}' is named twice (or is the default tenant)",
                        t.id
                    ),
                ));
            }
        }
        for entry in &self.tenant_api_keys {
            let Some((name, key)) = entry
                .split_once(':')
                .filter(|(n, k)| !n.is_empty() && !k.is_empty())
            else {
                return Err(invalid("tenant-api-key", "expected TENANT:KEY"));
            };
            match tenants.iter_mut().find(|t| t.id.as_str() == name) {
                Some(t) => t.api_keys.push(key.to_string()),
                None => tenants.push(TenantConfig {
                    id: TenantId::new(name),
                    api_keys: vec![key.to_string()],
                    tier: default_tier,
                    weight: 1.0,
                    tokens_per_minute: None,
                    requests_per_minute: None,
                    max_concurrent: None,
                }),
            }
        }
        let mut owners: HashMap<&str, &str> = client_keys
            .iter()
            .map(|k| (k.as_str(), "--api-key"))
            .collect();
        for t in &tenants {
            for key in &t.api_keys {
                if let Some(other) = owners.insert(key, t.id.as_str()) {
                    return Err(invalid(
                        "tenant-api-key",
                        format!("a key of tenant '{}' is also a key of {other}", t.id),
                    ));
                }
            }
        }
        Ok(tenants)
    }

    fn max_concurrent(&self) -> Result<Option<u32>, ConfigError> {
        match self.max_concurrent_requests {
            -1 => Ok(None),
            n if n >= 1 => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
            n => Err(invalid(
                "max-concurrent-requests",
                format!("{n}: give at least 1, or -1 for no cap"),
            )),
        }
    }

    fn request_rate(&self) -> Result<Option<f64>, ConfigError> {
        match self.rate_limit_tokens_per_second {
            None | Some(0.0) => Ok(None),
            Some(r) if r.is_finite() && r > 0.0 => Ok(Some(r)),
            Some(r) => Err(invalid(
                "rate-limit-tokens-per-second",
                format!("{r} is not a rate >= 0"),
            )),
        }
    }

    fn tier_deadlines(&self) -> Result<[Option<Duration>; 3], ConfigError> {
        match self.default_deadline_ms_by_tier.as_slice() {
            [] => Ok([None; 3]),
            [a, b, c] => Ok([*a, *b, *c].map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))),
            other => Err(invalid(
                "default-deadline-ms-by-tier",
                format!(
                    "{} values: give three, INTERACTIVE,AGENT,BATCH",
                    other.len()
                ),
            )),
        }
    }
}

impl AdmissionSettings {
    fn queue(
        &self,
        shedding: &Shedding,
        codel: Option<[CodelConfig; 3]>,
        slos: &Slos,
    ) -> Result<Option<QueueConfig>, ConfigError> {
        if self.queue_size == 0 {
            return Ok(None);
        }
        let longest = positive_seconds("queue-timeout-secs", self.queue_timeout_secs)?;
        let timeouts = match self.queue_timeout_by_tier.as_slice() {
            [] => slos.queue_waits(longest),
            [a, b, c] => [
                positive_seconds("queue-timeout-by-tier", *a)?,
                positive_seconds("queue-timeout-by-tier", *b)?,
                positive_seconds("queue-timeout-by-tier", *c)?,
            ],
            other => {
                return Err(invalid(
                    "queue-timeout-by-tier",
                    format!(
                        "{} values: give three, INTERACTIVE,AGENT,BATCH",
                        other.len()
                    ),
                ))
            }
        };
        Ok(Some(QueueConfig {
            size: self.queue_size,
            timeouts,
            shed: shedding.enabled,
            shed_retry_after: shedding.retry_after,
            codel,
        }))
    }
}

fn tenant(spec: &TenantSpec, default_tier: Tier) -> Result<TenantConfig, ConfigError> {
    let name = spec.name.trim();
    let bad = |message: String| invalid("config", format!("tenant '{name}': {message}"));
    if name.is_empty() {
        return Err(invalid("config", "a tenant needs a name"));
    }
    if !(spec.weight.is_finite() && spec.weight > 0.0) {
        return Err(bad(format!("weight {} must be above 0", spec.weight)));
    }
    if spec.api_keys.iter().any(|k| k.trim().is_empty()) {
        return Err(bad("an API key cannot be empty".into()));
    }
    if spec.tokens_per_minute == Some(0)
        || spec.requests_per_minute == Some(0)
        || spec.max_concurrent == Some(0)
    {
        return Err(bad(
            "a limit of 0 would refuse everything: leave it out for no limit".into(),
        ));
    }
    Ok(TenantConfig {
        id: TenantId::new(name),
        api_keys: spec.api_keys.clone(),
        tier: match spec.priority {
            Some(n) => {
                tier("config", n).map_err(|_| bad(format!("priority {n} is not 0, 1 or 2")))?
            }
            None => default_tier,
        },
        weight: spec.weight,
        tokens_per_minute: spec.tokens_per_minute,
        requests_per_minute: spec.requests_per_minute,
        max_concurrent: spec.max_concurrent,
    })
}
