//! Settings in, a validated `Config` out.
//!
//! `Settings` is what people type (flags, or the same keys in `--config sluice.toml`). `load`
//! merges the two: a flag given on the command line (or through its environment variable) wins,
//! then the file, then the flag's default. `Settings::validate` is the one place values are
//! checked; everything downstream takes `Config` and re-checks nothing.

mod adaptive;
mod admission;
mod checks;
mod degradation;
mod discovery;
mod intake;
mod kv_events;
mod listen;
mod load;
mod pd;
mod replicas;
mod resilience;
mod sections;
mod settings;
pub mod smg;
mod smg_defaults;
mod status;
mod telemetry;
mod tls_files;
mod tokens;

use std::path::PathBuf;
use std::time::Duration;

use axum::http::HeaderName;

pub use adaptive::AdaptiveSettings;
pub use admission::{AdmissionConfig, AdmissionSettings, TenantConfig, TenantSpec, DEFAULT_TENANT};
pub use degradation::{
    CascadeSpec, ClampSpec, DegradationSettings, DegradationSpec, PruneSpec, ReasoningSpec,
};
pub use discovery::DiscoverySettings;
pub use intake::IntakeSettings;
pub use listen::{ListenConfig, ListenSettings};
pub use load::{load, load_with, COMMAND_LINE_ONLY};
pub use settings::Settings;
pub use smg_defaults::{values as smg_default_values, SMG_QUEUE};
pub use status::{StatusSettings, UiConfig};
pub use tls_files::TlsSettings;

use checks::{invalid, non_empty_keys, parse_host, positive_seconds, seconds};

use crate::fleet::WorkerSpec;
pub use crate::forward::RetryConfig;
pub use crate::front::RequestLimits;
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

/// Characters of prompt per prefix block of the cache-aware index (`route`'s block size).
const PREFIX_BLOCK_CHARS: usize = 64;

/// Which origins a browser may call the gateway from.
#[derive(Debug, Clone, PartialEq)]
pub enum CorsOrigins {
    Any,
    List(Vec<axum::http::HeaderValue>),
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
    /// `--cors-allowed-origins`, checked: `*` alone, or origins that are header values.
    fn cors(&self) -> Result<Option<CorsOrigins>, ConfigError> {
        let origins = &self.cors_allowed_origins;
        if origins.is_empty() {
            return Ok(None);
        }
        if origins.iter().any(|o| o == "*") {
            if origins.len() > 1 {
                return Err(invalid("cors-allowed-origins", "'*' stands alone"));
            }
            return Ok(Some(CorsOrigins::Any));
        }
        origins
            .iter()
            .map(|o| {
                axum::http::HeaderValue::try_from(o.trim())
                    .map_err(|_| invalid("cors-allowed-origins", format!("'{o}' is not an origin")))
            })
            .collect::<Result<_, _>>()
            .map(|list| Some(CorsOrigins::List(list)))
    }

    /// `--model-alias ALIAS=MODEL` pairs, checked: both named, an alias once, not a model itself.
    fn model_aliases(
        &self,
    ) -> Result<std::collections::HashMap<String, sluice_core::ModelName>, ConfigError> {
        let mut aliases = std::collections::HashMap::new();
        for pair in &self.model_aliases {
            let Some((alias, model)) = pair
                .split_once('=')
                .map(|(a, m)| (a.trim(), m.trim()))
                .filter(|(a, m)| !a.is_empty() && !m.is_empty() && a != m)
            else {
                return Err(invalid(
                    "model-alias",
                    format!("'{pair}' is not ALIAS=MODEL with two different names"),
                ));
            };
            if aliases
                .insert(alias.to_string(), sluice_core::ModelName::new(model))
                .is_some()
            {
                return Err(invalid("model-alias", format!("'{alias}' is given twice")));
            }
        }
        Ok(aliases)
    }

