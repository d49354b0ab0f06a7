//! The gateway on 127.0.0.1:0 in front of in-process simulated engines.
#![allow(dead_code, unused_imports)]

use std::future::Future;
use std::time::Duration;

pub mod certs;
pub mod graph;
pub mod kube_api;
pub mod model;
pub mod otlp;
pub mod over;
pub mod paths;
pub mod pinned;
pub mod raw;
pub mod redis;
pub mod wire;

pub use serde_json::Value;
pub use sluice_gateway::{Config, Gateway};
pub use sluice_sim::testkit::*;
pub use sluice_sim::{EngineConfig, Fault, Flavor, FleetConfig, SimFleet};

/// An engine report of 20 running holding 0.75 of the KV and none waiting: one more of their
/// size fits under the 0.8 ceiling, and a reserve of 0.1 keeps 3 of the 21 for interactive
/// requests (`/workers` shows `start_room` 1).
pub fn one_place_left() -> Fault {
    Fault::Report {
        rank: None,
        waiting: Some(0),
        running: Some(20),
        kv_usage: Some(0.75),
    }
}

/// Every wait in these tests is bounded: a bug fails the test instead of hanging it.
pub async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

pub struct Setup {
    pub sims: SimFleet,
    pub gateway: Gateway,
    pub client: HttpClient,
}

/// The admin key the tests configure when they set one; the admin reads below send it (it is
/// ignored when no key is set, and reads are open then).
pub const ADMIN_KEY: &str = "admin-secret";

/// `GET url` with the admin key.
pub async fn get_admin(client: &HttpClient, url: &str) -> Answer {
    let auth = format!("Bearer {ADMIN_KEY}");
    send(
        client,
        "GET",
        url,
        None,
        &[("authorization", auth.as_str())],
    )
    .await
}

/// The ids of a `/v1/models` answer, in its order.
pub fn model_ids(models: &Value) -> Vec<String> {
    models["data"]
        .as_array()
        .expect("a list of models")
        .iter()
        .map(|m| m["id"].as_str().expect("an id").to_string())
        .collect()
}

/// Every worker `GET /workers` lists is ready.
pub fn all_ready(workers: &[Value]) -> bool {
    workers.iter().all(|w| w["status"] == "ready")
}

/// Reads the JSON view at `path` until `done` holds and returns it. It looks again only after
/// the gateway announces a change of its fleet (`Gateway::changes`), never on a timer; bounded.
pub async fn until_view(
    gateway: &Gateway,
    client: &HttpClient,
    what: &str,
    path: &str,
    mut done: impl FnMut(&Value) -> bool,
) -> Value {
    let url = format!("{}{path}", gateway.url());
    let mut changes = gateway.changes();
    bounded(what, async {
        loop {
            // Seen before the read: a change after it wakes the wait below.
            changes.borrow_and_update();
            let view = get_admin(client, &url).await.json();
            if done(&view) {
                return view;
            }
            changes.changed().await.expect("the gateway is running");
        }
    })
    .await
}

/// `GET /workers` until `done` holds for its list.
pub async fn until_workers(
    gateway: &Gateway,
    client: &HttpClient,
    what: &str,
    mut done: impl FnMut(&[Value]) -> bool,
) -> Vec<Value> {
    let view = until_view(gateway, client, what, "/workers", |v| {
        done(v["workers"].as_array().expect("a list of workers"))
    })
    .await;
    view["workers"].as_array().cloned().unwrap_or_default()
}

/// `engines` simulated engines and a gateway over them, configured by `tune`, all workers ready.
pub async fn start(engines: usize, engine: EngineConfig, tune: impl FnOnce(&mut Config)) -> Setup {
    let sims = SimFleet::start(FleetConfig::local(engines, engine))
        .await
        .unwrap();
    let mut config = Config::local(&sims.urls());
    tune(&mut config);
    serve(sims, config).await
}

/// The queue's depth in `tier`, as `/admission` shows it.
pub async fn depth(s: &Setup, tier: usize) -> u64 {
    let view = get_admin(&s.client, &s.url("/admission")).await.json();
    view["queue"]["tiers"][tier]["depth"].as_u64().unwrap()
}

