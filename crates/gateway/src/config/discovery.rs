//! Service discovery's settings: where workers are listed besides `--worker-urls` and the admin
//! API (SMG's flag names where SMG has the feature).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{invalid, positive_seconds};
use super::ConfigError;
use crate::control::discovery::{
    parse_target, Cluster, DiscoveryConfig, DnsConfig, FileConfig, KubeConfig, Members, ModelFrom,
    Selector, SystemResolver,
};
use crate::fleet::WorkerType;

/// Service-discovery flags (`sluice serve --help`, "Service discovery").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct DiscoverySettings {
    /// Which discovery to run: `kubernetes` (as --service-discovery), `file` (needs
    /// --discovery-file) or `dns` (needs --discovery-dns). Optional: giving the source's own
    /// flag is enough.
    #[arg(long, value_name = "PROVIDER")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) discovery_provider: Option<String>,

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
    pub(crate) discovery_dns: Option<String>,

    /// Watch the pods --selector matches through the Kubernetes API (in-cluster service
    /// account, else the kubeconfig): each Ready pod with an IP is a worker at
    /// http://POD_IP:--service-discovery-port; one that stops being Ready or goes is drained.
    /// Needs get, list and watch on pods.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) service_discovery: bool,

    /// The pods' labels, KEY=VALUE (several after one flag, or the flag repeated).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) selector: Vec<String>,

    /// With --pd-disaggregation: the prefill pods' labels. A pod's bootstrap port is read from
    /// its `sglang.ai/bootstrap-port` annotation (none without one).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) prefill_selector: Vec<String>,

    /// With --pd-disaggregation: the decode pods' labels.
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) decode_selector: Vec<String>,

    /// The port every discovered pod serves on.
    #[arg(long, default_value_t = 80)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) service_discovery_port: u16,

    /// The namespace to watch. Unset: every namespace (needs cluster-wide permissions).
    #[arg(long, value_name = "NAMESPACE")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) service_discovery_namespace: Option<String>,

    /// Each discovered worker's model from pod metadata: `namespace`, `label:KEY` or
    /// `annotation:KEY`. Unset: the model the worker lists at /v1/models.
    #[arg(long, value_name = "SOURCE")]
    #[serde(default)]
    #[arg(help_heading = "Service discovery")]
    pub(crate) model_id_from: Option<String>,

    /// Seconds between periodic rereads of --discovery-file (also reread as soon as it changes)
    /// and between lookups of --discovery-dns.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    #[arg(help_heading = "Service discovery")]
    pub(crate) discovery_check_interval_secs: f64,
}

impl DiscoverySettings {
    /// Some source registers workers.
    pub(super) fn any(&self) -> bool {
        self.kubernetes() || self.discovery_file.is_some() || self.discovery_dns.is_some()
    }

    /// Kubernetes discovery, by either spelling.
    fn kubernetes(&self) -> bool {
        self.service_discovery || self.discovery_provider.as_deref() == Some("kubernetes")
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
            Some("file" | "dns" | "kubernetes") => {}
            Some(other) => {
                return Err(invalid(
                    "discovery-provider",
                    format!("'{other}' is not one of kubernetes, file, dns"),
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
            kubernetes: self.kubernetes_config()?,
        })
    }

    fn kubernetes_config(&self) -> Result<Option<KubeConfig>, ConfigError> {
        if !self.kubernetes() {
            return Ok(None);
        }
        let mut selectors = Vec::new();
        for (flag, given, role) in [
            ("selector", &self.selector, WorkerType::Regular),
            (
                "prefill-selector",
                &self.prefill_selector,
                WorkerType::Prefill,
            ),
            ("decode-selector", &self.decode_selector, WorkerType::Decode),
        ] {
            if !given.is_empty() {
                selectors.push(Selector {
                    labels: labels(flag, given)?,
                    role,
                });
            }
        }
        if selectors.is_empty() {
            return Err(invalid(
                "selector",
                "Kubernetes discovery needs the pods' labels, e.g. --selector app=vllm (or \
                 --prefill-selector and --decode-selector)",
            ));
        }
        if self.service_discovery_port == 0 {
            return Err(invalid("service-discovery-port", "must be a port, not 0"));
        }
        let model_from = match &self.model_id_from {
            Some(text) => Some(
                text.parse::<ModelFrom>()
                    .map_err(|e| invalid("model-id-from", e))?,
            ),
            None => None,
        };
        Ok(Some(KubeConfig {
            members: Members::Selected {
                selectors,
                port: self.service_discovery_port,
            },
            namespace: self.service_discovery_namespace.clone(),
            model_from,
            cluster: Cluster::Infer,
        }))
    }
}

/// `KEY=VALUE` pairs (several in one value, comma-separated) as a label selector.
fn labels(flag: &'static str, given: &[String]) -> Result<String, ConfigError> {
    let mut labels = Vec::new();
    for pair in given.iter().flat_map(|s| s.split(',')) {
        match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                labels.push(format!("{}={}", k.trim(), v.trim()))
            }
            _ => return Err(invalid(flag, format!("'{pair}' is not KEY=VALUE"))),
        }
    }
    Ok(labels.join(","))
}
