//! Settings in, a validated `Config` out.
//!
//! `Settings` is what people type (flags, or the same keys in `--config sluice.toml`). `load`
//! merges the two: a flag given on the command line (or through its environment variable) wins,
//! then the file, then the flag's default. `Settings::validate` is the one place values are
//! checked; everything downstream takes `Config` and re-checks nothing.
//!
//! Layout: each section owns its flags and builds the config of what consumes it, which takes it
//! whole; `Config` holds only those outputs.
//! - `settings`: `Settings`, the sections flattened (their order is `--help`'s and the file's).
//! - `listen` (`ListenConfig`: the listeners), `access` (`http::Access`: keys, CORS), `intake`
//!   (`front::FrontConfig`), `routing` (`route::RouteConfig`, the prefix index's size, the model
//!   aliases), `upstream` (`UpstreamConfig`, the request timeout), `resilience` (retries,
//!   breakers), `pd` (a pair's workers and window).
//! - The control loops' parts, joined in `sections` into `ControlSettings`: `registration`,
//!   `health`, `overload` (the load monitor, shedding, the overload answer, the interactive
//!   reserve), `liveness`, `adaptive`, `kv_events`.
//! - `admission`, `degradation`, `discovery`, `replicas`, `status`, `telemetry`, `tokens`,
//!   `tls_files`: each its own consumer's config.
//! - `load` merges flags, file and defaults (`smg_defaults`: SMG's); `checks` the shared checks.

mod access;
mod adaptive;
mod admission;
mod checks;
mod degradation;
mod discovery;
mod health;
mod intake;
mod kv_events;
mod listen;
mod liveness;
mod load;
mod overload;
mod pd;
mod registration;
mod replicas;
mod resilience;
mod routing;
mod sections;
mod settings;
pub mod smg;
mod smg_defaults;
mod status;
mod telemetry;
mod tls_files;
mod tokens;
mod upstream;

use std::path::PathBuf;

use axum::http::HeaderName;

pub use access::AccessSettings;
pub use adaptive::AdaptiveSettings;
pub use admission::{AdmissionConfig, AdmissionSettings, TenantConfig, TenantSpec, DEFAULT_TENANT};
pub use degradation::{
    CascadeSpec, ClampSpec, DegradationSettings, DegradationSpec, PruneSpec, ReasoningSpec,
};
pub use discovery::DiscoverySettings;
pub use health::HealthSettings;
pub use intake::IntakeSettings;
pub use listen::{ListenConfig, ListenSettings};
pub use liveness::LivenessSettings;
pub use load::{load, load_with, COMMAND_LINE_ONLY};
pub use overload::OverloadSettings;
pub use registration::RegistrationSettings;
pub use routing::RoutingSettings;
pub use settings::Settings;
pub use smg_defaults::{values as smg_default_values, SMG_QUEUE};
pub use status::{StatusSettings, UiConfig};
pub use telemetry::{TelemetryConfig, TelemetrySettings};
pub use tls_files::TlsSettings;
pub use upstream::UpstreamSettings;

use checks::{invalid, parse_host};

use crate::fleet::WorkerSpec;
pub use crate::forward::{ForwardConfig, RetryConfig};
pub use crate::front::RequestLimits;
pub use crate::http::CorsOrigins;
pub use crate::upstream::UpstreamConfig;

/// Header names from a flag's list, each checked.
fn header_names(setting: &'static str, names: &[String]) -> Result<Vec<HeaderName>, ConfigError> {
    names
        .iter()
        .map(|h| {
            HeaderName::try_from(h.trim()).map_err(|e| invalid(setting, format!("'{h}': {e}")))
        })
        .collect()
}

