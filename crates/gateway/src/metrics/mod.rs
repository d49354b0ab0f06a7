//! The gateway's Prometheus metrics (`sluice_*`), passed around explicitly — no global registry.
//!
//! Counters and histograms the request path moves are families here; per-worker handles are
//! resolved once at registration (`WorkerMetrics`) so the hot path never builds a label set with
//! a worker name in it. Facts that already live in the fleet (in-flight counts, circuit states,
//! which workers exist) are not copied into gauges: `FleetCollector` reads them at scrape time,
//! so a gauge can never disagree with what routing sees.
//!
//! ## Layout
//!
//! - `mod.rs` — `Metrics`, the families the request path and the control loops move, and
//!   `WorkerMetrics`, one worker's handles.
//! - `labels` — the label sets, and the values each label may take.
//! - `admission`, `slo`, `trials` — the families of admission, of the objectives, of liveness
//!   trials.
//! - `exposition` — the text formats a scrape asks for.

pub(crate) mod admission;
mod exposition;
mod labels;
mod slo;
mod trials;

pub(crate) use trials::TrialLabels;

pub(crate) use admission::{
    AdmissionMetrics, Label, RejectedLabels, TenantCounters, TenantTokenLabels,
};
pub(crate) use exposition::{to_text_0_0_4, wants_openmetrics, OPENMETRICS, TEXT_0_0_4};
use labels::BREAKER_TRANSITIONS;
pub(crate) use labels::{
    CancelLabels, ReasonLabel, ReportIssueLabels, RequestLabels, ResultLabel, RouteLabel,
    SelectionLabels, StageLabel, TransitionLabels, UpstreamErrorLabels, WorkerLabel, REPORT_ISSUES,
    RETRY_REASONS, UPSTREAM_ERROR_KINDS,
};
pub(crate) use slo::SloMetrics;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_core::slo::Slos;

/// Buckets for time to first byte and whole requests: 5 ms to 5 minutes.
pub(crate) const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0,
];

/// Buckets for gaps between chunks of a stream: 1 ms to 10 s.
const GAP_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Every metric family of one gateway.
#[derive(Debug)]
pub struct Metrics {
    /// `sluice_requests_total`: every answer, by route, status and who made it.
    pub(crate) requests: Family<RequestLabels, Counter>,
    /// `sluice_request_duration_seconds`: arrival to the last byte, per route.
    pub(crate) duration: Family<RouteLabel, Histogram, Buckets>,
    /// Time to first byte per worker: the latency the policies and the status page read.
    pub(crate) ttft: Family<WorkerLabel, Histogram, Buckets>,
    /// Gaps between a stream's chunks per worker: a slow decoder shows here first.
    pub(crate) inter_chunk: Family<WorkerLabel, Histogram>,
    /// Workers chosen, by policy: whether the policy spreads the load.
    pub(crate) selections: Family<SelectionLabels, Counter>,
    /// Retries by reason (`RETRY_REASONS`).
    pub(crate) retries: Family<ReasonLabel, Counter>,
    /// Retries refused because the budget was spent: failures the budget kept from multiplying.
    pub(crate) retry_budget_exhausted: Counter,
    /// Circuit moves per worker (`BREAKER_TRANSITIONS`).
    pub(crate) breaker_transitions: Family<TransitionLabels, Counter>,
    /// Clients that left, by route and stage: the decoding the gateway stopped.
    pub(crate) cancellations: Family<CancelLabels, Counter>,
    /// Worker failures by kind (`UPSTREAM_ERROR_KINDS`), counted only by `upstream_error`.
    pub(crate) upstream_errors: Family<UpstreamErrorLabels, Counter>,
    /// Access-log lines dropped because the writer fell behind: the log is never a backpressure.
    pub(crate) access_log_dropped: Counter,
    /// Spans the OTLP exporter took, and spans dropped (the queue full, an export failed).
    pub(crate) trace_spans_exported: Counter,
    pub(crate) trace_spans_dropped_by: Family<ReasonLabel, Counter>,
    /// 1 Ready, 0 any other state; deleted with the worker.
    pub(crate) worker_health: Family<WorkerLabel, Gauge>,
    /// Health probes by result.
    pub(crate) health_checks: Family<ResultLabel, Counter>,
    /// From each worker's last load report; deleted with the worker.
    pub(crate) engine_waiting: Family<WorkerLabel, Gauge>,
    pub(crate) engine_running: Family<WorkerLabel, Gauge>,
    pub(crate) engine_token_usage: Family<WorkerLabel, Gauge<f64, AtomicU64>>,
    /// Load reports read from a fallback endpoint, or with a field dropped.
    pub(crate) report_issues: Family<ReportIssueLabels, Counter>,
    /// Liveness trials by verdict; deleted with the worker.
    pub(crate) liveness_trials: Family<TrialLabels, Counter>,
    /// Requests steered to a worker every candidate's overload, or liveness, veto covered.
    pub(crate) overload_fallbacks: Counter,
    pub(crate) liveness_fallbacks: Counter,
    /// `--worker-overload-shed` refusals, by the stage that shed.
    pub(crate) overload_sheds: Family<StageLabel, Counter>,
    /// Disaggregated dispatches that waited for the decode window and were admitted.
    pub(crate) pd_admission_waits: Counter,
    /// Disaggregated requests shed by the decode window.
    pub(crate) pd_admission_sheds: Counter,
    /// Answers judged against their tier's objectives; the client's time to first byte.
    pub(crate) slo: SloMetrics,
    /// Each API route's answered-by-a-worker counter and duration histogram, resolved once
    /// (`preset_routes`), so the common request looks no label set up.
    routes: std::sync::OnceLock<Vec<RouteSeries>>,
}

