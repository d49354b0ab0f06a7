//! Adaptive control's settings (seed 003): the per-worker concurrency limit learned from latency
//! (`--adaptive-concurrency`), and CoDel on each tier of the gateway queue.

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::adaptive::{AimdConfig, CodelConfig};

use super::checks::invalid;
use super::ConfigError;
use crate::control::AdaptiveConfig;

/// CoDel's targets for tiers 0, 1 and 2, in milliseconds: the seed's 200 ms for interactive
/// requests; a batch request is there to wait for room, so its tier stands for 30 s before it is
/// cut — at 5 s it cut batch work at exactly the fleet's capacity, which the engines would have
/// served in time (docs/adaptive.md).
pub(super) const CODEL_TARGETS_MS: [u64; 3] = [200, 1000, 30_000];

/// Adaptive-control flags (`sluice serve --help`, "Adaptive control").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct AdaptiveSettings {
    /// Cap this gateway's requests in flight on each worker by a limit learned from the latency
    /// its responses show: once per --adaptive-window-secs, p95 inter-token latency or time to
    /// first token at or over its breach target cuts the limit by 15%; both under their healthy
    /// targets (with the limit in use) raise it by 2. A worker at its limit takes no new request
    /// and is never steered to: the gateway queue holds the request, or it gets 503.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Adaptive control")]
    pub adaptive_concurrency: bool,

    /// How often each worker's limit is judged, over the responses of the window.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_window_secs: f64,

    /// p95 inter-token latency at or over which a worker's limit falls (fractions allowed).
    #[arg(long, default_value_t = 25.0, value_name = "MS")]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_itl_breach_ms: f64,

    /// p95 inter-token latency under which a worker's limit may rise.
    #[arg(long, default_value_t = 15.0, value_name = "MS")]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_itl_healthy_ms: f64,

    /// p95 time to first token at or over which a worker's limit falls. Unset: not judged.
    #[arg(long, value_name = "MS")]
    #[serde(default)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_ttft_breach_ms: Option<f64>,

    /// p95 time to first token a worker's limit needs under it to rise. Unset: not judged.
    #[arg(long, value_name = "MS")]
    #[serde(default)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_ttft_healthy_ms: Option<f64>,

    /// Responses a window needs before it is judged; fewer hold the limit.
    #[arg(long, default_value_t = 20)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_min_samples: u64,

    /// The least a worker's limit falls to.
    #[arg(long, default_value_t = 1)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_min_limit: u64,

    /// The most a worker's limit rises to. Unset: no ceiling.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_max_limit: Option<u64>,

    /// Where a worker's limit starts when its engine reports no running window (SGLang reports
    /// `max_running_requests`; vLLM does not).
    #[arg(long, default_value_t = 32)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) adaptive_initial_limit: u64,

    /// Turn CoDel off on the gateway queue (with --queue-size, each tier runs its own: once a
    /// tier's shortest wait has stood over its target for a whole interval, its head is cut,
    /// 503 `codel_drop`, at the paper's rising pace, and so is every arrival that would wait past
    /// the target, until an interval passes with none to refuse).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) disable_codel: bool,

    /// CoDel's target wait for every tier at once. Unset: --codel-target-ms-by-tier.
    #[arg(long, value_name = "MS")]
    #[serde(default)]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) codel_target_ms: Option<u64>,

    /// CoDel's target wait per tier, `INTERACTIVE,AGENT,BATCH` milliseconds.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "MS",
        default_value = "200,1000,30000"
    )]
    #[serde(default = "default_codel_targets")]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) codel_target_ms_by_tier: Vec<u64>,

    /// How long a tier's wait must stand over its target before CoDel cuts, the base of its pace
    /// (next cut after interval / sqrt(cuts so far)), and how long it must go without refusing
    /// anyone before it stops.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    #[arg(help_heading = "Adaptive control")]
    pub(crate) codel_interval_ms: u64,
}

