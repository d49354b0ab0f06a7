//! The admin API: workers listed, registered, replaced, patched and removed at runtime.
//!
//! | route | what | auth |
//! | --- | --- | --- |
//! | `GET /workers`, `GET /workers/{id}` | workers with health, circuit, models, load | read |
//! | `POST /workers` | register (202 + `Location`; 409 if the URL is registered) | admin key |
//! | `PUT /workers/{id}` | replace the whole spec, register again under the same id | admin key |
//! | `PATCH /workers/{id}` | change `api_key`, `labels` or the `health` block in place | admin key |
//! | `GET /loads` | every worker's last load report and vetoes, and an aggregate | read |
//! | `GET /busy_threshold`, `POST /busy_threshold` | the busy-rank thresholds; POST changes them | GET: read; POST: admin key |
//! | `DELETE /workers/{id}` | drain (a serving worker), then remove | admin key |
//! | `GET /admission` | tenants' tiers, requests in flight and budgets; the gateway-wide caps | read |
//!
//! "read": the admin key when one is set (reads show worker addresses and probe errors), unless
//! `--admin-reads-open`; open when no admin key is set.
//!
//! A spec is validated before anything is registered: an invalid one is a 400 naming its field.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use serde::Serialize;
use sluice_core::ModelName;

use sluice_core::health::HealthState;
use tokio::time::Instant;

use crate::control::Control;

use crate::fleet::{
    Fleet, FleetError, Origin, Removal, SpecError, Worker, WorkerPatch, WorkerSpec,
};
use crate::http::{discard, read_body, BodyLimits, Keys};

/// Largest worker spec accepted.
const SPEC_MAX_BYTES: usize = 64 * 1024;

mod admission;
mod refusal;

pub(crate) use refusal::AdminError;
mod load;

/// What the admin API acts on.
pub(crate) struct Admin {
    pub(crate) fleet: Arc<Fleet>,
    /// The health settings in force per worker, and the busy thresholds.
    pub(crate) control: Arc<Control>,
    /// The admin's keys, and whether reads need one (`--admin-reads-open`).
    pub(crate) keys: Keys,
    /// `--body-read-timeout-secs`.
    pub(crate) body_read_timeout: std::time::Duration,
    /// The admit stage, whose tenants `/admission` shows.
    pub(crate) admit: Arc<crate::admit::Admit>,
    /// The degradation ladder, whose level `/admission` shows.
    pub(crate) degrade: Option<Arc<crate::admit::degrade::Degrader>>,
}

impl Admin {
    /// Whether these headers may read the admin API.
    fn check_read(&self, headers: &HeaderMap) -> Result<(), AdminError> {
        if self.keys.reads_open || !self.keys.admin_configured() {
            return Ok(());
        }
        Ok(self.keys.check_admin_read(headers)?)
    }
}

/// `/workers`, `/loads` and `/busy_threshold`.
pub(crate) fn routes(admin: Arc<Admin>) -> Router {
    Router::new()
        .route("/loads", get(load::loads))
        // SMG's name for the same view.
        .route("/get_loads", get(load::loads))
        .route("/busy_threshold", get(load::busy_get).post(load::busy_post))
        .route("/admission", get(admission::admission))
        .route("/workers", get(list).post(create))
        .route(
            "/workers/{id}",
            get(show).put(replace).patch(patch).delete(remove),
        )
        .with_state(admin)
}

#[derive(Serialize)]
struct CircuitView {
    state: &'static str,
    consecutive_failures: u32,
}

#[derive(Serialize)]
struct ProbeView {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    seconds_ago: f64,
}

/// The health state machine and the settings in force for this worker.
#[derive(Serialize)]
struct HealthView {
    state: HealthState,
    /// Seconds in this state.
    for_secs: f64,
    consecutive_failures: u32,
    consecutive_passes: u32,
    checks_enabled: bool,
    check_interval_secs: f64,
    timeout_secs: f64,
    failure_threshold: u32,
    success_threshold: u32,
    drain_settle_secs: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_probe: Option<ProbeView>,
}

