//! KV events over ZMQ (`--kv-events-config`), black-box: a subscriber connects to the engine's
//! publisher as a gateway would, decodes each batch with the gateway's decoder, and rebuilds
//! which blocks the engine holds from them alone, in vLLM's encoding and in SGLang's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_core::held_blocks::{token_block_hashes, HeldBlocks, Stored};
use sluice_core::kv_events::{decode_batch, KvEvent};
use sluice_sim::testkit::{client, instant, post};
use sluice_sim::zmq_events::KvEventsConfig;
use sluice_sim::{Flavor, FleetConfig, SimFleet};
use zeromq::{Socket, SocketRecv};

/// The engine of `flavor` publishing on a free loopback port, a subscriber connected to it,
/// and the first batch that reached the subscriber (chats are sent until one has: a ZMQ
/// subscription takes effect some time after it is made).
async fn first_batch(flavor: Flavor) -> (Vec<u8>, Vec<u8>, usize) {
    let mut cfg = instant(flavor);
    cfg.kv_events_zmq = KvEventsConfig::parse(
        r#"{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": "kv@test"}"#,
    )
    .unwrap();
    let block_size = cfg.block_size as usize;
    let sims = SimFleet::start(FleetConfig::local(1, cfg)).await.unwrap();
    let endpoint = sims.engine(0).unwrap().state().kv_event_endpoints[0].clone();
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&endpoint).await.unwrap();
    sub.subscribe("").await.unwrap();
    let url = format!("{}/v1/completions", sims.urls()[0]);
    let chats = tokio::spawn(async move {
        let http = client();
        for i in 0.. {
            // Long enough for several full blocks; each prompt new, so each stores blocks.
            let prompt = format!("{i} {}", "the quick brown fox ".repeat(40));
            let body =
                serde_json::json!({"model": "test-model", "prompt": prompt, "max_tokens": 1});
            post(&http, &url, &body.to_string()).await;
        }
    });
    let message = tokio::time::timeout(Duration::from_secs(30), sub.recv())
        .await
        .expect("a batch within 30 s")
        .unwrap();
    chats.abort();
    assert_eq!(message.len(), 3, "topic, sequence, payload");
    let frames: Vec<Vec<u8>> = (0..3).map(|i| message.get(i).unwrap().to_vec()).collect();
    assert_eq!(frames[0], b"kv@test");
    assert_eq!(
        frames[1].len(),
        8,
        "the sequence number, 8 bytes big-endian"
    );
    (frames[1].clone(), frames[2].clone(), block_size)
}

/// The stored blocks of a batch rebuild the engine's view: every block chains after the one
/// before it, and the prompt they spell out matches all of them.
fn check_rebuilt(payload: &[u8], block_size: usize) {
    let batch = decode_batch(payload).unwrap();
    let mut held = HeldBlocks::new(10_000);
    let mut spelled: Vec<u32> = Vec::new();
    let mut stored = 0;
    for event in &batch.events {
        let KvEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size: size,
            ..
        } = event
        else {
            continue;
        };
        assert_eq!(*size, block_size);
        if parent.is_none() {
            spelled.clear();
            held.clear();
        }
        let outcome = held
            .store(&Stored {
                parent: *parent,
                engine_hashes: hashes,
                tokens,
                block_size: *size,
                start: 0,
            })
            .unwrap();
        assert_eq!(
            outcome.orphaned, 0,
            "each block follows one the batch stored"
        );
        spelled.extend(tokens);
        stored += hashes.len();
    }
    assert!(
        stored >= 2,
        "a long prompt stores several blocks: {batch:?}"
    );
    let keys = token_block_hashes(0, &spelled, block_size, usize::MAX);
    assert_eq!(held.held_prefix(&keys), keys.len());
}

#[tokio::test]
async fn vllm_publishes_map_batches_the_gateway_rebuilds_the_cache_from() {
    let (sequence, payload, block_size) = first_batch(Flavor::Vllm).await;
    let batch = decode_batch(&payload).unwrap();
    assert_eq!(batch.dp_rank, Some(0), "vLLM names the rank");
    assert!(u64::from_be_bytes(sequence.try_into().unwrap()) < 1_000);
    // vLLM's encoding: a map, not an array.
    assert_eq!(payload[0] & 0xf0, 0x80, "a fixmap");
    check_rebuilt(&payload, block_size);
}

#[tokio::test]
async fn sglang_publishes_array_batches_the_gateway_rebuilds_the_cache_from() {
    let (_, payload, block_size) = first_batch(Flavor::Sglang).await;
    let batch = decode_batch(&payload).unwrap();
    assert_eq!(batch.dp_rank, None);
    assert_eq!(payload[0], 0x92, "a two-element array: ts, events");
    check_rebuilt(&payload, block_size);
}
