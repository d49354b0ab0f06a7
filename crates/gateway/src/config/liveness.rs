//! Whether a worker's engine is alive and making progress: the stall, wedge, stale and
//! unresponsive bounds, and the trials that readmit. They build `LivenessConfig`, which the
//! liveness checker takes whole (a disaggregated pair's prefill leg reads the wedge bound too).

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::liveness::LivenessConfig;

use super::checks::seconds;
use super::ConfigError;

/// The liveness flags (`sluice serve --help`, "Liveness").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct LivenessSettings {
    /// Seconds without any contact after which a connection failure on a worker's channels
    /// excludes it from routing as unreachable (0: the first failure does); any contact
    /// re-admits it.
    #[arg(long, default_value_t = 2.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_stall_secs: f64,

    /// Seconds without a token from a worker with streams in flight and evidence it should be
    /// producing (a waiting queue, a growing or 4-deep pile) after which it is excluded from
    /// routing as wedged until it makes progress (0 disables).
    #[arg(long, default_value_t = 3.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_wedge_secs: f64,

    /// Seconds without anything at all from a worker this gateway holds requests on after
    /// which it is excluded from routing as unreachable until heard from (0 disables). Keep it
    /// above --load-monitor-interval.
    #[arg(long, default_value_t = 15.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_stale_secs: f64,

    /// A worker that owes this gateway answers and has sent no byte for this long, counted
    /// across requests (a client leaving, a deadline or a retry elsewhere ends the request, not
    /// the silence), is vetoed as `unresponsive` unless its reports show its engine stepping
    /// (where they carry such a signal, a poll must have shown it standing still or gone
    /// unanswered). Its requests still waiting are retried elsewhere, within the retry budget;
    /// it is readmitted on a byte, a step in its reports, or a trial. 0 turns the rule off.
    #[arg(long, default_value_t = 3.0)]
    #[arg(help_heading = "Liveness")]
    pub(crate) worker_unresponsive_secs: f64,

    /// No liveness trials: a worker out for a veto that awaits progress (wedged, unresponsive)
    /// is readmitted only by a byte on a request still in flight on it or a step in its
    /// reports. By default one one-token generation (max_tokens 1 on its own model, at most one
    /// in flight, one every --worker-stall-secs, at least a second) asks whether it is back.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Liveness")]
    pub(crate) disable_liveness_trials: bool,

    /// No liveness vetoes at all (unreachable, stale, wedged, unresponsive): a worker that is
    /// gone or stuck stays in rotation until health checks or the circuit breaker take it out,
    /// if they are on. For a naive baseline in benchmarks, not for production.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Liveness")]
    pub(crate) disable_liveness_checks: bool,
}

impl LivenessSettings {
    /// The liveness thresholds, or none with `--disable-liveness-checks`.
    pub(super) fn validate(&self) -> Result<Option<LivenessConfig>, ConfigError> {
        let cfg = LivenessConfig {
            stall: seconds("worker-stall-secs", self.worker_stall_secs)?,
            wedge: self.wedge()?,
            stale: seconds("worker-stale-secs", self.worker_stale_secs)?,
            unresponsive: seconds("worker-unresponsive-secs", self.worker_unresponsive_secs)?,
            trials: !self.disable_liveness_trials,
        };
        Ok((!self.disable_liveness_checks).then_some(cfg))
    }

    /// `--worker-wedge-secs`.
    pub(super) fn wedge(&self) -> Result<Duration, ConfigError> {
        seconds("worker-wedge-secs", self.worker_wedge_secs)
    }
}
