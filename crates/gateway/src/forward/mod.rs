//! The forward stage: send the request to the chosen worker, retry only what is safe, and hand
//! the response to the stream-back stage.
//!
//! Retries (see `sluice_core::retry` for why so few): a connection that never carried the request,
//! a connection lost before any answer (the worker died), or a worker's explicit at-capacity
//! answer (429, 529), is tried again on a *different* worker,
//! after an exponential, jittered backoff, at most `--retry-max-retries` times, and only while
//! the retry budget (tower's `TpsBudget`: retries stay under a share of recent requests) allows —
//! so a fleet-wide outage does not multiply its own load. When no other worker is left, the last
//! worker's answer is relayed as is (or, for connection failures, 502 `upstream_unreachable`).
//! Nothing is retried once the response has started.

mod client;
mod headers;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderValue, Request, Response, Uri, Version};
use bytes::Bytes;
use http_body_util::Full;
use sluice_core::breaker::Outcome;
use sluice_core::policy::Policy;
use sluice_core::retry::{may_retry, AttemptFailure};
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};

pub use client::{Upstream, UpstreamRequest, UpstreamResponse};
pub use headers::{is_event_stream, REQUEST_ID};

use crate::config::RetryConfig;
use crate::error::GatewayError;
use crate::fleet::{Lease, Pool};
use crate::front::ApiRoute;
use crate::metrics::{CancelLabels, Metrics, ReasonLabel, StageLabel, UpstreamErrorLabels};
use crate::route::{self, RouteRequest, Shedding};
use crate::stream::{Ending, Relay};
use sluice_core::overload::VetoClass;

/// How long a worker's own at-capacity answer (429, 529) keeps new requests off it: about the
/// time one of its running requests takes to free a slot.
const AT_CAPACITY_VETO: Duration = Duration::from_secs(1);

/// The window the retry budget looks back over.
const BUDGET_WINDOW: Duration = Duration::from_secs(10);

/// One request to forward.
pub struct Job<'a> {
    pub route: ApiRoute,
    pub parts: &'a Parts,
    pub body: &'a Bytes,
    pub request_id: &'a HeaderValue,
    pub pool: &'a Pool,
    pub target: &'a RouteRequest,
}

