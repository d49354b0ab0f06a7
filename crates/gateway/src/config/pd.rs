//! Prefill/decode disaggregation's settings, with SMG's flag names: the prefill and decode
//! workers, each side's policy, and the decode admission window (seed 000).

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{invalid, seconds};
use super::ConfigError;
use crate::fleet::{WorkerSpec, WorkerType};

/// Disaggregation flags (`sluice serve --help`, "Prefill/decode disaggregation").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub(crate) struct PdSettings {
    /// Serve the models of --prefill and --decode workers disaggregated: each request goes to a
    /// prefill worker and a decode worker at once (SGLang's bootstrap protocol), and the decode
    /// worker's answer is relayed. Other models' --worker-urls are served as usual.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Prefill/decode disaggregation")]
    pub(crate) pd_disaggregation: bool,

    /// A prefill worker and its bootstrap server's port, `URL [BOOTSTRAP_PORT|none]` (none, or
    /// left out: it has none). Repeatable. In a config file, a list in the same order:
    /// `prefill = ["http://p1:8000", "8998", "http://p2:8000"]`.
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append)]
    #[serde(default)]
    #[arg(help_heading = "Prefill/decode disaggregation")]
    pub(crate) prefill: Vec<String>,

    /// A decode worker. Repeatable.
    #[arg(long, value_name = "URL")]
    #[serde(default)]
    #[arg(help_heading = "Prefill/decode disaggregation")]
    pub(crate) decode: Vec<String>,

    /// The policy that picks a prefill worker (the --policy names) [default: --policy].
    #[arg(long, value_name = "POLICY")]
    #[serde(default)]
    #[arg(help_heading = "Prefill/decode disaggregation")]
    pub(crate) prefill_policy: Option<String>,

    /// The policy that picks a decode worker [default: --policy].
    #[arg(long, value_name = "POLICY")]
    #[serde(default)]
    #[arg(help_heading = "Prefill/decode disaggregation")]
    pub(crate) decode_policy: Option<String>,

    /// How long a disaggregated request waits for room in a decode worker's running window
    /// (never more requests in flight to it than its engine's max_running_requests, or its
    /// spec's) before it is shed with 503 worker_overload_shed and Retry-After; 0 sheds as soon
    /// as the window is full. Keep it well under the engines' bootstrap deadline.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    #[serde(default = "default_wait")]
    #[arg(help_heading = "Prefill/decode disaggregation")]
    pub(crate) pd_admission_wait_secs: f64,

    /// Do not gate decode workers by their running window (sluice's own flag): every
    /// disaggregated request is dispatched at once, as SMG's HTTP router does. For comparisons;
    /// a burst wider than the decode windows then expires prefill bootstraps.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Prefill/decode disaggregation")]
    pub(crate) disable_pd_admission_window: bool,
}

fn default_wait() -> f64 {
    30.0
}

impl PdSettings {
    /// The --prefill and --decode workers' specs.
    pub(super) fn workers(&self, key: Option<String>) -> Result<Vec<WorkerSpec>, ConfigError> {
        if !self.pd_disaggregation {
            if !self.prefill.is_empty() || !self.decode.is_empty() {
                return Err(invalid(
                    "prefill",
                    "--prefill and --decode workers need --pd-disaggregation",
                ));
            }
            return Ok(Vec::new());
        }
        let mut specs: Vec<WorkerSpec> = Vec::new();
        // The values come flat: a port (or none) belongs to the URL before it.
        let mut port_allowed = false;
        for value in &self.prefill {
            let port = if value == "none" {
                Some(None)
            } else {
                value.parse::<u16>().ok().map(Some)
            };
            match (port, specs.last_mut()) {
                (Some(port), Some(spec)) if port_allowed => {
                    if port == Some(0) {
                        return Err(invalid("prefill", "bootstrap port 0 is not a port"));
                    }
                    spec.bootstrap_port = port;
                    port_allowed = false;
                }
                (Some(_), _) => {
                    return Err(invalid(
                        "prefill",
                        format!("{value:?}: expected URL [BOOTSTRAP_PORT|none]"),
                    ))
                }
                (None, _) => {
                    let mut spec = WorkerSpec::from_url(value, key.clone())
                        .map_err(|e| invalid("prefill", e.to_string()))?;
                    spec.worker_type = WorkerType::Prefill;
                    specs.push(spec);
                    port_allowed = true;
                }
            }
        }
        for url in &self.decode {
            let mut spec = WorkerSpec::from_url(url, key.clone())
                .map_err(|e| invalid("decode", e.to_string()))?;
            spec.worker_type = WorkerType::Decode;
            specs.push(spec);
        }
        Ok(specs)
    }

    pub(super) fn admission_wait(&self) -> Result<Duration, ConfigError> {
        seconds("pd-admission-wait-secs", self.pd_admission_wait_secs)
    }
}
