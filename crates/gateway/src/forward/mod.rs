//! The forward stage: send the request to the chosen worker, retry only what is safe, and hand
//! the response to the stream-back stage.
//!
//! Retries (see `sluice_core::retry` for why so few): a connection that never carried the request,
//! a connection lost before any answer (the worker died), a worker's explicit at-capacity answer
//! (429, 529, SGLang's full queue as a 503 or as a stream's first event), or a worker's error
//! status (`--retry-status-codes`: 500, 502, 503, 504; an engine's error as a stream's first
//! event counts as the status it names) before anything reached the client, is tried again on a
//! *different* worker, after an exponential,
//! jittered backoff, up to `--retry-max-retries` attempts in all (SMG's count), and only while
//! the retry budget (tower's `TpsBudget`: retries stay under a share of recent requests) allows —
//! so a fleet-wide outage does not multiply its own load. When no other worker is left, the last
//! worker's answer is relayed as is (or, for connection failures, 502 `upstream_unreachable`).
//! Nothing is retried once the response has started. To see a refusal or a failure written in the
//! body, an event stream's head is held until its first event, and a 503's body is read
//! (`ahead`); the client was waiting for that first event anyway.
//!
//! ## Layout
//!
//! - `mod.rs` — the stage: `Forwarder`, one worker's attempts, the request a worker gets.
//! - `failed` — an attempt's failure, classified where it happens (`Failed`: the kind the retry
//!   rule judges, what it leaves the client) and judged in one place (`Forwarder::judge`).
//! - `ahead` — what is read of an answer before its head is relayed.
//! - `pd` — a disaggregated model's prefill/decode pair.
//! - `handover` — for a data plane (`sluice epp`): the leased worker handed over, not called.
//! - `refusal` — `ForwardError`, the stage's refusals.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::http::request::Parts;
use axum::http::{HeaderValue, Request, Version};
use bytes::Bytes;
use sluice_core::breaker::Outcome;
use sluice_core::retry::{AttemptFailure, Backoff};
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};

use crate::admit::Terms;
use crate::context::{RequestContext, DEADLINE};
use crate::error::Expired;

use crate::fleet::{Lease, Pool, AT_CAPACITY_VETO};
use crate::http::{copy_request_headers, REQUEST_ID};
use crate::metrics::{Metrics, ReasonLabel};
use crate::request::Asked;
use crate::route::{Chooser, Placement, RouteError};
use crate::upstream::{Upstream, UpstreamRequest, UpstreamResponse};

mod adapter;
mod ahead;
mod failed;
mod handover;
mod pd;
mod refusal;

use failed::{retry_reason, transport_failure, Failed, Left};

pub(crate) use ahead::{read_ahead, Ahead};
pub(crate) use handover::ToDataPlane;
pub use handover::{DataPlaneReply, Handover};
pub use pd::PdConfig;
pub(crate) use refusal::ForwardError;

/// The forward stage's hand-off to the stream-back stage: a worker's answer, to relay.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The worker's head, and its body still to read (less what `ahead` holds).
    pub(crate) response: UpstreamResponse,
    /// The request's hold on the worker, kept until the body ends.
    pub(crate) lease: Lease,
    /// When the request went to the worker (time to first byte counts from here).
    pub(crate) sent_at: Instant,
    /// What the forward stage read of the body before deciding on the answer.
    pub(crate) ahead: Ahead,
    /// Admission's terms: the deadline that still cuts the body, the tier its SLO is judged
    /// in, whether its usage is read.
    pub(crate) terms: Terms,
}

/// Where a placed request goes: sent on to its worker (`Forwarder`, `sluice serve`), or handed to
/// the data plane that sends it (`ToDataPlane`, `sluice epp`).
pub(crate) trait Dispatch {
    type Sent;

    /// The workers of `pool` a request must not be placed on, because this dispatch cannot
    /// reach them; refused when it cannot serve the pool at all.
    fn excluded(&self, _pool: &Pool) -> Result<Vec<u64>, RouteError> {
        Ok(Vec::new())
    }

    /// Not an `async fn`: an implementation returns the future that does the work, with no
    /// layer of its own around it (every layer keeps its own copy of the placement, and the
    /// whole request's future is moved into a box per request).
    fn dispatch<'a>(
        &'a self,
        ctx: &'a mut RequestContext,
        asked: &'a Asked<'a>,
        placement: Placement,
    ) -> impl Future<Output = Result<Self::Sent, ForwardError>> + 'a;
}

