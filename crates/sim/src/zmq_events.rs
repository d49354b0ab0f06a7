//! The prefix cache's KV events published over ZMQ, as vLLM and SGLang publish them when started
//! with `--kv-events-config '{"publisher": "zmq", ...}'`.
//!
//! Both engines send one batch per scheduler step that changed the cache, on a PUB socket bound
//! at the config's `endpoint` (`tcp://*:5557` by default; data-parallel rank `r` at the port plus
//! `r`), each as three frames: the `topic`, the sequence number (8 bytes, big-endian, from 0 per
//! publisher), and the batch as msgspec's MessagePack. The batch's shape follows the flavor:
//! - vLLM (`vllm/distributed/kv_events.py` and `vllm/v1/core/sched/scheduler.py`,
//!   vllm-project/vllm@0181ea3): a map (`ts`, `events`, `data_parallel_rank`), each event a map
//!   whose `type` names it; block hashes as bytes (vLLM's default, without
//!   `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`); stored and removed blocks on the `GPU` medium; a
//!   request's chained new blocks one `BlockStored`, each eviction one `BlockRemoved`
//!   (`vllm/v1/core/block_pool.py` @002f349).
//! - SGLang (`python/sglang/srt/disaggregation/kv_events.py`, sgl-project/sglang@006d053):
//!   array-like, a batch `[ts, events]` and each event `[tag, fields...]`; hashes as integers.
//!
//! The replay socket (`replay_endpoint`) is not served: a subscriber that misses batches sees
//! the gap in the sequence numbers and must start over from what comes next.

use std::sync::Arc;

use bytes::Bytes;
use rmpv::Value;
use tokio::sync::broadcast;
use zeromq::{Socket, SocketSend, ZmqMessage};

pub use crate::kv_events_config::{KvEventsConfig, KvEventsError};

use crate::config::Flavor;
use crate::engine::KvBatch;
use crate::scheduler::prefix::CacheEvent;
use crate::scheduler::Adapter;

/// One rank's publisher, bound.
pub(crate) struct Publisher {
    socket: zeromq::PubSocket,
    /// Where it was bound (the port resolved), for tests and the engine's state.
    pub endpoint: String,
}

impl Publisher {
    pub(crate) async fn bind(cfg: &KvEventsConfig, rank: u32) -> Result<Self, KvEventsError> {
        Self::bind_at(&cfg.endpoint_of(rank)?).await
    }

