//! What a request's spans say of it, from what its context learned. Names from OpenTelemetry's
//! semantic conventions 1.42.0 where they have one — HTTP (`http.*`, `error.type`) and GenAI
//! (`gen_ai.*`, experimental: `trace::genai`) — and `sluice.*` for the gateway's own decisions.

use std::borrow::Cow;

use opentelemetry::trace::Status;
use opentelemetry::KeyValue;
use opentelemetry_semantic_conventions::attribute as semconv;
use sluice_core::WorkerId;

use super::{Ending, RequestContext};
use crate::error::Answerable;
use crate::trace::genai;

/// GenAI's operation name for an OpenAI route, where the conventions have one.
fn operation(route: &str) -> Option<&'static str> {
    match route {
        "/v1/chat/completions" => Some("chat"),
        "/v1/completions" | "/generate" => Some("text_completion"),
        "/v1/embeddings" => Some("embeddings"),
        _ => None,
    }
}

/// The admission span's attributes: who asked, at what tier, how long it queued, the answer.
pub(super) fn admission(ctx: &RequestContext, refused: Option<&dyn Answerable>) -> Vec<KeyValue> {
    let mut attributes = Vec::with_capacity(5);
    if let Some(tenant) = &ctx.admission.tenant {
        attributes.push(KeyValue::new("sluice.tenant", tenant.to_string()));
    }
    if let Some(tier) = ctx.admission.tier {
        attributes.push(KeyValue::new("sluice.tier", tier.name()));
    }
    if let Some(wait) = ctx.queue_wait {
        attributes.push(KeyValue::new(
            "sluice.queue.wait_ms",
            wait.as_secs_f64() * 1e3,
        ));
    }
    let decision = match refused {
        Some(error) => {
            attributes.push(KeyValue::new("sluice.admission.reason", error.code()));
            "refused"
        }
        None if ctx.queue_wait.is_some() => "admitted after waiting",
        None => "admitted",
    };
    attributes.push(KeyValue::new("sluice.admission.decision", decision));
    attributes
}

/// An attempt span's name (GenAI's `{operation} {model}` for a client call) and attributes.
pub(super) fn attempt(
    ctx: &RequestContext,
    worker: &WorkerId,
) -> (Cow<'static, str>, Vec<KeyValue>) {
    let model = ctx.model.as_ref().map(ToString::to_string);
    let name = match (operation(ctx.route), &model) {
        (Some(op), Some(model)) => Cow::Owned(format!("{op} {model}")),
        (Some(op), None) => Cow::Borrowed(op),
        (None, _) => Cow::Borrowed("attempt"),
    };
    let mut attributes = vec![
        KeyValue::new("sluice.worker", worker.to_string()),
        KeyValue::new("sluice.attempt", i64::from(ctx.attempts)),
    ];
    if let Some(op) = operation(ctx.route) {
        attributes.push(KeyValue::new(genai::OPERATION_NAME, op));
    }
    if let Some(model) = model {
        attributes.push(KeyValue::new(genai::REQUEST_MODEL, model));
    }
    (name, attributes)
}

/// The end event's attributes: what went to the client.
pub(super) fn end_event(ending: &Ending) -> Vec<KeyValue> {
    vec![
        KeyValue::new("sluice.bytes", ending.bytes as i64),
        KeyValue::new("sluice.events", ending.chunks as i64),
    ]
}

/// The request span's attributes and status, as it ended.
pub(super) fn request(ctx: &RequestContext, ending: &Ending) -> (Vec<KeyValue>, Status) {
    let mut a = Vec::with_capacity(20);
    a.push(KeyValue::new(semconv::HTTP_REQUEST_METHOD, "POST"));
    a.push(KeyValue::new(semconv::HTTP_ROUTE, ctx.route));
    a.push(KeyValue::new(
        "sluice.request_id",
        ctx.id.to_str().unwrap_or_default().to_string(),
    ));
    if let Some(status) = ending.status {
        a.push(KeyValue::new(
            semconv::HTTP_RESPONSE_STATUS_CODE,
            i64::from(status),
        ));
    }
    if let Some(op) = operation(ctx.route) {
        a.push(KeyValue::new(genai::OPERATION_NAME, op));
    }
    if let Some(model) = &ctx.model {
        a.push(KeyValue::new(genai::REQUEST_MODEL, model.to_string()));
    }
    a.push(KeyValue::new(genai::REQUEST_STREAM, ctx.stream));
    if let Some(tenant) = &ctx.admission.tenant {
        a.push(KeyValue::new("sluice.tenant", tenant.to_string()));
    }
    if let Some(tier) = ctx.admission.tier {
        a.push(KeyValue::new("sluice.tier", tier.name()));
    }
    if let Some(worker) = &ctx.worker {
        a.push(KeyValue::new("sluice.worker", worker.to_string()));
    }
    a.push(KeyValue::new("sluice.attempts", i64::from(ctx.attempts)));
    if let Some(code) = ctx.code {
        a.push(KeyValue::new(semconv::ERROR_TYPE, code));
        a.push(KeyValue::new("sluice.error_code", code));
    }
    if let Some(class) = ctx.error_event {
        a.push(KeyValue::new("sluice.error_event", class));
    }
    answer_attributes(&mut a, ctx, ending);
    if !ctx.degraded.notes.is_empty() {
        a.push(KeyValue::new(
            "sluice.degraded",
            ctx.degraded.notes.join(", "),
        ));
    }
    if ending.cancelled {
        a.push(KeyValue::new("sluice.cancelled", true));
    }
    if ending.interrupted {
        a.push(KeyValue::new("sluice.interrupted", true));
    }
    let failed =
        ending.interrupted || ctx.error_event.is_some() || ending.status.is_some_and(|s| s >= 500);
    let status = if failed {
        Status::error(ctx.code.unwrap_or("failed"))
    } else {
        Status::Unset
    };
    (a, status)
}

/// What the answer itself tells: its usage, its time to first chunk and per output token.
fn answer_attributes(a: &mut Vec<KeyValue>, ctx: &RequestContext, ending: &Ending) {
    if let Some(usage) = ending.usage {
        a.push(KeyValue::new(
            genai::USAGE_INPUT_TOKENS,
            usage.prompt as i64,
        ));
        a.push(KeyValue::new(
            genai::USAGE_OUTPUT_TOKENS,
            usage.completion as i64,
        ));
    }
    if ending.forwarded && ending.status.is_some() {
        // The first byte of the answer: its first token for a stream.
        a.push(KeyValue::new(
            genai::RESPONSE_TIME_TO_FIRST_CHUNK,
            ctx.ttfb.as_secs_f64(),
        ));
        a.push(KeyValue::new(
            "sluice.ttft_ms",
            ctx.ttfb.as_secs_f64() * 1e3,
        ));
        if let Some(tpot) = time_per_output_token(ctx, ending) {
            a.push(KeyValue::new("sluice.tpot_ms", tpot * 1e3));
        }
    }
}

/// Seconds per output token after the first: the rest of the answer over the rest of its
/// tokens (from its usage, else its events).
fn time_per_output_token(ctx: &RequestContext, ending: &Ending) -> Option<f64> {
    let tokens = ending.usage.map_or(ending.chunks, |u| u.completion);
    let rest = ending.duration.checked_sub(ctx.ttfb)?;
    (tokens > 1).then(|| rest.as_secs_f64() / (tokens - 1) as f64)
}
