//! The front stage: the OpenAI routes, and everything a request must pass before it is admitted
//! — not draining, the API key, the content type, the body limit, the JSON facts routing needs.
//! Bad input ends here, in the OpenAI error shape, before any worker spends anything on it.
//!
//! It makes the request's context and runs the stages in order — admit (which places the
//! request), forward, stream back — each lent the context; a worker's answer goes to the
//! stream-back stage with the context, a refusal from any stage is answered here and the context
//! ends with it.

mod parse;
mod pick;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Response};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use hyper::body::Incoming;
use tokio::time::Instant;

pub use crate::forward::DataPlaneReply;
pub use parse::{parse, parse_form, ApiRoute, RequestFacts};
pub use pick::{pick, Answered, Picked};

use crate::admit::{AdmitStage, Asking, Placed};
use crate::context::{Accounts, RequestContext};
use crate::error::{reflected, GatewayError};
use crate::fleet::Fleet;
use crate::forward::{Dispatch, Forwarder};
use crate::http::{
    discard, read_body, request_id, BodyLimits, KeyOwner, Keys, Shortcut, REQUEST_ID,
};
use crate::route::Wants;
use crate::stream;
use crate::tokens::PromptJson;
use sluice_core::admission::Tier;

/// What the gateway accepts of a request's own numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// `--max-n`.
    pub max_n: u64,
    /// `--max-tokens-limit`; `None`: no bound of the gateway's.
    pub max_tokens: Option<u64>,
}

impl RequestLimits {
    /// Refuses a request asking for more than the limits allow, naming the field.
    fn check(&self, facts: &RequestFacts<'_>) -> Result<(), GatewayError> {
        if facts.n > self.max_n {
            return Err(GatewayError::AboveMax {
                param: "n",
                max: self.max_n,
                got: facts.n,
            });
        }
        match (facts.max_tokens, self.max_tokens) {
            (Some(got), Some(max)) if got > max => Err(GatewayError::AboveMax {
                param: facts.max_tokens_param,
                max,
                got,
            }),
            _ => Ok(()),
        }
    }
}

/// The request path's stages and what the front stage itself needs, shared by every request.
pub struct Front {
    pub fleet: Arc<Fleet>,
    pub admit: AdmitStage,
    pub forward: Forwarder,
    /// Where every request is accounted for (metrics, access log, in-flight count).
    pub accounts: Accounts,
    pub keys: Keys,
    pub max_payload: usize,
    /// `--body-read-timeout-secs`.
    pub body_read_timeout: std::time::Duration,
    /// `--max-buffered-body-bytes`: bytes of request bodies held at once, in permits.
    pub body_budget: tokio::sync::Semaphore,
    pub limits: RequestLimits,
    /// `--request-id-headers`: where a client's own request id is read from, in order.
    pub request_id_headers: Vec<HeaderName>,
    /// `--routing-key-headers`: what hash policies hash, the first present one, before the
    /// `user` field.
    pub routing_key_headers: Vec<HeaderName>,
    /// Set when shutdown begins: new requests are refused.
    pub draining: Arc<AtomicBool>,
}

impl Front {
    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// The model-routed routes (every `ApiRoute`), `/v1/models` and one model's card.
pub fn routes(front: Arc<Front>) -> Router {
    let mut router = Router::new();
    for route in ApiRoute::ALL {
        router = router.route(
            route.path(),
            post(
                move |State(front): State<Arc<Front>>, request: Request| async move {
                    openai(&front, route, request).await
                },
            ),
        );
    }
    router
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_card))
        .with_state(front)
}

/// The model-routed routes answered before the router (`http::Shortcut`): a POST to one of their
/// paths goes straight to `openai`, as the router would send it; anything else is handed back.
/// The request handed back is matched at once, never stored: boxing it would cost an
/// allocation on every request the router takes.
#[allow(clippy::result_large_err)]
pub fn shortcut(front: Arc<Front>) -> Shortcut {
    Arc::new(move |request: Request<Incoming>| {
        let route = (request.method() == Method::POST)
            .then(|| ApiRoute::at(request.uri().path()))
            .flatten();
        let Some(route) = route else {
            return Err(request);
        };
        let front = front.clone();
        Ok(Box::pin(async move {
            openai(&front, route, request.map(Body::new)).await
        }))
    })
}

