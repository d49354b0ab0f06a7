//! `--service-discovery`: the pods `--selector` matches, or an InferencePool's pods (`sluice epp
//! --pool-name`, in `pool`), watched through the Kubernetes API.
//!
//! kube-rs's watcher lists the pods, then watches them from the list's resource version; a
//! dropped watch is resumed, and a resource version the server no longer has (410 Gone) is met
//! with a fresh list, swapped in whole once complete (`Mirror`) — so a listing is never built
//! from half a relist. A pod is a worker while it is Ready, has an IP and is not being deleted:
//! `http://POD_IP:PORT` (`--service-discovery-port`, or the pool's target port), its model from
//! `--model-id-from` when given. A pod that stops being Ready, or goes, leaves the listing and
//! its worker drains.

use std::sync::Arc;

use axum::http::Uri;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::pods::{publish, worker_of, Mirror, ModelFrom};
use super::pool::{self, PoolRef};
use super::{Listing, Look, Source};
use crate::fleet::{Origin, WorkerType};

/// Which API server to ask.
#[derive(Debug, Clone, PartialEq)]
pub enum Cluster {
    /// The pod's service account inside a cluster, else the kubeconfig (as kubectl finds it).
    Infer,
    /// A plain-HTTP API server at this address, without credentials (tests).
    At(Uri),
}

/// `--service-discovery` and its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeConfig {
    pub members: Members,
    /// `--service-discovery-namespace` (every namespace when unset), or the pool's.
    pub namespace: Option<String>,
    pub model_from: Option<ModelFrom>,
    pub cluster: Cluster,
}

/// Which pods are workers, and on which port.
#[derive(Debug, Clone, PartialEq)]
pub enum Members {
    /// `--selector`, `--prefill-selector`, `--decode-selector`: each a label selector
    /// (`app=vllm,tier=gpu`) and the role of the pods it matches, all serving on `port`
    /// (`--service-discovery-port`).
    Selected { selectors: Vec<Selector>, port: u16 },
    /// The pods an InferencePool selects, on its target ports, followed as the pool changes.
    Pool(PoolRef),
}

/// Pods by their labels, and what they are.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    pub labels: String,
    pub role: WorkerType,
}

/// Why the watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("no Kubernetes credentials: {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// The pods' listing, kept by one watch task per selector.
pub struct KubeSource {
    target: String,
    listings: Vec<watch::Receiver<Listing>>,
    error: watch::Receiver<Option<String>>,
    tasks: Vec<AbortHandle>,
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Cluster {
    /// A client of this API server; credentials are read now.
    pub async fn client(&self) -> Result<Client, KubeError> {
        Ok(match self {
            Cluster::Infer => Client::try_default().await?,
            Cluster::At(uri) => Client::try_from(kube::Config::new(uri.clone()))?,
        })
    }
}

impl KubeSource {
    /// Connects (credentials are read now: missing ones stop the start) and starts watching.
    pub async fn start(config: KubeConfig) -> Result<Self, KubeError> {
        let client = config.cluster.client().await?;
        let pods: Api<Pod> = match &config.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let namespace = config.namespace.as_deref().unwrap_or("every namespace");
        let (error_tx, error) = watch::channel(None);
        let error_tx = Arc::new(error_tx);
        let (mut listings, mut tasks) = (Vec::new(), Vec::new());
        let target = match &config.members {
            Members::Selected { selectors, port } => {
                let matched: Vec<String> = selectors
                    .iter()
                    .map(|s| match s.role {
                        WorkerType::Regular => s.labels.clone(),
                        role => format!("{} ({})", s.labels, role.as_str()),
                    })
                    .collect();
                for selector in selectors.clone() {
                    let (listing_tx, listing) = watch::channel(Listing::new());
                    let watching = watch_pods(
                        pods.clone(),
                        (*port, config.model_from.clone()),
                        selector,
                        listing_tx,
                        error_tx.clone(),
                    );
                    tasks.push(tokio::spawn(watching).abort_handle());
                    listings.push(listing);
                }
                format!("pods {} in {namespace}", matched.join(" and "))
            }
            Members::Pool(pool) => {
                let (listing_tx, listing) = watch::channel(Listing::new());
                let watching = pool::watch(
                    client,
                    pods,
                    config.namespace.clone().unwrap_or_default(),
                    pool.clone(),
                    config.model_from.clone(),
                    listing_tx,
                    error_tx,
                );
                tasks.push(tokio::spawn(watching).abort_handle());
                listings.push(listing);
                format!("the pods of InferencePool {} in {namespace}", pool.name)
            }
        };
        Ok(Self {
            target,
            listings,
            error,
            tasks,
        })
    }
}

/// Follows the pods `selector` matches and publishes the listing they make after each change
/// (from the first complete list on), and the watch's last error (cleared by the next event).
async fn watch_pods(
    pods: Api<Pod>,
    (port, model_from): (u16, Option<ModelFrom>),
    selector: Selector,
    listing: watch::Sender<Listing>,
    error: Arc<watch::Sender<Option<String>>>,
) {
    let watch_config = watcher::Config::default().labels(&selector.labels);
    let mut events = watcher::watcher(pods, watch_config)
        .default_backoff()
        .boxed();
    let mut seen = Mirror::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                error.send_if_modified(|e| e.take().is_some());
                seen.apply(event);
            }
            Err(e) => {
                error.send_replace(Some(e.to_string()));
                continue;
            }
        }
        if seen.listed {
            let now: Listing = seen
                .known
                .values()
                .filter_map(|pod| worker_of(pod, port, model_from.as_ref(), selector.role))
                .map(|spec| (spec.url.clone(), spec))
                .collect();
            publish(&listing, now);
        }
    }
}