/// Reads `/admission` until the queue holds `n` in `tier` (the arrivals are on their own tasks).
pub async fn until_depth(s: &Setup, tier: usize, n: u64) {
    bounded("the queue's depth", async {
        while depth(s, tier).await != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// A gateway configured by `config` over `sims`, all its workers ready.
pub async fn serve(sims: SimFleet, config: Config) -> Setup {
    let gateway = Gateway::start(config).await.unwrap();
    let client = client();
    until_workers(&gateway, &client, "workers ready", all_ready).await;
    Setup {
        sims,
        gateway,
        client,
    }
}

impl Setup {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gateway.url())
    }

    /// The workers as `GET /workers` lists them, in registration order.
    pub async fn workers(&self) -> Vec<Value> {
        let list = get_admin(&self.client, &self.url("/workers")).await.json();
        list["workers"].as_array().cloned().unwrap_or_default()
    }

    /// The id of the `i`-th registered worker.
    pub async fn worker_id(&self, i: usize) -> String {
        self.workers().await[i]["id"]
            .as_str()
            .expect("an id")
            .to_string()
    }

    /// `GET /workers` until `done` holds for its list.
    pub async fn until_workers(
        &self,
        what: &str,
        done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        until_workers(&self.gateway, &self.client, what, done).await
    }

    /// `GET /workers/{id}` until `done` holds for it (a worker that is gone reads as `null`).
    pub async fn until_worker(
        &self,
        id: &str,
        what: &str,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Value {
        let list = self
            .until_workers(what, |workers| {
                let view = workers
                    .iter()
                    .find(|w| w["id"] == id)
                    .unwrap_or(&Value::Null);
                done(view)
            })
            .await;
        list.into_iter()
            .find(|w| w["id"] == id)
            .unwrap_or(Value::Null)
    }

    /// Waits until worker `id` is in health state `state` (`ready`, `not_ready`, ...).
    pub async fn until_status(&self, id: &str, state: &str) -> Value {
        self.until_worker(id, state, |w| w["status"] == state).await
    }

    /// The value of one metric series (a line starting with `series`), if present.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = get(&self.client, &self.url("/metrics")).await.text();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    pub async fn chat(&self, body: &str) -> Answer {
        post(&self.client, &self.url("/v1/chat/completions"), body).await
    }

    /// Puts engine `i` under `fault` (or clears it, `Fault::Clear`).
    pub async fn fault(&self, i: usize, fault: Fault) {
        self.sims.engine(i).unwrap().fault(fault).await.unwrap();
    }

    /// Requests each engine has received.
    pub fn received(&self) -> Vec<u64> {
        self.sims
            .engines()
            .iter()
            .map(|e| e.state().requests_received)
            .collect()
    }
}

/// A chat request body.
pub fn chat_body(model: &str, content: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

/// The gateway's error code header of an answer.
pub fn code(answer: &Answer) -> Option<String> {
    answer
        .headers
        .get("x-sluice-error-code")
        .map(|v| v.to_str().unwrap().to_string())
}

/// Sends a streaming chat request through the gateway and returns the response once its first
/// chunk has arrived (the request is then running in an engine).
pub async fn open_stream(
    s: &Setup,
    content: &str,
    max_tokens: u32,
) -> hyper::Response<hyper::body::Incoming> {
    open_stream_as(s, content, max_tokens, &[]).await
}

/// `open_stream` with request `headers` (a tenant's key, a tier).
pub async fn open_stream_as(
    s: &Setup,
    content: &str,
    max_tokens: u32,
    headers: &[(&str, &str)],
) -> hyper::Response<hyper::body::Incoming> {
    open_stream_at(&s.client, &s.gateway, content, max_tokens, headers).await
}

/// A streaming chat request through `gateway`, returned once its first chunk has arrived.
pub async fn open_stream_at(
    client: &HttpClient,
    gateway: &Gateway,
    content: &str,
    max_tokens: u32,
    headers: &[(&str, &str)],
) -> hyper::Response<hyper::body::Incoming> {
    let body = chat_body("test-model", content, max_tokens, true);
    open_stream_with(client, gateway, body, headers).await
}

/// A streaming request with `body` through `gateway`, returned once its first chunk has arrived.
pub async fn open_stream_with(
    client: &HttpClient,
    gateway: &Gateway,
    body: String,
    headers: &[(&str, &str)],
) -> hyper::Response<hyper::body::Incoming> {
    use http_body_util::BodyExt;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let mut request = http::Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let mut response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    bounded("a first chunk", response.body_mut().frame())
        .await
        .unwrap()
        .unwrap();
    response
}

/// A configured tenant with one key, in the agent tier, weight 1 and no budgets.
pub fn tenant(name: &str, key: &str) -> sluice_gateway::admit::TenantConfig {
    sluice_gateway::admit::TenantConfig {
        id: sluice_core::TenantId::new(name),
        api_keys: vec![key.into()],
        tier: sluice_core::admission::Tier::Agent,
        weight: 1.0,
        tokens_per_minute: None,
        requests_per_minute: None,
        max_concurrent: None,
    }
}
