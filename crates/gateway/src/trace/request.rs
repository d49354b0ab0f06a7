//! One request's spans while it runs. The request span (kind server) is the parent of an
//! admission span and of one span per attempt on a worker (kind client); the first byte is an
//! event on the request span. Spans are built only for a sampled request, and sent together when
//! the request ends; an unsampled one still names its attempts to the workers (`traceparent`
//! with the sampled flag off), so the trace stays one across services.
//!
//! Times are taken on the runtime's clock (`tokio::time::Instant`) and placed on the wall clock
//! from the request's arrival, so a span's length is what the gateway measured.

use std::borrow::Cow;
use std::time::SystemTime;

use axum::http::HeaderMap;
use opentelemetry::trace::{Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    IdGenerator, SamplingDecision, ShouldSample, SpanData, SpanEvents, SpanLinks,
};
use tokio::time::Instant;

use super::Tracing;

/// How an attempt on a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    /// The worker's answer went to the client with this status.
    Answered(u16),
    /// Given up for another worker, for this reason (`connect`, `at_capacity`, ...).
    Retried(&'static str),
    /// The request ended here with the gateway's error code.
    Failed(&'static str),
    /// The client left while it ran.
    Cancelled,
}

/// The attempt running now.
#[derive(Debug)]
struct Open {
    span: SpanContext,
    name: Cow<'static, str>,
    started: Instant,
    attributes: Vec<KeyValue>,
}

/// One request's trace.
#[derive(Debug)]
pub(crate) struct RequestTrace {
    tracing: Tracing,
    /// The request span's own context.
    span: SpanContext,
    /// The client's span, when it sent a valid `traceparent`.
    parent: Option<SpanContext>,
    route: &'static str,
    started: Instant,
    started_wall: SystemTime,
    /// Finished spans under the request span.
    children: Vec<SpanData>,
    events: Vec<Event>,
    attempt: Option<Open>,
}

impl RequestTrace {
    pub(super) fn begin(
        tracing: Tracing,
        parent: Option<SpanContext>,
        parent_cx: &Context,
        route: &'static str,
    ) -> Self {
        let shared = &tracing.0;
        let trace_id = parent
            .as_ref()
            .map_or_else(|| shared.ids.new_trace_id(), SpanContext::trace_id);
        let sampling = shared.sampler.should_sample(
            Some(parent_cx),
            trace_id,
            route,
            &SpanKind::Server,
            &[],
            &[],
        );
        let sampled = sampling.decision == SamplingDecision::RecordAndSample;
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let span = SpanContext::new(
            trace_id,
            shared.ids.new_span_id(),
            flags,
            false,
            sampling.trace_state,
        );
        Self {
            tracing,
            span,
            parent,
            route,
            started: Instant::now(),
            started_wall: SystemTime::now(),
            children: Vec::new(),
            events: Vec::new(),
            attempt: None,
        }
    }

    /// Whether this request's spans are recorded and exported.
    pub(crate) fn sampled(&self) -> bool {
        self.span.is_sampled()
    }

    pub(crate) fn trace_id(&self) -> TraceId {
        self.span.trace_id()
    }

    fn wall(&self, at: Instant) -> SystemTime {
        self.started_wall + at.saturating_duration_since(self.started)
    }

    fn child_context(&self) -> SpanContext {
        SpanContext::new(
            self.span.trace_id(),
            self.tracing.0.ids.new_span_id(),
            self.span.trace_flags(),
            false,
            self.span.trace_state().clone(),
        )
    }

    fn child(
        &self,
        span: SpanContext,
        name: Cow<'static, str>,
        kind: SpanKind,
        (from, to): (Instant, Instant),
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context: span,
            parent_span_id: self.span.span_id(),
            parent_span_is_remote: false,
            span_kind: kind,
            name,
            start_time: self.wall(from),
            end_time: self.wall(to),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.tracing.0.scope.clone(),
        }
    }

    /// Admission ran from `from` until now; `refused`: the error code it answered with.
    pub(crate) fn admission(
        &mut self,
        from: Instant,
        attributes: Vec<KeyValue>,
        refused: Option<&str>,
    ) {
        if !self.sampled() {
            return;
        }
        let status = match refused {
            Some(code) => Status::error(code.to_string()),
            None => Status::Unset,
        };
        let span = self.child_context();
        let data = self.child(
            span,
            Cow::Borrowed("admission"),
            SpanKind::Internal,
            (from, Instant::now()),
            attributes,
            status,
        );
        self.children.push(data);
    }

    /// An attempt on a worker starts now. One still open (it should not be) ends as cancelled.
    pub(crate) fn attempt(&mut self, name: Cow<'static, str>, attributes: Vec<KeyValue>) {
        self.attempt_ended(AttemptEnd::Cancelled);
        self.attempt = Some(Open {
            span: self.child_context(),
            name,
            started: Instant::now(),
            attributes,
        });
    }

    /// The attempt running now ended so.
    pub(crate) fn attempt_ended(&mut self, end: AttemptEnd) {
        let Some(open) = self.attempt.take() else {
            return;
        };
        if !self.sampled() {
            return;
        }
        let Open {
            span,
            name,
            started,
            mut attributes,
        } = open;
        let (outcome, status) = match end {
            AttemptEnd::Answered(code) => {
                attributes.push(KeyValue::new(
                    opentelemetry_semantic_conventions::attribute::HTTP_RESPONSE_STATUS_CODE,
                    i64::from(code),
                ));
                let status = if code >= 500 {
                    Status::error(code.to_string())
                } else {
                    Status::Unset
                };
                ("answered", status)
            }
            AttemptEnd::Retried(cause) => {
                attributes.push(KeyValue::new("sluice.retry.cause", cause));
                ("retried", Status::error(cause))
            }
            AttemptEnd::Failed(code) => {
                attributes.push(KeyValue::new(
                    opentelemetry_semantic_conventions::attribute::ERROR_TYPE,
                    code,
                ));
                ("failed", Status::error(code))
            }
            AttemptEnd::Cancelled => ("cancelled", Status::Unset),
        };
        attributes.push(KeyValue::new("sluice.attempt.outcome", outcome));
        let data = self.child(
            span,
            name,
            SpanKind::Client,
            (started, Instant::now()),
            attributes,
            status,
        );
        self.children.push(data);
    }

    /// `traceparent` (and `tracestate`) for the worker of the attempt running now: its span is
    /// the worker's parent.
    pub(crate) fn to_worker(&self, headers: &mut HeaderMap) {
        let span = self.attempt.as_ref().map_or(&self.span, |open| &open.span);
        super::inject(span, headers);
    }

    /// Something happened at `at` (the first byte, say).
    pub(crate) fn event(&mut self, name: &'static str, at: Instant, attributes: Vec<KeyValue>) {
        if self.sampled() {
            self.events
                .push(Event::new(name, self.wall(at), attributes, 0));
        }
    }

    /// The request ended now: its span, with `attributes` and `status`, and every span under
    /// it go to the exporter. An attempt still open is one its client left.
    pub(crate) fn finish(mut self, attributes: Vec<KeyValue>, status: Status) {
        self.attempt_ended(AttemptEnd::Cancelled);
        if !self.sampled() {
            return;
        }
        let mut spans = std::mem::take(&mut self.children);
        let name = Cow::Owned(format!("POST {}", self.route));
        let mut events = SpanEvents::default();
        events.events = std::mem::take(&mut self.events);
        spans.push(SpanData {
            span_context: self.span.clone(),
            parent_span_id: self
                .parent
                .as_ref()
                .map_or(SpanId::INVALID, SpanContext::span_id),
            parent_span_is_remote: self.parent.is_some(),
            span_kind: SpanKind::Server,
            name,
            start_time: self.started_wall,
            end_time: self.wall(Instant::now()),
            attributes,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.tracing.0.scope.clone(),
        });
        self.tracing.0.queue.send(spans);
    }
}
