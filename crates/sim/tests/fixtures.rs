#![allow(clippy::unwrap_used)] // test support: a failed step is the test failing
//! The simulator against the wire-conformance fixtures (`fixtures/engines/`), each written from
//! vLLM's or SGLang's own source: in the same situation, the simulator must say the same thing in
//! the same shape. The gateway is tested on the fixtures too, so the two cannot agree with each
//! other while disagreeing with the engines.
//!
//! Shapes are compared, not values: every metric sample a fixture has (its name and label names)
//! and every JSON field (with its type) must be in the simulator's answer; the values that tell
//! the behaviour (a counter standing still, a queue counted as waiting) are asserted one by one.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{json, Value};
use sluice_core::prom_text::{self, Exposition};
use sluice_sim::{Fault, Flavor, FleetConfig, PdRole, SimFleet};

/// Fixtures that are not a simulator's output, and why.
const NOT_SIMULATED: [(&str, &str); 2] = [
    (
        "sglang/v1-loads-malformed-field.json",
        "a spoiled report, as a proxy or a patched build may send it: only the gateway reads it",
    ),
    (
        "sglang/queue-full-detail.json",
        "the refusal where the exception reaches FastAPI's own handler; the simulator answers \
         as the serving layer does (sglang/queue-full.json)",
    ),
];

fn fixture(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/engines/");
    std::fs::read_to_string(format!("{root}{path}")).unwrap()
}

fn metrics(text: &str) -> Exposition {
    prom_text::parse(text).unwrap_or_else(|e| panic!("not Prometheus text ({e}):\n{text}"))
}

/// Each sample name with its label names.
fn series(e: &Exposition) -> BTreeSet<(String, Vec<String>)> {
    e.samples
        .iter()
        .map(|s| {
            let mut labels: Vec<String> = s.labels.iter().map(|(n, _)| n.clone()).collect();
            labels.sort();
            (s.name.clone(), labels)
        })
        .collect()
}

/// Every series of the fixture is in the simulator's exposition, with the same type. The
/// `_created` samples Python's client adds to counters are left out: nothing reads them.
fn assert_metrics_shape(fixture_path: &str, sim: &Exposition) {
    let expected = metrics(&fixture(fixture_path));
    let have = series(sim);
    for (name, labels) in series(&expected) {
        if name.ends_with("_created") {
            continue;
        }
        assert!(
            have.contains(&(name.clone(), labels.clone())),
            "{fixture_path}: the simulator has no {name} with labels {labels:?}"
        );
    }
    for (family, kind) in &expected.types {
        if let Some(ours) = sim.types.get(family) {
            assert_eq!(ours, kind, "{fixture_path}: {family}'s type");
        }
    }
}

/// Every field of `expected` is in `actual`, with a value of the same JSON type (recursively;
/// a list is compared by its first element, a null matches anything).
fn assert_json_shape(at: &str, expected: &Value, actual: &Value) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, value) in e {
                let Some(ours) = a.get(key) else {
                    panic!("{at}: no `{key}` in {actual}");
                };
                assert_json_shape(&format!("{at}.{key}"), value, ours);
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            if let (Some(e), Some(a)) = (e.first(), a.first()) {
                assert_json_shape(&format!("{at}[0]"), e, a);
            }
        }
        (Value::Null, _) => {}
        (e, a) => assert_eq!(
            std::mem::discriminant(e),
            std::mem::discriminant(a),
            "{at}: {e} against {a}"
        ),
    }
}

fn prompt_of(tokens: usize) -> String {
    json!({"model": "test-model", "prompt": vec![7; tokens], "max_tokens": 4,
           "ignore_eos": true})
    .to_string()
}

fn stream_of(tokens: u32) -> String {
    json!({"model": "test-model", "prompt": "hello", "max_tokens": tokens,
           "ignore_eos": true, "stream": true})
    .to_string()
}

#[tokio::test]
async fn every_fixture_is_checked_here_or_named_as_not_a_simulators_output() {
    let index: toml::Table = toml::from_str(&fixture("index.toml")).unwrap();
    let listed: BTreeSet<String> = index["fixture"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["file"].as_str().unwrap().to_string())
        .collect();
    let this = include_str!("fixtures.rs");
    for file in &listed {
        let skipped = NOT_SIMULATED.iter().any(|(f, _)| f == file);
        let quoted = format!("\"{file}\"");
        assert!(
            skipped || this.matches(&quoted).count() >= 1,
            "{file} is neither compared with the simulator nor named as not simulated"
        );
    }
}

