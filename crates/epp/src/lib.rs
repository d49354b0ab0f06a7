//! sluice as a Gateway API endpoint picker (`sluice epp`).
//!
//! A conformant gateway (Envoy Gateway, Istio, kgateway, GKE's, a plain Envoy) calls an endpoint
//! picker for every request through Envoy's external processing protocol (ext_proc, gRPC), and
//! sends the request where the picker says. Behind that protocol sits the whole of `sluice
//! serve`'s request path up to the choice of a worker — keys, tenants, tiers, budgets, deadlines,
//! the fair queue, CoDel, the ladder, the engines' ceilings and the liveness vetoes — and the
//! answer comes back through the picker, so time to first token, usage settlement, error events,
//! cancellation and the adaptive and liveness signals work as they do there. Only the exchange
//! with the worker is the data plane's (and with it retries).
//!
//! The gateway itself runs as `sluice serve` runs it — its control loops, its HTTP port with the
//! admin API, `/metrics` and the status page — and this crate adds the two gRPC listeners.
//!
//! # Layout
//! - `exchange` — one ext_proc stream: the pump that reads what the data plane sends, the drive
//!   that answers in the protocol's order.
//! - `wire` — ext_proc messages to and from HTTP types; the protocol's keys.
//! - `objective` — InferenceObjective priorities onto the tiers: given as flags, or followed in
//!   the cluster (`objective::cluster`).
//! - `pool` — `--pool-name`: the InferencePool's pods as the gateway's workers, its objectives.
//! - `health` — the gRPC health service: liveness, readiness, the ext_proc service.
//! - `tls` — the gRPC listeners' certificate: given, or made at start.
//! - `deploy` — the Envoy configuration the picker runs behind, for tests and benchmarks.

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod deploy;
mod exchange;
mod health;
pub mod objective;
pub mod pool;
mod tls;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use sluice_gateway::{Config, Gateway, StartError, Stopped};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

pub use objective::{ObjectiveSpecError, Objectives};

/// What `sluice epp` adds to `sluice serve`'s settings (names and defaults as the Inference
/// Extension's reference picker has them). The same keys in `--config`'s file, snake_case, as
/// for `sluice serve`'s settings.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EppSettings {
    /// The port the data plane's ext_proc filter calls (on --host).
    #[arg(long, default_value_t = 9002)]
    #[arg(help_heading = "Endpoint picker")]
    pub grpc_port: u16,

    /// The port of the gRPC health service (on --host), for the cluster's probes: `liveness`,
    /// `readiness`, `inference-extension` and `envoy.service.ext_proc.v3.ExternalProcessor`
    /// (the last also on --grpc-port, where Envoy's health checks reach it).
    #[arg(long, default_value_t = 9003)]
    #[arg(help_heading = "Endpoint picker")]
    pub grpc_health_port: u16,

    /// Serve --grpc-port over TLS, with --cert-path's certificate or one made at start
    /// (`--secure-serving=false`: plaintext HTTP/2).
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    #[arg(help_heading = "Endpoint picker")]
    pub secure_serving: bool,

    /// A directory with `tls.crt` and `tls.key` for --secure-serving (a Kubernetes TLS secret
    /// mounted as files). Unset: a self-signed certificate made at start.
    #[arg(long, value_name = "DIR")]
    #[arg(help_heading = "Endpoint picker")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_path: Option<PathBuf>,

    /// An InferenceObjective's priority, `NAME=PRIORITY` (repeatable): a request naming it in
    /// `x-gateway-inference-objective` is served in the tier of its priority — above 0
    /// interactive, 0 agent, below 0 (sheddable) batch. The pool's InferenceObjectives
    /// (--pool-name) win over these; an objective named nowhere has priority 0.
    #[arg(long = "inference-objective", value_name = "NAME=PRIORITY")]
    #[arg(help_heading = "Endpoint picker")]
    pub inference_objectives: Vec<String>,

    /// The InferencePool whose pods are the workers (`inference.networking.k8s.io/v1`, in
    /// --pool-namespace): its Ready pods on its target ports, followed as the pool and its pods
    /// change, and the priorities of the InferenceObjectives that name it. Instead of
    /// --service-discovery; --worker-urls may add workers beside it.
    #[arg(long, value_name = "NAME")]
    #[arg(help_heading = "Endpoint picker")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_name: Option<String>,

    /// The pool's namespace (cross-namespace pools are not part of the API).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "default",
        value_name = "NAMESPACE"
    )]
    #[arg(help_heading = "Endpoint picker")]
    pub pool_namespace: String,

    /// The pool's API group; only `inference.networking.k8s.io` (InferencePool v1) is read.
    #[arg(
        long,
        default_value = sluice_gateway::control::discovery::pool::POOL_GROUP,
        value_name = "GROUP"
    )]
    #[arg(help_heading = "Endpoint picker")]
    pub pool_group: String,
}

