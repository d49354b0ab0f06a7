//! The gateway's own probes and metrics: `/liveness` and `/health` (200 while the process runs,
//! shutdown included), `/readiness` (whether a request could be served now), `/metrics`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use serde::Serialize;

use crate::front::App;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/liveness", get(live))
        .route("/health", get(live))
        .route("/readiness", get(ready))
        .route("/metrics", get(metrics))
}

async fn live() -> StatusCode {
    StatusCode::OK
}

#[derive(Serialize)]
struct Readiness {
    status: &'static str,
    healthy_workers: usize,
    total_workers: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
}

/// Ready when not shutting down and at least one worker could take a request now: Ready *and*
/// its circuit not open, so readiness never claims a fleet whose every circuit is open.
async fn ready(State(app): State<Arc<App>>) -> Response<Body> {
    let snapshot = app.fleet.snapshot();
    let healthy = snapshot.workers.iter().filter(|w| w.is_routable()).count();
    let reason = if app.is_draining() {
        Some("draining")
    } else if healthy == 0 {
        Some("insufficient healthy workers")
    } else {
        None
    };
    let body = Readiness {
        status: if reason.is_some() {
            "not_ready"
        } else {
            "ready"
        },
        healthy_workers: healthy,
        total_workers: snapshot.workers.len(),
        reason,
    };
    let status = if reason.is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, axum::Json(body)).into_response()
}

/// Prometheus text (OpenMetrics).
pub async fn metrics(State(app): State<Arc<App>>) -> Response<Body> {
    let mut text = String::with_capacity(16 * 1024);
    if prometheus_client::encoding::text::encode(&mut text, &app.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