impl HealthView {
    fn of(admin: &Admin, worker: &Worker) -> Self {
        let now = Instant::now();
        let health = worker.health.machine();
        let effective = admin.control.health_of(&admin.fleet, worker);
        Self {
            state: health.state(),
            for_secs: (now - health.since()).as_secs_f64(),
            consecutive_failures: health.consecutive_failures(),
            consecutive_passes: health.consecutive_passes(),
            checks_enabled: !effective.disabled,
            check_interval_secs: effective.interval.as_secs_f64(),
            timeout_secs: effective.timeout.as_secs_f64(),
            failure_threshold: effective.thresholds.failure,
            success_threshold: effective.thresholds.success,
            drain_settle_secs: effective.drain_settle.as_secs_f64(),
            last_probe: worker.health.last_probe().map(|p| ProbeView {
                ok: p.error.is_none(),
                error: p.error.clone(),
                seconds_ago: (now - p.at).as_secs_f64(),
            }),
        }
    }
}

/// A worker as the admin API shows it.
#[derive(Serialize)]
pub(crate) struct WorkerView {
    id: String,
    url: String,
    /// Who registered it: `worker_urls`, `api`, `discovery_file`, `dns` or `kubernetes`.
    source: Origin,
    /// `regular`, `prefill` or `decode` (prefill/decode disaggregation).
    role: &'static str,
    /// A decode worker's admission window as this gateway counts it.
    #[serde(skip_serializing_if = "Option::is_none")]
    decode_window: Option<DecodeWindowView>,
    status: HealthState,
    /// A request could be sent to it now (Ready and circuit not open).
    routable: bool,
    /// Reached over HTTP/2 with prior knowledge (its spec's `http2`, else `--upstream-http2`).
    http2: bool,
    flavor: Option<String>,
    models: Vec<ModelName>,
    in_flight: u64,
    /// This gateway's requests in flight on it by LoRA adapter (the engine's own view of its
    /// adapter slots is in `engine_load.adapters`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    adapters_in_flight: std::collections::BTreeMap<String, u64>,
    health: HealthView,
    circuit: CircuitView,
    /// Why it gets no new request now, health and circuit aside.
    vetoes: load::VetoView,
    /// Its last load report, when the last poll gave one.
    engine_load: Option<load::LoadView>,
    /// Its adaptive concurrency limit, when on.
    #[serde(skip_serializing_if = "Option::is_none")]
    concurrency: Option<load::LimitView>,
    /// How the cache-aware policy scores it: by the blocks its engine's KV events say it holds,
    /// or by where prompts were sent; what its events have done.
    prefix_cache: crate::fleet::PrefixCacheView,
    /// Its latency model: the prefill rate learned, its predictions' errors.
    latency: crate::fleet::LatencyView,
    spec: WorkerSpec,
}

impl WorkerView {
    pub(crate) fn of(admin: &Admin, worker: &Worker) -> Self {
        let spec = worker.live().spec.clone();
        Self {
            id: worker.id.to_string(),
            url: spec.url.clone(),
            source: worker.origin,
            role: worker.role().as_str(),
            decode_window: DecodeWindowView::of(worker),
            status: worker.status(),
            routable: worker.is_routable(),
            http2: worker.endpoint.http2,
            flavor: worker.info().map(|i| i.flavor.clone()),
            models: worker.models(),
            in_flight: worker.in_flight(),
            adapters_in_flight: worker
                .adapters
                .counts()
                .into_iter()
                .map(|(name, n)| (name.to_string(), n))
                .collect(),
            health: HealthView::of(admin, worker),
            vetoes: load::VetoView::of(worker),
            engine_load: load::LoadView::of(worker),
            concurrency: load::LimitView::of(worker),
            prefix_cache: worker.held.view(),
            latency: worker.latency.view(),
            circuit: CircuitView {
                state: worker.breaker.state().as_str(),
                consecutive_failures: worker.breaker.consecutive_failures(),
            },
            spec,
        }
    }
}

/// A decode worker's admission window (seed 000).
#[derive(Serialize)]
struct DecodeWindowView {
    /// Its engine's running window (its spec's, else its reports'); `null`: not gated.
    size: Option<u64>,
    in_flight: u64,
    waiting: usize,
}

impl DecodeWindowView {
    fn of(worker: &Worker) -> Option<Self> {
        if worker.role() != crate::fleet::Role::Decode {
            return None;
        }
        let (in_flight, waiting) = worker.decode_window.counts();
        Some(Self {
            size: worker.running_window(),
            in_flight,
            waiting,
        })
    }
}

