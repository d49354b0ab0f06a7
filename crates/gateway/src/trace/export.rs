//! The spans' way out: the request path hands a finished request's spans to a bounded queue and
//! never waits; one task takes them off in batches and exports each batch through OTLP
//! (opentelemetry-otlp's exporter, gRPC or HTTP/protobuf). When the collector is slow or away
//! the queue fills and spans are dropped — counted in `sluice_trace_spans_dropped_total` by
//! why — instead of holding a request, as the access log does with its lines.
//!
//! Why not the SDK's batch span processor: it exports from a thread of its own, outside the
//! gateway's runtime (which the tonic exporter needs), and keeps its count of dropped spans to
//! itself.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::metrics::Metrics;

/// Requests whose spans may wait to be exported before new ones are dropped.
const QUEUE: usize = 2048;
/// Spans sent in one export at most.
const BATCH: usize = 512;
/// The longest a span waits for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);

/// Where finished requests' spans go; cloned into every request.
#[derive(Debug, Clone)]
pub struct Queue {
    tx: mpsc::Sender<Vec<SpanData>>,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// Hands one request's spans on, or drops them (counted) when the queue is full.
    pub fn send(&self, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        if self.tx.try_send(spans).is_err() {
            self.metrics.trace_spans_dropped("queue_full").inc_by(n);
        }
    }
}

/// The export task; it exports what is queued and ends when told to, or when every `Queue` is
/// gone.
#[derive(Debug)]
pub struct Exporting {
    task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

impl Exporting {
    /// Exports what is queued now and stops, waiting up to `within`.
    pub async fn finish(self, within: Duration) {
        let _ = self.stop.send(());
        if tokio::time::timeout(within, self.task).await.is_err() {
            warn!(
                ?within,
                "the trace exporter did not finish; the last spans may be lost"
            );
        }
    }
}

/// Starts the export task with `exporter`.
pub fn start<E: SpanExporter + 'static>(exporter: E, metrics: Arc<Metrics>) -> (Queue, Exporting) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(export(rx, stopped, exporter, metrics.clone()));
    (Queue { tx, metrics }, Exporting { task, stop })
}

/// Batches: up to `BATCH` spans, or what came within `LINGER` of the batch's start.
async fn export<E: SpanExporter>(
    mut rx: mpsc::Receiver<Vec<SpanData>>,
    mut stopped: oneshot::Receiver<()>,
    exporter: E,
    metrics: Arc<Metrics>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH);
    let mut open = true;
    let mut failing = false;
    while open {
        let due = Instant::now() + LINGER;
        while open && batch.len() < BATCH {
            tokio::select! {
                _ = &mut stopped => {
                    open = false;
                    while let Ok(spans) = rx.try_recv() {
                        batch.extend(spans);
                    }
                }
                got = tokio::time::timeout_at(due, rx.recv()) => match got {
                    Ok(Some(spans)) => batch.extend(spans),
                    Ok(None) => open = false,
                    Err(_) => break,
                },
            }
        }
        if batch.is_empty() {
            continue;
        }
        let spans = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
        let n = spans.len() as u64;
        match exporter.export(spans).await {
            Ok(()) => {
                metrics.trace_spans_exported.inc_by(n);
                failing = false;
            }
            Err(e) => {
                metrics.trace_spans_dropped("export_failed").inc_by(n);
                if !failing {
                    warn!(error = %e, "cannot export spans: they are dropped until the collector takes them");
                    failing = true;
                }
            }
        }
    }
    let _ = exporter.shutdown_with_timeout(Duration::from_secs(1));
}
