//! An HTTP worker's KV events: the ZMQ publisher vLLM and SGLang start with
//! `--kv-events-config` (vLLM's `vllm/distributed/kv_events.py` @0181ea3, SGLang's
//! `python/sglang/srt/disaggregation/kv_events.py` @006d053), one per data-parallel rank on the
//! configured port plus the rank. Each message is three frames: a topic, the batch's number
//! (8 bytes, big-endian, from 0) and the MessagePack batch.
//!
//! One subscriber per rank, for as long as the worker is registered (the fleet aborts it when
//! the registration ends). It is the one writer of the worker's `HeldIndex`: each batch applied
//! as it comes, numbered, so a gap (batches dropped by the publisher's high-water mark, or sent
//! while the connection was down) or a publisher counting from 0 again (the engine restarted)
//! forgets what that rank was known to hold; a disconnection forgets it at once. The socket
//! reconnects by itself (and re-sends the subscription); a connection that cannot be made is
//! tried again after `RETRY_AFTER`. vLLM's replay socket is not used: after a gap the rank's
//! blocks are relearned as prompts are stored again.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sluice_core::engine_cache::Numbered;
use sluice_core::kv_events::decode_batch;
use tracing::{debug, warn};
use zeromq::{Socket, SocketEvent, SocketRecv, ZmqMessage};

use crate::fleet::Worker;

/// How long a subscription that could not be made waits before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Where workers' KV events are heard (the flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KvEventsConfig {
    /// `--kv-events-port`: every HTTP worker's publisher is on its host at this port.
    pub(crate) port: Option<u16>,
    /// `--kv-events-ranks`: publishers per engine, at the port plus each rank.
    pub(crate) ranks: u32,
    /// `--kv-events-max-blocks`: blocks indexed per rank at most.
    pub(crate) max_blocks: usize,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            port: None,
            ranks: 1,
            max_blocks: 262_144,
        }
    }
}

impl KvEventsConfig {
    /// The publishers to subscribe to for `worker`, one per rank: its spec's endpoint, else its
    /// host at `--kv-events-port`; none for a gRPC worker (its events come on its stream).
    pub(crate) fn endpoints(&self, worker: &Worker) -> Option<Vec<String>> {
        if worker.endpoint.grpc() {
            return None;
        }
        let spec = &worker.live().spec;
        let (host, port) = match &spec.kv_events_endpoint {
            Some(endpoint) => endpoint.host_port()?,
            None => (worker.endpoint.authority.host().to_string(), self.port?),
        };
        let ranks = spec.kv_events_ranks.unwrap_or(self.ranks);
        Some(
            (0..ranks)
                .filter_map(|rank| u16::try_from(u32::from(port) + rank).ok())
                .map(|port| format!("tcp://{host}:{port}"))
                .collect(),
        )
    }
}

/// Subscribes to each rank's publisher until the worker's registration ends.
pub(super) async fn run_subscriber(worker: Arc<Worker>, endpoints: Vec<String>, max_blocks: usize) {
    worker.held.begin(max_blocks);
    let ranks = endpoints
        .into_iter()
        .enumerate()
        .map(|(rank, endpoint)| subscribe_rank(&worker, rank as u32, endpoint));
    futures_util::future::join_all(ranks).await;
}

/// One rank's publisher, subscribed to again whenever the subscription is lost.
async fn subscribe_rank(worker: &Worker, rank: u32, endpoint: String) {
    loop {
        let mut socket = zeromq::SubSocket::new();
        let mut monitor = socket.monitor();
        let subscribed = async {
            socket.connect(&endpoint).await?;
            socket.subscribe("").await
        };
        if let Err(e) = subscribed.await {
            debug!(worker = %worker.id, %endpoint, error = %e, "KV events: not subscribed yet");
            tokio::time::sleep(RETRY_AFTER).await;
            continue;
        }
        debug!(worker = %worker.id, %endpoint, "KV events: subscribed");
        loop {
            tokio::select! {
                received = socket.recv() => match received {
                    Ok(message) => apply(worker, rank, &message),
                    Err(e) => {
                        warn!(worker = %worker.id, %endpoint, error = %e, "KV events: subscription lost");
                        worker.held.lost(rank);
                        break;
                    }
                },
                Some(event) = monitor.next() => {
                    if matches!(event, SocketEvent::Disconnected(_)) {
                        // It reconnects by itself; what was missed meanwhile is unknown.
                        worker.held.lost(rank);
                    }
                }
            }
        }
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// Applies one message: its batch, numbered on this rank's stream.
fn apply(worker: &Worker, rank: u32, message: &ZmqMessage) {
    let frames: Vec<&[u8]> = message.iter().map(|f| f.as_ref()).collect();
    let (sequence, payload) = match frames.as_slice() {
        [_topic, sequence, payload] => (*sequence, *payload),
        _ => {
            worker.held.undecodable();
            return;
        }
    };
    let Ok(sequence) = <[u8; 8]>::try_from(sequence).map(u64::from_be_bytes) else {
        worker.held.undecodable();
        return;
    };
    match decode_batch(payload) {
        Ok(batch) => {
            let numbered = Numbered {
                stream: rank,
                sequence,
            };
            let applied = worker.held.apply(numbered, rank, &batch);
            if applied.gap {
                debug!(worker = %worker.id, rank, sequence, "KV events: batches missed, the rank's blocks forgotten");
            }
            if let Some(e) = applied.error {
                debug!(worker = %worker.id, rank, error = %e, "KV events: an event not applied");
            }
        }
        Err(e) => {
            debug!(worker = %worker.id, rank, error = %e, "KV events: a batch not decoded");
            worker.held.undecodable();
        }
    }
}
