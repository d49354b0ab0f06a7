//! A fake Kubernetes API server on a free loopback port, for pods and the Inference Extension's
//! InferencePools and InferenceObjectives, speaking the list-and-watch protocol clients use: a
//! list answers with the objects and a resource version; a watch from a resource version streams
//! newline-delimited `ADDED`, `MODIFIED` and `DELETED` events, and one from a version the server
//! no longer keeps gets an `ERROR` event with a 410 `Expired` status, after which a client must
//! list again. The test changes the objects, drops the watches, and expires the history, and can
//! await a client's next watch. Equality label selectors (`k=v,k2=v2`) and the `metadata.name`
//! field selector filter lists and watches.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// The resources served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Resource {
    Pods,
    Pools,
    Objectives,
}

impl Resource {
    fn list_kind(self) -> &'static str {
        match self {
            Resource::Pods => "PodList",
            Resource::Pools => "InferencePoolList",
            Resource::Objectives => "InferenceObjectiveList",
        }
    }
}

/// An open watch: what it asked for, and where its events go.
struct Watch {
    resource: Resource,
    labels: String,
    fields: String,
    tx: mpsc::UnboundedSender<Value>,
}

#[derive(Default)]
struct Store {
    /// By resource and name: the object's JSON.
    objects: BTreeMap<(Resource, String), Value>,
    version: u64,
    /// Versions at or before this are gone from the history.
    expired_before: u64,
    watches: Vec<Watch>,
}

pub struct FakeApi {
    pub addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    /// Watches and lists served so far, and the label selector pods were last asked with.
    served: watch::Sender<(u64, u64, String)>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    served: watch::Sender<(u64, u64, String)>,
}

/// Whether `object`'s labels satisfy an equality selector (`k=v,k2=v2`; empty: every object).
fn selects(selector: &str, object: &Value) -> bool {
    selector
        .split(',')
        .filter(|p| !p.is_empty())
        .all(|pair| match pair.split_once('=') {
            Some((k, v)) => object["metadata"]["labels"][k] == v,
            None => false,
        })
}

/// Whether `object` satisfies a field selector (`metadata.name=NAME` only; empty: every one).
fn fields_select(fields: &str, object: &Value) -> bool {
    fields
        .split(',')
        .filter(|p| !p.is_empty())
        .all(|pair| match pair.split_once('=') {
            Some(("metadata.name", name)) => object["metadata"]["name"] == name,
            _ => false,
        })
}

impl Watch {
    fn takes(&self, resource: Resource, object: &Value) -> bool {
        self.resource == resource
            && selects(&self.labels, object)
            && fields_select(&self.fields, object)
    }
}

impl Store {
    /// Stores `object` under `resource` at a new version, telling the watches that take it.
    fn put(&mut self, resource: Resource, name: &str, mut object: Value) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        let key = (resource, name.to_string());
        let kind = if self.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.objects.insert(key, object.clone());
        self.tell(resource, json!({"type": kind, "object": object}));
    }

    fn remove(&mut self, resource: Resource, name: &str) {
        self.version += 1;
        if let Some(mut object) = self.objects.remove(&(resource, name.to_string())) {
            object["metadata"]["resourceVersion"] = json!(self.version.to_string());
            self.tell(resource, json!({"type": "DELETED", "object": object}));
        }
    }

    /// Sends `event` to the watches that take its object; forgets closed ones.
    fn tell(&mut self, resource: Resource, event: Value) {
        self.watches
            .retain(|w| !w.takes(resource, &event["object"]) || w.tx.send(event.clone()).is_ok());
    }
}

