//! Traces (`--enable-trace`): a sampled request becomes spans in the operator's tracing
//! backend — the request, its admission (and wait in the queue), each attempt on a worker, the
//! first byte and the stream's end — exported over OTLP off the request path.
//!
//! The client's W3C `traceparent` (and `tracestate`) is the parent when it is valid, and its
//! sampled flag is followed; without one, `--trace-sample-ratio` decides by trace id. Every
//! attempt's worker gets a `traceparent` naming the attempt's span, sampled or not, so an
//! engine's own spans join the trace.
//!
//! Attribute names follow OpenTelemetry's semantic conventions 1.42.0 (the
//! `opentelemetry-semantic-conventions` crate, 0.33) for HTTP, and its GenAI attributes
//! (`genai`, experimental; that crate marks them as moved to the semantic-conventions-genai
//! repository) for the model and usage; what they do not name is `sluice.*`.
//!
//! ## Layout
//!
//! - `export` — a bounded queue the request path hands finished spans to, and the task that
//!   exports them in batches; what cannot be exported in time is dropped and counted.
//! - `request` — one request's spans while it runs.

mod export;
pub(crate) mod genai;
mod request;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::KeyValue;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{RandomIdGenerator, Sampler};
use opentelemetry_sdk::Resource;

pub use export::{ExportStats, Exporting};
pub(crate) use request::{AttemptEnd, RequestTrace};

use crate::metrics::Metrics;

/// How spans leave: OTLP over gRPC (port 4317 by convention) or HTTP/protobuf (4318).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Grpc,
    Http,
}

impl Protocol {
    /// The collector's conventional port for this protocol.
    pub(crate) fn default_port(self) -> u16 {
        match self {
            Protocol::Grpc => 4317,
            Protocol::Http => 4318,
        }
    }
}

/// `--enable-trace` and its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceConfig {
    /// `--otlp-traces-endpoint`, `HOST:PORT`.
    pub(crate) endpoint: String,
    pub(crate) protocol: Protocol,
    /// `--trace-sample-ratio`: the share of traces started here that are recorded.
    pub(crate) sample_ratio: f64,
    /// The longest one export may take before its spans count as dropped.
    pub export_timeout: Duration,
    /// Requests whose spans may wait for the exporter before new ones are dropped.
    pub queue: usize,
}

impl TraceConfig {
    /// The defaults for a collector at `endpoint`.
    pub fn new(endpoint: String, protocol: Protocol, sample_ratio: f64) -> Self {
        Self {
            endpoint,
            protocol,
            sample_ratio,
            export_timeout: Duration::from_secs(5),
            queue: 2048,
        }
    }
}

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-traces-endpoint: {0}")]
pub struct TraceError(#[from] opentelemetry_otlp::ExporterBuildError);

/// What every request's trace shares.
#[derive(Debug, Clone)]
pub(crate) struct Tracing(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    sampler: Sampler,
    ids: RandomIdGenerator,
    propagator: TraceContextPropagator,
    queue: export::Queue,
    scope: opentelemetry::InstrumentationScope,
}

impl Tracing {
    /// Builds the exporter for `config` and starts the export task. The exporter connects
    /// lazily: a collector that is not up yet costs dropped spans, not a failed start.
    pub fn start(
        config: &TraceConfig,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, Exporting), TraceError> {
        let resource = Resource::builder()
            .with_service_name(
                std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "sluice".to_string()),
            )
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let (queue, exporting) = match config.protocol {
            Protocol::Grpc => {
                let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(format!("http://{}", config.endpoint))
                    .with_timeout(config.export_timeout)
                    .build()?;
                opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
                export::start(exporter, config.queue, metrics)
            }
            Protocol::Http => {
                let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_endpoint(format!("http://{}/v1/traces", config.endpoint))
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_timeout(config.export_timeout)
                    .build()?;
                opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
                export::start(exporter, config.queue, metrics)
            }
        };
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
        let scope = opentelemetry::InstrumentationScope::builder("sluice")
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(opentelemetry_semantic_conventions::SCHEMA_URL)
            .build();
        let shared = Shared {
            sampler,
            ids: RandomIdGenerator::default(),
            propagator: TraceContextPropagator::new(),
            queue,
            scope,
        };
        Ok((Self(Arc::new(shared)), exporting))
    }

    /// The exporter's counts as they change.
    pub(crate) fn stats(&self) -> tokio::sync::watch::Receiver<ExportStats> {
        self.0.queue.stats()
    }

    /// The trace of a request that arrived with `headers`: the client's context, if it sent a
    /// valid one, is its parent.
    pub(crate) fn begin(&self, headers: &HeaderMap, route: &'static str) -> RequestTrace {
        let parent_cx = self.0.propagator.extract(&HeaderExtractor(headers));
        let parent: Option<SpanContext> =
            Some(parent_cx.span().span_context().clone()).filter(SpanContext::is_valid);
        RequestTrace::begin(self.clone(), parent, &parent_cx, route)
    }
}

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// `span` as W3C `traceparent` (and `tracestate` when it has one), on every attempt, sampled
/// or not. Written here rather than through `TraceContextPropagator::inject_context`, which
/// formats through `core::fmt` and parses the header names on each call (4.3k instructions a
/// request under callgrind, against a few hundred); a test holds the two to the same bytes.
fn inject(span: &SpanContext, headers: &mut HeaderMap) {
    let mut line = [0u8; 55];
    line[..3].copy_from_slice(b"00-");
    hex_into(&span.trace_id().to_bytes(), &mut line[3..35]);
    line[35] = b'-';
    hex_into(&span.span_id().to_bytes(), &mut line[36..52]);
    line[52] = b'-';
    let flags = span.trace_flags() & opentelemetry::trace::TraceFlags::SAMPLED;
    hex_into(&[flags.to_u8()], &mut line[53..55]);
    if let Ok(value) = HeaderValue::from_bytes(&line) {
        headers.insert(TRACEPARENT, value);
    }
    let state = span.trace_state().header();
    if !state.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&state) {
            headers.insert(TRACESTATE, value);
        }
    }
}

/// Lower-case hex of `bytes` into `out` (twice as long).
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry::Context;

    #[test]
    fn the_traceparent_written_is_the_propagators() {
        let propagator = TraceContextPropagator::new();
        let state = TraceState::from_key_value([("vendor", "x1")]).unwrap_or_default();
        for (trace, span, flags, state) in [
            (
                u128::MAX - 7,
                0x00f0_67aa_0ba9_02b7,
                TraceFlags::SAMPLED,
                TraceState::default(),
            ),
            (1, 1, TraceFlags::default(), state),
            (
                0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736,
                u64::MAX,
                TraceFlags::new(0xff),
                TraceState::default(),
            ),
        ] {
            let span = SpanContext::new(
                TraceId::from(trace),
                SpanId::from(span),
                flags,
                false,
                state,
            );
            let mut ours = HeaderMap::new();
            inject(&span, &mut ours);
            let mut theirs = HeaderMap::new();
            let cx = Context::new().with_remote_span_context(span.clone());
            propagator.inject_context(&cx, &mut opentelemetry_http::HeaderInjector(&mut theirs));
            assert_eq!(ours.get("traceparent"), theirs.get("traceparent"));
            let tracestate = theirs.get("tracestate").filter(|v| !v.is_empty());
            assert_eq!(ours.get("tracestate"), tracestate);
        }
    }
}
