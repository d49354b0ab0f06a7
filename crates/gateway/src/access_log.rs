//! `--access-log`: one JSON line per request, written off the request path.
//!
//! Why not a log line at INFO? A per-request line through the logging stack costs a gateway a
//! large share of its throughput (SMG loses ~15% to one). Here the request path only hands a small
//! record to a bounded channel; one task serializes and writes. If the writer falls behind, lines
//! are dropped and counted (`sluice_access_log_dropped_total`), never waited for. At shutdown
//! the gateway waits (briefly) for the writer to write what is queued, so the last requests'
//! lines are not lost with the process.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::error::Origin;
use crate::metrics::Metrics;

/// Records waiting to be written before new ones are dropped.
const QUEUE: usize = 8192;

/// One request, as the access log shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AccessRecord {
    /// Unix time the request arrived, in milliseconds.
    pub(crate) ts_ms: u64,
    pub(crate) request_id: String,
    pub(crate) route: &'static str,
    pub(crate) model: Option<String>,
    pub(crate) worker: Option<String>,
    pub(crate) status: u16,
    /// The gateway's error code, when it answered itself.
    pub(crate) code: Option<&'static str>,
    /// Whose doing the gateway's answer was: `client`, `upstream` or `gateway`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) origin: Option<Origin>,
    pub(crate) stream: bool,
    pub(crate) attempts: u32,
    /// Time to the response headers.
    pub(crate) ttfb_ms: f64,
    /// Time to the end of the response.
    pub(crate) duration_ms: f64,
    pub(crate) bytes: u64,
    /// The client left before the end.
    pub(crate) cancelled: bool,
    /// The worker failed mid-response.
    pub(crate) interrupted: bool,
    /// The engine ended its stream with an error event: `engine` (its failure), `client` (the
    /// request's), `at_capacity` (its queue was full).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_event: Option<&'static str>,
    /// What the degradation ladder did to it, as `x-sluice-degraded` says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) degraded: Option<String>,
    /// Its trace, when it was traced (`--enable-trace`, sampled): 32 hex digits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) trace_id: Option<String>,
}

/// The sending side, cloned into every request.
#[derive(Debug, Clone)]
pub(crate) struct AccessLog {
    tx: mpsc::Sender<AccessRecord>,
    metrics: Arc<Metrics>,
}

/// Why the access log cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the access log {path}: {source}")]
pub struct AccessLogError {
    path: String,
    source: std::io::Error,
}

/// The writer task; it writes what is queued and ends when told to, or once every `AccessLog`
/// handle is gone.
#[derive(Debug)]
pub(crate) struct AccessLogWriter {
    task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

impl AccessLogWriter {
    /// Writes the lines queued now and stops, waiting up to `within`.
    pub(crate) async fn finish(self, within: Duration) {
        let _ = self.stop.send(());
        if tokio::time::timeout(within, self.task).await.is_err() {
            warn!(
                ?within,
                "the access log writer did not finish; its last lines may be lost"
            );
        }
    }
}

impl AccessLog {
    /// Opens `path` (`-` is stdout) for appending and starts the writer task.
    pub(crate) async fn open(
        path: &Path,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, AccessLogWriter), AccessLogError> {
        let out: Box<dyn AsyncWrite + Send + Unpin> = if path.as_os_str() == "-" {
            Box::new(tokio::io::stdout())
        } else {
            let file = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .await
                .map_err(|source| AccessLogError {
                    path: path.display().to_string(),
                    source,
                })?;
            Box::new(file)
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let (stop, stopped) = oneshot::channel();
        let writer = AccessLogWriter {
            task: tokio::spawn(write_lines(rx, stopped, out)),
            stop,
        };
        Ok((Self { tx, metrics }, writer))
    }

    pub(crate) fn record(&self, record: AccessRecord) {
        if self.tx.try_send(record).is_err() {
            self.metrics.access_log_dropped.inc();
        }
    }
}

async fn write_lines(
    mut rx: mpsc::Receiver<AccessRecord>,
    mut stopped: oneshot::Receiver<()>,
    out: Box<dyn AsyncWrite + Send + Unpin>,
) {
    let mut out = BufWriter::new(out);
    let mut line = Vec::with_capacity(512);
    let mut stopping = false;
    loop {
        let record = tokio::select! {
            record = rx.recv() => record,
            _ = &mut stopped, if !stopping => {
                // What was queued before the stop is written; nothing after it.
                stopping = true;
                rx.close();
                continue;
            }
        };
        let Some(record) = record else { break };
        line.clear();
        if serde_json::to_writer(&mut line, &record).is_err() {
            continue;
        }
        line.push(b'\n');
        if out.write_all(&line).await.is_err() {
            return;
        }
        // Flush when nothing else is waiting, so lines appear promptly at low rates.
        if rx.is_empty() && out.flush().await.is_err() {
            return;
        }
    }
    let _ = out.flush().await;
}
