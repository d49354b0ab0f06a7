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
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::metrics::Metrics;

/// Spans sent in one export at most.
const BATCH: usize = 512;
/// The longest a span waits for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);

/// Spans exported and dropped so far, for whoever awaits the exporter (the metrics say the same).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub(crate) exported: u64,
    pub dropped: u64,
}

/// Where finished requests' spans go; cloned into every request.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    tx: mpsc::Sender<Vec<SpanData>>,
    counts: Counts,
}

/// Where exports and drops are counted.
#[derive(Debug, Clone)]
struct Counts {
    metrics: Arc<Metrics>,
    stats: Arc<watch::Sender<ExportStats>>,
}

impl Counts {
    fn exported(&self, n: u64) {
        self.metrics.trace_spans_exported.inc_by(n);
        self.stats.send_modify(|s| s.exported += n);
    }

    fn dropped(&self, reason: &'static str, n: u64) {
        self.metrics.trace_spans_dropped(reason).inc_by(n);
        self.stats.send_modify(|s| s.dropped += n);
    }
}

impl Queue {
    /// Hands one request's spans on, or drops them (counted) when the queue is full.
    pub(crate) fn send(&self, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        if self.tx.try_send(spans).is_err() {
            self.counts.dropped("queue_full", n);
        }
    }

    /// The exporter's counts as they change.
    pub(crate) fn stats(&self) -> watch::Receiver<ExportStats> {
        self.counts.stats.subscribe()
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
    pub(crate) async fn finish(self, within: Duration) {
        let _ = self.stop.send(());
        if tokio::time::timeout(within, self.task).await.is_err() {
            warn!(
                ?within,
                "the trace exporter did not finish; the last spans may be lost"
            );
        }
    }
}

/// Starts the export task with `exporter`; up to `queue` requests' spans wait for it.
pub fn start<E: SpanExporter + 'static>(
    exporter: E,
    queue: usize,
    metrics: Arc<Metrics>,
) -> (Queue, Exporting) {
    let (tx, rx) = mpsc::channel(queue.max(1));
    let (stop, stopped) = oneshot::channel();
    let counts = Counts {
        metrics,
        stats: Arc::new(watch::channel(ExportStats::default()).0),
    };
    let task = tokio::spawn(export(rx, stopped, exporter, counts.clone()));
    (Queue { tx, counts }, Exporting { task, stop })
}

/// Batches: up to `BATCH` spans, or what came within `LINGER` of the batch's start.
async fn export<E: SpanExporter>(
    mut rx: mpsc::Receiver<Vec<SpanData>>,
    mut stopped: oneshot::Receiver<()>,
    exporter: E,
    counts: Counts,
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
                counts.exported(n);
                failing = false;
            }
            Err(e) => {
                counts.dropped("export_failed", n);
                if !failing {
                    warn!(error = %e, "cannot export spans: they are dropped until the collector takes them");
                    failing = true;
                }
            }
        }
    }
    let _ = exporter.shutdown_with_timeout(Duration::from_secs(1));
}