impl Dispatch for Forwarder {
    type Sent = Answer;

    fn dispatch<'a>(
        &'a self,
        ctx: &'a mut RequestContext,
        asked: &'a Asked<'a>,
        placement: Placement,
    ) -> impl Future<Output = Result<Answer, ForwardError>> + 'a {
        self.forward(ctx, asked, placement)
    }
}

/// The window the retry budget looks back over.
const BUDGET_WINDOW: Duration = Duration::from_secs(10);

/// What the forward stage is configured with, built by the settings (the resilience section's
/// retries, the disaggregation section's window) and taken whole by `Forwarder::new`.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardConfig {
    pub retry: RetryConfig,
    /// The decode admission window and the prefill leg's silence bound (disaggregated models).
    pub pd: PdConfig,
}

/// Retry rules of the forward stage.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// 0 disables retries.
    pub(crate) max_retries: u32,
    /// Worker statuses retried on another worker (`--retry-status-codes`).
    pub status_codes: Vec<u16>,
    pub backoff: Backoff,
    pub(crate) budget_percent: f64,
    pub(crate) budget_min_per_sec: u32,
}

/// One request to forward: the client's head, the body to send, and its chooser.
struct Job<'a> {
    /// The client's method, path and headers, copied onto each attempt's request.
    parts: &'a Parts,
    /// What the worker gets: admission's body (spliced or rewritten by the ladder), or a pair
    /// leg's own.
    body: &'a Bytes,
    /// What the retry rule asks (another worker?) and what the request says to the upstream.
    chooser: &'a Chooser,
}

/// The forward stage, shared by every request.
pub(crate) struct Forwarder {
    /// The clients to workers (HTTP/1.1, HTTP/2, TLS, gRPC) every attempt is sent through.
    upstream: Upstream,
    /// How many attempts a request gets, and the backoff between them (`--retry-*`).
    retry: RetryConfig,
    /// How a disaggregated request's prefill and decode halves are sent and bounded.
    pd: PdConfig,
    /// Retries allowed per second of requests, shared by every request, so a fleet-wide failure
    /// cannot multiply the load (`--retry-budget-*`).
    budget: TpsBudget,
    /// Where attempts, retries and upstream errors are counted.
    metrics: Arc<Metrics>,
    /// Loads a LoRA adapter onto a worker whose spec allows it, when a request for it is placed
    /// there (`with_adapter_loads`).
    adapter_loads: Option<Arc<crate::control::AdapterLoads>>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    pub fn new(upstream: Upstream, config: ForwardConfig, metrics: Arc<Metrics>) -> Self {
        let ForwardConfig { retry, pd } = config;
        let budget = TpsBudget::new(
            BUDGET_WINDOW,
            retry.budget_min_per_sec,
            (retry.budget_percent / 100.0) as f32,
        );
        Self {
            upstream,
            retry,
            pd,
            budget,
            metrics,
            adapter_loads: None,
        }
    }

    /// Forwards the placed request to its first worker, and on a retry to the one its chooser
    /// picks next, until a worker answers, a failure is final, or the client goes away (the
    /// future is dropped: the upstream request goes with it, and the context counts it).
    pub(crate) async fn forward(
        &self,
        ctx: &mut RequestContext,
        asked: &Asked<'_>,
        mut placement: Placement,
    ) -> Result<Answer, ForwardError> {
        ctx.forwarding();
        self.budget.deposit();
        if let Some(prefill) = placement.prefill.take() {
            // Boxed: a disaggregated pair is the rare path, and its future (two legs, the decode
            // window) is most of the size of every request's future, which the router moves
            // whole into a box per request.
            let pair = pd::Choosers {
                prefill: *prefill,
                decode: placement.chooser,
            };
            let (terms, body) = (placement.terms, placement.body);
            return Box::pin(self.forward_pd(ctx, asked, terms, body, placement.lease, pair)).await;
        }
        // One worker at a time: the placement's, then whichever its chooser picks next. The
        // placement's parts are used where they are, not moved into locals of their own (nor
        // into a function of their own): each move copies them within the request's future.
        let chooser = &mut placement.chooser;
        let terms = &placement.terms;
        let mut next = Some(placement.lease);
        loop {
            let lease = match next.take() {
                Some(lease) => lease,
                None => chooser.next()?,
            };
            ctx.attempt(&lease.worker().id);
            let job = Job {
                parts: asked.parts,
                body: &placement.body,
                chooser,
            };
            let attempt = Attempt::of(ctx, asked, terms, &job);
            let attempts = attempt.attempts;
            let (worker, failure) = match self.attempt(attempt, lease).await {
                Tried::Answered(answer) => return Ok(answer),
                Tried::Final(error) => return Err(error),
                Tried::Retry(worker, failure) => (worker, failure),
            };
            chooser.tried(worker);
            ctx.retrying(retry_reason(failure));
            self.back_off(asked, terms, attempts, failure).await?;
        }
    }