/// One OpenAI request, from arrival to the start of its response. Its context is made here and
/// goes with the response body; a refusal is answered here and the context ends with it.
async fn openai(front: &Front, route: ApiRoute, request: Request) -> Response<Body> {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let id = request_id(&parts.headers, &front.request_id_headers);
    // Counted in flight from here, before the draining check, so shutdown cannot miss a request
    // that passed it.
    let mut ctx = RequestContext::new(&front.accounts, id.clone(), route.path(), started);
    ctx.trace_from(&front.accounts, &parts.headers);
    let mut body = Some(body);
    let served = serve(front, &mut ctx, route, &parts, &mut body, &front.forward).await;
    let rate_limits = ctx.admission.rate_headers.take();
    let degraded = degraded_header(&ctx.degraded);
    let mut response = match served {
        Ok(answer) => stream::relay(answer, ctx),
        Err(error) => {
            ctx.refuse(&error);
            if let Some(unread) = body {
                // Refused before the body was read: read it away first (see `http::discard`).
                discard(unread).await;
            }
            error.into_response()
        }
    };
    let headers = response.headers_mut();
    headers.insert(REQUEST_ID, id);
    if let Some(limits) = rate_limits {
        // A tenant with budgets sees them on every answer, as OpenAI's clients expect.
        headers.extend(limits);
    }
    if let Some(degraded) = degraded {
        headers.insert(DEGRADED, degraded);
    }
    response
}

/// What the degradation ladder did to a request, on its response.
pub const DEGRADED: HeaderName = HeaderName::from_static("x-sluice-degraded");

fn degraded_header(plan: &crate::context::Degraded) -> Option<HeaderValue> {
    if plan.notes.is_empty() {
        return None;
    }
    HeaderValue::try_from(plan.notes.join(", ")).ok()
}

/// The stages in order: front's own checks, admit, then `dispatch` (forward, or the handover to a
/// data plane). `body` is taken once it has been read whole; a refusal before that leaves it for
/// the caller.
async fn serve<D: Dispatch>(
    front: &Front,
    ctx: &mut RequestContext,
    route: ApiRoute,
    parts: &Parts,
    body: &mut Option<Body>,
    dispatch: &D,
) -> Result<D::Sent, GatewayError> {
    if front.is_draining() {
        return Err(GatewayError::ShuttingDown);
    }
    let owner = front.keys.check_client(&parts.headers)?;
    let form_type = if route.is_form() {
        Some(require_form(&parts.headers)?)
    } else {
        require_json(&parts.headers)?;
        None
    };
    let Some(unread) = body.as_mut() else {
        return Err(GatewayError::BodyUnreadable);
    };
    let limits = BodyLimits {
        max_bytes: front.max_payload,
        within: front.body_read_timeout,
        budget: Some(&front.body_budget),
    };
    let buffered = read_body(unread, &parts.headers, limits).await?;
    *body = None;
    // `buffered` holds its share of the budget until the request has been sent on.
    let body = &buffered.bytes;
    let facts = match &form_type {
        Some(content_type) => parse_form(content_type, body).await?,
        None => parse(route, body)?,
    };
    front.limits.check(&facts)?;
    ctx.stream = facts.stream;
    let read = Read {
        route,
        parts,
        body,
        facts: &facts,
    };
    admit_and_dispatch(front, ctx, read, owner, dispatch).await
}

/// A request read whole and parsed.
struct Read<'a> {
    route: ApiRoute,
    parts: &'a Parts,
    body: &'a Bytes,
    facts: &'a RequestFacts<'a>,
}

