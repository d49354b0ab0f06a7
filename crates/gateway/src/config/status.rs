//! The service-level objectives (what "within SLO" means on the status page, in
//! `sluice_slo_attained_total` and in the bench) and the status page's own settings.

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use sluice_core::slo::{Slo, Slos};

use super::checks::invalid;
use super::ConfigError;

/// SLO and status page flags (`sluice serve --help`, "SLOs and the status page").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct StatusSettings {
    /// Per-tier objectives for the time to first token, `INTERACTIVE,AGENT,BATCH` milliseconds
    /// from the request's arrival (0: none). An answer that completes within its tier's TTFT and
    /// TPOT objectives counts in sluice_slo_attained_total, else in sluice_slo_missed_total.
    #[arg(long, value_delimiter = ',', value_name = "MS", default_values_t = default_ttft())]
    #[serde(default = "default_ttft")]
    #[arg(help_heading = "SLOs and the status page")]
    pub slo_ttft_ms_by_tier: Vec<u64>,

    /// Per-tier objectives for the mean time per output token after the first,
    /// `INTERACTIVE,AGENT,BATCH` milliseconds (0: none); judged on streamed answers, whose
    /// tokens the gateway sees arrive.
    #[arg(long, value_delimiter = ',', value_name = "MS", default_values_t = default_tpot())]
    #[serde(default = "default_tpot")]
    #[arg(help_heading = "SLOs and the status page")]
    pub(crate) slo_tpot_ms_by_tier: Vec<u64>,

    /// Do not serve the status page (`/ui`) and its live feed.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "SLOs and the status page")]
    pub(crate) disable_ui: bool,

    /// How often the status page's live feed sends an update while someone watches (once a
    /// second otherwise, so the charts have a history when the page opens).
    #[arg(long, default_value_t = 250, value_name = "MS")]
    #[serde(default = "default_interval")]
    #[arg(help_heading = "SLOs and the status page")]
    pub(crate) ui_interval_ms: u64,
}

fn default_ttft() -> Vec<u64> {
    millis_by_tier(|slo| slo.ttft)
}

fn default_tpot() -> Vec<u64> {
    millis_by_tier(|slo| slo.tpot)
}

fn millis_by_tier(field: impl Fn(Slo) -> Option<Duration>) -> Vec<u64> {
    let slos = Slos::default();
    sluice_core::admission::Tier::ALL
        .iter()
        .map(|&tier| field(slos.of(tier)).map_or(0, |d| d.as_millis() as u64))
        .collect()
}

fn default_interval() -> u64 {
    250
}

/// The status page, when on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UiConfig {
    /// Between updates while the feed has a watcher.
    pub interval: Duration,
}

impl StatusSettings {
    pub(super) fn slos(&self) -> Result<Slos, ConfigError> {
        let ttft = three("slo-ttft-ms-by-tier", &self.slo_ttft_ms_by_tier)?;
        let tpot = three("slo-tpot-ms-by-tier", &self.slo_tpot_ms_by_tier)?;
        Ok(Slos::new([0, 1, 2].map(|i| Slo {
            ttft: ttft[i],
            tpot: tpot[i],
        })))
    }

    pub(super) fn ui(&self) -> Result<Option<UiConfig>, ConfigError> {
        if self.disable_ui {
            return Ok(None);
        }
        if !(10..=60_000).contains(&self.ui_interval_ms) {
            return Err(invalid(
                "ui-interval-ms",
                format!("{} is not between 10 and 60000", self.ui_interval_ms),
            ));
        }
        Ok(Some(UiConfig {
            interval: Duration::from_millis(self.ui_interval_ms),
        }))
    }
}

fn three(setting: &'static str, ms: &[u64]) -> Result<[Option<Duration>; 3], ConfigError> {
    match ms {
        [a, b, c] => Ok([*a, *b, *c].map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))),
        other => Err(invalid(
            setting,
            format!(
                "{} values: give three, INTERACTIVE,AGENT,BATCH",
                other.len()
            ),
        )),
    }
}
