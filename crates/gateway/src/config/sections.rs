//! The settings of each subsystem — policy, health checks, load monitoring and overload
//! protection, shedding, liveness — built from `Settings` and checked as a whole.

use std::time::Duration;

use sluice_core::health::Thresholds;
use sluice_core::liveness::LivenessConfig;
use sluice_core::overload::Ceilings;
use sluice_core::policy::{CacheAware, Policy};

use super::checks::{at_least, fraction, invalid, positive_count, positive_seconds, seconds};
use super::{ConfigError, Settings};
use crate::control::{busy_thresholds, HealthConfig, LoadConfig};
use crate::route::Shedding;

impl Settings {
    pub(super) fn load(&self) -> Result<LoadConfig, ConfigError> {
        let interval = positive_seconds("load-monitor-interval", self.load_monitor_interval)?;
        if self.worker_overload_waiting_requests == 0 {
            return Err(invalid(
                "worker-overload-waiting-requests",
                "must be at least 1 (the comparison is inclusive: 0 would veto every worker)",
            ));
        }
        let usage = self.worker_overload_token_usage;
        if !(usage > 0.0 && usage <= 1.0) {
            return Err(invalid(
                "worker-overload-token-usage",
                format!("{usage} is not a fraction of the KV cache in (0, 1]"),
            ));
        }
        let ceilings = if self.disable_worker_overload_protection {
            Ceilings::default()
        } else {
            Ceilings {
                waiting_requests: Some(self.worker_overload_waiting_requests),
                token_usage: Some(usage),
            }
        };
        Ok(LoadConfig {
            interval,
            ceilings,
            busy: busy_thresholds(
                self.active_decode_blocks_threshold,
                self.active_prefill_tokens_threshold,
                self.active_prefill_tokens_threshold_frac,
            )
            .map_err(|(setting, message)| invalid(setting, message))?,
            ..LoadConfig::default()
        })
    }

    pub(super) fn shedding(&self) -> Result<Shedding, ConfigError> {
        if !(400..=599).contains(&self.overload_status_code) {
            return Err(invalid(
                "overload-status-code",
                format!(
                    "{} is not an error status (503, or 529 for Dynamo-style clients)",
                    self.overload_status_code
                ),
            ));
        }
        Ok(Shedding {
            enabled: self.worker_overload_shed,
            status: self.overload_status_code,
            // A vetoed worker's load is not looked at again before the next poll.
            retry_after: Duration::from_secs(self.load_monitor_interval.ceil().max(1.0) as u64),
        })
    }

    pub(super) fn health(&self) -> Result<HealthConfig, ConfigError> {
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
            // With no service discovery to register a removed worker again, removal would
            // shrink a static fleet for good: off unless asked for.
            remove_unhealthy: self.remove_unhealthy_workers.unwrap_or(false),
        })
    }

    pub(super) fn policy(&self) -> Result<Policy, ConfigError> {
        Ok(match self.policy.as_str() {
            "round_robin" => Policy::RoundRobin,
            "random" => Policy::Random,
            "least_load" => Policy::LeastLoad,
            "power_of_two" => Policy::PowerOfTwo,
            "consistent_hash" => Policy::ConsistentHash,
            "cache_aware" => Policy::CacheAware(CacheAware {
                cache_threshold: fraction("cache-threshold", self.cache_threshold)?,
                balance_abs_threshold: self.balance_abs_threshold,
                balance_rel_threshold: at_least(
                    "balance-rel-threshold",
                    self.balance_rel_threshold,
                    1.0,
                )?,
            }),
            other => {
                return Err(invalid(
                    "policy",
                    format!(
                        "unknown policy '{other}' (round_robin, random, least_load, power_of_two, \
                         cache_aware, consistent_hash)"
                    ),
                ))
            }
        })
    }

    pub(super) fn liveness(&self) -> Result<LivenessConfig, ConfigError> {
        Ok(LivenessConfig {
            stall: seconds("worker-stall-secs", self.worker_stall_secs)?,
            wedge: seconds("worker-wedge-secs", self.worker_wedge_secs)?,
            stale: seconds("worker-stale-secs", self.worker_stale_secs)?,
            unresponsive: seconds("worker-unresponsive-secs", self.worker_unresponsive_secs)?,
        })
    }
}