/// The stages after the request was read: admit (which places it, waiting in the gateway queue
/// if it must), then dispatch.
async fn admit_and_dispatch<D: Dispatch>(
    front: &Front,
    ctx: &mut RequestContext,
    read: Read<'_>,
    owner: KeyOwner,
    dispatch: &D,
) -> Result<D::Sent, GatewayError> {
    let Read {
        route,
        parts,
        body,
        facts,
    } = read;
    let asking = Asking {
        headers: &parts.headers,
        owner,
        prompt_tokens: facts.prompt_tokens_estimate(),
        max_tokens: facts.max_tokens,
        n: facts.n,
    };
    let wants = wants(front, route, parts, facts);
    let admitting = Instant::now();
    let placed = front
        .admit
        .place(ctx, &asking, wants, route.takes_model())
        .await;
    ctx.admission_ended(admitting, placed.as_ref().err());
    let placed = placed?;
    let sending = Sending {
        route,
        facts,
        body,
        served: placed.placement.pool.model.as_str(),
    };
    let body = sending.body(&placed, ctx);
    dispatch.dispatch(ctx, parts, &body, placed.placement).await
}

/// A request about to be sent to a worker of the `served` model.
struct Sending<'a> {
    route: ApiRoute,
    facts: &'a RequestFacts<'a>,
    body: &'a Bytes,
    served: &'a str,
}

impl Sending<'_> {
    /// The body to send, as the ladder leaves it: re-serialised only when a step changed it,
    /// otherwise as it came (its model named as served).
    fn body(&self, placed: &Placed<'_>, ctx: &mut RequestContext) -> Bytes {
        placed
            .degrade
            .and_then(|degrade| {
                degrade.rewrite(placed.tier, self.served, self.body, &mut ctx.degraded)
            })
            .unwrap_or_else(|| served_body(self.route, self.facts, self.body, self.served))
    }
}

/// What the chooser reads of a request (its tier is admission's to set).
fn wants<'a>(
    front: &'a Front,
    route: ApiRoute,
    parts: &'a Parts,
    facts: &'a RequestFacts<'a>,
) -> Wants<'a> {
    Wants {
        model: facts.model.as_deref(),
        routing_key: front
            .routing_key_headers
            .iter()
            .find_map(|name| parts.headers.get(name))
            .map(HeaderValue::as_bytes)
            .or(facts.user.as_deref().map(str::as_bytes)),
        prompt: facts.prompt,
        prompt_json: match route {
            ApiRoute::Chat => Some(PromptJson::Messages(facts.prompt)),
            ApiRoute::Completions => Some(PromptJson::Completion(facts.prompt)),
            _ => None,
        },
        prompt_tokens: facts.prompt_tokens_estimate(),
        stream: facts.stream,
        n: facts.n,
        tier: Tier::Agent,
    }
}

/// The body the worker gets: told the model it serves — the one chosen for a request without
/// one, or the one an alias names — spliced in; the rest stays byte for byte.
fn served_body(route: ApiRoute, facts: &RequestFacts<'_>, body: &Bytes, served: &str) -> Bytes {
    match (&facts.model, &facts.model_at) {
        _ if !route.takes_model() => body.clone(),
        (Some(asked), _) if asked == served => body.clone(),
        (_, Some(at)) => with_model_at(body, at.clone(), served),
        (_, None) => with_model(body, served),
    }
}

/// `body` (a JSON object) with `"model":<model>` as its first field.
fn with_model(body: &Bytes, model: &str) -> Bytes {
    let Some(open) = body.iter().position(|b| *b == b'{') else {
        return body.clone();
    };
    let field = serde_json::to_string(model).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() + field.len() + 10);
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(b"\"model\":");
    out.extend_from_slice(field.as_bytes());
    // An empty object (the pass-through routes require no field) takes no separator.
    let rest = &body[open + 1..];
    if rest.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'}') {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// `body` with the value at `at` (a `null`, or an alias) replaced by `model` as a JSON string.
fn with_model_at(body: &Bytes, at: std::ops::Range<usize>, model: &str) -> Bytes {
    let field = serde_json::to_string(model).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() + field.len());
    out.extend_from_slice(&body[..at.start]);
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(&body[at.end..]);
    Bytes::from(out)
}

/// An upload must say it is a multipart form (its boundary is in the content type).
fn require_form(headers: &HeaderMap) -> Result<String, GatewayError> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/form-data")
        })
        .map(str::to_string)
        .ok_or(GatewayError::UnsupportedMediaType)
}