/// A long prompt in chunked prefill: the first chunk's scrape, then a later one.
struct LongPrefill {
    fleet: SimFleet,
    first: Exposition,
    later: Exposition,
    /// SGLang's `/v1/loads` at each look.
    first_loads: Option<Value>,
    loads: Option<Value>,
}

/// Sends one 100k-token prompt and scrapes `/metrics` (and SGLang's `/v1/loads`) part-way
/// through its prefill, twice, the engine frozen for each look so the prefill cannot end
/// meanwhile.
async fn long_prefill(flavor: Flavor) -> LongPrefill {
    let fleet = fleet(timed(flavor, 20.0)).await;
    let slot = fleet.engine(0).unwrap().clone();
    let base = slot.url();
    let c = client();
    let request = tokio::spawn({
        let (c, url) = (c.clone(), format!("{base}/v1/completions"));
        async move { post(&c, &url, &prompt_of(100_000)).await }
    });
    let look = |blocks: u64| {
        let (slot, c, base) = (slot.clone(), c.clone(), base.clone());
        async move {
            slot.until(|s| s.kv_blocks_used > blocks).await;
            slot.fault(Fault::Pause).await.unwrap();
            let text = get(&c, &format!("{base}/metrics")).await.text();
            let loads = match flavor {
                Flavor::Sglang => Some(
                    get(&c, &format!("{base}/v1/loads?include=all"))
                        .await
                        .json(),
                ),
                Flavor::Vllm => None,
            };
            let used = slot.state().kv_blocks_used;
            slot.fault(Fault::Clear).await.unwrap();
            (metrics(&text), loads, used)
        }
    };
    let (first, first_loads, used) = look(0).await;
    let (later, loads, _) = look(used).await;
    let answer = request.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    LongPrefill {
        fleet,
        first,
        later,
        first_loads,
        loads,
    }
}

fn value(e: &Exposition, name: &str) -> f64 {
    e.named(name)
        .map(|s| s.value)
        .next()
        .unwrap_or_else(|| panic!("no {name}"))
}

#[tokio::test]
async fn vllm_counts_a_long_prompt_when_its_prefill_ends_and_its_kv_grows_chunk_by_chunk() {
    let LongPrefill {
        fleet,
        first,
        later,
        ..
    } = long_prefill(Flavor::Vllm).await;
    assert_metrics_shape("vllm/metrics-long-prefill-1.prom", &first);
    assert_metrics_shape("vllm/metrics-long-prefill-2.prom", &later);
    for scrape in [&first, &later] {
        assert_eq!(value(scrape, "vllm:prompt_tokens_total"), 0.0);
        assert_eq!(value(scrape, "vllm:generation_tokens_total"), 0.0);
        assert_eq!(value(scrape, "vllm:num_requests_running"), 1.0);
        assert_eq!(value(scrape, "vllm:iteration_tokens_total_count"), 0.0);
    }
    let usage = |e: &Exposition| value(e, "vllm:kv_cache_usage_perc");
    assert!(
        usage(&later) > usage(&first) && usage(&first) > 0.0,
        "the KV grows by chunks: {} then {}",
        usage(&first),
        usage(&later)
    );
    let base = fleet.urls()[0].clone();
    let after = metrics(&get(&client(), &format!("{base}/metrics")).await.text());
    assert_eq!(value(&after, "vllm:prompt_tokens_total"), 100_000.0);
    // Four steps had outputs: the one that ended the prefill (the prompt and its first token)
    // and three more tokens.
    assert_eq!(value(&after, "vllm:iteration_tokens_total_count"), 4.0);
    assert_eq!(value(&after, "vllm:iteration_tokens_total_sum"), 100_004.0);
}