/// One route's most used series.
#[derive(Debug)]
struct RouteSeries {
    route: &'static str,
    relayed_ok: Counter,
    duration: Histogram,
}

/// Makes the latency histograms with the configured buckets (`--prometheus-duration-buckets`).
#[derive(Debug, Clone)]
pub(crate) struct Buckets(Arc<[f64]>);

impl prometheus_client::metrics::family::MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

fn gaps() -> Histogram {
    Histogram::new(GAP_BUCKETS)
}

impl Metrics {
    /// The families, with the default latency buckets, in `registry`.
    #[cfg(test)]
    pub(crate) fn register(registry: &mut Registry) -> Arc<Self> {
        Self::register_with(registry, &LATENCY_BUCKETS, Slos::default())
    }

    /// The families, with `latency_buckets` for request durations and time to first byte, and
    /// answers judged against `slos`.
    pub(crate) fn register_with(
        registry: &mut Registry,
        latency_buckets: &[f64],
        slos: Slos,
    ) -> Arc<Self> {
        let latency = Buckets(latency_buckets.into());
        let m = Self {
            slo: SloMetrics::register(registry, slos),
            routes: std::sync::OnceLock::new(),
            requests: Family::default(),
            duration: Family::new_with_constructor(latency.clone()),
            ttft: Family::new_with_constructor(latency),
            inter_chunk: Family::new_with_constructor(gaps),
            selections: Family::default(),
            retries: Family::default(),
            retry_budget_exhausted: Counter::default(),
            pd_admission_waits: Counter::default(),
            pd_admission_sheds: Counter::default(),
            breaker_transitions: Family::default(),
            cancellations: Family::default(),
            upstream_errors: Family::default(),
            access_log_dropped: Counter::default(),
            trace_spans_exported: Counter::default(),
            trace_spans_dropped_by: Family::default(),
            worker_health: Family::default(),
            health_checks: Family::default(),
            engine_waiting: Family::default(),
            engine_running: Family::default(),
            engine_token_usage: Family::default(),
            report_issues: Family::default(),
            liveness_trials: Family::default(),
            overload_fallbacks: Counter::default(),
            liveness_fallbacks: Counter::default(),
            overload_sheds: Family::default(),
        };
        m.register_requests(registry);
        m.register_workers(registry);
        m.register_engines(registry);
        for reason in RETRY_REASONS {
            let _ = m.retries.get_or_create(&ReasonLabel { reason });
        }
        for stage in ["select", "dispatch"] {
            let _ = m.overload_sheds.get_or_create(&StageLabel { stage });
        }
        for result in ["success", "failure"] {
            let _ = m.health_checks.get_or_create(&ResultLabel { result });
        }
        for reason in ["queue_full", "export_failed"] {
            let _ = m
                .trace_spans_dropped_by
                .get_or_create(&ReasonLabel { reason });
        }
        Arc::new(m)
    }

    /// Spans dropped for `reason`.
    pub(crate) fn trace_spans_dropped(&self, reason: &'static str) -> Counter {
        self.trace_spans_dropped_by
            .get_or_create_owned(&ReasonLabel { reason })
    }

