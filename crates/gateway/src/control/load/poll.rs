//! One load poll of a worker: which endpoint to ask for its flavor, and the report it gives.
//!
//! Sources by flavor: vLLM `GET /metrics`; SGLang `GET /v1/loads?include=all` (without the query
//! for an engine that refuses it with 400 or 422), and `/get_load`
//! when that is not served (an older SGLang) — for a while, then `/v1/loads` is asked again, so a
//! worker upgraded in place, or one whose `/v1/loads` failed for a moment, gets back the better
//! report (on current SGLang `/get_load` is a deprecated shim without KV usage). A `/v1/loads`
//! answer that is not a report at all is answered from `/get_load` for that poll only. A worker of
//! another flavor is not polled.

use std::time::Duration;

use sluice_core::load::{self, LoadReport, SGLANG_LOADS_QUERY};
use tokio::time::Instant;

use crate::control::get;
use crate::fleet::Worker;
use crate::upstream::{GetError, Upstream};

/// A `/metrics` page larger than this is not an engine's.
const LOAD_MAX_BYTES: usize = 16 * 1024 * 1024;

/// How long a worker without `/v1/loads` is read from `/get_load` before `/v1/loads` is asked
/// again.
const RETRY_PREFERRED: Duration = Duration::from_secs(60);

/// Which endpoint gives a worker's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    VllmMetrics,
    SglangLoads,
    /// `/v1/loads` without the query, for an engine that refused `include=all`.
    SglangLoadsCore,
    SglangGetLoad,
}

