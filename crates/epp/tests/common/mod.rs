//! A data plane in the test's hands: it speaks ext_proc to the picker as Envoy's filter does in
//! full-duplex streamed mode, sends the request where the picker says with the headers and body
//! the picker gave back, and streams the worker's answer through the picker to the "client"
//! (the test). Black-box: only the picker's gRPC port and the engines' HTTP ports are used.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

pub mod envoy;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, HeaderMutation, HttpBody, HttpHeaders,
    ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::value::Kind;
use http_body_util::BodyExt;
pub use sluice_epp::{EppSettings, Picker};
pub use sluice_gateway::Config;
pub use sluice_sim::testkit::*;
pub use sluice_sim::{EngineConfig, Fault, Flavor, FleetConfig, SimFleet};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

/// Every wait in these tests is bounded: a bug fails the test instead of hanging it.
pub async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The picker's settings for a test: loopback, free ports, plaintext gRPC.
pub fn epp_settings() -> EppSettings {
    EppSettings {
        grpc_port: 0,
        grpc_health_port: 0,
        secure_serving: false,
        cert_path: None,
        inference_objectives: Vec::new(),
        pool_name: None,
        pool_namespace: "default".into(),
        pool_group: sluice_gateway::control::discovery::pool::POOL_GROUP.into(),
    }
}

pub struct Setup {
    pub sims: SimFleet,
    pub picker: Picker,
}

/// `engines` simulated engines and a picker over them, its workers ready.
pub async fn start(
    engines: usize,
    engine: EngineConfig,
    tune: impl FnOnce(&mut Config, &mut EppSettings),
) -> Setup {
    let sims = SimFleet::start(FleetConfig::local(engines, engine))
        .await
        .unwrap();
    let mut config = Config::local(&sims.urls());
    let mut epp = epp_settings();
    tune(&mut config, &mut epp);
    let picker = Picker::start(config, &epp).await.unwrap();
    let s = Setup { sims, picker };
    s.until_ready(engines).await;
    s
}

impl Setup {
    /// Waits until `n` workers are routable, on the gateway's change notices.
    pub async fn until_ready(&self, n: usize) {
        let gateway = self.picker.gateway();
        let mut changes = gateway.changes();
        bounded("workers ready", async {
            loop {
                changes.borrow_and_update();
                let ready = gateway
                    .fleet()
                    .snapshot()
                    .workers
                    .iter()
                    .filter(|w| w.is_routable())
                    .count();
                if ready >= n {
                    return;
                }
                changes.changed().await.unwrap();
            }
        })
        .await;
    }

    pub async fn data_plane(&self) -> DataPlane {
        DataPlane::connect(self.picker.grpc_addr()).await
    }
}

/// What the picker decided for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Sent to `endpoint` (the header's value; the metadata's was asserted to be the same).
    Routed { endpoint: String },
    /// The picker answered itself.
    Immediate,
}

/// What the client got, and how.
#[derive(Debug)]
pub struct Exchange {
    pub decision: Decision,
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    /// The headers the worker received, when it was sent to one.
    pub sent_headers: http::HeaderMap,
    /// The body the worker received.
    pub sent_body: Bytes,
}

