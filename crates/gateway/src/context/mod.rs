//! The request context: the one record of a request, owned by the front stage, lent to each stage
//! (`&mut`) only to write what it observed, and moved into the response body when a worker
//! answers, so it lives exactly as long as the request. What a stage decides is not written here:
//! it is handed to the next stage by value (`admit::Admitted`, `route::Placement`,
//! `forward::Answer`); what every stage reads of the request is `request::Asked`.
//!
//! It records what the stages observe (who asked, the model, the workers tried, the status, the
//! bytes) and keeps what admission took (`Grants`), and its `Drop` is the one place a request is accounted for — the duration histogram, a
//! cancellation by stage, admission's holds given back, the access-log line, the in-flight count —
//! whatever way the request ends: answered, refused, cut by the deadline, interrupted by its
//! worker, abandoned by its client, or cut at shutdown. No stage has to remember to end anything.
//!
//! ## Layout
//!
//! - `admission` — who admission found the request to be (tenant, tier), and what it holds
//!   (permits, reservations: `Grants`), given back on drop.
//! - `inflight` — the gateway's count of requests in flight, which shutdown waits on.
//! - `traced` — what the request's trace says of it (`--enable-trace`): the attributes of its
//!   spans, from what the context learned.

mod admission;
mod inflight;
mod traced;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderValue, StatusCode};
use sluice_core::{ModelName, WorkerId};
use tokio::time::Instant;

pub(crate) use admission::{Admission, Ending, Grants, Hold, Usage, DEADLINE};
pub(crate) use inflight::{InFlight, InFlightGuard};

use crate::access_log::{AccessLog, AccessRecord};
use crate::error::{Answerable, Origin};
use crate::metrics::{CancelLabels, Metrics};
use crate::trace::{AttemptEnd, RequestTrace, Tracing};

/// Where a request is on its way, which decides what its drop means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Being read, admitted and routed.
    Received,
    /// Sent to a worker, waiting for its answer: a drop is a client that left waiting.
    Forwarding,
    /// The worker's response is being relayed: a drop is a client that left mid-response.
    Responding,
    /// Answered in full, refused by the gateway, or interrupted by the worker.
    Ended,
}

/// What every request's accounting goes to, shared by all of them.
#[derive(Debug, Clone)]
pub(crate) struct Accounts {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) access_log: Option<AccessLog>,
    /// `--enable-trace`.
    pub(crate) tracing: Option<Tracing>,
    pub(crate) in_flight: Arc<InFlight>,
}

/// What the degradation ladder did to a request: the notes of `x-sluice-degraded`, in the order
/// the steps applied.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Degraded {
    pub(crate) notes: Vec<String>,
}

/// One request, from arrival to the end of its response.
#[derive(Debug)]
pub(crate) struct RequestContext {
    /// `x-request-id`, the client's or ours.
    pub(crate) id: HeaderValue,
    /// The route's path, a metric label.
    pub(crate) route: &'static str,
    /// Its arrival: every duration the log, the metrics and the trace give counts from here.
    pub(crate) started: Instant,
    /// The model it is served by, once known.
    pub(crate) model: Option<ModelName>,
    /// Whether the client asked for a stream (the access log's `stream`), once its body is read.
    pub(crate) stream: bool,
    /// Who admission found the request to be, and the budgets its answer shows.
    pub(crate) admission: Admission,
    /// What admission took for it, given back with its ending.
    grants: Grants,
    /// What the degradation ladder did to it (`x-sluice-degraded`).
    pub(crate) degraded: Degraded,
    /// How far it got: a client that leaves is counted as cancelled at this stage.
    phase: Phase,
    /// The worker of the latest attempt.
    worker: Option<WorkerId>,
    /// Workers tried so far: the retry rule's count, and the access log's.
    attempts: u32,
    /// The status the client got, once it got one.
    status: Option<u16>,
    /// The gateway's error code, when it answered itself.
    code: Option<&'static str>,
    /// Whose doing that answer was (the client's, a worker's, the gateway's), so the access log
    /// tells an operator which 5xx to look for on the workers.
    origin: Option<Origin>,
    /// From arrival to the response head.
    ttfb: Duration,
    /// Response bytes relayed to the client, for the access log.
    bytes: u64,
    /// Its worker failed mid-response (the access log's `interrupted`).
    interrupted: bool,
    /// The engine ended its stream with an error event of this class (`engine`, `client`,
    /// `at_capacity`).
    error_event: Option<&'static str>,
    /// What a metered response said it used, and its events.
    usage: Option<Usage>,
    /// Events relayed, for the per-event metrics of a metered stream.
    chunks: u64,
    /// Where its ending is counted, however it ends.
    metrics: Arc<Metrics>,
    /// The access log and the arrival in Unix milliseconds, when the log is on.
    access: Option<(AccessLog, u64)>,
    /// Its trace, when traces are on (recorded only when sampled); boxed, so a context without
    /// one stays small.
    trace: Option<Box<RequestTrace>>,
    /// How long it waited in the gateway queue, if it did.
    queue_wait: Option<Duration>,
    /// Counted in flight until the context is gone.
    _in_flight: InFlightGuard,
}

