//! The front stage: the HTTP surface, and everything a request must pass before a worker is
//! chosen — the API key, the content type, the body limit, the JSON facts, the model's pool.
//! Bad input ends here, in the OpenAI error shape, before any worker spends anything on it.

mod auth;
mod parse;
mod request_id;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Response, Uri};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

pub use auth::Keys;
pub use parse::{parse, ApiRoute, RequestFacts};

use crate::access_log::{AccessLog, AccessRecord};
use crate::admin;
use crate::error::GatewayError;
use crate::fleet::Fleet;
use crate::forward::{Forwarder, Job, REQUEST_ID};
use crate::inflight::InFlight;
use crate::metrics::Metrics;
use crate::probes;
use crate::route::{self, RouteRequest};
use crate::stream::Ending;

/// Everything the handlers share.
pub struct App {
    pub fleet: Arc<Fleet>,
    pub forwarder: Forwarder,
    pub metrics: Arc<Metrics>,
    /// The registry `/metrics` encodes (the families in `metrics` and the fleet collector).
    pub registry: Registry,
    pub keys: Keys,
    pub max_payload: usize,
    pub routing_key_header: HeaderName,
    pub access_log: Option<AccessLog>,
    /// Set when shutdown begins: readiness turns 503 `draining`, new requests are refused.
    pub draining: Arc<AtomicBool>,
    pub probes: Arc<probes::Probes>,
    /// OpenAI requests in flight, which shutdown waits for.
    pub in_flight: Arc<InFlight>,
}

impl App {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// Every route of the gateway.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .merge(admin::routes())
        .merge(probes::routes(app.probes.clone()))
        .route("/metrics", get(probes::metrics))
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
}

async fn chat(State(app): State<Arc<App>>, request: Request) -> Response<Body> {
    openai(&app, ApiRoute::Chat, request).await
}

async fn completions(State(app): State<Arc<App>>, request: Request) -> Response<Body> {
    openai(&app, ApiRoute::Completions, request).await
}

async fn embeddings(State(app): State<Arc<App>>, request: Request) -> Response<Body> {
    openai(&app, ApiRoute::Embeddings, request).await
}

async fn unknown_route(method: Method, uri: Uri) -> Response<Body> {
    GatewayError::UnknownRoute {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
    .into_response()
}

/// axum adds the `Allow` header to what this returns.
async fn method_not_allowed(method: Method, uri: Uri) -> Response<Body> {
    GatewayError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
    .into_response()
}

/// One OpenAI request, from arrival to the start of its response.
async fn openai(app: &App, route: ApiRoute, request: Request) -> Response<Body> {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let request_id = request_id::accept_or_make(&parts.headers);
    // Counted before the draining check, so shutdown cannot miss a request that passed it.
    let in_flight = app.in_flight.enter();
    let ending = Ending {
        in_flight,
        metrics: app.metrics.clone(),
        route: route.path(),
        started,
        access: app
            .access_log
            .as_ref()
            .map(|log| (log.clone(), access_record(route, &request_id))),
    };
    let mut response = match serve(app, route, &parts, body, &request_id, ending).await {
        Ok(response) => response,
        Err((error, mut ending)) => {
            let status = error.status().as_u16();
            ending.note_error(status, error.code());
            app.metrics
                .count_request(route.path(), status, error.code());
            ending.finish(0, false, false);
            error.into_response()
        }
    };
    response.headers_mut().insert(REQUEST_ID, request_id);
    response
}

async fn serve(
    app: &App,
    route: ApiRoute,
    parts: &Parts,
    body: Body,
    request_id: &HeaderValue,
    mut ending: Ending,
) -> Result<Response<Body>, (GatewayError, Ending)> {
    macro_rules! check {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Err((e, ending)),
            }
        };
    }
    if app.is_draining() {
        return Err((GatewayError::ShuttingDown, ending));
    }
    check!(app.keys.check_client(&parts.headers));
    check!(require_json(&parts.headers));
    let body = check!(read_body(body, &parts.headers, app.max_payload).await);
    let facts = check!(parse(route, &body));
    if let Some((_, record)) = &mut ending.access {
        record.model = facts.model.as_deref().map(str::to_string);
        record.stream = facts.stream;
    }
    let snapshot = app.fleet.snapshot();
    let pool = check!(route::pool(&snapshot, facts.model.as_deref()));
    // The only model served was chosen for a request without one: say so to the worker too,
    // by splicing the field in (the rest of the body stays byte for byte).
    let body = if facts.model.is_none() {
        with_model(&body, pool.model.as_str())
    } else {
        body.clone()
    };
    let routing_key = parts
        .headers
        .get(&app.routing_key_header)
        .map(HeaderValue::as_bytes)
        .or(facts.user.as_deref().map(str::as_bytes));
    let target = RouteRequest::new(
        app.forwarder.policy(),
        routing_key,
        facts.prompt,
        facts.prompt_tokens_estimate(),
        facts.stream,
    );
    let job = Job {
        route,
        parts,
        body: &body,
        request_id,
        pool,
        target: &target,
    };
    app.forwarder.forward(job, ending).await
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
    out.push(b',');
    out.extend_from_slice(&body[open + 1..]);
    Bytes::from(out)
}

/// A body that says it is something other than JSON is refused; no content type is accepted.
fn require_json(headers: &HeaderMap) -> Result<(), GatewayError> {
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

/// Reads the whole body, refusing one over `limit` bytes whether it declares its length or is
/// chunked.
pub async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, GatewayError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(GatewayError::PayloadTooLarge { limit })
        }
        Err(_) => Err(GatewayError::BodyUnreadable),
    }
}

fn access_record(route: ApiRoute, request_id: &HeaderValue) -> AccessRecord {
    AccessRecord {
        ts_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        request_id: request_id.to_str().unwrap_or("").to_string(),
        route: route.path(),
        model: None,
        worker: None,
        status: 0,
        code: None,
        stream: false,
        attempts: 0,
        ttfb_ms: 0.0,
        duration_ms: 0.0,
        bytes: 0,
        cancelled: false,
        interrupted: false,
    }
}

/// `GET /v1/models`: the models at least one routable worker serves, each with the card a
/// worker gave for it.
async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response<Body> {
    if let Err(e) = app.keys.check_client(&headers) {
        return e.into_response();
    }
    let snapshot = app.fleet.snapshot();
    let mut names: Vec<_> = snapshot.pools.keys().collect();
    names.sort();
    let data: Vec<serde_json::Value> = names
        .into_iter()
        .filter_map(|name| {
            let pool = &snapshot.pools[name];
            let worker = pool.workers.iter().find(|w| w.is_routable())?;
            let card = worker.info().and_then(|info| {
                info.models
                    .iter()
                    .find(|m| &m.id == name)
                    .map(|m| m.card.clone())
            });
            Some(card.unwrap_or_else(
                || serde_json::json!({"id": name, "object": "model", "owned_by": "sluice"}),
            ))
        })
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
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
}
