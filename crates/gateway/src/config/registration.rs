//! A worker's joining and leaving: how often one not yet reached is tried, how long it may take
//! to start, and how long one being removed settles. The control loops take the first three
//! (`ControlSettings`), the fleet the last (`FleetSettings`).

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{positive_seconds, seconds};
use super::ConfigError;

/// The registration flags (`sluice serve --help`, "Workers").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct RegistrationSettings {
    /// How often a worker that could not be reached at registration is tried again
    /// (`--worker-startup-check-interval`, SMG's name, is the same flag).
    #[arg(long, alias = "worker-startup-check-interval", default_value_t = 5.0)]
    #[arg(help_heading = "Workers")]
    pub worker_startup_check_interval_secs: f64,

    /// A worker registration has not reached within this long is Failed (and removed under
    /// --remove-unhealthy-workers); it is still asked, and can join later. SMG's flag and default
    /// (large models take long to load); 0: wait forever.
    #[arg(long, default_value_t = 1800.0)]
    #[arg(help_heading = "Workers")]
    pub worker_startup_timeout_secs: f64,

    /// Seconds before a new worker is first asked what it serves (SMG's flag): for engines known
    /// to take a while to start, so the first attempts do not log them as unreachable.
    #[arg(long, default_value_t = 0.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) worker_startup_delay: f64,

    /// Seconds between reads of a registered worker's `/v1/models`, so that the LoRA adapters
    /// loaded or unloaded on it at run time are routed to (0: read once, at registration).
    #[arg(long, default_value_t = 10.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) worker_models_refresh_secs: f64,

    /// Seconds one call to a worker's LoRA adapter load or unload endpoint may take, when the
    /// gateway loads an adapter its spec's `lora` block names (the request waiting for it is
    /// bounded by its own deadline too).
    #[arg(long, default_value_t = 60.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) adapter_load_timeout_secs: f64,

    /// Seconds a Ready worker being removed takes no new requests before it goes (0: at once).
    #[arg(long, default_value_t = 5.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) drain_settle_secs: f64,
}

impl RegistrationSettings {
    /// `--worker-startup-check-interval-secs`.
    pub(super) fn check_interval(&self) -> Result<Duration, ConfigError> {
        positive_seconds(
            "worker-startup-check-interval-secs",
            self.worker_startup_check_interval_secs,
        )
    }

    /// `--worker-startup-delay`.
    pub(super) fn delay(&self) -> Result<Duration, ConfigError> {
        seconds("worker-startup-delay", self.worker_startup_delay)
    }

    /// `--worker-startup-timeout-secs`; 0: none.
    pub(super) fn timeout(&self) -> Result<Option<Duration>, ConfigError> {
        let timeout = seconds(
            "worker-startup-timeout-secs",
            self.worker_startup_timeout_secs,
        )?;
        Ok(Some(timeout).filter(|t| !t.is_zero()))
    }

    /// `--worker-models-refresh-secs`; 0: never.
    pub(super) fn models_refresh(&self) -> Result<Option<Duration>, ConfigError> {
        let every = seconds(
            "worker-models-refresh-secs",
            self.worker_models_refresh_secs,
        )?;
        Ok(Some(every).filter(|t| !t.is_zero()))
    }

    /// `--adapter-load-timeout-secs`.
    pub(super) fn adapter_load_timeout(&self) -> Result<Duration, ConfigError> {
        positive_seconds("adapter-load-timeout-secs", self.adapter_load_timeout_secs)
    }

    /// `--drain-settle-secs`.
    pub(super) fn drain_settle(&self) -> Result<Duration, ConfigError> {
        seconds("drain-settle-secs", self.drain_settle_secs)
    }
}