impl Source for KubeSource {
    const ORIGIN: Origin = Origin::Kubernetes;

    fn target(&self) -> String {
        self.target.clone()
    }

    async fn poll(&mut self, _asked: bool) -> Look {
        let changed = self
            .listings
            .iter()
            .any(|l| l.has_changed().unwrap_or(false));
        if changed {
            // The union of every selector's pods (a pod two selectors match is the later one's).
            let mut all = Listing::new();
            for listing in &mut self.listings {
                all.extend(listing.borrow_and_update().clone());
            }
            return Look::Listed(all);
        }
        if self.error.has_changed().unwrap_or(false) {
            if let Some(e) = self.error.borrow_and_update().clone() {
                return Look::Failed(e);
            }
        }
        Look::Unchanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(ip: Option<&str>, ready: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("vllm-0".into()),
                namespace: Some("llm".into()),
                labels: Some([("model".to_string(), "llama-3.1-8b".to_string())].into()),
                annotations: Some([("sluice/model".to_string(), "m".to_string())].into()),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_ready_pod_with_an_ip_is_a_worker_on_the_discovery_port() {
        let spec = worker_of(
            &pod(Some("10.1.2.3"), "True"),
            8000,
            None,
            WorkerType::Regular,
        )
        .unwrap();
        assert_eq!(spec.url, "http://10.1.2.3:8000");
        assert_eq!(spec.model_id, None);
        let v6 = worker_of(
            &pod(Some("fd00::7"), "True"),
            8000,
            None,
            WorkerType::Regular,
        )
        .unwrap();
        assert_eq!(v6.url, "http://[fd00::7]:8000");
    }

    #[test]
    fn a_pod_not_ready_without_an_ip_or_being_deleted_is_not() {
        assert!(worker_of(
            &pod(Some("10.1.2.3"), "False"),
            8000,
            None,
            WorkerType::Regular
        )
        .is_none());
        assert!(worker_of(&pod(None, "True"), 8000, None, WorkerType::Regular).is_none());
        let mut leaving = pod(Some("10.1.2.3"), "True");
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(worker_of(&leaving, 8000, None, WorkerType::Regular).is_none());
    }

    #[test]
    fn the_model_comes_from_a_label_an_annotation_or_the_namespace() {
        let model = |from: &str| {
            let from = from.parse().unwrap();
            worker_of(
                &pod(Some("10.1.2.3"), "True"),
                8000,
                Some(&from),
                WorkerType::Regular,
            )
            .unwrap()
            .model_id
        };
        assert_eq!(model("label:model").as_deref(), Some("llama-3.1-8b"));
        assert_eq!(model("annotation:sluice/model").as_deref(), Some("m"));
        assert_eq!(model("namespace").as_deref(), Some("llm"));
        assert_eq!(model("label:absent"), None);
        assert!("label:".parse::<ModelFrom>().is_err());
        assert!("pod".parse::<ModelFrom>().is_err());
    }
}
