//! The front stage: the OpenAI routes, and everything a request must pass before it is admitted
//! — not draining, the API key, the content type, the body limit, the JSON facts routing needs.
//! Bad input ends here, in the OpenAI error shape, before any worker spends anything on it.
//!
//! It makes the request's context and the one immutable value every later stage reads
//! (`request::Asked`), and runs the stages in order, each taking the one before's hand-off by
//! value: admit -> `Admitted` -> route -> `Placement` -> forward -> `Answer` -> stream back. The
//! context is lent to each only to record what it observed; a refusal from any stage is answered
//! here and the context ends with it.

mod pick;
mod refused;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Response};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use hyper::body::Incoming;
use tokio::time::Instant;

pub use crate::forward::DataPlaneReply;
pub use crate::request::{parse, parse_form, ApiRoute, RequestFacts};
pub use pick::{pick, Answered, Picked};
pub use refused::{Answers, GatewayError};

use crate::admit::{AdmitError, AdmitStage};
use crate::context::{Accounts, RequestContext};
use crate::error::{reflected, respond, Answerable};
use crate::fleet::Fleet;
use crate::forward::{Dispatch, Forwarder};
use crate::http::{
    discard, read_body, request_id, BodyLimits, Keys, RequestError, Shortcut, REQUEST_ID,
};
use crate::request::{Arrival, Asked};
use crate::route::RouteStage;
use crate::stream;

/// What the front stage takes of a request before any other stage sees it: its body's size and
/// time, the bodies held at once, what a body may ask for. Built by its settings section
/// (`config::IntakeSettings`), taken whole.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Intake {
    /// `--max-payload-size`: the largest body read.
    pub max_payload: usize,
    /// `--max-buffered-body-bytes`: bytes of request bodies held at once.
    pub max_buffered: usize,
    /// `--body-read-timeout-secs`: a body's time to arrive once its head has.
    pub body_read_timeout: std::time::Duration,
    /// `--max-n`, `--max-tokens-limit`.
    pub limits: RequestLimits,
}

/// What the front stage is configured with, built by its settings section
/// (`config::IntakeSettings`) and taken whole at assembly.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// The body's size and time, and what a body may ask for.
    pub intake: Intake,
    /// `--request-id-headers`: where a client's own request id is read from, in order.
    pub request_id_headers: Vec<HeaderName>,
    /// How refusals are answered (`--overload-status-code`).
    pub answers: Answers,
}

/// What the gateway accepts of a request's own numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// `--max-n`.
    pub(crate) max_n: u64,
    /// `--max-tokens-limit`; `None`: no bound of the gateway's.
    pub max_tokens: Option<u64>,
}

