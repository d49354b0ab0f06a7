//! The listeners' settings: where the gateway serves its clients, how many at once, how long a
//! connection may take to send its head, its probe and metrics ports, and how long shutdown
//! waits. They build `ListenConfig`, which the gateway's listening takes whole.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{positive_count, positive_seconds, seconds};
use super::{parse_host, ConfigError};

/// The listener flags (`sluice serve --help`, "Listener", and the probe and metrics ports).
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct ListenSettings {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    #[arg(help_heading = "Listener")]
    pub(crate) host: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 30000)]
    #[arg(help_heading = "Listener")]
    pub port: u16,

    /// Time a client has to send a complete request head: from connecting (whatever it sends
    /// meanwhile — nothing, a byte, an HTTP/2 preface) or from the end of its previous response,
    /// so it also bounds an idle HTTP/1.1 keep-alive connection.
    #[arg(long, default_value_t = 10.0)]
    #[arg(help_heading = "Listener")]
    pub(crate) header_read_timeout_secs: f64,

    /// Client connections served at once, per listener; more wait in the kernel's backlog. Capped
    /// at startup to half of what the open-file limit leaves after 64 for the rest, since each
    /// busy connection also holds one to a worker; with --upstream-http2 (and no worker spec
    /// saying otherwise) to all of it but one per worker, as workers then take one connection each.
    #[arg(long, default_value_t = 8192)]
    #[arg(help_heading = "Listener")]
    pub(crate) max_connections: usize,

    /// Longest wait, on SIGTERM, for requests in flight to finish.
    #[arg(long, default_value_t = 180.0)]
    #[arg(help_heading = "Listener")]
    pub(crate) shutdown_grace_period_secs: f64,

    /// Also serve /liveness, /readiness and /health on this port, from a thread and runtime of
    /// their own, so a saturated gateway still answers its probes.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Health checks")]
    pub(crate) health_check_port: Option<u16>,

    /// Also serve /metrics on this port.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Metrics and logs")]
    pub(crate) prometheus_port: Option<u16>,

    /// Address of the --prometheus-port listener.
    #[arg(long, default_value = "127.0.0.1")]
    #[arg(help_heading = "Metrics and logs")]
    pub(crate) prometheus_host: String,
}

/// Where and how the gateway listens, passed whole to its listening.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    /// `--host`, `--port`: the OpenAI routes, admin and probes.
    pub addr: SocketAddr,
    /// `--tls-cert-path`, `--tls-key-path`: the listener serves HTTPS.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// `--header-read-timeout-secs`: a connection's time to send a request head.
    pub header_read_timeout: Duration,
    /// `--max-connections` as asked; `ListenConfig::limits` caps it by the open-file limit.
    pub max_connections: usize,
    /// `--health-check-port`: the probes' own listener, on a thread of its own.
    pub health: Option<SocketAddr>,
    /// `--prometheus-port` on `--prometheus-host`: `/metrics` on a listener of its own.
    pub(crate) metrics: Option<SocketAddr>,
    /// `--shutdown-grace-period-secs`: how long shutdown waits for requests in flight.
    pub(crate) shutdown_grace: Duration,
}

impl ListenSettings {
    /// The listeners, serving HTTPS with `tls` when the TLS settings give an identity.
    pub(super) fn validate(
        &self,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<ListenConfig, ConfigError> {
        let host = parse_host("host", &self.host)?;
        let metrics = self
            .prometheus_port
            .map(|port| parse_host("prometheus-host", &self.prometheus_host).map(|h| (h, port)))
            .transpose()?;
        Ok(ListenConfig {
            addr: SocketAddr::new(host, self.port),
            tls,
            header_read_timeout: positive_seconds(
                "header-read-timeout-secs",
                self.header_read_timeout_secs,
            )?,
            max_connections: positive_count("max-connections", self.max_connections)?,
            health: self
                .health_check_port
                .map(|port| SocketAddr::new(host, port)),
            metrics: metrics.map(|(host, port)| SocketAddr::new(host, port)),
            shutdown_grace: seconds(
                "shutdown-grace-period-secs",
                self.shutdown_grace_period_secs,
            )?,
        })
    }
}

/// How often an idle HTTP/2 client is pinged, and how long it has to answer.
const H2_KEEPALIVE: Duration = Duration::from_secs(20);

/// The soft open-file limit, read from `/proc/self/limits` (Linux); `None` elsewhere or unlimited.
fn open_file_limit() -> Option<usize> {
    sluice_core::room::open_file_limit(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

impl ListenConfig {
    /// The connection bounds of a listener: `--max-connections`, capped so that a flood of
    /// connections cannot take the file descriptors the gateway needs for its `workers` and its
    /// probe port: half of what the open-file limit leaves when a busy client connection holds
    /// one to a worker too (HTTP/1.1), all of it when `every_worker_http2` (one connection each,
    /// whatever the number of streams).
    pub(crate) fn limits(&self, every_worker_http2: bool, workers: usize) -> crate::http::Limits {
        let fds = open_file_limit()
            .map(|files| sluice_core::room::client_connections(files, every_worker_http2, workers));
        let max_connections = match fds {
            Some(room) if room < self.max_connections => {
                tracing::warn!(
                    asked = self.max_connections,
                    capped = room,
                    "--max-connections capped by the open-file limit (ulimit -n)"
                );
                room
            }
            _ => self.max_connections,
        };
        crate::http::Limits {
            header_read: self.header_read_timeout,
            max_connections,
            h2_keepalive: H2_KEEPALIVE,
        }
    }
}