    /// The key sent to workers that have none of their own: `--worker-api-key`, else — SMG's
    /// meaning of `--api-key` — the one client key when exactly one is given.
    pub fn default_worker_key(&self) -> Option<String> {
        self.worker_api_key
            .clone()
            .or_else(|| match self.api_keys.as_slice() {
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
        let retry = self.resilience.retry()?;
        let slos = self.status.slos()?;
        Ok(Config {
            listener: self.listen.validate(self.listen_tls()?)?,
            workers: self.workers()?,
            route: self.route()?,
            pd: self.pd_config()?,
            fleet: self.fleet()?,
            request_id_headers: header_names("request-id-headers", &self.request_id_headers)?,
            model_aliases: self.model_aliases()?,
            cors: self.cors()?,
            keys: self.keys()?,
            admin_reads_open: self.admin_reads_open,
            intake: self.intake.validate()?,
            upstream: self.upstream()?,
            request_timeout: positive_seconds("request-timeout-secs", self.request_timeout_secs)?,
            upstream_http2: self.upstream_http2,
            retry,
            control: self.control()?,
            answers: self.answers()?,
            smg_defaults: self.smg_defaults,
            admission: self.admission.validate(
                &self.api_keys,
                &self.shedding(),
                self.adaptive.codel()?,
                &slos,
            )?,
            degradation: self
                .degradation
                .validate(self.adaptive.codel()?, self.load()?.interval)?,
            access_log: self.access_log.clone(),
            trace: self.trace()?,
            duration_buckets: self.duration_buckets()?,
            slos,
            ui: self.status.ui()?,
            discovery: self.discovery.validate()?,
            shared: self.replicas.validate(
                &self.tls.ca_cert_paths,
                self.tls
                    .client_cert_path
                    .as_deref()
                    .zip(self.tls.client_key_path.as_deref()),
            )?,
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

    fn pd_config(&self) -> Result<crate::forward::PdConfig, ConfigError> {
        Ok(crate::forward::PdConfig {
            admission_wait: self.pd.admission_wait()?,
            window: !self.pd.disable_pd_admission_window,
            wedge: seconds("worker-wedge-secs", self.worker_wedge_secs)?,
        })
    }

    /// What the fleet keeps of its workers, from its own flags (what it borrows of other
    /// sections is read where it is when the gateway is assembled: `fleet::Borrowed`).
    fn fleet(&self) -> Result<crate::fleet::FleetSettings, ConfigError> {
        Ok(crate::fleet::FleetSettings {
            breaker: self.resilience.breaker()?,
            prefix_capacity: (self.max_tree_size / PREFIX_BLOCK_CHARS).max(1),
            interactive_reserve: checks::fraction("interactive-reserve", self.interactive_reserve)?,
            drain_settle: seconds("drain-settle-secs", self.drain_settle_secs)?,
            default_worker_key: self.default_worker_key(),
        })
    }

    /// The keys the flags give; tenants' keys are admission's.
    fn keys(&self) -> Result<crate::http::Keys, ConfigError> {
        Ok(crate::http::Keys {
            client: non_empty_keys("api-key", &self.api_keys)?,
            admin: self.admin_key()?,
            control_plane: self.control_plane_keys()?,
            tenants: Vec::new(),
        })
    }

    fn admin_key(&self) -> Result<Option<String>, ConfigError> {
        Ok(match &self.admin_api_key {
            Some(k) => non_empty_keys("admin-api-key", std::slice::from_ref(k))?.pop(),
            None => None,
        })
    }

    fn control_plane_keys(&self) -> Result<Vec<crate::http::ControlPlaneKey>, ConfigError> {
        self.control_plane_api_keys
            .iter()
            .map(|k| {
                k.parse().map_err(|e: crate::http::ControlPlaneKeyError| {
                    invalid("control-plane-api-keys", e.to_string())
                })
            })
            .collect()
    }

    fn upstream(&self) -> Result<UpstreamConfig, ConfigError> {
        Ok(UpstreamConfig {
            connect_timeout: positive_seconds("connect-timeout-secs", self.connect_timeout_secs)?,
            pool_idle_timeout: seconds(
                "upstream-pool-idle-timeout-secs",
                self.upstream_pool_idle_timeout_secs,
            )?,
            tls: self.upstream_tls()?,
            tokens: crate::tokens::SharedTokens::new(self.tokens()?),
        })
    }

    /// `--worker-startup-timeout-secs`; 0: none.
    fn startup_timeout(&self) -> Result<Option<Duration>, ConfigError> {
        let timeout = seconds(
            "worker-startup-timeout-secs",
            self.worker_startup_timeout_secs,
        )?;
        Ok(Some(timeout).filter(|t| !t.is_zero()))
    }
}

/// The validated configuration of one gateway.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where and how it listens: its address, TLS, connection bounds, probe and metrics ports.
    pub listener: ListenConfig,
    /// Workers registered at startup.
    pub workers: Vec<WorkerSpec>,
    /// How the route stage picks: the policies, the routing key, shedding.
    pub route: crate::route::RouteConfig,
    /// The decode admission window and the prefill leg's silence bound.
    pub pd: crate::forward::PdConfig,
    /// What the fleet keeps of its workers: their circuits, the prefix index, the interactive
    /// reserve, the drain, the default key (what it borrows of other sections: `fleet::Borrowed`).
    pub fleet: crate::fleet::FleetSettings,
    /// `--request-id-headers`, in order of precedence.
    pub request_id_headers: Vec<HeaderName>,
    /// `--cors-allowed-origins`; `None`: no cross-origin allowance.
    pub cors: Option<CorsOrigins>,
    /// `--model-alias`: alias -> the served model it names.
    pub model_aliases: std::collections::HashMap<String, sluice_core::ModelName>,
    /// `--admin-reads-open`: admin reads need no key.
    pub admin_reads_open: bool,
    /// The keys a request must carry: clients' (`--api-key`), the admin's (`--admin-api-key`),
    /// the control plane's (`--control-plane-api-keys`); tenants' keys join them from admission
    /// when the gateway is assembled.
    pub keys: crate::http::Keys,
    /// What a request may send and ask for, and how long its body may take.
    pub intake: crate::front::Intake,
    /// How worker connections are made, secured and pooled.
    pub upstream: UpstreamConfig,
    pub request_timeout: Duration,
    pub upstream_http2: bool,
    pub retry: RetryConfig,
    /// What the control loops that watch each worker run by: registration, probes, load polls,
    /// liveness, adaptive limits, KV events. Passed whole to `Control`.
    pub control: crate::control::ControlSettings,
    /// `--discovery-file`, `--discovery-dns`.
    pub discovery: crate::control::discovery::DiscoveryConfig,
    /// `--redis-url`: budgets and caps shared with the other replicas.
    pub shared: Option<crate::shared::SharedConfig>,
    /// How refusals are answered (`--overload-status-code`).
    pub answers: crate::front::Answers,
    /// `--smg-defaults`: what was not given took SMG's default (said in the startup log).
    pub(crate) smg_defaults: bool,
    /// Tenants, tiers and the gateway-wide caps.
    pub admission: AdmissionConfig,
    /// The degradation ladder (`[degradation]`, `[[cascade]]`); `None`: off.
    pub(crate) degradation: Option<crate::admit::degrade::DegradationConfig>,
    pub access_log: Option<PathBuf>,
    /// `--enable-trace` and its settings; `None`: off.
    pub trace: Option<crate::trace::TraceConfig>,
    /// `--prometheus-duration-buckets`; `None`: the defaults.
    pub duration_buckets: Option<Vec<f64>>,
    /// `--slo-ttft-ms-by-tier`, `--slo-tpot-ms-by-tier`.
    pub slos: sluice_core::slo::Slos,
    /// The status page; `None` with `--disable-ui`.
    pub ui: Option<UiConfig>,
}

impl Config {
    /// The connection bounds of each listener (`ListenConfig::limits`), for these workers.
    pub(crate) fn connection_limits(&self) -> crate::http::Limits {
        let every_worker_http2 =
            self.upstream_http2 && self.workers.iter().all(|w| w.http2 != Some(false));
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
