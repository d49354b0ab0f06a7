//! An InferencePool's pods (Gateway API Inference Extension, `inference.networking.k8s.io/v1`):
//! the pods in the pool's namespace its selector matches, Ready ones, on each of its target ports.
//!
//! Two watches run together: the pool itself (by name), and the pods of its namespace. The pods
//! are watched whole rather than by the pool's selector, so a change of the selector or of the
//! ports applies at once, from what is already known, without a new watch. Until both have
//! listed once nothing is published; a pool that does not exist (or goes) lists no worker, and
//! says so as the source's error.
//!
//! The types are the parts of the API this reads and the deploy manifests write, from the API
//! reference (`api/v1/inferencepool_types.go` and `shared_types.go` in
//! kubernetes-sigs/gateway-api-inference-extension, v1.x). They skip fields they do not know, as
//! the cluster may be newer; the manifests' test reads them back and compares, so a misspelt
//! field there does not pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{ApiResource, GroupVersionKind, NotUsed, Object};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::pods::{publish, worker_of, Mirror, ModelFrom};
use super::Listing;
use crate::fleet::WorkerType;

/// The InferencePool API group, at version v1 (GIE 1.x), the only one read.
pub const POOL_GROUP: &str = "inference.networking.k8s.io";

/// The pool a picker serves (`--pool-name`; its namespace is the source's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRef {
    pub name: String,
}

/// An InferencePool.
pub type InferencePool = Object<InferencePoolSpec, NotUsed>;

/// Where InferencePools are served.
pub(crate) fn pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(POOL_GROUP, "v1", "InferencePool"),
        "inferencepools",
    )
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Which pods of the pool's namespace are its members.
    pub(crate) selector: LabelSelector,
    /// The ports the members serve on (one endpoint per pod and port).
    pub(crate) target_ports: Vec<Port>,
    /// The picker the gateway asks for this pool's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker_ref: Option<EndpointPickerRef>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LabelSelector {
    /// Every pair must be among a pod's labels.
    #[serde(default)]
    pub(crate) match_labels: BTreeMap<String, String>,
}

impl LabelSelector {
    pub(crate) fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value))
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Port {
    pub number: i32,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    /// `FailOpen` or `FailClose` (the default): what the gateway does when the picker does not
    /// answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failure_mode: Option<String>,
}

/// The workers `pool`'s spec makes of the pods known.
pub(crate) fn members(
    spec: &InferencePoolSpec,
    pods: &BTreeMap<String, Pod>,
    model_from: Option<&ModelFrom>,
) -> Listing {
    let ports: Vec<u16> = spec
        .target_ports
        .iter()
        .filter_map(|p| u16::try_from(p.number).ok().filter(|p| *p > 0))
        .collect();
    pods.values()
        .filter(|pod| spec.selector.matches(pod.metadata.labels.as_ref()))
        .flat_map(|pod| {
            ports
                .iter()
                .filter_map(move |port| worker_of(pod, *port, model_from, WorkerType::Regular))
        })
        .map(|spec| (spec.url.clone(), spec))
        .collect()
}

/// Follows the pool and the pods of its namespace, and publishes the pool's workers after each
/// change once both have listed; errors as `watch_pods` reports them, and a missing pool.
pub(super) async fn watch(
    client: Client,
    pods: Api<Pod>,
    namespace: String,
    pool: PoolRef,
    model_from: Option<ModelFrom>,
    listing: watch::Sender<Listing>,
    error: Arc<watch::Sender<Option<String>>>,
) {
    let pools: Api<InferencePool> = Api::namespaced_with(client, &namespace, &pool_resource());
    let by_name = watcher::Config::default().fields(&format!("metadata.name={}", pool.name));
    let mut pool_events = watcher::watcher(pools, by_name).default_backoff().boxed();
    let mut pod_events = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    let (mut seen_pools, mut seen_pods) = (Mirror::new(), Mirror::new());
    loop {
        let outcome = tokio::select! {
            Some(event) = pool_events.next() => event.map(|e| seen_pools.apply(e)),
            Some(event) = pod_events.next() => event.map(|e| seen_pods.apply(e)),
            else => return,
        };
        if let Err(e) = outcome {
            error.send_replace(Some(e.to_string()));
            continue;
        }
        if !(seen_pools.listed && seen_pods.listed) {
            continue;
        }
        let found: Option<&InferencePool> = seen_pools.known.values().next();
        let now = match found {
            Some(found) => {
                error.send_if_modified(|e| e.take().is_some());
                members(&found.spec, &seen_pods.known, model_from.as_ref())
            }
            None => {
                let missing = format!("no InferencePool {} in {namespace}", pool.name);
                error.send_if_modified(|e| {
                    let changed = e.as_deref() != Some(missing.as_str());
                    *e = Some(missing);
                    changed
                });
                Listing::new()
            }
        };
        publish(&listing, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, ip: &str, app: &str) -> (String, Pod) {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("llm".into()),
                labels: Some([("app".to_string(), app.to_string())].into()),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        };
        (format!("llm/{name}"), pod)
    }

    fn spec(app: &str, ports: &[i32]) -> InferencePoolSpec {
        InferencePoolSpec {
            selector: LabelSelector {
                match_labels: [("app".to_string(), app.to_string())].into(),
            },
            target_ports: ports.iter().map(|&number| Port { number }).collect(),
            endpoint_picker_ref: None,
        }
    }

    #[test]
    fn the_pools_selector_picks_its_pods_on_each_of_its_ports() {
        let pods: BTreeMap<String, Pod> = [
            pod("a", "10.0.0.1", "vllm"),
            pod("b", "10.0.0.2", "vllm"),
            pod("c", "10.0.0.3", "other"),
        ]
        .into();
        let urls = |spec: &InferencePoolSpec| -> Vec<String> {
            members(spec, &pods, None).into_keys().collect()
        };
        assert_eq!(
            urls(&spec("vllm", &[8000])),
            ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        );
        assert_eq!(urls(&spec("other", &[8000])), ["http://10.0.0.3:8000"]);
        assert_eq!(
            urls(&spec("other", &[8000, 8001])),
            ["http://10.0.0.3:8000", "http://10.0.0.3:8001"]
        );
        assert!(urls(&spec("vllm", &[0])).is_empty(), "no usable port");
        let everyone = InferencePoolSpec {
            selector: LabelSelector::default(),
            ..spec("", &[9000])
        };
        assert_eq!(
            urls(&everyone).len(),
            3,
            "an empty selector takes every pod"
        );
    }
}