/// The forward stage, shared by every request.
pub struct Forwarder {
    upstream: Upstream,
    policy: Policy,
    shedding: Shedding,
    retry: RetryConfig,
    budget: TpsBudget,
    request_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Forwarder {
    pub fn new(
        upstream: Upstream,
        policy: Policy,
        shedding: Shedding,
        retry: RetryConfig,
        request_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let budget = TpsBudget::new(
            BUDGET_WINDOW,
            retry.budget_min_per_sec,
            (retry.budget_percent / 100.0) as f32,
        );
        Self {
            upstream,
            policy,
            shedding,
            retry,
            budget,
            request_timeout,
            metrics,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Forwards `job` until a worker answers, a failure is final, or the client goes away (the
    /// future is dropped: the upstream request goes with it).
    pub async fn forward(
        &self,
        job: Job<'_>,
        mut ending: Ending,
    ) -> Result<Response<Body>, (GatewayError, Ending)> {
        let deadline = ending.started + self.request_timeout;
        let mut waiting = WaitingGuard {
            metrics: &self.metrics,
            route: ending.route,
            armed: true,
        };
        self.budget.deposit();
        let mut tried: Vec<u64> = Vec::new();
        let mut attempts = 0u32;
        let outcome = loop {
            let selected =
                match route::select(&self.policy, &self.shedding, job.pool, job.target, &tried) {
                    Ok(selected) => selected,
                    Err(e) => {
                        if matches!(e, GatewayError::WorkerOverloadShed { .. }) {
                            self.count_shed("select");
                        }
                        break Err(e);
                    }
                };
            match selected.fallback {
                Some(VetoClass::Overload) => {
                    self.metrics.overload_fallbacks.inc();
                }
                Some(VetoClass::Liveness) => {
                    self.metrics.liveness_fallbacks.inc();
                }
                None => {}
            }
            let lease = selected.lease;
            attempts += 1;
            ending.note_attempt(lease.worker().id.as_str(), attempts);
            match self.attempt(&job, lease, attempts, &tried, deadline).await {
                Attempt::Answered(answer) => break Ok(answer),
                Attempt::Final(error) => break Err(error),
                Attempt::Retry(worker, failure) => {
                    tried.push(worker);
                    self.count_retry(failure);
                    let wait = self.retry.backoff.delay(attempts, rand::random::<f64>());
                    tokio::time::sleep_until((Instant::now() + wait).min(deadline)).await;
                }
            }
        };
        waiting.armed = false;
        match outcome {
            Ok(answer) => Ok(relay(answer, deadline, ending)),
            Err(error) => Err((error, ending)),
        }
    }

    /// One attempt on the leased worker.
    async fn attempt(
        &self,
        job: &Job<'_>,
        mut lease: Lease,
        attempts: u32,
        tried: &[u64],
        deadline: Instant,
    ) -> Attempt {
        let worker = lease.worker().clone();
        if self.shedding.enabled && worker.veto_class() == Some(VetoClass::Overload) {
            // Flagged between selection and dispatch: shed rather than pick again.
            self.count_shed("dispatch");
            return Attempt::Final(GatewayError::OverloadedBeforeDispatch {
                worker: worker.id.clone(),
                model: job.pool.model.clone(),
                status: self.shedding.status,
                retry_after: self.shedding.retry_after,
            });
        }
        lease.prefilling(job.target.prompt_tokens);
        if job.target.stream {
            lease.streaming();
        }
        let sent_at = Instant::now();
        let request = build_request(job, &lease);
        let sent = tokio::time::timeout_at(deadline, self.upstream.send(worker.http2, request));
        match sent.await {
            Err(_) => Attempt::Final(self.timed_out(lease)),
            Ok(Ok(response)) => {
                worker.signals.contact(Instant::now());
                let at_capacity = matches!(response.status().as_u16(), 429 | 529);
                if at_capacity {
                    // The worker says it is full: keep new requests off it for a moment.
                    worker.vetoes.at_capacity_for(AT_CAPACITY_VETO);
                }
                if at_capacity
                    && self.may_retry(AttemptFailure::AtCapacity, job, tried, &lease, attempts)
                {
                    // Not a failure of the worker: its permit is handed back unrecorded.
                    return Attempt::Retry(worker.key, AttemptFailure::AtCapacity);
                }
                Attempt::Answered(Answered {
                    response,
                    lease,
                    sent_at,
                })
            }
            Ok(Err(e)) => {
                // Refused or reset: the transport failed, a liveness signal.
                worker.signals.transport_failure(Instant::now());
                let (failure, kind) = if e.is_connect() {
                    (AttemptFailure::Connect, "connect")
                } else {
                    (AttemptFailure::Dropped, "reset")
                };
                lease.settle(Outcome::Failure);
                self.count_upstream_error(&lease, kind);
                if self.may_retry(failure, job, tried, &lease, attempts) {
                    return Attempt::Retry(worker.key, failure);
                }
                Attempt::Final(if attempts > 1 || failure == AttemptFailure::Connect {
                    GatewayError::UpstreamUnreachable {
                        model: job.pool.model.clone(),
                        attempts,
                    }
                } else {
                    GatewayError::UpstreamFailed {
                        worker: worker.id.clone(),
                    }
                })
            }
        }
    }

    fn count_shed(&self, stage: &'static str) {
        self.metrics
            .overload_sheds
            .get_or_create(&StageLabel { stage })
            .inc();
    }

    fn count_retry(&self, failure: AttemptFailure) {
        let reason = match failure {
            AttemptFailure::AtCapacity => "at_capacity",
            AttemptFailure::Dropped => "dropped",
            _ => "connect",
        };
        self.metrics
            .retries
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Whether this failure may be tried again now: a safe kind, retries left, another worker
    /// to try, and budget to spend (withdrawn only when everything else allows it).
    fn may_retry(
        &self,
        failure: AttemptFailure,
        job: &Job<'_>,
        tried: &[u64],
        lease: &Lease,
        attempts: u32,
    ) -> bool {
        if !may_retry(failure, attempts - 1, self.retry.max_retries) {
            return false;
        }
        let current = lease.worker().key;
        let another = job
            .pool
            .workers
            .iter()
            .any(|w| w.key != current && !tried.contains(&w.key) && w.is_routable());
        if !another {
            return false;
        }
        if !self.budget.withdraw() {
            self.metrics.retry_budget_exhausted.inc();
            return false;
        }
        true
    }

    fn timed_out(&self, mut lease: Lease) -> GatewayError {
        lease.settle(Outcome::Failure);
        self.count_upstream_error(&lease, "timeout");
        GatewayError::UpstreamTimeout {
            worker: lease.worker().id.clone(),
            timeout: self.request_timeout,
        }
    }

    fn count_upstream_error(&self, lease: &Lease, kind: &'static str) {
        self.metrics
            .upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                worker: lease.worker().id.to_string(),
                kind,
            })
            .inc();
    }
}

/// A worker's answer, with what its relay needs.
struct Answered {
    response: UpstreamResponse,
    lease: Lease,
    sent_at: Instant,
}

/// How one attempt ended.
enum Attempt {
    Answered(Answered),
    /// Tell the client this.
    Final(GatewayError),
    /// Try another worker (this one's key, and why).
    Retry(u64, AttemptFailure),
}

/// Counts a client that left while its request was still waiting for a worker's answer.
struct WaitingGuard<'a> {
    metrics: &'a Metrics,
    route: &'static str,
    armed: bool,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.metrics
                .cancellations
                .get_or_create(&CancelLabels {
                    route: self.route,
                    stage: "waiting",
                })
                .inc();
        }
    }
}