    /// Requests as the gateway answered them: answers, durations, retries, cancellations, the
    /// disaggregated window, the access log.
    fn register_requests(&self, r: &mut Registry) {
        r.register(
            "requests",
            "Requests answered, by route, status and gateway error code",
            self.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from request to the end of the response (streams included)",
            self.duration.clone(),
        );
        r.register(
            "retries",
            "Attempts sent again to another worker, by reason (connect, dropped, at_capacity)",
            self.retries.clone(),
        );
        r.register(
            "retry_budget_exhausted",
            "Retries refused because the retry budget was spent",
            self.retry_budget_exhausted.clone(),
        );
        r.register(
            "client_cancellations",
            "Requests whose client went away before the response ended; the upstream request was dropped",
            self.cancellations.clone(),
        );
        r.register(
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind",
            self.access_log_dropped.clone(),
        );
        r.register(
            "trace_spans_exported",
            "Spans exported to the OTLP collector (--enable-trace)",
            self.trace_spans_exported.clone(),
        );
        r.register(
            "trace_spans_dropped",
            "Spans dropped instead of exported: queue_full (the collector slower than the requests), export_failed (the collector away or refusing)",
            self.trace_spans_dropped_by.clone(),
        );
        r.register(
            "pd_admission_waits",
            "Disaggregated dispatches that waited for room in a decode worker's running window and were admitted",
            self.pd_admission_waits.clone(),
        );
        r.register(
            "pd_admission_sheds",
            "Disaggregated requests shed by a decode worker's running window (wider than it, or no room within --pd-admission-wait-secs)",
            self.pd_admission_sheds.clone(),
        );
    }

    /// Each worker as the gateway saw it: first bytes, gaps, selections, circuit, errors, health.
    fn register_workers(&self, r: &mut Registry) {
        r.register(
            "worker_ttft_seconds",
            "Time from sending a request to a worker to its first response byte, as the gateway saw it",
            self.ttft.clone(),
        );
        r.register(
            "worker_inter_chunk_seconds",
            "Gaps between response chunks of a worker, as the gateway saw them",
            self.inter_chunk.clone(),
        );
        r.register(
            "worker_selections",
            "Workers chosen by the load-balancing policy",
            self.selections.clone(),
        );
        r.register(
            "worker_circuit_transitions",
            "Circuit breaker state changes",
            self.breaker_transitions.clone(),
        );
        r.register(
            "upstream_errors",
            "Failures talking to workers, by kind",
            self.upstream_errors.clone(),
        );
        r.register(
            "worker_health",
            "Worker health: 1 Ready, 0 any other state (pending, not ready, failed, draining)",
            self.worker_health.clone(),
        );
        r.register(
            "worker_health_checks",
            "Health probes of workers, by result (success, failure)",
            self.health_checks.clone(),
        );
    }

    /// The engines' own reports, and the overload rules read from them.
    fn register_engines(&self, r: &mut Registry) {
        r.register(
            "engine_waiting_requests",
            "Requests waiting in the engine's queue (summed over ranks), from its last load report",
            self.engine_waiting.clone(),
        );
        r.register(
            "engine_running_requests",
            "Requests in the engine's running batch (summed over ranks), from its last load report",
            self.engine_running.clone(),
        );
        r.register(
            "engine_token_usage",
            "KV cache usage of the engine (mean over ranks, 0..1), from its last load report",
            self.engine_token_usage.clone(),
        );
        r.register(
            "engine_load_report_issues",
            "Load reports read from an older endpoint (fallback) or with a malformed field left out (dropped_field)",
            self.report_issues.clone(),
        );
        r.register(
            "worker_liveness_trials",
            "One-token generations sent to a worker out for a liveness veto that awaits progress, by verdict (answered readmits it)",
            self.liveness_trials.clone(),
        );
        r.register(
            "worker_overload_fallback",
            "Requests steered to the least loaded worker because every candidate was over its ceilings",
            self.overload_fallbacks.clone(),
        );
        r.register(
            "worker_liveness_fallback",
            "Requests steered to a worker the liveness checks doubt because no other was routable",
            self.liveness_fallbacks.clone(),
        );
        r.register(
            "worker_overload_shed",
            "Requests refused because every candidate was overloaded (--worker-overload-shed), or, stage predicted, predicted late everywhere (--policy predicted), by stage",
            self.overload_sheds.clone(),
        );
    }