    /// Binds exactly `endpoint` (a restarted engine's, its port known).
    pub(crate) async fn bind_at(endpoint: &str) -> Result<Self, KvEventsError> {
        let endpoint = endpoint.to_string();
        let mut socket = zeromq::PubSocket::new();
        let bound = socket
            .bind(&endpoint)
            .await
            .map_err(|e| KvEventsError::Bind {
                endpoint: endpoint.clone(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            socket,
            endpoint: bound.to_string(),
        })
    }
}

/// What one rank's publisher sends, and where it counts what it sent.
pub(crate) struct Publishing {
    pub rank: u32,
    pub flavor: Flavor,
    pub block_size: u32,
    pub topic: Bytes,
    /// Batches sent: the next one's number.
    pub sent: Arc<std::sync::atomic::AtomicU64>,
}

/// Publishes each of the rank's batches until the engine goes (`killed`), then closes its
/// socket, its port free once this returns (a restarted engine binds it again). A batch the
/// publisher fell behind on is dropped unnumbered, as the engines' bounded queues drop them.
pub(crate) async fn run(
    mut publisher: Publisher,
    batches: broadcast::Receiver<Arc<KvBatch>>,
    publishing: Publishing,
    mut killed: tokio::sync::watch::Receiver<bool>,
) {
    tokio::select! {
        () = publish(&mut publisher, batches, &publishing) => {}
        _ = killed.wait_for(|k| *k) => {}
    }
    let _ = publisher.socket.close().await;
}

async fn publish(
    publisher: &mut Publisher,
    mut batches: broadcast::Receiver<Arc<KvBatch>>,
    p: &Publishing,
) {
    let (rank, flavor, block_size, topic, sent) =
        (p.rank, p.flavor, p.block_size, &p.topic, &p.sent);
    let mut sequence: u64 = 0;
    loop {
        let batch = match batches.recv().await {
            Ok(batch) if batch.rank == rank => batch,
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let payload = encode(&batch, flavor, block_size, now_secs());
        let frames = vec![
            topic.clone(),
            Bytes::copy_from_slice(&sequence.to_be_bytes()),
            Bytes::from(payload),
        ];
        let Ok(message) = ZmqMessage::try_from(frames) else {
            return;
        };
        if publisher.socket.send(message).await.is_err() {
            return;
        }
        sequence += 1;
        sent.store(sequence, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The wall clock in seconds, as `time.time()` stamps a batch.
fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// A batch as the flavor's engine encodes it.
pub fn encode(batch: &KvBatch, flavor: Flavor, block_size: u32, ts: f64) -> Vec<u8> {
    let value = match flavor {
        Flavor::Vllm => vllm_batch(batch, block_size, ts),
        Flavor::Sglang => sglang_batch(batch, block_size, ts),
    };
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).expect("writing to a Vec cannot fail");
    out
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

fn tokens(ids: &[u32]) -> Value {
    Value::Array(ids.iter().map(|&t| Value::from(t)).collect())
}

/// vLLM's block hash on the wire: bytes.
fn vllm_hash(hash: u64) -> Value {
    Value::Binary(hash.to_be_bytes().to_vec())
}

/// A run of stored blocks, each after the one before: vLLM's one `BlockStored` for the blocks a
/// request filled in a step (`block_pool.py`, `cache_full_blocks`: the new full blocks' hashes,
/// the parent of the first, the tokens of all).
struct Run {
    hashes: Vec<u64>,
    parent: Option<u64>,
    tokens: Vec<u32>,
    /// The request's adapter: `lora_id` is its `lora_int_id`, `lora_name` its name
    /// (`cache_full_blocks` reads both off the request's `lora_request`).
    adapter: Option<Adapter>,
}

/// An event as vLLM reports it.
enum VllmEvent {
    Stored(Run),
    /// Each evicted block is a removal of its own (`_maybe_evict_cached_block`).
    Removed(u64),
}

/// The batch's events with runs of chained stores joined, as vLLM reports them.
fn vllm_events(events: &[CacheEvent]) -> Vec<VllmEvent> {
    let mut out: Vec<VllmEvent> = Vec::new();
    for event in events {
        match event {
            CacheEvent::Stored {
                hash,
                parent,
                tokens: ids,
                adapter,
            } => {
                if let Some(VllmEvent::Stored(run)) = out.last_mut() {
                    if *parent == run.hashes.last().copied() && *adapter == run.adapter {
                        run.hashes.push(*hash);
                        run.tokens.extend(ids);
                        continue;
                    }
                }
                out.push(VllmEvent::Stored(Run {
                    hashes: vec![*hash],
                    parent: *parent,
                    tokens: ids.clone(),
                    adapter: adapter.clone(),
                }));
            }
            CacheEvent::Removed(hash) => out.push(VllmEvent::Removed(*hash)),
        }
    }
    out
}

fn vllm_batch(batch: &KvBatch, block_size: u32, ts: f64) -> Value {
    let events = vllm_events(&batch.events)
        .into_iter()
        .map(|event| match event {
            VllmEvent::Stored(run) => map(vec![
                ("type", Value::from("BlockStored")),
                (
                    "block_hashes",
                    Value::Array(run.hashes.into_iter().map(vllm_hash).collect()),
                ),
                (
                    "parent_block_hash",
                    run.parent.map_or(Value::Nil, vllm_hash),
                ),
                ("token_ids", tokens(&run.tokens)),
                ("block_size", Value::from(block_size)),
                (
                    "lora_id",
                    run.adapter
                        .as_ref()
                        .map_or(Value::Nil, |a| Value::from(a.id.0)),
                ),
                ("medium", Value::from("GPU")),
                (
                    "lora_name",
                    run.adapter
                        .as_ref()
                        .map_or(Value::Nil, |a| Value::from(a.name.as_ref())),
                ),
            ]),
            VllmEvent::Removed(hash) => map(vec![
                ("type", Value::from("BlockRemoved")),
                ("block_hashes", Value::Array(vec![vllm_hash(hash)])),
                ("medium", Value::from("GPU")),
            ]),
        })
        .collect();
    map(vec![
        ("ts", Value::F64(ts)),
        ("events", Value::Array(events)),
        ("data_parallel_rank", Value::from(batch.rank)),
    ])
}

fn sglang_batch(batch: &KvBatch, block_size: u32, ts: f64) -> Value {
    let events = batch
        .events
        .iter()
        .map(|event| match event {
            // SGLang's radix cache publishes `lora_id=None` whatever the request's adapter
            // (mem_cache/radix_cache.py, `_record_store_event`); its tree keeps adapters apart.
            CacheEvent::Stored {
                hash,
                parent,
                tokens: ids,
                adapter: _,
            } => Value::Array(vec![
                Value::from("BlockStored"),
                Value::Array(vec![Value::from(*hash)]),
                parent.map_or(Value::Nil, Value::from),
                tokens(ids),
                Value::from(block_size),
                Value::Nil,
            ]),
            CacheEvent::Removed(hash) => Value::Array(vec![
                Value::from("BlockRemoved"),
                Value::Array(vec![Value::from(*hash)]),
            ]),
        })
        .collect();
    Value::Array(vec![Value::F64(ts), Value::Array(events)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_publishes_only_with_zmq_and_offsets_each_ranks_port() {
        assert_eq!(
            KvEventsConfig::parse(r#"{"publisher": "null"}"#).unwrap(),
            None
        );
        assert_eq!(
            KvEventsConfig::parse(r#"{"enable_kv_cache_events": false}"#).unwrap(),
            None
        );
        let cfg = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true}"#)
            .unwrap()
            .unwrap();
        assert_eq!(cfg.endpoint_of(0).unwrap(), "tcp://0.0.0.0:5557");
        assert_eq!(cfg.endpoint_of(2).unwrap(), "tcp://0.0.0.0:5559");
        let any = KvEventsConfig::parse(r#"{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(any.endpoint_of(1).unwrap(), "tcp://127.0.0.1:0");
        assert!(KvEventsConfig::parse(r#"{"publisher": "zmq", "endpoint": "ipc:///x"}"#).is_err());
        assert!(KvEventsConfig::parse("zmq").is_err());
    }

    #[test]
    fn vllm_reports_a_requests_chained_blocks_as_one_store_and_each_eviction_alone() {
        let stored = |hash, parent, t: u32| CacheEvent::Stored {
            hash,
            parent,
            tokens: vec![t, t],
            adapter: None,
        };
        let events = vllm_events(&[
            stored(1, None, 1),
            stored(2, Some(1), 2),
            stored(3, Some(2), 3),
            stored(9, Some(7), 9),
            CacheEvent::Removed(4),
            CacheEvent::Removed(5),
        ]);
        let shape: Vec<String> = events
            .iter()
            .map(|e| match e {
                VllmEvent::Stored(run) => {
                    format!(
                        "stored {:?} after {:?} {:?}",
                        run.hashes, run.parent, run.tokens
                    )
                }
                VllmEvent::Removed(hash) => format!("removed {hash}"),
            })
            .collect();
        assert_eq!(
            shape,
            [
                "stored [1, 2, 3] after None [1, 1, 2, 2, 3, 3]",
                "stored [9] after Some(7) [9, 9]",
                "removed 4",
                "removed 5",
            ]
        );
    }
}