fn build_request(job: &Job<'_>, lease: &Lease) -> UpstreamRequest {
    let worker = lease.worker();
    let path = job
        .parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| axum::http::uri::PathAndQuery::from_static("/"));
    let uri = Uri::from_parts({
        let mut p = axum::http::uri::Parts::default();
        p.scheme = Some(worker.scheme.clone());
        p.authority = Some(worker.authority.clone());
        p.path_and_query = Some(path);
        p
    })
    .unwrap_or_default();
    let mut request = Request::new(Full::new(job.body.clone()));
    *request.method_mut() = job.parts.method.clone();
    *request.uri_mut() = uri;
    if worker.http2 {
        *request.version_mut() = Version::HTTP_2;
    }
    let headers = request.headers_mut();
    headers::copy_request_headers(&job.parts.headers, headers);
    headers.insert(REQUEST_ID, job.request_id.clone());
    if let Some(auth) = &worker.live().authorization {
        headers.insert(axum::http::header::AUTHORIZATION, auth.clone());
    }
    request
}

/// Hands a worker's response to the stream-back stage.
fn relay(answer: Answered, deadline: Instant, mut ending: Ending) -> Response<Body> {
    let Answered {
        response,
        lease,
        sent_at,
    } = answer;
    let (mut parts, body) = response.into_parts();
    let status = parts.status.as_u16();
    headers::clean_response_headers(&mut parts.headers);
    parts.version = Version::HTTP_11;
    let sse = is_event_stream(&parts.headers);
    ending.note_response(status);
    ending.metrics.count_request(ending.route, status, "none");
    let relay = Relay::new(body, lease, status, sse, sent_at, deadline, ending);
    Response::from_parts(parts, Body::new(relay))
}
