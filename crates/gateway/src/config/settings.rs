//! Every setting of `sluice serve`, once: the same struct is the command line (clap) and the
//! TOML file (serde), so a flag and its file key can never drift apart. A file key is the flag's
//! name in snake_case (`--worker-urls` is `worker_urls`).

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::access::AccessSettings;
use super::adaptive::AdaptiveSettings;
use super::admission::AdmissionSettings;
use super::degradation::DegradationSettings;
use super::discovery::DiscoverySettings;
use super::health::HealthSettings;
use super::intake::IntakeSettings;
use super::kv_events::KvEventsSettings;
use super::listen::ListenSettings;
use super::liveness::LivenessSettings;
use super::overload::OverloadSettings;
use super::pd::PdSettings;
use super::registration::RegistrationSettings;
use super::replicas::ReplicaSettings;
use super::resilience::ResilienceSettings;
use super::routing::RoutingSettings;
use super::status::StatusSettings;
use super::telemetry::TelemetrySettings;
use super::tls_files::TlsSettings;
use super::tokens::TokenizerSettings;
use super::upstream::UpstreamSettings;

/// How to run the gateway.
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Read settings from this TOML file; flags given on the command line win over it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    #[arg(help_heading = "Configuration")]
    pub(crate) config: Option<PathBuf>,

    /// Print the effective settings as TOML and exit.
    #[arg(long)]
    #[serde(skip)]
    #[arg(help_heading = "Configuration")]
    pub print_config: bool,

    /// Take SMG 1.13's default for every setting where sluice's differs and that is not given on
    /// the command line, in the environment or in the config file: no gateway queue (SMG queues
    /// only past --max-concurrent-requests, 100 deep), SMG's retry schedule, limits and listen
    /// addresses (docs/migrating-from-smg.md lists each).
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Configuration")]
    pub(crate) smg_defaults: bool,

    /// Where and how the gateway listens.
    #[command(flatten)]
    #[serde(flatten)]
    pub listen: ListenSettings,

    /// Workers to register at startup (OpenAI-compatible base URLs, e.g. http://10.0.0.5:8000).
    #[arg(long, num_args = 1.., value_name = "URL")]
    #[serde(default)]
    #[arg(help_heading = "Workers")]
    pub worker_urls: Vec<String>,

    /// API key sent as a bearer token to workers that have none of their own (the `--worker-urls`
    /// ones, and any registered without `api_key`). Unset: a single --api-key is sent, as in SMG.
    #[arg(
        long,
        value_name = "KEY",
        env = "SLUICE_WORKER_API_KEY",
        hide_env_values = true
    )]
    #[serde(default)]
    #[arg(help_heading = "Workers")]
    pub worker_api_key: Option<String>,

    #[command(flatten)]
    #[serde(flatten)]
    pub routing: RoutingSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub access: AccessSettings,

    /// What a request may send and ask for, and how long its body may take.
    #[command(flatten)]
    #[serde(flatten)]
    pub intake: IntakeSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub upstream: UpstreamSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) resilience: ResilienceSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub registration: RegistrationSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub health: HealthSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub overload: OverloadSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub liveness: LivenessSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub telemetry: TelemetrySettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub admission: AdmissionSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub adaptive: AdaptiveSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub degradation: DegradationSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub discovery: DiscoverySettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) replicas: ReplicaSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) pd: PdSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub status: StatusSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) tokenizer: TokenizerSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) kv_events: KvEventsSettings,

    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsSettings,
}