/// Why the settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--{setting}: {message}")]
    Invalid {
        setting: &'static str,
        message: String,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--{setting}: {source}")]
    Tls {
        setting: &'static str,
        source: crate::tls::TlsError,
    },
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("{path}:{line}:{column}: unknown setting `{key}` (the flag's name in snake_case, as --print-config writes it)")]
    UnknownKey {
        path: PathBuf,
        key: String,
        line: usize,
        column: usize,
    },
    #[error(transparent)]
    Cli(#[from] clap::Error),
    #[error("SMG's defaults do not fit the settings: {0}")]
    Defaults(toml::de::Error),
    #[error("cannot render the settings as TOML: {0}")]
    Render(#[from] toml::ser::Error),
}

impl Settings {
    /// The key sent to workers that have none of their own: `--worker-api-key`, else — SMG's
    /// meaning of `--api-key` — the one client key when exactly one is given.
    pub fn default_worker_key(&self) -> Option<String> {
        self.worker_api_key
            .clone()
            .or_else(|| match self.access.api_keys.as_slice() {
                [only] => Some(only.clone()),
                _ => None,
            })
    }

    /// The settings as a TOML file `--config` would accept.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        Ok(toml::to_string(self)?)
    }

    /// The settings and a command's own (`load_with`'s) as one TOML file `--config` would
    /// accept.
    pub fn to_toml_with<T: serde::Serialize>(&self, own: &T) -> Result<String, ConfigError> {
        let mut table = toml::Table::try_from(self)?;
        table.extend(toml::Table::try_from(own)?);
        Ok(toml::to_string(&table)?)
    }

    pub fn validate(&self) -> Result<Config, ConfigError> {
        let slos = self.status.slos()?;
        Ok(Config {
            listener: self.listen.validate(self.listen_tls()?)?,
            workers: self.workers()?,
            route: self
                .routing
                .route(&self.pd, self.overload.shedding(), slos)?,
            fleet: self.fleet()?,
            access: self.access.validate()?,
            front: self.intake.validate(self.overload.answers()?)?,
            upstream: self.upstream.validate(
                self.upstream_tls()?,
                crate::tokens::SharedTokens::new(self.tokens()?),
            )?,
            forward: self.forward()?,
            control: self.control()?,
            admission: self.admission.validate(admission::Joined {
                client_keys: &self.access.api_keys,
                shedding: self.overload.shedding(),
                codel: self.adaptive.codel()?,
                slos: &slos,
                request_timeout: self.upstream.request_timeout()?,
                aliases: self.routing.model_aliases()?,
            })?,
            degradation: self
                .degradation
                .validate(self.adaptive.codel()?, self.overload.load()?.interval)?,
            discovery: self.discovery.validate()?,
            shared: self.replicas.validate(
                &self.tls.ca_cert_paths,
                self.tls
                    .client_cert_path
                    .as_deref()
                    .zip(self.tls.client_key_path.as_deref()),
            )?,
            ui: self.status.ui()?,
            telemetry: self.telemetry.validate(slos, self.smg_defaults)?,
        })
    }

    /// `--worker-urls` and the disaggregated `--prefill`/`--decode` workers.
    fn workers(&self) -> Result<Vec<WorkerSpec>, ConfigError> {
        let mut workers = self
            .worker_urls
            .iter()
            .map(|url| {
                WorkerSpec::from_url(url, self.default_worker_key())
                    .map_err(|e| invalid("worker-urls", e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        workers.extend(self.pd.workers(self.default_worker_key())?);
        let pd_selectors = !self.discovery.prefill_selector.is_empty()
            || !self.discovery.decode_selector.is_empty();
        if pd_selectors && !self.pd.pd_disaggregation {
            return Err(invalid(
                "prefill-selector",
                "--prefill-selector and --decode-selector need --pd-disaggregation",
            ));
        }
        Ok(workers)
    }

    /// The forward stage's retries and a pair's window.
    fn forward(&self) -> Result<ForwardConfig, ConfigError> {
        Ok(ForwardConfig {
            retry: self.resilience.retry()?,
            pd: crate::forward::PdConfig {
                admission_wait: self.pd.admission_wait()?,
                window: !self.pd.disable_pd_admission_window,
                wedge: self.liveness.wedge()?,
            },
        })
    }

    /// What the fleet keeps of its workers, from its own flags (what it borrows of other
    /// sections is read where it is when the gateway is assembled: `fleet::Borrowed`).
    fn fleet(&self) -> Result<crate::fleet::FleetSettings, ConfigError> {
        Ok(crate::fleet::FleetSettings {
            breaker: self.resilience.breaker()?,
            prefix_capacity: self.routing.prefix_capacity(),
            interactive_reserve: self.overload.interactive_reserve()?,
            drain_settle: self.registration.drain_settle()?,
            default_worker_key: self.default_worker_key(),
            room_by_prediction: self
                .routing
                .predicts()
                .then(|| self.status.slos())
                .transpose()?,
        })
    }
}

/// The validated configuration of one gateway: each field is one settings section's output,
/// taken whole by what consumes it.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where and how it listens: its address, TLS, connection bounds, probe and metrics ports.
    pub listener: ListenConfig,
    /// Workers registered at startup.
    pub workers: Vec<WorkerSpec>,
    /// How the route stage picks: the policies, the routing key, shedding.
    pub route: crate::route::RouteConfig,
    /// What the fleet keeps of its workers: their circuits, the prefix index, the interactive
    /// reserve, the drain, the default key (what it borrows of other sections: `fleet::Borrowed`).
    pub fleet: crate::fleet::FleetSettings,
    /// Who may call: the keys a request must carry (tenants' keys join them from admission when
    /// the gateway is assembled), whether admin reads need one, the origins browsers may use.
    pub access: crate::http::Access,
    /// What a request may send and ask for, where its id is read from, how refusals are answered.
    pub front: crate::front::FrontConfig,
    /// How worker connections are made, secured and pooled, and which protocol by default.
    pub upstream: UpstreamConfig,
    /// The forward stage's retries and a disaggregated pair's window.
    pub forward: ForwardConfig,
    /// What the control loops that watch each worker run by: registration, probes, load polls,
    /// liveness, adaptive limits, KV events. Passed whole to `Control`.
    pub control: crate::control::ControlSettings,
    /// Tenants, tiers, the gateway-wide caps, the request timeout, the model aliases.
    pub admission: AdmissionConfig,
    /// The degradation ladder (`[degradation]`, `[[cascade]]`); `None`: off.
    pub(crate) degradation: Option<crate::admit::degrade::DegradationConfig>,
    /// `--discovery-file`, `--discovery-dns`.
    pub discovery: crate::control::discovery::DiscoveryConfig,
    /// `--redis-url`: budgets and caps shared with the other replicas.
    pub shared: Option<crate::shared::SharedConfig>,
    /// The status page; `None` with `--disable-ui`.
    pub ui: Option<UiConfig>,
    /// What is recorded besides serving: the access log, traces, the histograms' buckets, the
    /// objectives counted against.
    pub telemetry: TelemetryConfig,
}

impl Config {
    /// The connection bounds of each listener (`ListenConfig::limits`), for these workers.
    pub(crate) fn connection_limits(&self) -> crate::http::Limits {
        let every_worker_http2 =
            self.upstream.http2 && self.workers.iter().all(|w| w.http2 != Some(false));
        self.listener.limits(every_worker_http2, self.workers.len())
    }

    /// The defaults, listening on an ephemeral loopback port: what tests start from.
    pub fn local(worker_urls: &[String]) -> Self {
        let mut settings = Settings::defaults();
        settings.listen.port = 0;
        settings.worker_urls = worker_urls.to_vec();
        #[allow(clippy::expect_used)]
        settings.validate().expect("the defaults are valid")
    }
}

impl Settings {
    /// Every setting at its default.
    pub fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            settings: Settings,
        }
        use clap::Parser;
        #[allow(clippy::expect_used)]
        Only::try_parse_from(["sluice"])
            .expect("the defaults parse")
            .settings
    }
}

#[cfg(test)]
mod tests;