impl RequestContext {
    /// A request that arrived at `started` on `route`, counted in flight from now.
    pub fn new(
        accounts: &Accounts,
        id: HeaderValue,
        route: &'static str,
        started: Instant,
    ) -> Self {
        let in_flight = accounts.in_flight.enter();
        let access = accounts.access_log.as_ref().map(|log| {
            let ts_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            (log.clone(), ts_ms)
        });
        Self {
            id,
            route,
            started,
            model: None,
            stream: false,
            admission: Admission::default(),
            grants: Grants::default(),
            degraded: Degraded::default(),
            phase: Phase::Received,
            worker: None,
            attempts: 0,
            status: None,
            code: None,
            origin: None,
            ttfb: Duration::ZERO,
            bytes: 0,
            interrupted: false,
            error_event: None,
            usage: None,
            chunks: 0,
            metrics: accounts.metrics.clone(),
            access,
            trace: None,
            queue_wait: None,
            _in_flight: in_flight,
        }
    }

    /// Starts the request's trace, when traces are on: the client's `traceparent` in `headers`
    /// is its parent.
    pub(crate) fn trace_from(&mut self, accounts: &Accounts, headers: &axum::http::HeaderMap) {
        self.trace = accounts
            .tracing
            .as_ref()
            .map(|tracing| Box::new(tracing.begin(headers, self.route)));
    }

    /// Its trace is recorded (traces on, and it was sampled).
    pub(crate) fn traced(&self) -> bool {
        self.trace.as_deref().is_some_and(RequestTrace::sampled)
    }

