//! The gRPC health service (grpc.health.v1), on both gRPC listeners: the cluster's probes and
//! Envoy's health checks ask it, by service name, whether the picker can take requests.
//!
//! `liveness` is serving while the process answers. Every other name — `readiness`, the
//! Inference Extension's `inference-extension`, the ext_proc service's own name, and the empty
//! name (the whole server) — follows the gateway's `/readiness`: a worker a request could use, and
//! not draining. It is looked at again whenever the fleet changes (never polled), and set when
//! it changed.

use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

use sluice_gateway::Gateway;

/// The names that follow readiness.
const FOLLOW_READINESS: [&str; 4] = [
    "",
    "readiness",
    "inference-extension",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// The health statuses, and the task that keeps them.
pub(crate) struct Readiness {
    reporter: HealthReporter,
}

async fn set(reporter: &HealthReporter, ready: bool) {
    let status = if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in FOLLOW_READINESS {
        reporter.set_service_status(name, status).await;
    }
}

impl Readiness {
    /// Serving as the gateway's readiness says now, and from now on until `stop`.
    pub async fn start(
        gateway: &Gateway,
        mut stop: watch::Receiver<bool>,
        tasks: &mut JoinSet<()>,
    ) -> Self {
        let reporter = HealthReporter::new();
        reporter
            .set_service_status("liveness", ServingStatus::Serving)
            .await;
        let probes = gateway.probes().clone();
        let mut ready = probes.is_ready();
        set(&reporter, ready).await;
        let mut changes = gateway.changes();
        let keeper = reporter.clone();
        tasks.spawn(async move {
            let stopping = async move {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            tokio::pin!(stopping);
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        // The fleet changes with every load report; readiness seldom.
                        let now = probes.is_ready();
                        if now != ready {
                            ready = now;
                            set(&keeper, ready).await;
                        }
                    }
                    () = &mut stopping => return,
                }
            }
        });
        Self { reporter }
    }

    /// The service, for a listener.
    pub fn service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    /// Shutdown began: not ready from now on, whatever the fleet does.
    pub async fn draining(&self) {
        set(&self.reporter, false).await;
    }
}
