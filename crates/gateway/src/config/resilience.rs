//! Resilience's settings: retrying a failed attempt on another worker, and each worker's circuit
//! breaker (SMG's flag names and defaults).

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::breaker::{BreakerConfig, FailureRate};
use sluice_core::retry::Backoff;

use super::checks::{at_least, fraction, invalid, positive_count, positive_seconds, seconds};
use super::{ConfigError, RetryConfig};

/// Retry and circuit-breaker flags (`sluice serve --help`, "Retries", "Circuit breaker").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub(crate) struct ResilienceSettings {
    /// Attempts of one request in all, the first included, as SMG counts them (1: never retry).
    /// The later ones follow connection failures, at-capacity answers and the statuses of
    /// --retry-status-codes, each on another worker.
    #[arg(long, default_value_t = 4)]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_max_retries: u32,

    /// Worker answers retried on another worker, within the retry budget, when they come before
    /// any byte reached the client (429 and 529 are always retried as at-capacity answers).
    #[arg(long, value_delimiter = ',', default_values_t = [500, 502, 503, 504])]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_status_codes: Vec<u16>,

    /// Wait before the first retry.
    #[arg(long, default_value_t = 50)]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_initial_backoff_ms: u64,

    /// Longest wait between retries.
    #[arg(long, default_value_t = 5_000)]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_max_backoff_ms: u64,

    /// Growth of the wait per retry.
    #[arg(long, default_value_t = 2.0)]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_backoff_multiplier: f64,

    /// Share of each wait drawn at random (0..=1), so retries from many requests spread out.
    #[arg(long, default_value_t = 0.5)]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_jitter_factor: f64,

    /// Retries may add at most this percentage of the requests of the last 10 seconds.
    #[arg(long, default_value_t = 20.0)]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_budget_percent: f64,

    /// Retries always allowed per second, on top of the percentage (so a quiet gateway can retry).
    #[arg(long, default_value_t = 10)]
    #[arg(help_heading = "Retries")]
    pub(crate) retry_budget_min_per_sec: u32,

    /// Never retry.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Retries")]
    pub(crate) disable_retries: bool,

    /// Consecutive failures (connection errors, 5xx) that open a worker's circuit.
    #[arg(long, default_value_t = 10)]
    #[arg(help_heading = "Circuit breaker")]
    pub(crate) cb_failure_threshold: u32,

    /// Consecutive successful trials that close a half-open circuit (also the number of trial
    /// requests let through at once).
    #[arg(long, default_value_t = 3)]
    #[arg(help_heading = "Circuit breaker")]
    pub(crate) cb_success_threshold: u32,

    /// How long an open circuit refuses requests before it lets trials through.
    #[arg(long, default_value_t = 60.0)]
    #[arg(help_heading = "Circuit breaker")]
    pub(crate) cb_timeout_duration_secs: f64,

    /// A closed circuit also opens when at least this share of the outcomes within
    /// --cb-window-duration-secs failed (at least --cb-min-requests of them): a worker failing
    /// every other request never fails --cb-failure-threshold in a row.
    #[arg(long, default_value_t = 0.5)]
    #[arg(help_heading = "Circuit breaker")]
    pub(crate) cb_failure_rate: f64,

    /// Outcomes the failure rate needs before it can open a circuit; 0 turns the rule off.
    #[arg(long, default_value_t = 20)]
    #[arg(help_heading = "Circuit breaker")]
    pub(crate) cb_min_requests: u32,

    /// The window the failure rate is judged over (SMG's name and default).
    #[arg(long, default_value_t = 120.0)]
    #[arg(help_heading = "Circuit breaker")]
    pub(crate) cb_window_duration_secs: f64,

    /// Never open circuits.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Circuit breaker")]
    pub(crate) disable_circuit_breaker: bool,
}

impl ResilienceSettings {
    pub(super) fn retry(&self) -> Result<RetryConfig, ConfigError> {
        Ok(RetryConfig {
            max_retries: if self.disable_retries {
                0
            } else {
                self.retry_max_retries.saturating_sub(1)
            },
            backoff: Backoff {
                initial: Duration::from_millis(self.retry_initial_backoff_ms),
                multiplier: at_least(
                    "retry-backoff-multiplier",
                    self.retry_backoff_multiplier,
                    1.0,
                )?,
                max: Duration::from_millis(self.retry_max_backoff_ms),
                jitter: fraction("retry-jitter-factor", self.retry_jitter_factor)?,
            },
            status_codes: match self
                .retry_status_codes
                .iter()
                .find(|code| !(400..=599).contains(*code))
            {
                Some(code) => {
                    return Err(invalid(
                        "retry-status-codes",
                        format!("{code} is not an error status"),
                    ))
                }
                None => self.retry_status_codes.clone(),
            },
            budget_percent: at_least("retry-budget-percent", self.retry_budget_percent, 0.0)?,
            budget_min_per_sec: self.retry_budget_min_per_sec,
        })
    }

    pub(super) fn breaker(&self) -> Result<Option<BreakerConfig>, ConfigError> {
        let failure_rate = (self.cb_min_requests > 0)
            .then(|| -> Result<FailureRate, ConfigError> {
                let rate = self.cb_failure_rate;
                if !(rate > 0.0 && rate <= 1.0) {
                    return Err(invalid(
                        "cb-failure-rate",
                        format!("{rate} is not a share of outcomes in (0, 1]"),
                    ));
                }
                Ok(FailureRate {
                    rate,
                    min_requests: self.cb_min_requests,
                    window: positive_seconds(
                        "cb-window-duration-secs",
                        self.cb_window_duration_secs,
                    )?,
                })
            })
            .transpose()?;
        Ok((!self.disable_circuit_breaker).then_some(BreakerConfig {
            failure_threshold: positive_count("cb-failure-threshold", self.cb_failure_threshold)?,
            success_threshold: positive_count("cb-success-threshold", self.cb_success_threshold)?,
            open_timeout: seconds("cb-timeout-duration-secs", self.cb_timeout_duration_secs)?,
            half_open_trials: self.cb_success_threshold,
            failure_rate,
        }))
    }
}
