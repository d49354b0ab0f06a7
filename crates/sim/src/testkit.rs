//! A small HTTP client and fleet helpers for black-box tests of the simulator and of anything
//! put in front of it. Test support: it panics on transport errors instead of returning them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::{EngineConfig, Flavor, FleetConfig, Profile, SimFleet};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// An engine that answers at once.
pub fn instant(flavor: Flavor) -> EngineConfig {
    EngineConfig::new(flavor, "test-model", Profile::named("instant").unwrap())
}

/// An engine with real (8B/H100) step times, sped up `scale` times.
pub fn timed(flavor: Flavor, scale: f64) -> EngineConfig {
    let mut cfg = EngineConfig::new(
        flavor,
        "test-model",
        Profile::named("llama3-8b-h100").unwrap(),
    );
    cfg.time_scale = scale;
    cfg
}

pub async fn fleet(cfg: EngineConfig) -> SimFleet {
    SimFleet::start(FleetConfig::local(1, cfg)).await.unwrap()
}

pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn events(&self) -> Vec<String> {
        sse_events(&self.text())
    }
}

pub fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data event: {e:?}"))
                .to_string()
        })
        .collect()
}

pub async fn send(
    client: &HttpClient,
    method: &str,
    url: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut request = http::Request::builder().method(method).uri(url);
    let typed = headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
    if body.is_some() && !typed {
        request = request.header("content-type", "application/json");
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

pub async fn get(client: &HttpClient, url: &str) -> Answer {
    send(client, "GET", url, None, &[]).await
}

pub async fn post(client: &HttpClient, url: &str, body: &str) -> Answer {
    send(client, "POST", url, Some(body), &[]).await
}
