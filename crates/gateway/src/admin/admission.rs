//! `GET /admission`: each tenant's tier, weight, requests in flight and budgets as they stand,
//! and the gateway-wide caps.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response};
use axum::response::IntoResponse;
use serde::Serialize;
use sluice_core::admission::{reset_text, Level};
use tokio::time::Instant;

use super::Admin;
use crate::admit::Tenant;

#[derive(Serialize)]
struct BudgetView {
    limit: u64,
    remaining: u64,
    reset: String,
}

impl From<Level> for BudgetView {
    fn from(level: Level) -> Self {
        Self {
            limit: level.limit,
            remaining: level.remaining,
            reset: reset_text(level.reset),
        }
    }
}

#[derive(Serialize)]
struct TenantView {
    name: String,
    tier: &'static str,
    weight: f64,
    in_flight: u32,
    max_concurrent: Option<u32>,
    tokens_per_minute: Option<BudgetView>,
    requests_per_minute: Option<BudgetView>,
}

impl TenantView {
    fn of(tenant: &Tenant, now: Instant) -> Self {
        Self {
            name: tenant.id.to_string(),
            tier: tenant.tier.name(),
            weight: tenant.weight,
            in_flight: tenant.in_flight(),
            max_concurrent: tenant.max_concurrent,
            tokens_per_minute: Tenant::level(&tenant.tokens, now).map(Into::into),
            requests_per_minute: Tenant::level(&tenant.requests, now).map(Into::into),
        }
    }
}

pub(crate) async fn admission(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
) -> Response<Body> {
    if let Err(e) = admin.check_read(&headers) {
        return e.into_response();
    }
    let now = Instant::now();
    let tenants: Vec<TenantView> = admin
        .admit
        .tenants()
        .all()
        .map(|t| TenantView::of(t, now))
        .collect();
    axum::Json(serde_json::json!({
        "tenants": tenants,
        "gateway": admin.admit.gateway_view(),
        "queue": admin.admit.queue().map(|q| q.view()),
        "degradation": admin.degrade.as_ref().map(|d| d.view()),
    }))
    .into_response()
}