impl Source {
    fn path(self) -> &'static str {
        match self {
            Source::VllmMetrics => "/metrics",
            Source::SglangLoads => SGLANG_LOADS_QUERY,
            Source::SglangLoadsCore => "/v1/loads",
            Source::SglangGetLoad => "/get_load",
        }
    }

    /// The endpoint's name in logs and `/loads` (without the query).
    fn name(self) -> &'static str {
        match self {
            Source::VllmMetrics => "/metrics",
            Source::SglangLoads | Source::SglangLoadsCore => "/v1/loads",
            Source::SglangGetLoad => "/get_load",
        }
    }

    fn parse(self, body: &[u8]) -> Result<LoadReport, load::LoadError> {
        match self {
            Source::VllmMetrics => load::parse_vllm_metrics(&String::from_utf8_lossy(body)),
            Source::SglangLoads | Source::SglangLoadsCore => load::parse_sglang_loads(body),
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
    /// A gRPC worker's `GetLoads` failed as a call.
    #[error("GetLoads failed: {0}")]
    Grpc(tonic::Status),
}

impl PollError {
    pub(crate) fn is_transport(&self) -> bool {
        match self {
            PollError::Get(e) => e.is_transport(),
            PollError::Grpc(status) => std::error::Error::source(status).is_some(),
            _ => false,
        }
    }

    pub(crate) fn is_timeout(&self) -> bool {
        match self {
            PollError::Get(e) => e.is_timeout(),
            PollError::Grpc(status) => status.code() == tonic::Code::DeadlineExceeded,
            _ => false,
        }
    }

    /// The worker answered, if not with a report: it is there.
    pub fn answered(&self) -> bool {
        match self {
            PollError::Status { .. } | PollError::Report { .. } => true,
            PollError::Grpc(status) => {
                std::error::Error::source(status).is_none()
                    && status.code() != tonic::Code::DeadlineExceeded
            }
            _ => false,
        }
    }

    /// The request was refused as malformed: its query, by an engine that checks it.
    fn refused_query(&self) -> bool {
        matches!(
            self,
            PollError::Status {
                status: 400 | 422,
                ..
            }
        )
    }

    /// The endpoint is not served at all (an engine older than it).
    fn not_served(&self) -> bool {
        matches!(
            self,
            PollError::Status {
                status: 404 | 405,
                ..
            }
        )
    }
}

/// A poll's report, where it came from, and whether an older endpoint had to stand in.
#[derive(Debug)]
pub(super) struct Polled {
    pub(crate) report: LoadReport,
    pub(crate) source: &'static str,
    pub(crate) fell_back: bool,
}

/// What the monitor remembers of one worker's load endpoints between polls.
#[derive(Debug, Default)]
pub(super) struct Sources {
    /// Read from `/get_load` until then: `/v1/loads` was not served.
    older_until: Option<Instant>,
    /// `/v1/loads` refused `include=all`: asked without it.
    core_only: bool,
}

impl Sources {
    /// Polls `worker` once.
    pub(super) async fn poll(
        &mut self,
        upstream: &Upstream,
        worker: &Worker,
        timeout: Duration,
    ) -> Result<Polled, PollError> {
        if worker.endpoint.grpc() {
            return poll_grpc(upstream, worker, timeout).await.map(whole);
        }
        let preferred = match worker.info().map(|i| i.flavor.clone()).as_deref() {
            Some("vllm") => Source::VllmMetrics,
            Some("sglang") => Source::SglangLoads,
            other => return Err(PollError::Unsupported(other.unwrap_or("unknown").into())),
        };
        if preferred != Source::SglangLoads {
            return poll_one(upstream, worker, preferred, timeout)
                .await
                .map(whole);
        }
        let now = Instant::now();
        if self.older_until.is_some_and(|until| now < until) {
            let polled = poll_one(upstream, worker, Source::SglangGetLoad, timeout).await?;
            return Ok(fallen_back(polled));
        }
        let loads = if self.core_only {
            Source::SglangLoadsCore
        } else {
            Source::SglangLoads
        };
        let mut result = poll_one(upstream, worker, loads, timeout).await;
        if result.as_ref().is_err_and(PollError::refused_query) && !self.core_only {
            self.core_only = true;
            result = poll_one(upstream, worker, Source::SglangLoadsCore, timeout).await;
        }
        match result {
            Ok(polled) => {
                self.older_until = None;
                Ok(whole(polled))
            }
            Err(e) if e.not_served() || matches!(e, PollError::Report { .. }) => {
                if e.not_served() {
                    self.older_until = Some(now + RETRY_PREFERRED);
                }
                let polled = poll_one(upstream, worker, Source::SglangGetLoad, timeout).await?;
                Ok(fallen_back(polled))
            }
            Err(e) => Err(e),
        }
    }
}

fn whole((report, source): (LoadReport, &'static str)) -> Polled {
    Polled {
        report,
        source,
        fell_back: false,
    }
}

fn fallen_back((report, source): (LoadReport, &'static str)) -> Polled {
    Polled {
        fell_back: true,
        ..whole((report, source))
    }
}

async fn poll_one(
    upstream: &Upstream,
    worker: &Worker,
    source: Source,
    timeout: Duration,
) -> Result<(LoadReport, &'static str), PollError> {
    let path = source.name();
    let (status, body) = get(upstream, worker, source.path(), LOAD_MAX_BYTES, timeout).await?;
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

/// A gRPC worker's `GetLoads`, read as the `/v1/loads` answer it mirrors field for field (so one
/// parser says what every SGLang report means).
async fn poll_grpc(
    upstream: &Upstream,
    worker: &Worker,
    timeout: Duration,
) -> Result<(LoadReport, &'static str), PollError> {
    const PATH: &str = "GetLoads";
    let loads = upstream
        .grpc()
        .loads(&worker.endpoint, timeout)
        .await
        .map_err(PollError::Grpc)?;
    let body = crate::upstream::grpc::loads_json(&loads);
    let report = load::parse_sglang_loads(body.as_bytes())
        .map_err(|error| PollError::Report { path: PATH, error })?;
    Ok((report, PATH))
}

/// SGLang's prefill chunk (`/server_info` `chunked_prefill_size`), its tokens per batch.
pub(super) async fn sglang_batch_size(
    upstream: &Upstream,
    worker: &Worker,
    timeout: Duration,
) -> Option<u64> {
    if worker.endpoint.grpc() {
        let info = upstream
            .grpc()
            .server_info(&worker.endpoint, timeout)
            .await
            .ok()?;
        let size = info
            .server_args?
            .fields
            .get("chunked_prefill_size")?
            .kind
            .clone()?;
        return match size {
            prost_types::value::Kind::NumberValue(n) if n > 0.0 => Some(n as u64),
            _ => None,
        };
    }
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
