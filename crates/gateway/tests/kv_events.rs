//! Precise prefix routing, black-box: the gateway on loopback subscribed to simulated engines'
//! KV events (vLLM's and SGLang's ZMQ publishers, and gRPC workers' event stream), the
//! cache-aware policy scoring each worker by the blocks its engine says it holds. The engines
//! tokenize with the simulated model's tokenizer (`--model-tokenizer`), whose files the gateway
//! is given, so both make the same ids of a prompt.
//!
//! Prompts are put in an engine's cache behind the gateway's back (sent to the engine directly,
//! or through a second gateway), so only the engine's events can tell the gateway where they
//! are: the approximate index, which remembers where this gateway sent prompts, cannot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::model::ModelDir;
use common::{bounded, serve, Setup};
use serde_json::{json, Value};
use sluice_core::policy::{CacheAware, Policy};
use sluice_gateway::config::Config;
use sluice_gateway::fleet::ZmqEndpoint;
use sluice_gateway::tokens::{ChatMessage, SharedTokens};
use sluice_gateway::Gateway;
use sluice_sim::lora::{LoraSettings, FAST_LOAD};
use sluice_sim::testkit::{instant, post};
use sluice_sim::zmq_events::KvEventsConfig;
use sluice_sim::{EngineConfig, Flavor, FleetConfig, SimFleet};

/// The engines' block size (the instant profile's, vLLM's default).
const BLOCK: usize = 16;

/// `n` distinct prompt words (each one token of the simulated model), from `seed` on.
fn words(seed: u32, n: u32) -> String {
    (seed..seed + n)
        .map(|i| {
            let letter = |k: u32| char::from(b'a' + (k % 26) as u8);
            format!(" {}{}{}", letter(i / 676), letter(i / 26), letter(i))
        })
        .collect()
}

/// A one-message chat for `model` (the base model or a LoRA adapter).
fn chat_for(model: &str, content: &str) -> String {
    json!({"model": model, "max_tokens": 1,
           "messages": [{"role": "user", "content": content}]})
    .to_string()
}

/// Full blocks of a one-message chat, as the engine's tokenizer makes it.
fn full_blocks(model: &ModelDir, content: &str) -> u64 {
    let ids = model
        .tokens()
        .chat_ids(&[ChatMessage {
            role: "user".into(),
            content: content.into(),
        }])
        .unwrap();
    (ids.len() / BLOCK) as u64
}