    /// The trace, for the headers a worker gets.
    pub(crate) fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_deref()
    }

    /// Admission ran from `from` until now, and admitted the request or `refused` it.
    pub(crate) fn admission_ended(&mut self, from: Instant, refused: Option<&dyn Answerable>) {
        if self.traced() {
            let attributes = traced::admission(self, refused);
            if let Some(trace) = &mut self.trace {
                trace.admission(from, attributes, refused.map(|e| e.code()));
            }
        }
    }

    /// Keeps what admission took for the request, to give it back with the request's ending.
    pub(crate) fn keep(&mut self, grants: Grants) {
        self.grants.extend(grants);
    }

    /// It waited `wait` in the gateway queue for a turn.
    pub(crate) fn queued(&mut self, wait: Duration) {
        self.queue_wait = Some(wait);
    }

    /// The attempt on the current worker is given up for another, because of `cause`.
    pub(crate) fn retrying(&mut self, cause: &'static str) {
        if let Some(trace) = &mut self.trace {
            trace.attempt_ended(AttemptEnd::Retried(cause));
        }
    }

    /// The request is about to go to a worker: from now until a response, a drop is a client
    /// that left while waiting.
    pub(crate) fn forwarding(&mut self) {
        self.phase = Phase::Forwarding;
    }

    /// Another attempt went to `worker`.
    pub(crate) fn attempt(&mut self, worker: &WorkerId) {
        self.attempts += 1;
        self.worker = Some(worker.clone());
        // A trace not recorded still names each attempt to its worker: an id, nothing more.
        let (name, attributes) = if self.traced() {
            traced::attempt(self, worker)
        } else {
            (std::borrow::Cow::Borrowed(""), Vec::new())
        };
        if let Some(trace) = &mut self.trace {
            trace.attempt(name, attributes);
        }
    }

    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The gateway's metrics, for what a stage counts about this request.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A worker's response started with `status`; its body follows.
    pub(crate) fn respond(&mut self, status: u16) {
        self.answered(status, None);
        self.phase = Phase::Responding;
        if let Some(trace) = &mut self.trace {
            trace.attempt_ended(AttemptEnd::Answered(status));
            trace.event("first byte", Instant::now(), Vec::new());
        }
    }

    /// The gateway answers the request itself with `error`, at `status`.
    pub(crate) fn refuse(&mut self, status: StatusCode, error: &dyn Answerable) {
        self.answered(status.as_u16(), Some(error.code()));
        self.origin = Some(error.origin());
        self.phase = Phase::Ended;
        if let Some(trace) = &mut self.trace {
            trace.attempt_ended(AttemptEnd::Failed(error.code()));
        }
    }

    fn answered(&mut self, status: u16, code: Option<&'static str>) {
        self.status = Some(status);
        self.code = code;
        self.ttfb = self.started.elapsed();
        self.metrics
            .count_request(self.route, status, code.unwrap_or("none"));
    }

    /// `n` more bytes of the response went to the client.
    pub(crate) fn relayed(&mut self, n: usize) {
        self.bytes += n as u64;
    }

    /// What a metered response used: its `usage` block when it gave one, and its events.
    pub(crate) fn metered(&mut self, usage: Option<Usage>, chunks: u64) {
        self.usage = usage;
        self.chunks = chunks;
    }

    /// The response is over: in full, or `interrupted` by its worker.
    pub(crate) fn end(&mut self, interrupted: bool) {
        self.interrupted = interrupted;
        self.phase = Phase::Ended;
    }

    /// The engine ended the stream with an error event (relayed as it came): a failed answer,
    /// whatever its status said.
    pub(crate) fn error_event(&mut self, class: sluice_core::engine_error::ErrorClass) {
        use sluice_core::engine_error::ErrorClass;
        self.error_event = Some(match class {
            ErrorClass::Engine => "engine",
            ErrorClass::Client => "client",
            ErrorClass::AtCapacity => "at_capacity",
        });
    }

    fn count_cancellation(&self, stage: &'static str) {
        self.metrics
            .cancellations
            .get_or_create(&CancelLabels {
                route: self.route,
                stage,
            })
            .inc();
    }

    fn access_record(&self, ts_ms: u64, ending: &Ending) -> AccessRecord {
        AccessRecord {
            ts_ms,
            request_id: self.id.to_str().unwrap_or("").to_string(),
            route: self.route,
            model: self.model.as_ref().map(ToString::to_string),
            worker: self.worker.as_ref().map(ToString::to_string),
            // A client that left before any answer: nginx's "client closed request".
            status: ending.status.unwrap_or(STATUS_CLIENT_CLOSED),
            code: self.code,
            origin: self.origin,
            stream: self.stream,
            attempts: self.attempts,
            ttfb_ms: self.ttfb.as_secs_f64() * 1e3,
            duration_ms: ending.duration.as_secs_f64() * 1e3,
            bytes: ending.bytes,
            cancelled: ending.cancelled,
            interrupted: ending.interrupted,
            error_event: self.error_event,
            degraded: (!self.degraded.notes.is_empty()).then(|| self.degraded.notes.join(", ")),
            trace_id: self
                .trace
                .as_ref()
                .filter(|t| t.sampled())
                .map(|t| t.trace_id().to_string()),
        }
    }
}

/// The access log's status for a request whose client left before any answer.
const STATUS_CLIENT_CLOSED: u16 = 499;

