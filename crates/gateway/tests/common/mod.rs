//! The gateway on 127.0.0.1:0 in front of in-process simulated engines.
#![allow(dead_code, unused_imports)]

use std::future::Future;
use std::time::Duration;

pub use sluice_core::health::HealthState;
pub use sluice_gateway::fleet::Snapshot;
pub use sluice_gateway::{Config, Gateway};
pub use sluice_sim::testkit::*;
pub use sluice_sim::{EngineConfig, Fault, Flavor, FleetConfig, SimFleet};

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

pub fn all_ready(s: &Snapshot) -> bool {
    s.workers.iter().all(|w| w.status() == HealthState::Ready)
}

/// `engines` simulated engines and a gateway over them, configured by `tune`, all workers ready.
pub async fn start(engines: usize, engine: EngineConfig, tune: impl FnOnce(&mut Config)) -> Setup {
    let sims = SimFleet::start(FleetConfig::local(engines, engine))
        .await
        .unwrap();
    let mut config = Config::local(&sims.urls());
    tune(&mut config);
    let gateway = Gateway::start(config).await.unwrap();
    bounded("workers ready", gateway.fleet().until(all_ready)).await;
    Setup {
        sims,
        gateway,
        client: client(),
    }
}

impl Setup {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gateway.url())
    }

    pub async fn chat(&self, body: &str) -> Answer {
        post(&self.client, &self.url("/v1/chat/completions"), body).await
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
    use http_body_util::BodyExt;
    let request = http::Request::post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(chat_body(
            "test-model",
            content,
            max_tokens,
            true,
        ))))
        .unwrap();
    let mut response = s.client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    bounded("a first chunk", response.body_mut().frame())
        .await
        .unwrap()
        .unwrap();
    response
}