#[tokio::test]
async fn sglang_counts_the_request_in_chunked_prefill_nowhere_but_in_its_uncached_tokens() {
    let LongPrefill {
        later,
        first_loads,
        loads,
        ..
    } = long_prefill(Flavor::Sglang).await;
    let (first_loads, loads) = (first_loads.unwrap(), loads.unwrap());
    let expected: Value =
        serde_json::from_str(&fixture("sglang/v1-loads-chunked-prefill.json")).unwrap();
    assert_json_shape("v1-loads-chunked-prefill", &expected, &first_loads);
    let expected: Value =
        serde_json::from_str(&fixture("sglang/v1-loads-chunked-prefill-2.json")).unwrap();
    assert_json_shape("v1-loads-chunked-prefill-2", &expected, &loads);
    let field = |v: &Value, k: &str| v["loads"][0][k].as_u64().unwrap();
    assert!(
        field(&loads, "num_used_tokens") > field(&first_loads, "num_used_tokens")
            && field(&loads, "num_waiting_uncached_tokens")
                < field(&first_loads, "num_waiting_uncached_tokens"),
        "chunk by chunk, KV tokens in use grow and tokens to prefill fall: {first_loads} then {loads}"
    );
    let rank = &loads["loads"][0];
    assert_eq!(rank["num_running_reqs"], 0, "{rank}");
    assert_eq!(rank["num_waiting_reqs"], 0, "{rank}");
    let uncached = rank["num_waiting_uncached_tokens"].as_u64().unwrap();
    assert!(uncached > 0 && uncached < 100_000, "{rank}");
    assert_eq!(value(&later, "sglang:num_running_reqs"), 0.0);
    assert_eq!(value(&later, "sglang:num_queue_reqs"), 0.0);
}

#[tokio::test]
async fn vllm_asleep_looks_idle_says_so_and_serves_once_awake() {
    let fleet = fleet(instant(Flavor::Vllm)).await;
    let base = fleet.urls()[0].clone();
    let c = client();
    assert_eq!(
        post(&c, &format!("{base}/sleep?level=1"), "").await.status,
        200
    );
    assert_eq!(
        get(&c, &format!("{base}/is_sleeping")).await.json()["is_sleeping"],
        true
    );
    let asleep = metrics(&get(&c, &format!("{base}/metrics")).await.text());
    assert_metrics_shape("vllm/metrics-asleep.prom", &asleep);
    let state = |e: &Exposition, label: &str| {
        e.named("vllm:engine_sleep_state")
            .find(|s| s.label("sleep_state") == Some(label))
            .map(|s| s.value)
    };
    assert_eq!(state(&asleep, "awake"), Some(0.0));
    assert_eq!(state(&asleep, "weights_offloaded"), Some(1.0));
    assert_eq!(state(&asleep, "discard_all"), Some(0.0));

    let request = tokio::spawn({
        let (c, url) = (c.clone(), format!("{base}/v1/completions"));
        async move { post(&c, &url, &prompt_of(16)).await }
    });
    let slot = fleet.engine(0).unwrap();
    slot.until(|s| s.waiting == 1).await;
    assert_eq!(
        slot.state().tokens_generated,
        0,
        "nothing runs while asleep"
    );
    assert_eq!(post(&c, &format!("{base}/wake_up"), "").await.status, 200);
    assert_eq!(request.await.unwrap().status, 200);
    let awake = metrics(&get(&c, &format!("{base}/metrics")).await.text());
    assert_eq!(state(&awake, "awake"), Some(1.0));
}

/// One prefill engine (0) and one decode engine (1) of `flavor`, the prefill frozen so the
/// decode half waits for its KV; returns the fleet once the decode half is waiting.
async fn decode_waiting_for_its_kv(flavor: Flavor) -> SimFleet {
    let mut prefill = instant(flavor);
    prefill.pd_role = Some(PdRole::Prefill);
    let mut decode = instant(flavor);
    decode.pd_role = Some(PdRole::Decode);
    let fleet = SimFleet::start(FleetConfig::local(1, prefill).also(1, decode))
        .await
        .unwrap();
    fleet.engine(0).unwrap().fault(Fault::Pause).await.unwrap();
    let bootstrap = fleet.engine(0).unwrap().bootstrap_addr().unwrap();
    let body = json!({"model": "test-model", "prompt": "x".repeat(400), "max_tokens": 4,
                      "bootstrap_host": bootstrap.ip().to_string(),
                      "bootstrap_port": bootstrap.port(), "bootstrap_room": 7})
    .to_string();
    let c = client();
    for (engine, body) in [(0, body.clone()), (1, body)] {
        let url = format!("{}/v1/completions", fleet.engine(engine).unwrap().url());
        let c = c.clone();
        tokio::spawn(async move { post(&c, &url, &body).await });
    }
    fleet.engine(1).unwrap().until(|s| s.waiting == 1).await;
    fleet
}