/// A body that says it is something other than JSON is refused; no content type is accepted. So
/// is a compressed body: the gateway must read the JSON, and decodes no content coding.
fn require_json(headers: &HeaderMap) -> Result<(), GatewayError> {
    if let Some(encoding) = headers.get(header::CONTENT_ENCODING) {
        let encoding = String::from_utf8_lossy(encoding.as_bytes());
        if !encoding.trim().eq_ignore_ascii_case("identity") {
            return Err(GatewayError::UnsupportedContentEncoding {
                encoding: reflected(encoding.trim()),
            });
        }
    }
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let mime = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    if mime.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(GatewayError::UnsupportedMediaType)
    }
}

/// `GET /v1/models`: the models at least one routable worker serves, each with the card a
/// worker gave for it.
async fn models(State(front): State<Arc<Front>>, headers: HeaderMap) -> Response<Body> {
    if let Err(e) = front.keys.check_client(&headers) {
        return e.into_response();
    }
    let snapshot = front.fleet.snapshot();
    let mut names: Vec<_> = snapshot.pools.keys().collect();
    names.sort();
    let mut data: Vec<serde_json::Value> = names
        .into_iter()
        .filter_map(|name| card(&snapshot, name.as_str()))
        .collect();
    let mut aliases: Vec<_> = front.admit.route.aliases().iter().collect();
    aliases.sort();
    data.extend(
        aliases
            .into_iter()
            .filter_map(|(alias, model)| alias_card(&snapshot, alias, model)),
    );
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: one model's card, as `/v1/models` lists it; 404 when no routable
/// worker serves it.
async fn model_card(
    State(front): State<Arc<Front>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response<Body> {
    if let Err(e) = front.keys.check_client(&headers) {
        return e.into_response();
    }
    let snapshot = front.fleet.snapshot();
    let found = match front.admit.route.aliases().get(&id) {
        Some(model) => alias_card(&snapshot, &id, model),
        None => card(&snapshot, &id),
    };
    match found {
        Some(card) => axum::Json(card).into_response(),
        None => GatewayError::ModelNotFound {
            model: reflected(&id),
        }
        .into_response(),
    }
}

/// The card of an alias: its model's, under the alias's name, with `root` naming the model.
fn alias_card(
    snapshot: &crate::fleet::Snapshot,
    alias: &str,
    model: &sluice_core::ModelName,
) -> Option<serde_json::Value> {
    let mut card = card(snapshot, model.as_str())?;
    card["id"] = serde_json::Value::from(alias);
    card["root"] = serde_json::Value::from(model.as_str());
    Some(card)
}

/// The card of `model` a routable worker gave, or a plain one; `None` when none serves it.
fn card(snapshot: &crate::fleet::Snapshot, model: &str) -> Option<serde_json::Value> {
    let pool = snapshot.pools.get(model)?;
    let worker = pool.workers.iter().find(|w| w.is_routable())?;
    let card = worker.info().and_then(|info| {
        info.models
            .iter()
            .find(|m| m.id.as_str() == model)
            .map(|m| m.card.clone())
    });
    Some(card.unwrap_or_else(
        || serde_json::json!({"id": model, "object": "model", "owned_by": "sluice"}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_spliced_in_without_touching_the_rest() {
        let body = Bytes::from_static(b" {\"messages\":[], \"x\": 1.50}");
        let out = with_model(&body, "m\"1");
        assert_eq!(
            &out[..],
            b" {\"model\":\"m\\\"1\",\"messages\":[], \"x\": 1.50}"
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "m\"1");
    }

    #[test]
    fn an_empty_object_gets_the_model_as_its_only_field() {
        for body in [&b"{}"[..], b"{ \n}"] {
            let out = with_model(&Bytes::from_static(body), "m");
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v, serde_json::json!({"model": "m"}));
        }
    }

    #[test]
    fn a_null_model_is_replaced_not_repeated() {
        let body = Bytes::from_static(br#"{"model": null, "messages":[]}"#);
        let out = with_model_at(&body, 10..14, "m");
        assert_eq!(&out[..], br#"{"model": "m", "messages":[]}"#);
    }
}
