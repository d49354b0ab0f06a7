//! Service discovery's settings: where workers are listed besides `--worker-urls` and the admin
//! API (SMG's flag names where SMG has the feature).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{invalid, positive_seconds};
use super::ConfigError;
use crate::control::discovery::{
    parse_target, DiscoveryConfig, DnsConfig, FileConfig, SystemResolver,
};

/// Service-discovery flags (`sluice serve --help`, "Service discovery").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct DiscoverySettings {
    /// Which discovery to run: `file` (needs --discovery-file) or `dns` (needs
    /// --discovery-dns). Optional: giving the source's own flag is enough.
    #[arg(long, value_name = "PROVIDER")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub discovery_provider: Option<String>,

    /// A file listing workers (JSON, or TOML when it ends in .toml): a list of URLs or worker
    /// specs as POST /workers takes them, or an object with such a `workers` list. Reread as
    /// soon as it changes, on SIGHUP and every --discovery-check-interval-secs; listed workers
    /// are registered, re-registered when their spec changes, and drained when no longer
    /// listed. A file that does not parse changes nothing and is logged. It may be written
    /// after the gateway starts.
    #[arg(long, value_name = "PATH")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub discovery_file: Option<PathBuf>,

    /// Register one worker per address NAME resolves to, reached on PORT (a Kubernetes headless
    /// Service finds its Ready pods this way, with no RBAC). Resolved at start and every
    /// --discovery-check-interval-secs; a failed lookup changes nothing.
    #[arg(long, value_name = "NAME:PORT")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub discovery_dns: Option<String>,

    /// Seconds between periodic rereads of --discovery-file (also reread as soon as it changes)
    /// and between lookups of --discovery-dns.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    #[arg(help_heading = "Service discovery")]
    pub discovery_check_interval_secs: f64,
}

impl DiscoverySettings {
    /// Some source registers workers.
    pub(super) fn any(&self) -> bool {
        self.discovery_file.is_some() || self.discovery_dns.is_some()
    }

    pub(super) fn validate(&self) -> Result<DiscoveryConfig, ConfigError> {
        let every = positive_seconds(
            "discovery-check-interval-secs",
            self.discovery_check_interval_secs,
        )?;
        match self.discovery_provider.as_deref() {
            None => {}
            Some("file") if self.discovery_file.is_none() => {
                return Err(invalid("discovery-provider", "file needs --discovery-file"))
            }
            Some("dns") if self.discovery_dns.is_none() => {
                return Err(invalid("discovery-provider", "dns needs --discovery-dns"))
            }
            Some("file" | "dns") => {}
            Some("kubernetes") => {
                return Err(invalid(
                    "discovery-provider",
                    "Kubernetes discovery is not built yet: list the pods behind a headless Service with --discovery-dns NAME:PORT",
                ))
            }
            Some(other) => {
                return Err(invalid(
                    "discovery-provider",
                    format!("'{other}' is not one of file, dns"),
                ))
            }
        }
        let dns = match &self.discovery_dns {
            Some(target) => {
                let (name, port) = parse_target(target).map_err(|e| invalid("discovery-dns", e))?;
                Some(DnsConfig {
                    name,
                    port,
                    every,
                    resolver: Arc::new(SystemResolver),
                })
            }
            None => None,
        };
        Ok(DiscoveryConfig {
            file: self
                .discovery_file
                .clone()
                .map(|path| FileConfig { path, every }),
            dns,
        })
    }
}