    /// Waits out a retry's backoff (exponential, jittered, cut at the request's deadline). A
    /// deadline that passes meanwhile ends the request here, as nobody's failure: no next worker
    /// is asked, or charged with a timeout it had no time for.
    async fn back_off(
        &self,
        asked: &Asked<'_>,
        terms: &Terms,
        attempts: u32,
        failure: AttemptFailure,
    ) -> Result<(), ForwardError> {
        self.count_retry(failure);
        let deadline = terms.deadline;
        let wait = self.retry.backoff.delay(attempts, rand::random::<f64>());
        tokio::time::sleep_until((Instant::now() + wait).min(deadline)).await;
        if Instant::now() < deadline {
            return Ok(());
        }
        let timeout = terms.allowed(asked.arrival.started);
        Err(if terms.cut_by_client() {
            Expired::DeadlineExceeded { budget: timeout }
        } else {
            Expired::RequestTimeout { timeout }
        }
        .into())
    }

    /// One attempt on the leased worker.
    async fn attempt(&self, at: Attempt<'_>, mut lease: Lease) -> Tried {
        lease.for_request(at.request_id);
        let request = at.job.chooser.request();
        lease.prefilling(request.prompt_tokens);
        if request.stream {
            lease.streaming();
        }
        if let Err(failed) = self.adapter_ready(&at, &mut lease).await {
            return self.tried(failed, &at);
        }
        let sent_at = Instant::now();
        let sent = match self.wait_for_answer(&at, &mut lease).await {
            Ok(sent) => sent,
            Err((worker, failure)) => return Tried::Retry(worker, failure),
        };
        let key = lease.worker().key;
        let failed = match sent {
            // The client's deadline is not the worker's failure: its permit goes back unrecorded.
            Err(_) if at.terms.cut_by_client() => {
                Failed::refused(key, Expired::DeadlineExceeded { budget: at.timeout }.into())
            }
            Err(_) => Failed::refused(key, self.timed_out(lease, at.timeout)),
            Ok(Ok((response, ahead))) => {
                return self.answered(&at, lease, response, ahead, sent_at)
            }
            // Nothing was sent: the worker's permit goes back unrecorded.
            Ok(Err(crate::upstream::SendError::NotOnGrpc { param, message })) => {
                Failed::refused(key, ForwardError::NotOnGrpc { param, message })
            }
            // The gateway's own want, not the worker's failure.
            Ok(Err(crate::upstream::SendError::NoTokenizer)) => {
                Failed::refused(key, ForwardError::TokenizerUnavailable)
            }
            Ok(Err(e)) => self.transport_failed(&at, lease, &e),
        };
        self.tried(failed, &at)
    }

    /// What a failed attempt comes to, as `judge` decides.
    fn tried(&self, failed: Failed, at: &Attempt<'_>) -> Tried {
        match self.judge(failed, at) {
            Ok((worker, failure)) => Tried::Retry(worker, failure),
            Err(Left::Relay(answer)) => Tried::Answered(answer),
            Err(Left::Refuse(error)) => Tried::Final(error),
        }
    }