impl Drop for RequestContext {
    fn drop(&mut self) {
        let duration = self.started.elapsed();
        let cancelled = match self.phase {
            Phase::Forwarding => {
                self.count_cancellation("waiting");
                true
            }
            Phase::Responding => {
                self.count_cancellation("streaming");
                true
            }
            Phase::Received => true,
            Phase::Ended => false,
        };
        self.metrics.observe_duration(self.route, duration);
        let ending = Ending {
            status: self.status,
            bytes: self.bytes,
            duration,
            cancelled,
            interrupted: self.interrupted,
            forwarded: self.worker.is_some(),
            usage: self.usage,
            chunks: self.chunks,
        };
        self.grants.release(&ending);
        if let Some((log, ts_ms)) = self.access.take() {
            log.record(self.access_record(ts_ms, &ending));
        }
        if let Some(mut trace) = self.trace.take() {
            if trace.sampled() {
                trace.event("end", Instant::now(), traced::end_event(&ending));
                let (attributes, status) = traced::request(self, &ending);
                (*trace).finish(attributes, status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use prometheus_client::registry::Registry;

    use super::*;

    /// A hold that counts its releases and keeps the last ending.
    struct Counted(Arc<parking_lot::Mutex<Vec<Ending>>>);

    impl Hold for Counted {
        fn release(self: Box<Self>, ending: &Ending) {
            self.0.lock().push(*ending);
        }
    }

    fn accounts() -> (Accounts, Registry) {
        let mut registry = Registry::default();
        let accounts = Accounts {
            metrics: Metrics::register(&mut registry),
            access_log: None,
            tracing: None,
            in_flight: Arc::new(InFlight::default()),
        };
        (accounts, registry)
    }

    fn context(
        accounts: &Accounts,
        endings: &Arc<parking_lot::Mutex<Vec<Ending>>>,
    ) -> RequestContext {
        let mut ctx = RequestContext::new(
            accounts,
            HeaderValue::from_static("r1"),
            "/v1/chat/completions",
            Instant::now(),
        );
        let mut grants = Grants::default();
        grants.hold(Box::new(Counted(endings.clone())));
        ctx.keep(grants);
        ctx
    }

    fn cancellations(a: &Accounts, stage: &'static str) -> u64 {
        a.metrics
            .cancellations
            .get_or_create(&CancelLabels {
                route: "/v1/chat/completions",
                stage,
            })
            .get()
    }

    #[test]
    fn every_ending_gives_back_what_admission_holds_and_leaves_the_count() {
        let (a, registry) = accounts();
        let endings = Arc::new(parking_lot::Mutex::new(Vec::new()));

        let mut refused = context(&a, &endings);
        assert_eq!(a.in_flight.count(), 1);
        let expired = crate::error::Expired::RequestTimeout {
            timeout: Duration::ZERO,
        };
        refused.refuse(StatusCode::SERVICE_UNAVAILABLE, &expired);
        drop(refused);

        let mut completed = context(&a, &endings);
        completed.forwarding();
        completed.respond(200);
        completed.relayed(10);
        completed.end(false);
        drop(completed);

        let mut left_waiting = context(&a, &endings);
        left_waiting.forwarding();
        drop(left_waiting);

        let mut left_streaming = context(&a, &endings);
        left_streaming.forwarding();
        left_streaming.respond(200);
        drop(left_streaming);

        let mut interrupted = context(&a, &endings);
        interrupted.respond(200);
        interrupted.end(true);
        drop(interrupted);

        drop(context(&a, &endings));

        assert_eq!(a.in_flight.count(), 0);
        let seen: Vec<(Option<u16>, bool, bool, u64)> = endings
            .lock()
            .iter()
            .map(|e| (e.status, e.cancelled, e.interrupted, e.bytes))
            .collect();
        assert_eq!(
            seen,
            [
                (Some(503), false, false, 0),
                (Some(200), false, false, 10),
                (None, true, false, 0),
                (Some(200), true, false, 0),
                (Some(200), false, true, 0),
                (None, true, false, 0),
            ]
        );
        assert_eq!(cancellations(&a, "waiting"), 1);
        assert_eq!(cancellations(&a, "streaming"), 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"request_duration_seconds_count{route="/v1/chat/completions"} 6"#),
            "every ending is timed: {text}"
        );
    }

    #[test]
    fn holds_are_given_back_last_taken_first() {
        struct Tagged(usize, Arc<AtomicUsize>, Arc<parking_lot::Mutex<Vec<usize>>>);
        impl Hold for Tagged {
            fn release(self: Box<Self>, _: &Ending) {
                self.1.fetch_add(1, Ordering::Relaxed);
                self.2.lock().push(self.0);
            }
        }
        let (a, _registry) = accounts();
        let released = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut ctx = RequestContext::new(
            &a,
            HeaderValue::from_static("r2"),
            "/v1/chat/completions",
            Instant::now(),
        );
        for tag in 0..3 {
            let mut grants = Grants::default();
            grants.hold(Box::new(Tagged(tag, released.clone(), order.clone())));
            ctx.keep(grants);
        }
        drop(ctx);
        assert_eq!(released.load(Ordering::Relaxed), 3);
        assert_eq!(*order.lock(), [2, 1, 0]);
    }
}