/// An engine publishing its KV events over ZMQ on a free loopback port, its prompts in the
/// simulated model's tokens.
fn publishing(flavor: Flavor) -> EngineConfig {
    let mut engine = instant(flavor);
    engine.kv_events_zmq =
        KvEventsConfig::parse(r#"{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0"}"#).unwrap();
    engine.model_tokenizer = true;
    engine
}

/// The cache-aware policy with the model's files.
fn precise_config(urls: &[String], model: &ModelDir) -> Config {
    let mut config = Config::local(urls);
    config.route.policy = Policy::CacheAware(CacheAware::default());
    config.upstream.tokens = SharedTokens::new(Some(model.tokens()));
    config
}

/// Two engines of `engine`'s settings, each worker's spec naming its publisher.
async fn zmq_setup(engine: EngineConfig, model: &ModelDir) -> Setup {
    let sims = SimFleet::start(FleetConfig::local(2, engine))
        .await
        .unwrap();
    let mut config = precise_config(&sims.urls(), model);
    for (i, spec) in config.workers.iter_mut().enumerate() {
        let endpoint = sims.engine(i).unwrap().state().kv_event_endpoints[0].clone();
        spec.kv_events_endpoint = ZmqEndpoint::parse(&endpoint);
        assert!(spec.kv_events_endpoint.is_some(), "{endpoint}");
    }
    serve(sims, config).await
}

/// Worker `i`'s `prefix_cache` as `/workers` shows it.
async fn prefix_cache(s: &Setup, i: usize) -> Value {
    s.workers().await[i]["prefix_cache"].clone()
}

/// Where a chat reaches engine `i` without this gateway: its URL, or another gateway's.
struct Direct(Vec<String>);

impl Direct {
    async fn send(&self, s: &Setup, i: usize, content: &str) {
        self.send_for(s, i, "test-model", content).await
    }

    async fn send_for(&self, s: &Setup, i: usize, model: &str, content: &str) {
        let url = format!("{}/v1/chat/completions", self.0[i]);
        let answer = post(&s.client, &url, &chat_for(model, content)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
}

/// Sends chats to engine `i` directly until the gateway hears its events (a ZMQ subscription
/// takes hold some time after it is made; batches published before are not received).
async fn until_events_flow(s: &Setup, direct: &Direct, i: usize) {
    bounded("events flow", async {
        for n in 0.. {
            direct.send(s, i, &words(10_000 + n * 40, 40)).await;
            if prefix_cache(s, i).await["scored_by"] == "events" {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Puts `content`'s blocks in engine `i`'s cache behind the gateway's back, and waits until
/// the gateway has heard of them.
async fn store_directly(s: &Setup, direct: &Direct, model: &ModelDir, i: usize, content: &str) {
    store_directly_for(s, direct, model, (i, "test-model"), content).await
}

/// `store_directly` under `served`, the base model or an adapter.
async fn store_directly_for(
    s: &Setup,
    direct: &Direct,
    model: &ModelDir,
    (i, served): (usize, &str),
    content: &str,
) {
    let before = prefix_cache(s, i).await["blocks"].as_u64().unwrap();
    direct.send_for(s, i, served, content).await;
    let want = before + full_blocks(model, content);
    bounded("the blocks heard of", async {
        while prefix_cache(s, i).await["blocks"].as_u64().unwrap() < want {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Sends `content` through the gateway; the engine it reached.
async fn routed(s: &Setup, content: &str) -> usize {
    routed_for(s, "test-model", content).await
}

/// `routed` for `model`.
async fn routed_for(s: &Setup, model: &str, content: &str) -> usize {
    let before = s.received();
    assert_eq!(s.chat(&chat_for(model, content)).await.status, 200);
    let after = s.received();
    let moved: Vec<usize> = (0..after.len())
        .filter(|&i| after[i] != before[i])
        .collect();
    assert_eq!(moved.len(), 1, "{before:?} -> {after:?}");
    moved[0]
}

/// Four prompts, each in one engine's cache only (in an order no tie-breaking in turn could
/// follow), are each routed to the engine that holds it.
async fn each_prompt_goes_where_it_is_held(s: &Setup, direct: &Direct, model: &ModelDir) {
    for i in 0..2 {
        until_events_flow(s, direct, i).await;
    }
    let homes = [1, 0, 0, 1];
    let prompts: Vec<String> = (0..4).map(|k| words(k * 1000, 200)).collect();
    for (prompt, &home) in prompts.iter().zip(&homes) {
        store_directly(s, direct, model, home, prompt).await;
    }
    for (k, (prompt, &home)) in prompts.iter().zip(&homes).enumerate() {
        assert_eq!(routed(s, prompt).await, home, "prompt {k}");
    }
    for i in 0..2 {
        let view = prefix_cache(s, i).await;
        assert_eq!(view["scored_by"], "events", "{view}");
        assert_eq!(view["block_size"], BLOCK, "{view}");
        assert_eq!(view["gaps"], 0, "{view}");
        assert_eq!(view["malformed"], 0, "{view}");
        let id = s.worker_id(i).await;
        let series = |name: &str| format!("{name}{{worker=\"{id}\"}}");
        let held = s.metric(&series("sluice_worker_kv_blocks_held")).await;
        // Two of the prompts, 12 full blocks each at least.
        assert!(held.is_some_and(|b| b >= 24.0), "{held:?}");
        let batches = s
            .metric(&series("sluice_worker_kv_event_batches_total"))
            .await;
        assert!(batches.is_some_and(|b| b >= 1.0), "{batches:?}");
    }
}

#[tokio::test]
async fn vllm_zmq_events_route_a_prompt_to_the_engine_holding_it() {
    let model = ModelDir::new("kv-vllm");
    let s = zmq_setup(publishing(Flavor::Vllm), &model).await;
    let direct = Direct(s.sims.urls());
    each_prompt_goes_where_it_is_held(&s, &direct, &model).await;
}

#[tokio::test]
async fn sglang_zmq_events_route_a_prompt_to_the_engine_holding_it() {
    let model = ModelDir::new("kv-sglang");
    let s = zmq_setup(publishing(Flavor::Sglang), &model).await;
    let direct = Direct(s.sims.urls());
    each_prompt_goes_where_it_is_held(&s, &direct, &model).await;
}

#[tokio::test]
async fn grpc_stream_events_route_a_prompt_to_the_engine_holding_it() {
    let model = ModelDir::new("kv-grpc");
    let mut engine = instant(Flavor::Sglang);
    engine.grpc = Some(Default::default());
    let sims = SimFleet::start(FleetConfig::local(2, engine))
        .await
        .unwrap();
    let urls = sims.urls();
    // A gRPC engine is reached directly through a gateway of its own.
    let mut others = Vec::new();
    for url in &urls {
        let mut config = Config::local(std::slice::from_ref(url));
        config.upstream.tokens = SharedTokens::new(Some(model.tokens()));
        others.push(Gateway::start(config).await.unwrap());
    }
    let direct = Direct(others.iter().map(Gateway::url).collect());
    let s = serve(sims, precise_config(&urls, &model)).await;
    for other in &others {
        common::until_workers(other, &s.client, "ready", common::all_ready).await;
    }
    each_prompt_goes_where_it_is_held(&s, &direct, &model).await;
}

#[tokio::test]
async fn a_prompt_evicted_where_it_was_sent_goes_where_it_is_still_held() {
    let model = ModelDir::new("kv-evict");
    let mut engine = publishing(Flavor::Vllm);
    // 64 blocks of 16: three long prompts push an earlier one out.
    engine.num_gpu_blocks = 64;
    let s = zmq_setup(engine, &model).await;
    let direct = Direct(s.sims.urls());
    for i in 0..2 {
        until_events_flow(&s, &direct, i).await;
    }
    let prompt = words(0, 200);
    let first = routed(&s, &prompt).await;
    let other = 1 - first;
    for k in 0..3 {
        direct.send(&s, first, &words(2_000 + k * 700, 600)).await;
    }
    store_directly(&s, &direct, &model, other, &prompt).await;
    // Everything the first engine published has been applied: its evictions too.
    bounded("the first engine's batches applied", async {
        loop {
            let sent = s.sims.engine(first).unwrap().state().kv_event_batches[0];
            let view = prefix_cache(&s, first).await;
            if sent > 0 && view["streams"][0]["last_batch"].as_u64() == Some(sent - 1) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        routed(&s, &prompt).await,
        other,
        "the engine it was first sent to evicted it; the other holds it"
    );
}

#[tokio::test]
async fn in_a_pool_where_one_worker_publishes_the_other_is_scored_the_approximate_way() {
    let model = ModelDir::new("kv-mixed");
    let sims = SimFleet::start(FleetConfig::local(2, publishing(Flavor::Vllm)))
        .await
        .unwrap();
    let mut config = precise_config(&sims.urls(), &model);
    let endpoint = sims.engine(0).unwrap().state().kv_event_endpoints[0].clone();
    config.workers[0].kv_events_endpoint = ZmqEndpoint::parse(&endpoint);
    let s = serve(sims, config).await;
    let direct = Direct(s.sims.urls());
    until_events_flow(&s, &direct, 0).await;
    direct.send(&s, 1, &words(9_000, 200)).await;
    let view = prefix_cache(&s, 1).await;
    assert_eq!(
        (view["scored_by"].as_str(), view["batches"].as_u64()),
        (Some("approximate"), Some(0)),
        "{view}"
    );
    // Two prompts held where events flow go there, though ties would be broken in turn.
    let held = [words(0, 200), words(1_000, 200)];
    for prompt in &held {
        store_directly(&s, &direct, &model, 0, prompt).await;
    }
    for prompt in &held {
        assert_eq!(routed(&s, prompt).await, 0, "held where events flow");
    }
    let sent = words(3_000, 200);
    let first = routed(&s, &sent).await;
    assert_eq!(
        routed(&s, &sent).await,
        first,
        "a prompt sent through the gateway stays where it went"
    );
}

#[tokio::test]
async fn a_restarted_engine_is_forgotten_and_heard_again() {
    let model = ModelDir::new("kv-restart");
    let s = zmq_setup(publishing(Flavor::Vllm), &model).await;
    let direct = Direct(s.sims.urls());
    until_events_flow(&s, &direct, 0).await;
    let prompt = words(0, 200);
    store_directly(&s, &direct, &model, 0, &prompt).await;
    s.fault(0, sluice_sim::Fault::Restart).await;
    // The engine came back empty on its ports: what it held is forgotten...
    bounded("the restarted engine's blocks forgotten", async {
        while prefix_cache(&s, 0).await["blocks"] != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // ...and its events are heard again once the subscription reconnects.
    until_events_flow(&s, &direct, 0).await;
    store_directly(&s, &direct, &model, 0, &prompt).await;
    let view = prefix_cache(&s, 0).await;
    assert!(view["lost"].as_u64().unwrap() >= 1, "{view}");
}

#[tokio::test]
async fn one_prompt_under_two_adapters_goes_where_each_adapter_holds_it() {
    let model = ModelDir::new("kv-lora");
    let mut engine = publishing(Flavor::Vllm);
    let mut lora = LoraSettings::serving(&["sql", "med"], FAST_LOAD);
    lora.max_loras = Some(2);
    engine.lora = Some(lora);
    let s = zmq_setup(engine, &model).await;
    let direct = Direct(s.sims.urls());
    for i in 0..2 {
        until_events_flow(&s, &direct, i).await;
    }
    let prompt = words(0, 200);
    store_directly_for(&s, &direct, &model, (1, "sql"), &prompt).await;
    store_directly_for(&s, &direct, &model, (0, "med"), &prompt).await;
    // Keyed alike, both engines would hold the prompt for either adapter and one tie-break
    // would send both requests to the same engine.
    assert_eq!(routed_for(&s, "sql", &prompt).await, 1);
    assert_eq!(routed_for(&s, "med", &prompt).await, 0);
}
