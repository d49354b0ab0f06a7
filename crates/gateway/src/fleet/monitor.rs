//! The load monitor: every Ready worker's engine load, polled on its pool's schedule, turned into
//! the overload and busy verdicts the route stage reads.
//!
//! Sources by flavor: vLLM `GET /metrics`; SGLang `GET /v1/loads`, falling back to `/get_load` on
//! older servers (remembered per worker). A worker of another flavor is not polled. A poll that
//! yields no report (error, timeout, empty, unsupported) clears the worker's verdicts: no fresh
//! signal, no opinion — the overload check fails open.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_core::health::HealthState;
use sluice_core::load::{self, LoadReport};
use sluice_core::overload::{BusyThresholds, Ceilings, RankActivity};
use tokio::time::Instant;

use super::get::{get, GetError};
use super::spec::OverloadOverrides;
use super::Fleet;
use super::Worker;
use crate::forward::Upstream;

/// A `/metrics` page larger than this is not an engine's.
const LOAD_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Load monitoring and overload protection, gateway-wide (the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// `--load-monitor-interval`.
    pub interval: Duration,
    /// The gateway's ceilings; both `None` under `--disable-worker-overload-protection`.
    pub ceilings: Ceilings,
    /// The busy thresholds at startup (`/busy_threshold` changes them at runtime).
    pub busy: BusyThresholds,
    /// How long one load request may take (5 s).
    pub poll_timeout: Duration,
    /// The shortest poll interval, whatever a spec asks (1 s).
    pub min_interval: Duration,
}

impl Default for LoadConfig {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            ceilings: Ceilings {
                waiting_requests: Some(8),
                token_usage: Some(0.8),
            },
            busy: BusyThresholds::default(),
            poll_timeout: Duration::from_secs(5),
            min_interval: Duration::from_secs(1),
        }
    }
}

impl LoadConfig {
    /// A worker's ceilings: each field of its block wins over the gateway's.
    pub fn ceilings_for(&self, o: &OverloadOverrides) -> Ceilings {
        Ceilings {
            waiting_requests: o.waiting_requests.or(self.ceilings.waiting_requests),
            token_usage: o.token_usage.or(self.ceilings.token_usage),
        }
    }
}

/// Which endpoint gives a worker's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    VllmMetrics,
    SglangLoads,
    SglangGetLoad,
}

impl Source {
    fn path(self) -> &'static str {
        match self {
            Source::VllmMetrics => "/metrics",
            Source::SglangLoads => "/v1/loads",
            Source::SglangGetLoad => "/get_load",
        }
    }

    fn parse(self, body: &[u8]) -> Result<LoadReport, load::LoadError> {
        match self {
            Source::VllmMetrics => load::parse_vllm_metrics(&String::from_utf8_lossy(body)),
            Source::SglangLoads => load::parse_sglang_loads(body),
            Source::SglangGetLoad => load::parse_sglang_get_load(body),
        }
    }
}

/// Why a poll gave no report.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    #[error("its flavor ({0}) reports no load")]
    Unsupported(String),
    #[error(transparent)]
    Get(#[from] GetError),
    #[error("{path} answered {status}")]
    Status { path: &'static str, status: u16 },
    #[error("{path}: {error}")]
    Report {
        path: &'static str,
        error: load::LoadError,
    },
}

impl PollError {
    pub fn is_transport(&self) -> bool {
        matches!(self, PollError::Get(e) if e.is_transport())
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self, PollError::Get(e) if e.is_timeout())
    }

    /// The worker answered, if not with a report: it is there.
    pub fn answered(&self) -> bool {
        matches!(self, PollError::Status { .. } | PollError::Report { .. })
    }
}

/// One poll: the report and the endpoint it came from.
async fn poll(
    upstream: &Upstream,
    worker: &Worker,
    source: &mut Option<Source>,
    timeout: Duration,
) -> Result<(LoadReport, &'static str), PollError> {
    let chosen = match *source {
        Some(s) => s,
        None => match worker.info().map(|i| i.flavor.clone()).as_deref() {
            Some("vllm") => Source::VllmMetrics,
            Some("sglang") => Source::SglangLoads,
            other => return Err(PollError::Unsupported(other.unwrap_or("unknown").into())),
        },
    };
    match poll_one(upstream, worker, chosen, timeout).await {
        Err(PollError::Status { status: 404, .. } | PollError::Report { .. })
            if chosen == Source::SglangLoads =>
        {
            // An older SGLang: /get_load from now on.
            let report = poll_one(upstream, worker, Source::SglangGetLoad, timeout).await?;
            *source = Some(Source::SglangGetLoad);
            Ok(report)
        }
        result => {
            if result.is_ok() {
                *source = Some(chosen);
            }
            result
        }
    }
}