impl Exchange {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    pub fn code(&self) -> Option<&str> {
        self.headers
            .get("x-sluice-error-code")
            .map(|v| v.to_str().unwrap())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub struct DataPlane {
    client: ExternalProcessorClient<Channel>,
    http: HttpClient,
}

fn wire_headers(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: k.to_string(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

fn message(request: processing_request::Request) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        ..ProcessingRequest::default()
    }
}

fn apply(mutation: Option<&HeaderMutation>, to: &mut http::HeaderMap) {
    let Some(mutation) = mutation else { return };
    for name in &mutation.remove_headers {
        to.remove(name.as_str());
    }
    for HeaderValueOption {
        header,
        append_action,
        ..
    } in &mutation.set_headers
    {
        let header = header.as_ref().unwrap();
        let name = http::HeaderName::from_bytes(header.key.as_bytes()).unwrap();
        let value = http::HeaderValue::from_bytes(&header.raw_value).unwrap();
        if *append_action == 0 {
            to.append(name, value);
        } else {
            to.insert(name, value);
        }
    }
}

async fn next_whole(answers: &mut Streaming<ProcessingResponse>) -> ProcessingResponse {
    bounded("the picker's answer", answers.message())
        .await
        .unwrap()
        .expect("the picker ended the stream early")
}

async fn next(answers: &mut Streaming<ProcessingResponse>) -> processing_response::Response {
    next_whole(answers).await.response.unwrap()
}

/// A streamed body answer's bytes and whether it ended the body.
fn streamed(
    answer: &envoy_types::pb::envoy::service::ext_proc::v3::BodyResponse,
) -> (Vec<u8>, bool) {
    match answer
        .response
        .as_ref()
        .and_then(|r| r.body_mutation.as_ref())
        .and_then(|m| m.mutation.as_ref())
    {
        Some(body_mutation::Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not a streamed body: {other:?}"),
    }
}

impl DataPlane {
    pub async fn connect(addr: std::net::SocketAddr) -> Self {
        let client = ExternalProcessorClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        Self {
            client,
            http: client_http(),
        }
    }

    /// A JSON POST to `path` through the picker.
    pub async fn post(&mut self, path: &str, body: &str, headers: &[(&str, &str)]) -> Exchange {
        let mut all = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", "gateway"),
            (":scheme", "http"),
            ("content-type", "application/json"),
        ];
        all.extend_from_slice(headers);
        self.exchange(&all, Some(body.as_bytes())).await
    }

    /// A chat completion through the picker.
    pub async fn chat(&mut self, body: &str, headers: &[(&str, &str)]) -> Exchange {
        self.post("/v1/chat/completions", body, headers).await
    }

    /// One request through the picker and, when it says so, a worker.
    pub async fn exchange(&mut self, head: &[(&str, &str)], body: Option<&[u8]>) -> Exchange {
        self.exchange_with(head, body, None).await
    }

    /// `exchange`, the data plane sending `metadata` (its subset hint, say) with the request.
    pub async fn exchange_with(
        &mut self,
        head: &[(&str, &str)],
        body: Option<&[u8]>,
        metadata: Option<Metadata>,
    ) -> Exchange {
        let (tx, rx) = mpsc::channel(64);
        let mut answers = self
            .client
            .process(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let mut first = message(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(wire_headers(head)),
            end_of_stream: body.is_none(),
            ..HttpHeaders::default()
        }));
        first.metadata_context = metadata;
        tx.send(first).await.unwrap();
        if let Some(body) = body {
            // In two pieces, as a data plane may pass it on.
            let (first, rest) = body.split_at(body.len() / 2);
            for (piece, eos) in [(first, false), (rest, true)] {
                tx.send(message(processing_request::Request::RequestBody(
                    HttpBody {
                        body: piece.to_vec(),
                        end_of_stream: eos,
                        ..HttpBody::default()
                    },
                )))
                .await
                .unwrap();
            }
        }
        let mut request_headers = http::HeaderMap::new();
        for (k, v) in head.iter().filter(|(k, _)| !k.starts_with(':')) {
            request_headers.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        let path = head.iter().find(|(k, _)| *k == ":path").unwrap().1;
        let first = next_whole(&mut answers).await;
        let in_metadata = metadata_endpoint(&first);
        let routed = match first.response.unwrap() {
            processing_response::Response::ImmediateResponse(immediate) => {
                let mut headers = http::HeaderMap::new();
                apply(immediate.headers.as_ref(), &mut headers);
                return Exchange {
                    decision: Decision::Immediate,
                    status: immediate.status.unwrap().code as u16,
                    headers,
                    body: Bytes::from(immediate.body),
                    sent_headers: http::HeaderMap::new(),
                    sent_body: Bytes::new(),
                };
            }
            processing_response::Response::RequestHeaders(routed) => routed,
            other => panic!("unexpected first answer: {other:?}"),
        };
        apply(
            routed
                .response
                .as_ref()
                .and_then(|r| r.header_mutation.as_ref()),
            &mut request_headers,
        );
        let endpoint = request_headers
            .get("x-gateway-destination-endpoint")
            .expect("the endpoint header")
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(
            in_metadata.as_deref(),
            Some(endpoint.as_str()),
            "the header and the metadata name the same endpoint"
        );
        let mut sent_body = Vec::new();
        if body.is_some() {
            loop {
                match next(&mut answers).await {
                    processing_response::Response::RequestBody(b) => {
                        let (bytes, eos) = streamed(&b);
                        sent_body.extend(bytes);
                        if eos {
                            break;
                        }
                    }
                    other => panic!("expected the request body, got {other:?}"),
                }
            }
        }
        self.to_worker(WorkerCall {
            tx,
            answers,
            endpoint,
            path: path.to_string(),
            headers: request_headers,
            body: sent_body,
        })
        .await
    }

    /// Sends the request to the worker, and its answer back through the picker.
    async fn to_worker(&self, call: WorkerCall) -> Exchange {
        let WorkerCall {
            tx,
            mut answers,
            endpoint,
            path,
            headers,
            body,
        } = call;
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{endpoint}{path}"));
        for (name, value) in &headers {
            if name != "x-gateway-destination-endpoint" {
                request = request.header(name, value);
            }
        }
        let sent_body = Bytes::from(body);
        let request = request
            .body(http_body_util::Full::new(sent_body.clone()))
            .unwrap();
        let response = self.http.request(request).await.unwrap();
        let (parts, mut worker_body) = response.into_parts();
        let status = parts.status.as_u16().to_string();
        let mut head: Vec<(&str, &str)> = vec![(":status", status.as_str())];
        for (name, value) in &parts.headers {
            head.push((name.as_str(), value.to_str().unwrap()));
        }
        tx.send(message(processing_request::Request::ResponseHeaders(
            HttpHeaders {
                headers: Some(wire_headers(&head)),
                end_of_stream: false,
                ..HttpHeaders::default()
            },
        )))
        .await
        .unwrap();
        // The worker's body goes to the picker piece by piece while its answers are read.
        let pump = tokio::spawn(async move {
            while let Some(frame) = worker_body.frame().await {
                let Ok(data) = frame.unwrap().into_data() else {
                    continue;
                };
                let piece = message(processing_request::Request::ResponseBody(HttpBody {
                    body: data.to_vec(),
                    end_of_stream: false,
                    ..HttpBody::default()
                }));
                if tx.send(piece).await.is_err() {
                    return;
                }
            }
            let _ = tx
                .send(message(processing_request::Request::ResponseBody(
                    HttpBody {
                        end_of_stream: true,
                        ..HttpBody::default()
                    },
                )))
                .await;
            // The data plane keeps its side open until the client's answer is over.
            std::future::pending::<()>().await;
            drop(tx);
        });
        let mut client_headers = parts.headers.clone();
        match next(&mut answers).await {
            processing_response::Response::ResponseHeaders(h) => apply(
                h.response.as_ref().and_then(|r| r.header_mutation.as_ref()),
                &mut client_headers,
            ),
            other => panic!("expected the response headers' answer, got {other:?}"),
        }
        let mut client_body = Vec::new();
        loop {
            match next(&mut answers).await {
                processing_response::Response::ResponseBody(b) => {
                    let (bytes, eos) = streamed(&b);
                    client_body.extend(bytes);
                    if eos {
                        break;
                    }
                }
                other => panic!("expected the response body, got {other:?}"),
            }
        }
        // The client's answer is over (the picker may end it before the worker does, at a
        // deadline): the data plane stops reading the worker and closes its side.
        pump.abort();
        Exchange {
            decision: Decision::Routed {
                endpoint: headers["x-gateway-destination-endpoint"]
                    .to_str()
                    .unwrap()
                    .to_string(),
            },
            status: parts.status.as_u16(),
            headers: client_headers,
            body: Bytes::from(client_body),
            sent_headers: headers,
            sent_body,
        }
    }
}

struct WorkerCall {
    tx: mpsc::Sender<ProcessingRequest>,
    answers: Streaming<ProcessingResponse>,
    endpoint: String,
    path: String,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

/// The HTTP client the data plane reaches workers with.
fn client_http() -> HttpClient {
    client()
}

/// The `envoy.lb` metadata's endpoint of a routing answer.
pub fn metadata_endpoint(answer: &ProcessingResponse) -> Option<String> {
    let lb = answer.dynamic_metadata.as_ref()?.fields.get("envoy.lb")?;
    let Some(Kind::StructValue(inner)) = &lb.kind else {
        return None;
    };
    match &inner.fields.get("x-gateway-destination-endpoint")?.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A subset hint allowing `endpoints`.
pub fn subset_hint(endpoints: &[String]) -> Metadata {
    use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: endpoints
                .iter()
                .map(|e| Value {
                    kind: Some(Kind::StringValue(e.clone())),
                })
                .collect(),
        })),
    };
    let mut metadata = Metadata::default();
    metadata.filter_metadata.insert(
        "envoy.lb.subset_hint".into(),
        Struct {
            fields: [("x-gateway-destination-endpoint-subset".to_string(), list)].into(),
        },
    );
    metadata
}

/// `ip:port` of a worker URL `http://ip:port`.
pub fn address_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

/// The picker's `/metrics`, as text.
pub async fn metrics(picker: &Picker) -> String {
    let url = format!("{}/metrics", picker.gateway().url());
    get(&client(), &url).await.text()
}

pub fn chat_body(content: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

impl Setup {
    /// The picker's `/workers` until worker `i`'s view satisfies `done`; on change notices.
    pub async fn until_worker(
        &self,
        i: usize,
        what: &str,
        mut done: impl FnMut(&serde_json::Value) -> bool,
    ) {
        let gateway = self.picker.gateway();
        let url = format!("{}/workers", gateway.url());
        let http = client();
        let mut changes = gateway.changes();
        bounded(what, async {
            loop {
                changes.borrow_and_update();
                let view = get(&http, &url).await.json();
                if done(&view["workers"][i]) {
                    return;
                }
                changes.changed().await.unwrap();
            }
        })
        .await;
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