/// Why the picker could not start.
#[derive(Debug, thiserror::Error)]
pub enum EppError {
    #[error(transparent)]
    Gateway(#[from] StartError),
    #[error(transparent)]
    Objective(#[from] ObjectiveSpecError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("--grpc-port: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error(transparent)]
    Pool(#[from] pool::PoolError),
    #[error("--pool-name: {0}")]
    Kubernetes(#[from] sluice_gateway::control::discovery::KubeError),
}

/// The ext_proc service: each stream is one request, run on its own task.
struct ExtProc(Arc<exchange::Shared>);

#[tonic::async_trait]
impl ExternalProcessor for ExtProc {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (out, answers) = mpsc::channel(exchange::ANSWERS);
        // Boxed: the exchange's state is kilobytes, and a task's future is moved whole as the
        // task starts and ends; a pointer moves for free.
        tokio::spawn(Box::pin(exchange::run(
            self.0.clone(),
            request.into_inner(),
            out,
        )));
        Ok(Response::new(ReceiverStream::new(answers)))
    }
}

/// A running endpoint picker: the gateway, and its gRPC listeners.
pub struct Picker {
    gateway: Gateway,
    objective_changes: watch::Receiver<u64>,
    grpc_addr: SocketAddr,
    health_addr: SocketAddr,
    readiness: health::Readiness,
    stop: watch::Sender<bool>,
    servers: JoinSet<()>,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, EppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| EppError::Bind { addr, source })
}

fn local(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, EppError> {
    listener
        .local_addr()
        .map_err(|source| EppError::Bind { addr, source })
}

/// Workers named by host name are never picked: the data plane connects to the `ip:port` it is
/// given, so say so at start.
fn warn_unaddressed(gateway: &Gateway) {
    let unaddressed: Vec<String> = gateway
        .fleet()
        .snapshot()
        .workers
        .iter()
        .filter(|w| w.endpoint.socket_addr().is_none())
        .map(|w| w.id.to_string())
        .collect();
    if !unaddressed.is_empty() {
        warn!(
            workers = ?unaddressed,
            "workers named by host name are never picked: the data plane connects to the \
             ip:port it is given"
        );
    }
}

impl Picker {
    /// Starts the gateway as `sluice serve` would, then the ext_proc and health listeners on its
    /// `--host`.
    pub async fn start(config: Config, epp: &EppSettings) -> Result<Self, EppError> {
        let objectives = Objectives::parse(epp.inference_objectives.iter().map(String::as_str))?;
        let following = match pool::watched(&config) {
            Some(pool) => Some(objectives.follow(&pool).await?),
            None => None,
        };
        let identity = if epp.secure_serving {
            Some(tls::identity(epp.cert_path.as_deref())?)
        } else {
            None
        };
        let host = config.listener.addr.ip();
        let gateway = Gateway::start(config).await?;
        warn_unaddressed(&gateway);
        let grpc_at = SocketAddr::new(host, epp.grpc_port);
        let health_at = SocketAddr::new(host, epp.grpc_health_port);
        let grpc = bind(grpc_at).await?;
        let health = bind(health_at).await?;
        let grpc_addr = local(&grpc, grpc_at)?;
        let health_addr = local(&health, health_at)?;
        let (stop, stopped) = watch::channel(false);
        let mut servers = JoinSet::new();
        let readiness = health::Readiness::start(&gateway, stopped.clone(), &mut servers).await;
        if let Some(following) = following {
            servers.spawn(following.run(stopped.clone()));
        }
        let objective_changes = objectives.changes();
        let shared = Arc::new(exchange::Shared {
            front: gateway.front().clone(),
            objectives,
        });
        let mut builder = tonic::transport::Server::builder();
        if let Some(identity) = identity {
            builder =
                builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?;
        }
        let ext_proc = builder
            .add_service(ExternalProcessorServer::new(ExtProc(shared)))
            .add_service(readiness.service());
        servers.spawn(serve(ext_proc, grpc, stopped.clone(), "ext_proc"));
        let probes = tonic::transport::Server::builder().add_service(readiness.service());
        servers.spawn(serve(probes, health, stopped, "grpc health"));
        info!(
            %grpc_addr,
            %health_addr,
            tls = epp.secure_serving,
            "endpoint picker listening"
        );
        Ok(Self {
            gateway,
            objective_changes,
            grpc_addr,
            health_addr,
            readiness,
            stop,
            servers,
        })
    }

    /// Where the data plane's ext_proc filter connects.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The gRPC health service's own listener.
    pub fn health_addr(&self) -> SocketAddr {
        self.health_addr
    }

    /// Changes each time the pool's InferenceObjectives give new priorities.
    pub fn objective_changes(&self) -> watch::Receiver<u64> {
        self.objective_changes.clone()
    }

    /// The gateway behind the picker (its HTTP port: admin API, `/metrics`, the status page).
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Readiness turns `NOT_SERVING` and new requests are refused (503 `shutting_down`, the
    /// data plane's to send elsewhere); requests in flight run to their end, bounded by the
    /// grace period; then the listeners stop.
    pub async fn shutdown(mut self) -> Stopped {
        self.gateway.begin_shutdown();
        self.readiness.draining().await;
        let stopped = self.gateway.shutdown().await;
        let _ = self.stop.send(true);
        while self.servers.join_next().await.is_some() {}
        stopped
    }
}

/// Serves `router` on `listener` until `stop` turns true.
async fn serve(
    router: tonic::transport::server::Router,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
) {
    let stopping = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    if let Err(e) = router
        .serve_with_incoming_shutdown(incoming, stopping)
        .await
    {
        warn!(error = %e, listener = what, "gRPC listener stopped");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use sluice_gateway::Settings;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
        #[command(flatten)]
        epp: EppSettings,
    }

    /// `sluice epp`'s settings from these arguments (the program name first), as the binary
    /// loads them.
    pub(crate) fn load(args: &[&str]) -> (Settings, EppSettings) {
        let matches = Cli::command().try_get_matches_from(args).unwrap();
        sluice_gateway::config::load_with(&matches).unwrap()
    }

    #[test]
    fn the_pickers_settings_are_keys_of_the_config_file_too() {
        let dir = std::env::temp_dir().join(format!("sluice-epp-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("epp.toml");
        let file = path.to_str().unwrap();
        std::fs::write(
            &path,
            "worker_urls = [\"http://10.0.0.5:8000\"]\ngrpc_port = 9102\n\
             secure_serving = false\ncert_path = \"/etc/epp\"\n\
             inference_objectives = [\"chat=10\", \"offline=-1\"]\n",
        )
        .unwrap();
        let (settings, epp) = load(&["sluice", "--config", file, "--grpc-port", "9202"]);
        assert_eq!(settings.worker_urls, ["http://10.0.0.5:8000"]);
        assert_eq!(epp.grpc_port, 9202, "the flag wins");
        assert_eq!(epp.grpc_health_port, 9003, "the default stays");
        assert!(!epp.secure_serving);
        assert_eq!(
            epp.cert_path.as_deref(),
            Some(std::path::Path::new("/etc/epp"))
        );
        assert_eq!(epp.inference_objectives, ["chat=10", "offline=-1"]);

        // --print-config's file loads back to the same settings, an unset path left out.
        let unset = EppSettings {
            cert_path: None,
            ..epp.clone()
        };
        for epp in [epp, unset] {
            std::fs::write(&path, settings.to_toml_with(&epp).unwrap()).unwrap();
            assert_eq!(load(&["sluice", "--config", file]).1, epp);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
