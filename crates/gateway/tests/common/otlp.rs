//! An OpenTelemetry collector's trace receiver on a free loopback port, built from
//! `opentelemetry-proto`'s types: OTLP over gRPC (its tonic `TraceService`), or over
//! HTTP/protobuf (the same `ExportTraceServiceRequest` behind `POST /v1/traces`). What arrives is
//! handed to the test span by span. A silent receiver takes the connection and never answers.

use std::net::SocketAddr;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::sync::mpsc;

pub struct Receiver {
    pub addr: SocketAddr,
    spans: mpsc::UnboundedReceiver<Span>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Collect(mpsc::UnboundedSender<Span>);

fn forward(to: &mpsc::UnboundedSender<Span>, request: ExportTraceServiceRequest) {
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            for span in scope.spans {
                let _ = to.send(span);
            }
        }
    }
}

#[tonic::async_trait]
impl TraceService for Collect {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        forward(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// OTLP over gRPC.
    pub async fn grpc() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, spans) = mpsc::unbounded_channel();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Collect(tx)))
                .serve_with_incoming(incoming)
                .await;
        });
        Self { addr, spans, task }
    }

    /// OTLP over HTTP/protobuf.
    pub async fn http() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, spans) = mpsc::unbounded_channel();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: bytes::Bytes| {
                let tx = tx.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
                    forward(&tx, request);
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, spans, task }
    }

    /// Takes connections and never answers, as a collector that has stopped reading.
    pub async fn silent() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_tx, spans) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Self { addr, spans, task }
    }

    /// `HOST:PORT`, as `--otlp-traces-endpoint` takes it.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// The next `n` spans to arrive.
    pub async fn take(&mut self, n: usize) -> Vec<Span> {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            got.push(self.spans.recv().await.unwrap());
        }
        got
    }
}

/// A span's attribute as text (strings, and numbers and booleans written out).
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

/// Lower-case hex of an id's bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
