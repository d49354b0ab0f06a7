//! One load poll of a worker: which endpoint to ask for its flavor, and the report it gives.
//!
//! Sources by flavor: vLLM `GET /metrics`; SGLang `GET /v1/loads`, falling back to `/get_load` on
//! older servers (remembered per worker). A worker of another flavor is not polled.

use std::time::Duration;

use sluice_core::load::{self, LoadReport};

use crate::control::get;
use crate::fleet::Worker;
use crate::upstream::{GetError, Upstream};

/// A `/metrics` page larger than this is not an engine's.
const LOAD_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Which endpoint gives a worker's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
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
pub(super) async fn poll(
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

/// SGLang's prefill chunk (`/server_info` `chunked_prefill_size`), its tokens per batch.
pub(super) async fn sglang_batch_size(
    upstream: &Upstream,
    worker: &Worker,
    timeout: Duration,
) -> Option<u64> {
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
