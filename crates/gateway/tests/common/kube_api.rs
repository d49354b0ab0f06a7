//! A fake Kubernetes API server for pods on a free loopback port, speaking the list-and-watch
//! protocol clients use: a list answers with the pods and a resource version; a watch from a
//! resource version streams newline-delimited `ADDED`, `MODIFIED` and `DELETED` events, and
//! one from a version the server no longer keeps gets an `ERROR` event with a 410 `Expired`
//! status, after which a client must list again. The test changes the pods, drops the watches,
//! and expires the history, and can await a client's next watch. Equality label selectors
//! (`k=v,k2=v2`) filter lists and watches.

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

#[derive(Default)]
struct Pods {
    /// By name: the pod's JSON.
    pods: BTreeMap<String, Value>,
    version: u64,
    /// Versions at or before this are gone from the history.
    expired_before: u64,
    /// Open watches and the label selector each asked with.
    watches: Vec<(String, mpsc::UnboundedSender<Value>)>,
}

pub struct FakeApi {
    pub addr: SocketAddr,
    pods: Arc<Mutex<Pods>>,
    /// Watches and lists served so far, and the label selector last asked for.
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
    pods: Arc<Mutex<Pods>>,
    served: watch::Sender<(u64, u64, String)>,
}

/// Whether `pod`'s labels satisfy an equality selector (`k=v,k2=v2`; empty: every pod).
fn selects(selector: &str, pod: &Value) -> bool {
    selector
        .split(',')
        .filter(|p| !p.is_empty())
        .all(|pair| match pair.split_once('=') {
            Some((k, v)) => pod["metadata"]["labels"][k] == v,
            None => false,
        })
}

/// Sends `event` to the watches whose selector takes its pod; forgets closed ones.
fn tell(watches: &mut Vec<(String, mpsc::UnboundedSender<Value>)>, event: &Value) {
    watches.retain(|(selector, w)| {
        !selects(selector, &event["object"]) || w.send(event.clone()).is_ok()
    });
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
        let pods = Arc::new(Mutex::new(Pods::default()));
        let served = watch::channel((0, 0, String::new())).0;
        let shared = Shared {
            pods: pods.clone(),
            served: served.clone(),
        };
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods", get(pods_route))
            .route("/api/v1/pods", get(pods_route))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            addr,
            pods,
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
        let mut state = self.pods.lock();
        state.version += 1;
        let mut pod = pod(name, ip, ready, state.version);
        pod["metadata"]["labels"] = labels;
        pod["metadata"]["annotations"] = annotations;
        let kind = if state.pods.contains_key(name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.pods.insert(name.to_string(), pod.clone());
        let event = json!({"type": kind, "object": pod});
        tell(&mut state.watches, &event);
    }

    /// Deletes pod `name`, telling every open watch.
    pub fn delete(&self, name: &str) {
        let mut state = self.pods.lock();
        state.version += 1;
        if let Some(mut pod) = state.pods.remove(name) {
            pod["metadata"]["resourceVersion"] = json!(state.version.to_string());
            let event = json!({"type": "DELETED", "object": pod});
            tell(&mut state.watches, &event);
        }
    }

    /// Ends every open watch (the connection closes cleanly, as when a server times it out).
    pub fn drop_watches(&self) {
        self.pods.lock().watches.clear();
    }

    /// Forgets the history up to now: a watch resumed from an earlier version gets 410 Gone.
    pub fn expire_history(&self) {
        let mut state = self.pods.lock();
        state.version += 1;
        state.expired_before = state.version;
        state.watches.clear();
    }

    /// Watches and lists served so far.
    pub fn served(&self) -> (u64, u64) {
        let (watches, lists, _) = self.served.borrow().clone();
        (watches, lists)
    }

    /// The label selector the client last asked with.
    pub fn selector(&self) -> String {
        self.served.borrow().2.clone()
    }

    /// Resolves once `watches` watches have been served in all.
    pub async fn until_watches(&self, watches: u64) {
        let mut served = self.served.subscribe();
        served.wait_for(|(w, _, _)| *w >= watches).await.unwrap();
    }
}

async fn pods_route(
    State(shared): State<Shared>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let selector = query.get("labelSelector").cloned().unwrap_or_default();
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut state = shared.pods.lock();
    if !watching {
        shared.served.send_modify(|(_, lists, s)| {
            *lists += 1;
            *s = selector.clone();
        });
        let items: Vec<Value> = state
            .pods
            .values()
            .filter(|pod| selects(&selector, pod))
            .cloned()
            .collect();
        let list = json!({
            "apiVersion": "v1",
            "kind": "PodList",
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
        state.watches.push((selector.clone(), tx));
    }
    drop(state);
    shared.served.send_modify(|(watches, _, s)| {
        *watches += 1;
        *s = selector.clone();
    });
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