/// A pod of namespace `llm` at `ip`, Ready or not.
pub fn pod(name: &str, ip: &str, ready: bool, version: u64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": format!("uid-{name}"),
            "resourceVersion": version.to_string(),
            "labels": {"app": "vllm", "model": "test-model"},
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

impl FakeApi {
    pub async fn start() -> Self {
        let store = Arc::new(Mutex::new(Store::default()));
        let served = watch::channel((0, 0, String::new())).0;
        let shared = Shared {
            store: store.clone(),
            served: served.clone(),
        };
        let serve = |resource: Resource| {
            move |State(shared): State<Shared>, Query(query): Query<BTreeMap<String, String>>| async move {
                list_or_watch(shared, query, resource)
            }
        };
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods", get(serve(Resource::Pods)))
            .route("/api/v1/pods", get(serve(Resource::Pods)))
            .route(
                "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools",
                get(serve(Resource::Pools)),
            )
            .route(
                "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{ns}/inferenceobjectives",
                get(serve(Resource::Objectives)),
            )
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            addr,
            store,
            served,
            server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds or changes pod `name`, telling every open watch.
    pub fn set(&self, name: &str, ip: &str, ready: bool) {
        self.set_labeled(
            name,
            ip,
            ready,
            json!({"app": "vllm", "model": "test-model"}),
            json!({}),
        );
    }

    /// `set` with these labels and annotations.
    pub fn set_labeled(
        &self,
        name: &str,
        ip: &str,
        ready: bool,
        labels: Value,
        annotations: Value,
    ) {
        let mut pod = pod(name, ip, ready, 0);
        pod["metadata"]["labels"] = labels;
        pod["metadata"]["annotations"] = annotations;
        self.store.lock().put(Resource::Pods, name, pod);
    }

    /// Deletes pod `name`, telling every open watch.
    pub fn delete(&self, name: &str) {
        self.store.lock().remove(Resource::Pods, name);
    }

    /// Adds or changes InferencePool `name` (namespace `llm`): the pods `match_labels` selects,
    /// on `port`.
    pub fn set_pool(&self, name: &str, match_labels: Value, port: u16) {
        let pool = json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": name, "namespace": "llm", "uid": format!("uid-pool-{name}")},
            "spec": {
                "selector": {"matchLabels": match_labels},
                "targetPorts": [{"number": port}],
                "endpointPickerRef": {"name": "sluice-epp", "port": {"number": 9002}},
            },
        });
        self.store.lock().put(Resource::Pools, name, pool);
    }

    /// Deletes InferencePool `name`.
    pub fn delete_pool(&self, name: &str) {
        self.store.lock().remove(Resource::Pools, name);
    }

    /// Adds or changes InferenceObjective `name` for `pool`, with `priority` (unset: none).
    pub fn set_objective(&self, name: &str, pool: &str, priority: Option<i32>) {
        let mut spec = json!({"poolRef": {"name": pool}});
        if let Some(priority) = priority {
            spec["priority"] = json!(priority);
        }
        let objective = json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": "llm", "uid": format!("uid-objective-{name}")},
            "spec": spec,
        });
        self.store.lock().put(Resource::Objectives, name, objective);
    }

    /// Ends every open watch (the connection closes cleanly, as when a server times it out).
    pub fn drop_watches(&self) {
        self.store.lock().watches.clear();
    }

    /// Forgets the history up to now: a watch resumed from an earlier version gets 410 Gone.
    pub fn expire_history(&self) {
        let mut state = self.store.lock();
        state.version += 1;
        state.expired_before = state.version;
        state.watches.clear();
    }

    /// Watches and lists served so far.
    pub fn served(&self) -> (u64, u64) {
        let (watches, lists, _) = self.served.borrow().clone();
        (watches, lists)
    }

    /// The label selector the client last asked for pods with.
    pub fn selector(&self) -> String {
        self.served.borrow().2.clone()
    }

    /// Resolves once `watches` watches have been served in all.
    pub async fn until_watches(&self, watches: u64) {
        let mut served = self.served.subscribe();
        served.wait_for(|(w, _, _)| *w >= watches).await.unwrap();
    }
}

fn list_or_watch(shared: Shared, query: BTreeMap<String, String>, resource: Resource) -> Response {
    let labels = query.get("labelSelector").cloned().unwrap_or_default();
    let fields = query.get("fieldSelector").cloned().unwrap_or_default();
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let count = |watch: bool| {
        shared.served.send_modify(|(watches, lists, s)| {
            if watch {
                *watches += 1;
            } else {
                *lists += 1;
            }
            if resource == Resource::Pods {
                *s = labels.clone();
            }
        })
    };
    let mut state = shared.store.lock();
    if !watching {
        count(false);
        let items: Vec<Value> = state
            .objects
            .iter()
            .filter(|((r, _), o)| {
                *r == resource && selects(&labels, o) && fields_select(&fields, o)
            })
            .map(|(_, o)| o.clone())
            .collect();
        let list = json!({
            "apiVersion": "v1",
            "kind": resource.list_kind(),
            "metadata": {"resourceVersion": state.version.to_string()},
            "items": items,
        });
        return axum::Json(list).into_response();
    }
    let (tx, rx) = mpsc::unbounded_channel();
    if from < state.expired_before {
        let gone = json!({"type": "ERROR", "object": {
            "apiVersion": "v1", "kind": "Status", "status": "Failure",
            "message": format!("too old resource version: {from}"),
            "reason": "Expired", "code": 410,
        }});
        let _ = tx.send(gone);
    } else {
        state.watches.push(Watch {
            resource,
            labels: labels.clone(),
            fields: fields.clone(),
            tx,
        });
    }
    drop(state);
    count(true);
    let lines = tokio_stream_of(rx).map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(line)
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(lines))
        .unwrap()
}

/// The receiver as a stream, ending when every sender is gone.
fn tokio_stream_of(
    mut rx: mpsc::UnboundedReceiver<Value>,
) -> impl futures_util::Stream<Item = Value> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