    /// Sends the request and waits for the answer's head, until the deadline — or until the
    /// worker is judged unresponsive and this request may go elsewhere (then the retry).
    async fn wait_for_answer(
        &self,
        at: &Attempt<'_>,
        lease: &mut Lease,
    ) -> Result<Sent, (u64, AttemptFailure)> {
        let worker = lease.worker().clone();
        let request = build_request(at, lease);
        let deadline = at.terms.deadline;
        let sent = async {
            let head =
                tokio::time::timeout_at(deadline, self.upstream.send(&worker.endpoint, request));
            let mut response = match head.await? {
                Ok(response) => response,
                Err(e) => return Ok(Err(e)),
            };
            // The head is held until what the verdict needs of the body has come
            // (`stream::ahead`), or the deadline: then the relay ends it as any stream cut by
            // its deadline, which is not the worker's failure.
            let ahead = read_ahead(&mut response, deadline)
                .await
                .map_err(crate::upstream::SendError::Exchange);
            Ok(ahead.map(|ahead| (response, ahead)))
        };
        tokio::pin!(sent);
        let given_up = worker.vetoes.given_up();
        tokio::pin!(given_up);
        let mut may_give_up = true;
        loop {
            tokio::select! {
                sent = &mut sent => return Ok(sent),
                () = &mut given_up, if may_give_up => {
                    // Judged unresponsive while this waited: go elsewhere if allowed (dropping
                    // the attempt closes its connection), else keep waiting here.
                    let unresponsive = Failed {
                        worker: worker.key,
                        kind: AttemptFailure::Unresponsive,
                        left: (),
                    };
                    if let Ok(retry) = self.judge(unresponsive, at) {
                        lease.settle(Outcome::Failure);
                        self.count_upstream_error(lease, "unresponsive");
                        return Err(retry);
                    }
                    may_give_up = false;
                }
            }
        }
    }

    /// The worker answered: at capacity (429, 529, SGLang's full queue as a 503 or as a stream's
    /// first event) or a retryable error (a status, or an engine's error as a stream's first
    /// event) is a failure, judged as any other (the answer relayed if it goes nowhere else);
    /// anything else is the answer.
    fn answered(
        &self,
        at: &Attempt<'_>,
        mut lease: Lease,
        response: UpstreamResponse,
        ahead: Ahead,
        sent_at: Instant,
    ) -> Tried {
        lease.worker().signals.contact(Instant::now());
        if ahead.at_capacity || !response.status().is_success() {
            // A refusal or an error is an answer: the worker is not silent. (A stream's 200
            // head is not: an API process sends it before its engine has stepped.)
            lease.answered();
        }
        if ahead.at_capacity {
            // The worker says it is full: keep new requests off it for a moment. Not a failure
            // of the worker: its permit is handed back unrecorded.
            lease.worker().vetoes.at_capacity_for(AT_CAPACITY_VETO);
        }
        // An engine's failure in the first event is judged as the status it names (500 when it
        // names none): nothing has reached the client yet.
        let status = ahead
            .error
            .and_then(|e| e.failure_status())
            .unwrap_or_else(|| response.status().as_u16());
        let retryable = !ahead.at_capacity && self.retry.status_codes.contains(&status);
        // Retried, or relayed when it may not be; a failure of the worker only by the one rule
        // (`Outcome::of_answer`), whatever `--retry-status-codes` lists.
        if retryable && Outcome::of_answer(status, false) == Some(Outcome::Failure) {
            lease.settle(Outcome::Failure);
            self.count_upstream_error(&lease, "status");
        }
        let kind = if ahead.at_capacity {
            Some(AttemptFailure::AtCapacity)
        } else {
            retryable.then_some(AttemptFailure::ServerError)
        };
        let worker = lease.worker().key;
        let answer = Answer {
            response,
            lease,
            sent_at,
            ahead,
            terms: *at.terms,
        };
        match kind {
            None => Tried::Answered(answer),
            Some(kind) => {
                let left = Left::Relay(answer);
                self.tried(Failed { worker, kind, left }, at)
            }
        }
    }

    /// Refused or reset: the transport failed (a liveness signal); retried when safe.
    fn transport_failed(
        &self,
        at: &Attempt<'_>,
        mut lease: Lease,
        e: &crate::upstream::SendError,
    ) -> Failed {
        let worker = lease.worker().clone();
        let (failure, kind) = transport_failure(&worker, e);
        lease.settle(Outcome::Failure);
        self.count_upstream_error(&lease, kind);
        let error = if failure == AttemptFailure::BadAnswer {
            ForwardError::UpstreamBadAnswer {
                worker: worker.id.clone(),
            }
        } else if at.attempts > 1 || failure == AttemptFailure::Connect {
            ForwardError::UpstreamUnreachable {
                model: at.job.chooser.model().clone(),
                attempts: at.attempts,
            }
        } else {
            ForwardError::UpstreamFailed {
                worker: worker.id.clone(),
            }
        };
        Failed {
            worker: worker.key,
            kind: failure,
            left: Left::Refuse(error),
        }
    }