impl RequestLimits {
    /// Refuses a request asking for more than the limits allow, naming the field.
    fn check(&self, facts: &RequestFacts<'_>) -> Result<(), RequestError> {
        if facts.n > self.max_n {
            return Err(RequestError::AboveMax {
                param: "n",
                max: self.max_n,
                got: facts.n,
            });
        }
        match (facts.max_tokens, self.max_tokens) {
            (Some(got), Some(max)) if got > max => Err(RequestError::AboveMax {
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
    /// The workers, for `/v1/models`.
    pub(crate) fleet: Arc<Fleet>,
    /// Admission: tenants, tiers, budgets, the queue, the ladder, the model's pool.
    pub(crate) admit: AdmitStage,
    /// The chooser: the first worker of an admitted request.
    pub(crate) route: RouteStage,
    /// The exchange with workers, retries included.
    pub(crate) forward: Forwarder,
    /// Where every request is accounted for (metrics, access log, in-flight count).
    pub(crate) accounts: Accounts,
    /// The client keys (and tenants' keys) a request must carry.
    pub(crate) keys: Keys,
    /// The body's size and time, and what a body may ask for.
    pub(crate) intake: Intake,
    /// `--max-buffered-body-bytes`: bytes of request bodies held at once, in permits.
    pub(crate) body_budget: tokio::sync::Semaphore,
    /// `--request-id-headers`: where a client's own request id is read from, in order.
    pub(crate) request_id_headers: Vec<HeaderName>,
    /// How refusals are answered: `--overload-status-code` for an overload.
    pub(crate) answers: Answers,
    /// Set when shutdown begins: new requests are refused.
    pub(crate) draining: Arc<AtomicBool>,
}

impl Front {
    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// The model-routed routes (every `ApiRoute`), `/v1/models` and one model's card.
pub(crate) fn routes(front: Arc<Front>) -> Router {
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
pub(crate) fn shortcut(front: Arc<Front>) -> Shortcut {
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
    let arrival = Arrival {
        id: request_id(&parts.headers, &front.request_id_headers),
        route,
        started,
    };
    // Counted in flight from here, before the draining check, so shutdown cannot miss a request
    // that passed it.
    let mut ctx = RequestContext::new(&front.accounts, arrival.id.clone(), route.path(), started);
    ctx.trace_from(&front.accounts, &parts.headers);
    let mut body = Some(body);
    let served = serve(front, &mut ctx, &arrival, &parts, &mut body, &front.forward).await;
    let rate_limits = ctx.admission.rate_headers.take();
    let degraded = degraded_header(&ctx.degraded);
    let mut response = match served {
        Ok(answer) => stream::relay(answer, ctx),
        Err(error) => {
            let status = front.answers.status(&error);
            ctx.refuse(status, &error);
            if let Some(unread) = body {
                // Refused before the body was read: read it away first (see `http::discard`).
                discard(unread).await;
            }
            respond(&error, status)
        }
    };
    let headers = response.headers_mut();
    headers.insert(REQUEST_ID, arrival.id);
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
pub(crate) const DEGRADED: HeaderName = HeaderName::from_static("x-sluice-degraded");

fn degraded_header(plan: &crate::context::Degraded) -> Option<HeaderValue> {
    if plan.notes.is_empty() {
        return None;
    }
    HeaderValue::try_from(plan.notes.join(", ")).ok()
}

/// The stages in order: front's own checks, then admit, route and `dispatch` (forward, or the
/// handover to a data plane). `body` is taken once it has been read whole; a refusal before
/// that leaves it for the caller.
async fn serve<D: Dispatch>(
    front: &Front,
    ctx: &mut RequestContext,
    arrival: &Arrival,
    parts: &Parts,
    body: &mut Option<Body>,
    dispatch: &D,
) -> Result<D::Sent, GatewayError> {
    if front.is_draining() {
        return Err(RequestError::ShuttingDown.into());
    }
    let route = arrival.route;
    let owner = front.keys.check_client(&parts.headers)?;
    let form_type = if route.is_form() {
        Some(require_form(&parts.headers)?)
    } else {
        require_json(&parts.headers)?;
        None
    };
    let Some(unread) = body.as_mut() else {
        return Err(RequestError::BodyUnreadable.into());
    };
    let limits = BodyLimits {
        max_bytes: front.intake.max_payload,
        within: front.intake.body_read_timeout,
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
    front.intake.limits.check(&facts)?;
    ctx.stream = facts.stream;
    let asked = Asked {
        arrival,
        parts,
        body,
        facts: &facts,
        owner,
    };
    run_stages(front, ctx, &asked, dispatch).await
}

/// The stages after the request was read, each taking the one before's hand-off by value:
/// admit (waiting in the gateway queue if it must) -> `Admitted` -> route -> `Placement` ->
/// dispatch.
async fn run_stages<D: Dispatch>(
    front: &Front,
    ctx: &mut RequestContext,
    asked: &Asked<'_>,
    dispatch: &D,
) -> Result<D::Sent, GatewayError> {
    // Each hand-off is made in a block that ends before the next stage is awaited, and handed
    // on as it is made, so the request's future keeps no place for it beside the next stage's.
    let placing = {
        let admitting = Instant::now();
        let mut admitted = match front.admit.admit(asked, ctx).await {
            Ok(admitted) => {
                ctx.admission_ended(admitting, None);
                admitted
            }
            Err(error) => {
                ctx.admission_ended(admitting, Some(&error));
                return Err(error.into());
            }
        };
        // What admission took is given back with the request's ending, which its context knows.
        ctx.keep(admitted.grants.take());
        let excluded = dispatch.excluded(&admitted.pool)?;
        front.route.place(asked, admitted, excluded)
    };
    // Converted in place, not taken apart and rewrapped by `?`: the answer is large.
    let placement = placing.await?;
    dispatch
        .dispatch(ctx, asked, placement)
        .await
        .map_err(GatewayError::from)
}

/// An upload must say it is a multipart form (its boundary is in the content type).
fn require_form(headers: &HeaderMap) -> Result<String, RequestError> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/form-data")
        })
        .map(str::to_string)
        .ok_or(RequestError::UnsupportedMediaType)
}

/// A body that says it is something other than JSON is refused; no content type is accepted. So
/// is a compressed body: the gateway must read the JSON, and decodes no content coding.
fn require_json(headers: &HeaderMap) -> Result<(), RequestError> {
    if let Some(encoding) = headers.get(header::CONTENT_ENCODING) {
        let encoding = String::from_utf8_lossy(encoding.as_bytes());
        if !encoding.trim().eq_ignore_ascii_case("identity") {
            return Err(RequestError::UnsupportedContentEncoding {
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
        Err(RequestError::UnsupportedMediaType)
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
    let mut aliases: Vec<_> = front.admit.aliases.iter().collect();
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
    let found = match front.admit.aliases.get(&id) {
        Some(model) => alias_card(&snapshot, &id, model),
        None => card(&snapshot, &id),
    };
    match found {
        Some(card) => axum::Json(card).into_response(),
        None => {
            let error = AdmitError::ModelNotFound {
                model: reflected(&id),
            };
            respond(&error, error.status())
        }
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
    let mut routable = pool.workers.iter().filter(|w| w.is_routable()).peekable();
    routable.peek()?;
    // A worker that lists it (an adapter's pool also holds workers it may be loaded onto).
    let card = routable.find_map(|worker| {
        let info = worker.info()?;
        info.models
            .iter()
            .find(|m| m.id.as_str() == model)
            .map(|m| m.card.clone())
    });
    Some(card.unwrap_or_else(
        || serde_json::json!({"id": model, "object": "model", "owned_by": "sluice"}),
    ))
}
