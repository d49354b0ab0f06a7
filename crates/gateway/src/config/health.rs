//! The health probes: how often, how long each may take, how many failures take a worker out and
//! how many successes bring it back, the path, and whether a failed worker is removed. They build
//! `HealthConfig`, which the control loops' prober takes whole.

use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::health::Thresholds;

use super::checks::{invalid, positive_count, positive_seconds};
use super::ConfigError;
use crate::control::HealthConfig;

/// The health-check flags (`sluice serve --help`, "Health checks").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct HealthSettings {
    /// Seconds between two health probes of a worker (each worker on its own schedule).
    #[arg(long, default_value_t = 60.0)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_check_interval_secs: f64,

    /// A probe that has no 2xx answer within this many seconds failed.
    #[arg(long, default_value_t = 5.0)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_check_timeout_secs: f64,

    /// Consecutive failed probes that take a Ready worker out of rotation (NotReady); 3x more
    /// make it Failed, and 10x probes without becoming Ready fail a Pending worker.
    #[arg(long, default_value_t = 3)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_failure_threshold: u32,

    /// Consecutive passed probes that bring a worker (back) to Ready.
    #[arg(long, default_value_t = 2)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_success_threshold: u32,

    /// Path probed on each worker (GET, 2xx is healthy).
    #[arg(long, default_value = "/health")]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_check_endpoint: String,

    /// Do not probe workers (a worker's `health.disable_health_check` overrides it).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Health checks")]
    pub(crate) disable_health_check: bool,

    /// Remove workers that reach Failed. Off, they stay registered and probed, and rejoin in
    /// place once they answer again. Alone, the flag means true [default: on with service
    /// discovery, which registers a removed worker again once its health endpoint answers; off
    /// without, so a static fleet does not shrink for good].
    #[arg(
        long,
        visible_alias = "worker-auto-recovery",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL",
        overrides_with = "no_remove_unhealthy_workers"
    )]
    #[serde(default)]
    #[arg(help_heading = "Health checks")]
    pub remove_unhealthy_workers: Option<bool>,

    /// Keep failed workers registered and probed (the default without service discovery).
    #[arg(
        long,
        visible_alias = "no-worker-auto-recovery",
        overrides_with = "remove_unhealthy_workers"
    )]
    #[serde(skip)]
    #[arg(help_heading = "Health checks")]
    pub(crate) no_remove_unhealthy_workers: bool,
}

impl HealthSettings {
    /// The probes' config; `discovered`: a discovery source is on (removal's default follows).
    pub(super) fn validate(&self, discovered: bool) -> Result<HealthConfig, ConfigError> {
        let endpoint = &self.health_check_endpoint;
        if !endpoint.starts_with('/') || endpoint.parse::<axum::http::uri::PathAndQuery>().is_err()
        {
            return Err(invalid(
                "health-check-endpoint",
                format!("'{endpoint}' is not a path such as /health"),
            ));
        }
        Ok(HealthConfig {
            interval: positive_seconds(
                "health-check-interval-secs",
                self.health_check_interval_secs,
            )?,
            timeout: positive_seconds("health-check-timeout-secs", self.health_check_timeout_secs)?,
            thresholds: Thresholds {
                failure: positive_count("health-failure-threshold", self.health_failure_threshold)?,
                success: positive_count("health-success-threshold", self.health_success_threshold)?,
            },
            endpoint: endpoint.clone(),
            disabled: self.disable_health_check,
            // Seed 004: the default follows discovery. Without a source to register a removed
            // worker again, removal would shrink a static fleet for good.
            remove_unhealthy: self.remove_unhealthy_workers.unwrap_or(discovered),
        })
    }
}