    fn count_retry(&self, failure: AttemptFailure) {
        self.metrics
            .retries
            .get_or_create(&ReasonLabel {
                reason: retry_reason(failure),
            })
            .inc();
    }

    fn timed_out(&self, mut lease: Lease, timeout: Duration) -> ForwardError {
        lease.settle(Outcome::Failure);
        self.count_upstream_error(&lease, "timeout");
        ForwardError::UpstreamTimeout {
            worker: lease.worker().id.clone(),
            timeout,
        }
    }

    fn count_upstream_error(&self, lease: &Lease, kind: &'static str) {
        self.metrics
            .upstream_error(lease.worker().id.as_str(), kind);
    }
}

/// What waiting for an answer's head gives: the deadline passed, or the exchange's result.
type Sent = Result<
    Result<(UpstreamResponse, Ahead), crate::upstream::SendError>,
    tokio::time::error::Elapsed,
>;

/// One attempt, and what its request and retry rules need to know.
#[derive(Clone)]
pub(super) struct Attempt<'a> {
    /// What is sent, the same for every attempt of one leg.
    job: &'a Job<'a>,
    /// Sent to the worker, and what its lease is known by.
    request_id: &'a axum::http::HeaderValue,
    /// Attempts so far, this one included.
    attempts: u32,
    /// Admission's terms: the deadline the attempt is cut at, the client's own.
    terms: &'a Terms,
    /// The whole time allowed (what a timeout error says).
    timeout: Duration,
    /// The request's trace, which names the attempt to the worker.
    trace: Option<&'a crate::trace::RequestTrace>,
}

/// How one attempt ended. Returned once per attempt and matched at once: boxing the answer
/// would cost an allocation per request to spare copying a few hundred bytes.
#[allow(clippy::large_enum_variant)]
enum Tried {
    Answered(Answer),
    /// Tell the client this.
    Final(ForwardError),
    /// Try another worker (this one's key, and why).
    Retry(u64, AttemptFailure),
}

impl<'a> Attempt<'a> {
    /// The attempt of `asked` at `job` that `ctx` has just counted.
    fn of(ctx: &'a RequestContext, asked: &Asked<'a>, terms: &'a Terms, job: &'a Job<'a>) -> Self {
        Attempt {
            job,
            request_id: &asked.arrival.id,
            attempts: ctx.attempts(),
            terms,
            timeout: terms.allowed(asked.arrival.started),
            trace: ctx.trace(),
        }
    }
}

fn build_request(at: &Attempt<'_>, lease: &Lease) -> UpstreamRequest {
    let worker = lease.worker();
    let path = at
        .job
        .parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| axum::http::uri::PathAndQuery::from_static("/"));
    let mut request = Request::new(at.job.body.clone());
    *request.method_mut() = at.job.parts.method.clone();
    let endpoint = &worker.endpoint;
    *request.uri_mut() = if endpoint.http2 || endpoint.tls() {
        endpoint.uri(path)
    } else {
        // Cleartext HTTP/1.1 sends the path alone (the pool adds `Host`): made so here rather
        // than made absolute and taken apart again.
        axum::http::Uri::from(path)
    };
    if endpoint.http2 {
        *request.version_mut() = Version::HTTP_2;
    }
    let headers = request.headers_mut();
    copy_request_headers(&at.job.parts.headers, headers);
    add_worker_headers(
        headers,
        at.request_id,
        at.terms.client_deadline,
        worker,
        at.trace,
    );
    request
}

/// What a worker gets from the gateway on top of the client's headers: the request id, what is
/// left of the client's deadline (so the engine can drop it in time too), the worker's own key,
/// and with traces on, the attempt's `traceparent`.
fn add_worker_headers(
    headers: &mut axum::http::HeaderMap,
    request_id: &HeaderValue,
    client_deadline: Option<Instant>,
    worker: &crate::fleet::Worker,
    trace: Option<&crate::trace::RequestTrace>,
) {
    if let Some(trace) = trace {
        trace.to_worker(headers);
    }
    headers.insert(REQUEST_ID, request_id.clone());
    if let Some(due) = client_deadline {
        let left = due.saturating_duration_since(Instant::now()).as_millis() as u64;
        headers.insert(DEADLINE, HeaderValue::from(left));
    }
    if let Some(auth) = &worker.live().authorization {
        headers.insert(axum::http::header::AUTHORIZATION, auth.clone());
    }
}