#[tokio::test]
async fn vllm_counts_a_decode_waiting_for_its_kv_as_deferred() {
    let fleet = decode_waiting_for_its_kv(Flavor::Vllm).await;
    let base = fleet.urls()[1].clone();
    let scrape = metrics(&get(&client(), &format!("{base}/metrics")).await.text());
    assert_metrics_shape("vllm/metrics-pd-decode.prom", &scrape);
    let reason = |r: &str| {
        scrape
            .named("vllm:num_requests_waiting_by_reason")
            .find(|s| s.label("reason") == Some(r))
            .map(|s| s.value)
    };
    assert_eq!(reason("deferred"), Some(1.0));
    assert_eq!(reason("capacity"), Some(0.0));
    assert_eq!(value(&scrape, "vllm:num_requests_waiting"), 1.0);
}

#[tokio::test]
async fn sglang_counts_a_decode_waiting_for_its_kv_in_its_transfer_queue() {
    let fleet = decode_waiting_for_its_kv(Flavor::Sglang).await;
    let base = fleet.urls()[1].clone();
    let loads = get(&client(), &format!("{base}/v1/loads?include=all"))
        .await
        .json();
    let expected: Value = serde_json::from_str(&fixture("sglang/v1-loads-decode.json")).unwrap();
    assert_json_shape("v1-loads-decode", &expected, &loads);
    let rank = &loads["loads"][0];
    assert_eq!(rank["num_waiting_reqs"], 1, "{rank}");
    assert_eq!(rank["queues"]["waiting"], 0, "{rank}");
    assert_eq!(
        rank["disaggregation"]["decode_transfer_queue_reqs"], 1,
        "{rank}"
    );
    let plain = get(&client(), &format!("{base}/v1/loads")).await.json();
    assert!(
        plain["loads"][0].get("queues").is_none(),
        "sections only when asked for: {plain}"
    );
}

#[tokio::test]
async fn sglang_reports_its_retractions_in_the_shape_of_its_queues_section() {
    let fleet = fleet(instant(Flavor::Sglang)).await;
    let base = fleet.urls()[0].clone();
    let loads = get(&client(), &format!("{base}/v1/loads?include=queues"))
        .await
        .json();
    let expected: Value =
        serde_json::from_str(&fixture("sglang/v1-loads-retracting.json")).unwrap();
    assert_json_shape("v1-loads-retracting", &expected, &loads);
    assert_eq!(loads["loads"][0]["queues"]["retracted"], 0);
}

#[tokio::test]
async fn sglang_get_load_has_the_older_shape_with_a_null_rank() {
    let fleet = fleet(instant(Flavor::Sglang)).await;
    let legacy = get(&client(), &format!("{}/get_load", fleet.urls()[0]))
        .await
        .json();
    let expected: Value = serde_json::from_str(&fixture("sglang/get-load-dp-null.json")).unwrap();
    let keys =
        |v: &Value| -> BTreeSet<String> { v[0].as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&legacy), keys(&expected));
    assert!(legacy[0]["dp_rank"].is_null());
}

/// The error event of a stream failed by the `error-event` fault, and what came before it.
async fn failed_stream(flavor: Flavor, code: u16) -> Vec<String> {
    let fleet = fleet(instant(flavor)).await;
    fleet
        .engine(0)
        .unwrap()
        .fault(Fault::ErrorEvent { rate: 1.0, code })
        .await
        .unwrap();
    let c = client();
    let base = fleet.urls()[0].clone();
    let answer = post(&c, &format!("{base}/v1/completions"), &stream_of(8)).await;
    assert_eq!(answer.status, 200, "the stream had started");
    let whole = json!({"model": "test-model", "prompt": "hello", "max_tokens": 8}).to_string();
    let refused = post(&c, &format!("{base}/v1/completions"), &whole).await;
    assert_eq!(refused.status, code, "a whole answer gets the status");
    answer.events()
}

