//! What both Kubernetes watchers (`kubernetes`'s pods by selector, `pool`'s InferencePool) make
//! of what they see: a pod as a worker, the objects a watch has shown, the listing published.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use super::Listing;
use crate::fleet::{WorkerSpec, WorkerType};

/// Where a pod's model name comes from (`--model-id-from`, SMG's flag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFrom {
    Namespace,
    Label(String),
    Annotation(String),
}

impl std::str::FromStr for ModelFrom {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "namespace" => Ok(ModelFrom::Namespace),
            Some(("label", key)) if !key.is_empty() => Ok(ModelFrom::Label(key.to_string())),
            Some(("annotation", key)) if !key.is_empty() => {
                Ok(ModelFrom::Annotation(key.to_string()))
            }
            _ => Err(format!(
                "'{text}' is not namespace, label:KEY or annotation:KEY"
            )),
        }
    }
}

/// The annotation a prefill pod's bootstrap port is read from (SGLang's bootstrap server).
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";

/// The worker a pod matched by `role`'s selector is now on `port`, if it is one.
pub fn worker_of(
    pod: &Pod,
    port: u16,
    model_from: Option<&ModelFrom>,
    role: WorkerType,
) -> Option<WorkerSpec> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    if !ready {
        return None;
    }
    let url = format!("http://{}", SocketAddr::new(ip, port));
    let mut spec = WorkerSpec::from_url(&url, None).ok()?;
    spec.model_id = match model_from {
        None => None,
        Some(ModelFrom::Namespace) => pod.metadata.namespace.clone(),
        Some(ModelFrom::Label(key)) => pod.metadata.labels.as_ref()?.get(key).cloned(),
        Some(ModelFrom::Annotation(key)) => pod.metadata.annotations.as_ref()?.get(key).cloned(),
    };
    spec.worker_type = role;
    if role == WorkerType::Prefill {
        spec.bootstrap_port = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(BOOTSTRAP_PORT_ANNOTATION))
            .and_then(|p| p.trim().parse().ok())
            .filter(|p: &u16| *p > 0);
    }
    Some(spec)
}

/// The objects a watch has shown: kept through resumed watches, and through a relist, which is
/// swapped in whole once complete.
pub struct Mirror<K> {
    pub known: BTreeMap<String, K>,
    relisting: Option<BTreeMap<String, K>>,
    /// A first list has completed.
    pub listed: bool,
}

impl<K: kube::Resource> Default for Mirror<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: kube::Resource> Mirror<K> {
    pub fn new() -> Self {
        Self {
            known: BTreeMap::new(),
            relisting: None,
            listed: false,
        }
    }

    pub fn apply(&mut self, event: Event<K>) {
        match event {
            Event::Apply(object) => {
                self.known.insert(key(&object), object);
            }
            Event::Delete(object) => {
                self.known.remove(&key(&object));
            }
            Event::Init => self.relisting = Some(BTreeMap::new()),
            Event::InitApply(object) => {
                self.relisting
                    .get_or_insert_default()
                    .insert(key(&object), object);
            }
            Event::InitDone => {
                self.known = self.relisting.take().unwrap_or_default();
                self.listed = true;
            }
        }
    }
}

/// Publishes `now` if it differs from what was published.
pub(super) fn publish(listing: &watch::Sender<Listing>, now: Listing) {
    listing.send_if_modified(|before| {
        let changed = *before != now;
        *before = now;
        changed
    });
}

fn key(object: &impl kube::Resource) -> String {
    let meta = object.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}