async fn poll_one(
    upstream: &Upstream,
    worker: &Worker,
    source: Source,
    timeout: Duration,
) -> Result<(LoadReport, &'static str), PollError> {
    let path = source.path();
    let (status, body) = get(upstream, worker, path, LOAD_MAX_BYTES, timeout).await?;
    if !status.is_success() {
        return Err(PollError::Status {
            path,
            status: status.as_u16(),
        });
    }
    let report = source
        .parse(&body)
        .map_err(|error| PollError::Report { path, error })?;
    Ok((report, path))
}

/// What the busy checks read from a report, with the gateway's own estimate of the prompt
/// tokens waiting for prefill on the worker spread over its ranks (engines do not report it).
/// `max_num_batched_tokens` is the worker spec's, else what the engine said (SGLang's
/// `chunked_prefill_size`); without it the fractional prefill check cannot hold.
pub fn activity(
    report: &LoadReport,
    pending_prefill_tokens: u64,
    max_num_batched_tokens: Option<u64>,
) -> Vec<RankActivity> {
    let ranks = report.ranks.len().max(1) as u64;
    report
        .ranks
        .iter()
        .map(|r| RankActivity {
            decode_blocks: r.kv_usage,
            prefill_tokens: pending_prefill_tokens / ranks,
            max_num_batched_tokens,
        })
        .collect()
}

/// SGLang's prefill chunk (`/server_info` `chunked_prefill_size`), its tokens per batch.
async fn sglang_batch_size(upstream: &Upstream, worker: &Worker, timeout: Duration) -> Option<u64> {
    let (status, body) = get(upstream, worker, "/server_info", 1024 * 1024, timeout)
        .await
        .ok()?;
    if !status.is_success() {
        return None;
    }
    let info: serde_json::Value = serde_json::from_slice(&body).ok()?;
    info.get("chunked_prefill_size")?
        .as_u64()
        .filter(|n| *n > 0)
}

/// Polls one worker while it is registered: every interval of its pool, only while Ready (the
/// first poll as soon as it is).
/// The least time between a poll and an early one (requests piling up on an engine that had
/// room, see `QueueGate::early_poll_at`), so a steady stream into a roomy engine cannot turn the
/// monitor into a busy loop.
const EARLY_POLL_SPACING: Duration = Duration::from_millis(250);

pub(super) async fn run_monitor(fleet: Weak<Fleet>, worker: Arc<Worker>, upstream: Upstream) {
    let mut source = None;
    // Asked once, of SGLang workers only (vLLM's /metrics does not carry it).
    let mut engine_batch: Option<Option<u64>> = None;
    loop {
        let Some((interval, timeout, mut changes)) = fleet.upgrade().map(|f| {
            (
                f.poll_interval_of(&worker),
                f.load_config().poll_timeout,
                f.changes(),
            )
        }) else {
            return;
        };
        match worker.status() {
            HealthState::Draining => return,
            HealthState::Ready => {
                let result = poll(&upstream, &worker, &mut source, timeout).await;
                let sglang = matches!(source, Some(Source::SglangLoads | Source::SglangGetLoad));
                if result.is_ok() && sglang && engine_batch.is_none() {
                    engine_batch = Some(sglang_batch_size(&upstream, &worker, timeout).await);
                }
                let Some(fleet) = fleet.upgrade() else {
                    return;
                };
                let polled = Instant::now();
                fleet.load_polled(&worker, result, engine_batch.flatten());
                drop(fleet);
                let early = async {
                    worker.vetoes.early_poll_wanted().await;
                    tokio::time::sleep_until(polled + EARLY_POLL_SPACING.min(interval)).await;
                };
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = early => {}
                }
            }
            _ => {
                // Not polled; look again when the fleet changes (it may become Ready).
                let _ = tokio::time::timeout(interval, changes.changed()).await;
            }
        }
    }
}