/// The last two events of `fixture_path` against `events`: the error event's shape, then
/// `[DONE]`.
fn assert_ends_like(fixture_path: &str, events: &[String]) {
    let expected = sse_events(&fixture(fixture_path));
    let (error, done) = (&events[events.len() - 2], &events[events.len() - 1]);
    assert_eq!(done, "[DONE]");
    let expected_error: Value = serde_json::from_str(&expected[expected.len() - 2]).unwrap();
    let error: Value = serde_json::from_str(error).unwrap();
    assert_json_shape(fixture_path, &expected_error, &error);
    assert_eq!(error["error"]["code"], expected_error["error"]["code"]);
    assert_eq!(error["error"]["type"], expected_error["error"]["type"]);
}

#[tokio::test]
async fn a_stream_failed_on_the_engine_ends_with_its_error_event_then_done() {
    let vllm = failed_stream(Flavor::Vllm, 500).await;
    assert!(vllm.len() > 3, "tokens came before the failure: {vllm:?}");
    assert_ends_like("vllm/stream-error-midway.sse", &vllm);
    assert_ends_like(
        "vllm/stream-error-client.sse",
        &failed_stream(Flavor::Vllm, 400).await,
    );
    assert_ends_like(
        "sglang/stream-error-midway.sse",
        &failed_stream(Flavor::Sglang, 500).await,
    );
}

#[tokio::test]
async fn sglang_refuses_past_max_queued_requests_as_its_scheduler_does_in_both_shapes() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.max_queued_requests = Some(1);
    let fleet = fleet(cfg).await;
    let slot = fleet.engine(0).unwrap();
    slot.fault(Fault::Pause).await.unwrap();
    let base = slot.url();
    let c = client();
    tokio::spawn({
        let (c, url) = (c.clone(), format!("{base}/v1/completions"));
        async move { post(&c, &url, &prompt_of(16)).await }
    });
    slot.until(|s| s.waiting == 1).await;

    let whole = post(&c, &format!("{base}/v1/completions"), &prompt_of(16)).await;
    assert_eq!(whole.status, 503);
    let expected: Value = serde_json::from_str(&fixture("sglang/queue-full.json")).unwrap();
    assert_eq!(whole.json(), expected);

    let stream = post(&c, &format!("{base}/v1/completions"), &stream_of(4)).await;
    assert_eq!(stream.status, 200, "the stream had started");
    assert_eq!(
        stream.events(),
        sse_events(&fixture("sglang/stream-queue-full.sse"))
            .iter()
            .map(|e| {
                // The fixture's frame is Python's json.dumps (", " and ": "); compare as JSON.
                serde_json::from_str::<Value>(e).map_or(e.clone(), |v| v.to_string())
            })
            .collect::<Vec<_>>()
    );
}

/// An engine serving adapters `sql` and `med` with the engine's own defaults otherwise, after one
/// request under `model`.
async fn serving_adapters(flavor: Flavor, model: &str) -> SimFleet {
    use sluice_sim::lora::{LoraSettings, FAST_LOAD};
    let mut cfg = instant(flavor);
    cfg.lora = Some(LoraSettings::serving(&["sql", "med"], FAST_LOAD));
    let fleet = fleet(cfg).await;
    let body = json!({"model": model, "prompt": "hello", "max_tokens": 2}).to_string();
    let url = format!("{}/v1/completions", fleet.urls()[0]);
    assert_eq!(post(&client(), &url, &body).await.status, 200);
    fleet
}

#[tokio::test]
async fn vllm_lora_info_has_the_fixtures_labels() {
    let fleet = serving_adapters(Flavor::Vllm, "sql").await;
    let text = get(&client(), &format!("{}/metrics", fleet.urls()[0])).await;
    let sim = metrics(&text.text());
    assert_metrics_shape("vllm/metrics-lora.prom", &sim);
    assert!(sim
        .named("vllm:lora_requests_info")
        .any(|s| s.label("running_lora_adapters") == Some("sql")));
}

#[tokio::test]
async fn sglang_loads_have_the_fixtures_lora_section() {
    let fleet = serving_adapters(Flavor::Sglang, "test-model:sql").await;
    let url = format!("{}/v1/loads?include=all", fleet.urls()[0]);
    let sim = get(&client(), &url).await.json();
    let expected: Value = serde_json::from_str(&fixture("sglang/v1-loads-lora.json")).unwrap();
    assert_json_shape(
        "sglang/v1-loads-lora.json",
        &expected["loads"][0]["lora"],
        &sim["loads"][0]["lora"],
    );
}