/// A positive number of milliseconds (fractions allowed: benchmarks scale targets with a sped-up
/// engine clock).
fn millis(setting: &'static str, ms: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(ms / 1000.0)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            invalid(
                setting,
                format!("{ms} is not a positive number of milliseconds"),
            )
        })
}

fn default_codel_targets() -> Vec<u64> {
    CODEL_TARGETS_MS.to_vec()
}

impl AdaptiveSettings {
    /// The limiter's settings, when `--adaptive-concurrency` is on.
    pub(super) fn limiter(&self) -> Result<Option<AdaptiveConfig>, ConfigError> {
        if !self.adaptive_concurrency {
            return Ok(None);
        }
        let window = Duration::try_from_secs_f64(self.adaptive_window_secs)
            .ok()
            .filter(|w| *w >= Duration::from_millis(100))
            .ok_or_else(|| invalid("adaptive-window-secs", "must be at least 0.1 seconds"))?;
        if self.adaptive_itl_healthy_ms >= self.adaptive_itl_breach_ms {
            return Err(invalid(
                "adaptive-itl-healthy-ms",
                "must be under --adaptive-itl-breach-ms",
            ));
        }
        if let (Some(healthy), Some(breach)) =
            (self.adaptive_ttft_healthy_ms, self.adaptive_ttft_breach_ms)
        {
            if healthy >= breach {
                return Err(invalid(
                    "adaptive-ttft-healthy-ms",
                    "must be under --adaptive-ttft-breach-ms",
                ));
            }
        }
        let floor = self.adaptive_min_limit.max(1);
        if self.adaptive_max_limit.is_some_and(|c| c < floor) {
            return Err(invalid(
                "adaptive-max-limit",
                "must be at least --adaptive-min-limit",
            ));
        }
        if self.adaptive_initial_limit == 0 {
            return Err(invalid("adaptive-initial-limit", "must be at least 1"));
        }
        Ok(Some(AdaptiveConfig {
            window,
            aimd: AimdConfig {
                itl_breach: millis("adaptive-itl-breach-ms", self.adaptive_itl_breach_ms)?,
                itl_healthy: millis("adaptive-itl-healthy-ms", self.adaptive_itl_healthy_ms)?,
                ttft_breach: self
                    .adaptive_ttft_breach_ms
                    .map(|ms| millis("adaptive-ttft-breach-ms", ms))
                    .transpose()?,
                ttft_healthy: self
                    .adaptive_ttft_healthy_ms
                    .map(|ms| millis("adaptive-ttft-healthy-ms", ms))
                    .transpose()?,
                min_samples: self.adaptive_min_samples,
                floor,
                ceiling: self.adaptive_max_limit,
            },
            initial_limit: self.adaptive_initial_limit,
        }))
    }

    /// Each tier's CoDel settings, unless turned off.
    pub(super) fn codel(&self) -> Result<Option<[CodelConfig; 3]>, ConfigError> {
        if self.disable_codel {
            return Ok(None);
        }
        let interval = match self.codel_interval_ms {
            0 => return Err(invalid("codel-interval-ms", "must be at least 1")),
            ms => Duration::from_millis(ms),
        };
        let targets: [u64; 3] = match (
            self.codel_target_ms,
            self.codel_target_ms_by_tier.as_slice(),
        ) {
            (Some(all), _) => [all; 3],
            (None, [a, b, c]) => [*a, *b, *c],
            (None, other) => {
                return Err(invalid(
                    "codel-target-ms-by-tier",
                    format!(
                        "{} values: give three, INTERACTIVE,AGENT,BATCH",
                        other.len()
                    ),
                ))
            }
        };
        if targets.contains(&0) {
            return Err(invalid("codel-target-ms", "a target must be at least 1 ms"));
        }
        Ok(Some(targets.map(|target| CodelConfig {
            target: Duration::from_millis(target),
            interval,
        })))
    }
}