    /// Starts every route's series at zero, so each family is on the page from startup and a
    /// rate over it has a start (Prometheus's advice: initialise the label sets you know).
    pub(crate) fn preset_routes(&self, routes: &[&'static str]) {
        let mut series = Vec::with_capacity(routes.len());
        for &route in routes {
            let relayed_ok = self
                .requests
                .get_or_create(&RequestLabels {
                    route,
                    status: 200,
                    code: "none",
                })
                .clone();
            let duration = self.duration.get_or_create(&RouteLabel { route }).clone();
            for stage in ["waiting", "streaming"] {
                let _ = self
                    .cancellations
                    .get_or_create(&CancelLabels { route, stage });
            }
            series.push(RouteSeries {
                route,
                relayed_ok,
                duration,
            });
        }
        let _ = self.routes.set(series);
    }

    /// A preset route's series (a dozen short paths: a scan beats hashing the label set).
    fn route(&self, route: &str) -> Option<&RouteSeries> {
        self.routes.get()?.iter().find(|s| s.route == route)
    }

    /// A request on `route` took `duration`, from arrival to the end of its response.
    pub(crate) fn observe_duration(&self, route: &'static str, duration: std::time::Duration) {
        let secs = duration.as_secs_f64();
        match self.route(route) {
            Some(series) => series.duration.observe(secs),
            None => self
                .duration
                .get_or_create(&RouteLabel { route })
                .observe(secs),
        }
    }

    /// One failure of `worker` as the request path saw it, by `kind` (one of
    /// `UPSTREAM_ERROR_KINDS`): the one place `sluice_upstream_errors_total` is counted.
    pub(crate) fn upstream_error(&self, worker: &str, kind: &'static str) {
        self.upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                worker: worker.to_string(),
                kind,
            })
            .inc();
    }

    /// The handles one worker's requests touch.
    pub(crate) fn for_worker(&self, worker: &str, policy: &'static str) -> WorkerMetrics {
        let label = WorkerLabel {
            worker: worker.to_string(),
        };
        for kind in UPSTREAM_ERROR_KINDS {
            let _ = self.upstream_errors.get_or_create(&UpstreamErrorLabels {
                worker: worker.to_string(),
                kind,
            });
        }
        for (from, to) in BREAKER_TRANSITIONS {
            let _ = self.breaker_transitions.get_or_create(&TransitionLabels {
                worker: worker.to_string(),
                from,
                to,
            });
        }
        WorkerMetrics {
            ttft: self.ttft.get_or_create_owned(&label),
            inter_chunk: self.inter_chunk.get_or_create_owned(&label),
            selections: self.selections.get_or_create_owned(&SelectionLabels {
                policy,
                worker: worker.to_string(),
            }),
            health: self.worker_health.get_or_create_owned(&label),
            engine_waiting: self.engine_waiting.get_or_create_owned(&label),
            engine_running: self.engine_running.get_or_create_owned(&label),
            engine_token_usage: self.engine_token_usage.get_or_create_owned(&label),
            report_fallback: self.report_issue(worker, "fallback"),
            report_dropped_field: self.report_issue(worker, "dropped_field"),
        }
    }

    fn report_issue(&self, worker: &str, issue: &'static str) -> Counter {
        self.report_issues.get_or_create_owned(&ReportIssueLabels {
            worker: worker.to_string(),
            issue,
        })
    }

    pub(crate) fn count_health_check(&self, passed: bool) {
        let result = if passed { "success" } else { "failure" };
        self.health_checks
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Deletes a removed worker's series, every family that carries its label, so a dashboard
    /// sees it gone rather than frozen. (Seed 000 has such gauges read -1 only because its
    /// metrics library cannot delete a series; this one can.)
    pub(crate) fn forget_worker(&self, worker: &str, policy: &'static str) {
        let label = WorkerLabel {
            worker: worker.to_string(),
        };
        self.ttft.remove(&label);
        self.inter_chunk.remove(&label);
        self.worker_health.remove(&label);
        self.engine_waiting.remove(&label);
        self.engine_running.remove(&label);
        self.engine_token_usage.remove(&label);
        self.forget_trials(worker);
        for issue in REPORT_ISSUES {
            self.report_issues.remove(&ReportIssueLabels {
                worker: worker.to_string(),
                issue,
            });
        }
        self.selections.remove(&SelectionLabels {
            policy,
            worker: worker.to_string(),
        });
        for kind in UPSTREAM_ERROR_KINDS {
            self.upstream_errors.remove(&UpstreamErrorLabels {
                worker: worker.to_string(),
                kind,
            });
        }
        for (from, to) in BREAKER_TRANSITIONS {
            self.breaker_transitions.remove(&TransitionLabels {
                worker: worker.to_string(),
                from,
                to,
            });
        }
    }

    pub(crate) fn count_request(&self, route: &'static str, status: u16, code: &'static str) {
        if let (200, "none", Some(series)) = (status, code, self.route(route)) {
            series.relayed_ok.inc();
            return;
        }
        self.requests
            .get_or_create(&RequestLabels {
                route,
                status,
                code,
            })
            .inc();
    }
}

/// Per-worker handles, resolved once.
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    pub(crate) ttft: Histogram,
    pub(crate) inter_chunk: Histogram,
    pub(crate) selections: Counter,
    pub(crate) health: Gauge,
    pub(crate) engine_waiting: Gauge,
    pub(crate) engine_running: Gauge,
    pub(crate) engine_token_usage: Gauge<f64, AtomicU64>,
    pub(crate) report_fallback: Counter,
    pub(crate) report_dropped_field: Counter,
}
