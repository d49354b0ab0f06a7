//! Load monitoring and overload: how often a worker's load is polled, the ceilings past which it
//! is overloaded, whether a request with nowhere to go is shed and with what status, the share
//! kept for interactive requests, the busy-rank checks. They build the load monitor's
//! `LoadConfig`, the route stage's `Shedding`, the front's `Answers` and the fleet's reserve.

use std::time::Duration;

use axum::http::StatusCode;
use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::overload::Ceilings;

use super::checks::{fraction, invalid, positive_seconds};
use super::ConfigError;
use crate::control::{busy_thresholds, LoadConfig};
use crate::front::Answers;
use crate::route::Shedding;

/// The overload flags (`sluice serve --help`, "Load monitoring and overload").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct OverloadSettings {
    /// Seconds between two load polls of a pool's workers (vLLM /metrics, SGLang /v1/loads);
    /// a worker spec's `load_monitor_interval_secs` may ask for less (never under 1 s). 1 by
    /// default (SMG: 10): the liveness checks tell a wedged engine from a busy one by its
    /// reports, so a veto lands a poll after the bound; a vLLM scrape costs its API process
    /// about 2.4 ms of CPU (docs/overload.md). A poll gets twice the interval to answer, at
    /// least 1 s and at most 5 s.
    #[arg(long, default_value_t = 1.0)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) load_monitor_interval: f64,

    /// Waiting requests (summed over a worker's ranks) at or above which it is overloaded: left
    /// out of routing while another worker is under its ceilings. At least 1.
    #[arg(long, default_value_t = 8)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub worker_overload_waiting_requests: u64,

    /// KV cache usage (mean over a worker's ranks, 0..1) at or above which it is overloaded.
    #[arg(long, default_value_t = 0.8)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) worker_overload_token_usage: f64,

    /// Accepted for SMG command lines: overload protection is on by default.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) worker_overload_protection: bool,

    /// Turn both overload ceilings off (a worker spec's `overload` block still applies).
    #[arg(long, conflicts_with = "worker_overload_protection")]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) disable_worker_overload_protection: bool,

    /// When every worker a request could use is overloaded, refuse it at once (with
    /// --overload-status-code and Retry-After) instead of steering it to the least loaded. With
    /// the gateway queue, it waits only when room is measured freeing on those workers fast
    /// enough to serve it within its tier's wait (docs/overload.md).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub worker_overload_shed: bool,

    /// Status of a shed request: 503, or 529 for Dynamo-style clients.
    #[arg(long, default_value_t = 503)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub overload_status_code: u16,

    /// Share of each worker's capacity kept for interactive (tier 0) requests while a model has
    /// them: a less urgent request goes to a worker only while, by its last load report, the
    /// worker could start more than this share of what it holds (its running window, or what its
    /// KV cache holds under --worker-overload-token-usage, in requests of the size running); else
    /// it waits in the gateway queue (where --worker-overload-shed does not shed it: the fleet has
    /// room); without the queue, a worker with room only within the reserve is still taken before
    /// a full one. Kept for 60 s after an interactive request for the model had its first token;
    /// a model without interactive traffic keeps nothing back. 0 turns it off (docs/overload.md).
    #[arg(long, default_value_t = 0.1)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) interactive_reserve: f64,

    /// Busy rank check: KV blocks in use above this fraction of the rank's blocks. Off unless set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) active_decode_blocks_threshold: Option<f64>,

    /// Busy rank check: more prompt tokens than this waiting for prefill. Off unless set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) active_prefill_tokens_threshold: Option<u64>,

    /// Busy rank check: prompt tokens waiting for prefill above this multiple of the rank's
    /// max_num_batched_tokens. Off unless set.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Load monitoring and overload")]
    pub(crate) active_prefill_tokens_threshold_frac: Option<f64>,
}

impl OverloadSettings {
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

    pub(super) fn shedding(&self) -> Shedding {
        Shedding {
            enabled: self.worker_overload_shed,
            // A vetoed worker's load is not looked at again before the next poll.
            retry_after: Duration::from_secs(self.load_monitor_interval.ceil().max(1.0) as u64),
        }
    }

    /// `--overload-status-code`: how the edge answers an overload refusal.
    pub(super) fn answers(&self) -> Result<Answers, ConfigError> {
        StatusCode::from_u16(self.overload_status_code)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .map(|overload| Answers { overload })
            .ok_or_else(|| {
                invalid(
                    "overload-status-code",
                    format!(
                        "{} is not an error status (503, or 529 for Dynamo-style clients)",
                        self.overload_status_code
                    ),
                )
            })
    }

    /// `--interactive-reserve`.
    pub(super) fn interactive_reserve(&self) -> Result<f64, ConfigError> {
        fraction("interactive-reserve", self.interactive_reserve)
    }
}