async fn list(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> Response<Body> {
    if let Err(e) = admin.check_read(&headers) {
        return e.into_response();
    }
    let snapshot = admin.fleet.snapshot();
    let workers: Vec<WorkerView> = snapshot
        .workers
        .iter()
        .map(|w| WorkerView::of(&admin, w))
        .collect();
    let mut view = serde_json::json!({"total": workers.len(), "workers": workers});
    let sources = admin.control.sources();
    if !sources.is_empty() {
        view["discovery"] = serde_json::json!(sources);
    }
    axum::Json(view).into_response()
}

async fn show(
    State(admin): State<Arc<Admin>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response<Body> {
    if let Err(e) = admin.check_read(&headers) {
        return e.into_response();
    }
    match admin.fleet.snapshot().worker(&id) {
        Some(worker) => axum::Json(WorkerView::of(&admin, worker)).into_response(),
        None => AdminError::WorkerNotFound { id }.into_response(),
    }
}

/// The registry's refusals as the admin API answers them (409 `worker_exists`, 404
/// `worker_not_found`).
impl From<FleetError> for AdminError {
    fn from(e: FleetError) -> Self {
        match e {
            FleetError::Exists { url, id } => AdminError::WorkerExists { url, id },
            FleetError::NotFound { id } => AdminError::WorkerNotFound { id },
        }
    }
}

/// Checks the admin key and reads the body; a refused body is read away first (see
/// `http::discard`).
async fn authorized_body(admin: &Admin, request: Request) -> Result<bytes::Bytes, AdminError> {
    let (parts, mut body) = request.into_parts();
    let read = match admin.keys.check_admin(&parts.headers) {
        Ok(()) => {
            let limits = BodyLimits {
                max_bytes: SPEC_MAX_BYTES,
                within: admin.body_read_timeout,
                budget: None,
            };
            read_body(&mut body, &parts.headers, limits)
                .await
                .map(|b| b.bytes)
        }
        Err(e) => Err(e),
    };
    if read.is_err() {
        discard(body).await;
    }
    Ok(read?)
}

fn invalid(e: SpecError) -> AdminError {
    AdminError::InvalidWorkerSpec {
        field: e.field,
        message: e.message,
    }
}

fn accepted(admin: &Admin, worker: &Worker) -> Response<Body> {
    let view = WorkerView::of(admin, worker);
    let mut response = (StatusCode::ACCEPTED, axum::Json(view)).into_response();
    if let Ok(location) = HeaderValue::try_from(format!("/workers/{}", worker.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

async fn create(State(admin): State<Arc<Admin>>, request: Request) -> Response<Body> {
    register(&admin, request, |fleet, spec| fleet.add(spec, Origin::Api)).await
}

async fn replace(
    State(admin): State<Arc<Admin>>,
    Path(id): Path<String>,
    request: Request,
) -> Response<Body> {
    register(&admin, request, |fleet, spec| {
        fleet.replace(&id, spec, Origin::Api)
    })
    .await
}

/// POST and PUT: a validated spec, registered by `how`, answered 202 with its `Location`.
async fn register(
    admin: &Admin,
    request: Request,
    how: impl FnOnce(&Arc<Fleet>, WorkerSpec) -> Result<Arc<Worker>, FleetError>,
) -> Response<Body> {
    let result = async {
        let body = authorized_body(admin, request).await?;
        let spec = WorkerSpec::parse(&body).map_err(invalid)?;
        how(&admin.fleet, spec).map_err(AdminError::from)
    }
    .await;
    match result {
        Ok(worker) => accepted(admin, &worker),
        Err(e) => e.into_response(),
    }
}

async fn patch(
    State(admin): State<Arc<Admin>>,
    Path(id): Path<String>,
    request: Request,
) -> Response<Body> {
    let result = async {
        let body = authorized_body(&admin, request).await?;
        let patch = WorkerPatch::parse(&body).map_err(invalid)?;
        admin.fleet.patch(&id, patch).map_err(AdminError::from)
    }
    .await;
    match result {
        Ok(worker) => axum::Json(WorkerView::of(&admin, &worker)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn remove(
    State(admin): State<Arc<Admin>>,
    Path(id): Path<String>,
    request: Request,
) -> Response<Body> {
    if let Err(e) = admin.keys.check_admin(request.headers()) {
        return e.into_response();
    }
    match admin.fleet.remove(&id) {
        Ok(removal) => {
            let status = match removal {
                Removal::Draining => "draining",
                Removal::Removed => "removed",
            };
            (
                StatusCode::ACCEPTED,
                axum::Json(serde_json::json!({"id": id, "status": status})),
            )
                .into_response()
        }
        Err(e) => AdminError::from(e).into_response(),
    }
}
