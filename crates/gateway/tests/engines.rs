//! The gateway against engines that behave as vLLM's and SGLang's own source does, played from
//! the wire-conformance fixtures (`fixtures/engines/`, each naming the source file it was written
//! from) by a scripted engine — not by the project's simulator. Each test is a behaviour a real
//! engine showed that once misfired a protection: an error event before `[DONE]` read as a
//! success, SGLang's full queue opening the circuit, an older SGLang's load report thrown away, a
//! disaggregated decode engine's transfer queue read as overload, an engine asleep taking
//! traffic, a long prefill read as a wedged engine, a request in chunked prefill read as one the
//! engine never got.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::over::{chat, ids, metric, worker_view};
use common::wire::{fixture, Scripted, WireEngine};
use common::*;
use sluice_core::breaker::BreakerConfig;
use sluice_core::policy::Policy;
use tokio::sync::Notify;

/// A gateway over `engines`, round robin, polling their load every 50 ms, tuned by `tune`; every
/// worker ready.
async fn gateway_over(engines: &[&WireEngine], tune: impl FnOnce(&mut Config)) -> Gateway {
    let urls: Vec<String> = engines.iter().map(|e| e.url.clone()).collect();
    let mut config = Config::local(&urls);
    config.route.policy = Policy::RoundRobin;
    config.control.load.interval = Duration::from_millis(50);
    config.control.load.min_interval = Duration::from_millis(10);
    tune(&mut config);
    let gateway = Gateway::start(config).await.unwrap();
    until_workers(&gateway, &client(), "workers ready", all_ready).await;
    gateway
}

async fn until_worker(gateway: &Gateway, id: &str, what: &str, done: impl Fn(&Value) -> bool) {
    until_workers(gateway, &client(), what, |workers| {
        workers.iter().any(|w| w["id"] == id && done(w))
    })
    .await;
}

fn quick_breaker(c: &mut Config) {
    c.fleet.breaker = Some(BreakerConfig {
        failure_threshold: 3,
        success_threshold: 1,
        open_timeout: Duration::from_secs(60),
        half_open_trials: 1,
        failure_rate: None,
    });
}

#[tokio::test]
async fn an_error_event_before_done_is_a_failed_answer_and_opens_the_circuit() {
    let failing = WireEngine::start(
        "vllm",
        Scripted::stream(fixture("vllm/stream-error-midway.sse")),
    )
    .await;
    let healthy = WireEngine::start("vllm", Scripted::ok_stream()).await;
    let gateway = gateway_over(&[&failing, &healthy], quick_breaker).await;
    let failing_id = ids(&gateway).await[0].clone();

    let mut relayed = 0;
    for _ in 0..12 {
        let a = chat(&gateway, true).await;
        assert_eq!(a.status, 200);
        if a.text().contains("\"error\"") {
            assert_eq!(
                a.text(),
                fixture("vllm/stream-error-midway.sse"),
                "the engine's stream, its error event and [DONE] as they came"
            );
            relayed += 1;
        }
    }
    assert_eq!(relayed, 3, "the circuit opened at the third failed stream");
    assert_eq!(failing.received(), 3);
    assert_eq!(
        worker_view(&gateway, &failing_id).await["circuit"]["state"],
        "open"
    );
    let series =
        format!("sluice_upstream_errors_total{{worker=\"{failing_id}\",kind=\"error_event\"}}");
    assert_eq!(metric(&gateway, &series).await, 3.0);
}

#[tokio::test]
async fn an_error_the_engine_classes_as_the_clients_fails_the_request_not_the_worker() {
    let engine = WireEngine::start(
        "vllm",
        Scripted::stream(fixture("vllm/stream-error-client.sse")),
    )
    .await;
    let gateway = gateway_over(&[&engine], quick_breaker).await;
    let id = ids(&gateway).await[0].clone();
    for _ in 0..6 {
        let a = chat(&gateway, true).await;
        assert_eq!(a.text(), fixture("vllm/stream-error-client.sse"));
    }
    assert_eq!(engine.received(), 6, "never shut out");
    assert_eq!(
        worker_view(&gateway, &id).await["circuit"]["state"],
        "closed"
    );
    let series = format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"error_event\"}}");
    assert_eq!(metric(&gateway, &series).await, 0.0);
}

#[tokio::test]
async fn sglangs_full_queue_is_backpressure_retried_elsewhere_in_both_shapes() {
    let full = WireEngine::start(
        "sglang",
        Scripted::json(503, fixture("sglang/queue-full.json")),
    )
    .await;
    let room = WireEngine::start("sglang", Scripted::ok_stream()).await;
    let gateway = gateway_over(&[&full, &room], quick_breaker).await;
    let full_id = ids(&gateway).await[0].clone();
    for _ in 0..8 {
        full.then(Scripted::json(
            503,
            fixture("sglang/queue-full-detail.json"),
        ));
        let a = chat(&gateway, false).await;
        assert_eq!(
            a.status,
            200,
            "retried on the engine with room: {}",
            a.text()
        );
    }
    for _ in 0..8 {
        full.then(Scripted::stream(fixture("sglang/stream-queue-full.sse")));
        let a = chat(&gateway, true).await;
        assert_eq!(a.status, 200);
        assert!(
            !a.text().contains("queue is full"),
            "the refusal was the first event, retried: {}",
            a.text()
        );
    }
    assert!(full.received() >= 1, "the full engine was asked");
    assert_eq!(
        worker_view(&gateway, &full_id).await["circuit"]["state"],
        "closed",
        "backpressure never opens the circuit"
    );
    assert!(metric(&gateway, "sluice_retries_total{reason=\"at_capacity\"}").await >= 1.0);
}

#[tokio::test]
async fn a_full_queue_with_nowhere_else_to_go_is_relayed_and_not_a_failure() {
    let full = WireEngine::start(
        "sglang",
        Scripted::json(503, fixture("sglang/queue-full.json")),
    )
    .await;
    let gateway = gateway_over(&[&full], quick_breaker).await;
    let id = ids(&gateway).await[0].clone();
    for _ in 0..5 {
        let a = chat(&gateway, false).await;
        assert_eq!(a.status, 503);
        assert_eq!(a.text(), fixture("sglang/queue-full.json"), "as it came");
    }
    assert_eq!(
        worker_view(&gateway, &id).await["circuit"]["state"],
        "closed"
    );
}

#[tokio::test]
async fn an_older_sglangs_report_with_a_null_rank_keeps_its_overload_veto() {
    let loaded = WireEngine::start("sglang", Scripted::ok_stream()).await;
    loaded.set_load("/get_load", 200, fixture("sglang/get-load-dp-null.json"));
    let idle = WireEngine::start("sglang", Scripted::ok_stream()).await;
    idle.set_load(
        "/v1/loads",
        200,
        r#"{"loads":[{"dp_rank":0,"num_running_reqs":0,"num_waiting_reqs":0,"token_usage":0.0}]}"#,
    );
    let gateway = gateway_over(&[&loaded, &idle], |_| {}).await;
    let loaded_id = ids(&gateway).await[0].clone();
    until_worker(&gateway, &loaded_id, "overloaded", |w| {
        w["vetoes"]["overloaded"] == true
    })
    .await;
    for _ in 0..6 {
        assert_eq!(chat(&gateway, false).await.status, 200);
    }
    assert_eq!(loaded.received(), 0, "50 waiting: no request for it");
    let series = format!(
        "sluice_engine_load_report_issues_total{{worker=\"{loaded_id}\",issue=\"fallback\"}}"
    );
    assert!(metric(&gateway, &series).await >= 1.0);
}

#[tokio::test]
async fn a_malformed_field_keeps_the_report_and_a_bad_body_does_not_lose_v1_loads() {
    let engine = WireEngine::start("sglang", Scripted::ok_stream()).await;
    engine.set_load(
        "/v1/loads",
        200,
        fixture("sglang/v1-loads-malformed-field.json"),
    );
    engine.set_load(
        "/get_load",
        200,
        r#"[{"dp_rank":0,"num_reqs":0,"num_waiting_reqs":0}]"#,
    );
    let gateway = gateway_over(&[&engine], |_| {}).await;
    let id = ids(&gateway).await[0].clone();
    until_worker(&gateway, &id, "overloaded from /v1/loads", |w| {
        w["vetoes"]["overloaded"] == true
    })
    .await;
    let series = format!(
        "sluice_engine_load_report_issues_total{{worker=\"{id}\",issue=\"dropped_field\"}}"
    );
    assert!(metric(&gateway, &series).await >= 1.0);

    // One answer that is no report at all: /get_load stands in for that poll only.
    engine.set_load("/v1/loads", 200, "<html>proxy error</html>");
    until_worker(&gateway, &id, "read from /get_load", |w| {
        w["engine_load"]["source"] == "/get_load"
    })
    .await;
    engine.set_load("/v1/loads", 200, fixture("sglang/v1-loads-decode.json"));
    until_worker(&gateway, &id, "back on /v1/loads", |w| {
        w["engine_load"]["source"] == "/v1/loads"
    })
    .await;
}

#[tokio::test]
async fn an_engine_that_refuses_the_query_is_asked_without_it() {
    let engine = WireEngine::start("sglang", Scripted::ok_stream()).await;
    engine.refuse_queries();
    engine.set_load(
        "/v1/loads",
        200,
        fixture("sglang/v1-loads-malformed-field.json"),
    );
    let gateway = gateway_over(&[&engine], |_| {}).await;
    let id = ids(&gateway).await[0].clone();
    until_worker(&gateway, &id, "overloaded from /v1/loads", |w| {
        w["vetoes"]["overloaded"] == true && w["engine_load"]["source"] == "/v1/loads"
    })
    .await;
}

#[tokio::test]
async fn a_decode_engines_transfer_queue_is_not_overload() {
    let sglang = WireEngine::start("sglang", Scripted::ok_stream()).await;
    sglang.set_load("/v1/loads", 200, fixture("sglang/v1-loads-decode.json"));
    let vllm = WireEngine::start("vllm", Scripted::ok_stream()).await;
    vllm.set_load("/metrics", 200, fixture("vllm/metrics-pd-decode.prom"));
    let gateway = gateway_over(&[&sglang, &vllm], |_| {}).await;
    let [sglang_id, vllm_id] = <[String; 2]>::try_from(ids(&gateway).await).unwrap();
    for (id, waiting, deferred) in [(&sglang_id, 3, 37), (&vllm_id, 2, 12)] {
        until_worker(&gateway, id, "a report", |w| {
            w["engine_load"]["waiting"] == waiting && w["engine_load"]["deferred"] == deferred
        })
        .await;
        let view = worker_view(&gateway, id).await;
        assert_eq!(view["vetoes"]["overloaded"], false, "{view}");
    }
    for _ in 0..4 {
        assert_eq!(chat(&gateway, false).await.status, 200);
    }
    assert_eq!((sglang.received(), vllm.received()), (2, 2));
}

#[tokio::test]
async fn an_engine_asleep_gets_no_request_until_it_wakes() {
    let asleep = WireEngine::start("vllm", Scripted::ok_stream()).await;
    asleep.set_load("/metrics", 200, fixture("vllm/metrics-asleep.prom"));
    let awake = WireEngine::start("vllm", Scripted::ok_stream()).await;
    awake.set_load("/metrics", 200, fixture("vllm/metrics-pd-decode.prom"));
    let gateway = gateway_over(&[&asleep, &awake], |_| {}).await;
    let asleep_id = ids(&gateway).await[0].clone();
    until_worker(&gateway, &asleep_id, "asleep", |w| {
        w["vetoes"]["asleep"] == true
    })
    .await;
    for _ in 0..6 {
        assert_eq!(chat(&gateway, false).await.status, 200);
    }
    assert_eq!(asleep.received(), 0);
    asleep.set_load("/metrics", 200, fixture("vllm/metrics-pd-decode.prom"));
    until_worker(&gateway, &asleep_id, "awake", |w| {
        w["vetoes"]["asleep"] == false
    })
    .await;
    for _ in 0..4 {
        assert_eq!(chat(&gateway, false).await.status, 200);
    }
    assert!(asleep.received() > 0, "back in rotation");
}

/// Sends a request with a long prompt that `engine` answers with `answer` (held until released),
/// and returns once the engine has it.
async fn send_held(
    gateway: &Gateway,
    engine: &WireEngine,
    answer: Scripted,
    stream: bool,
) -> tokio::task::JoinHandle<Answer> {
    engine.then(answer);
    let url = format!("{}/v1/chat/completions", gateway.url());
    let body = chat_body("test-model", "a long prompt", 1, stream);
    let held = tokio::spawn(async move { post(&client(), &url, &body).await });
    bounded("the request at the engine", async {
        while engine.received() == 0 {
            engine.polls_past(engine.polls(), 1).await;
        }
    })
    .await;
    held
}

fn fast_liveness(c: &mut Config) {
    let l = c.control.liveness.as_mut().expect("on by default");
    l.wedge = Duration::from_millis(300);
    l.unresponsive = Duration::from_millis(300);
}

#[tokio::test]
async fn a_long_prefill_is_not_a_wedged_engine_while_its_kv_usage_moves() {
    let engine = WireEngine::start("vllm", Scripted::ok_stream()).await;
    engine.set_load(
        "/metrics",
        200,
        "vllm:num_requests_running 0\nvllm:generation_tokens_total 0\n",
    );
    let gateway = gateway_over(&[&engine], fast_liveness).await;
    let id = ids(&gateway).await[0].clone();
    let prefill = Arc::new(Notify::new());
    let held = send_held(
        &gateway,
        &engine,
        Scripted::ok_stream().held(&prefill),
        true,
    )
    .await;
    // Each chunk of the prefill takes KV blocks: the scrapes differ, the counters do not.
    for i in 0..24 {
        let page = if i % 2 == 0 { 2 } else { 1 };
        let text = fixture(&format!("vllm/metrics-long-prefill-{page}.prom"));
        engine.set_load("/metrics", 200, text);
        bounded("a poll", engine.polls_past(engine.polls(), 2)).await;
        let view = worker_view(&gateway, &id).await;
        assert_eq!(view["vetoes"]["liveness"], Value::Null, "poll {i}: {view}");
    }
    // The same scrape again and again: the engine stopped stepping.
    bounded(
        "engine silent",
        until_worker(&gateway, &id, "engine silent", |w| {
            w["vetoes"]["liveness"] == "engine_silent"
        }),
    )
    .await;
    prefill.notify_one();
    assert_eq!(bounded("the held stream", held).await.unwrap().status, 200);
}

/// SGLang's request in chunked prefill is in neither its running nor its waiting count; what
/// shows the scheduler working on it is its KV tokens in use and its tokens still to prefill,
/// which move with every chunk. A snapshot that then stands still is a wedged scheduler.
#[tokio::test]
async fn a_request_in_sglangs_chunked_prefill_is_not_a_wedge_while_its_kv_tokens_move() {
    let engine = WireEngine::start("sglang", Scripted::ok_stream()).await;
    let other = WireEngine::start("sglang", Scripted::ok_stream()).await;
    let idle =
        r#"{"loads":[{"dp_rank":0,"num_running_reqs":0,"num_waiting_reqs":0,"token_usage":0.0}]}"#;
    engine.set_load("/v1/loads", 200, idle);
    // Over its waiting ceiling, so the request goes to `engine`; a request given up on would
    // still be re-sent there (a retry needs a routable worker, not an un-vetoed one).
    other.set_load("/get_load", 200, fixture("sglang/get-load-dp-null.json"));
    let gateway = gateway_over(&[&engine, &other], fast_liveness).await;
    let [id, other_id] = <[String; 2]>::try_from(ids(&gateway).await).unwrap();
    until_worker(&gateway, &other_id, "the other overloaded", |w| {
        w["vetoes"]["overloaded"] == true
    })
    .await;
    let prefill = Arc::new(Notify::new());
    let held = send_held(
        &gateway,
        &engine,
        Scripted::json(200, "{}").held(&prefill),
        false,
    )
    .await;
    // Well past the unresponsive bound, many reports later, each a chunk on from the last.
    for i in 0..24 {
        let page = if i % 2 == 0 { "" } else { "-2" };
        let text = fixture(&format!("sglang/v1-loads-chunked-prefill{page}.json"));
        engine.set_load("/v1/loads", 200, text);
        bounded("a poll", engine.polls_past(engine.polls(), 2)).await;
        let view = worker_view(&gateway, &id).await;
        assert_eq!(view["vetoes"]["liveness"], Value::Null, "poll {i}: {view}");
    }
    assert_eq!(other.received(), 0, "not sent a second time");
    // The same snapshot again and again, the request still in hand: the scheduler stopped.
    bounded(
        "engine silent",
        until_worker(&gateway, &id, "engine silent", |w| {
            w["vetoes"]["liveness"] == "engine_silent"
        }),
    )
    .await;
    prefill.notify_one();
    assert_eq!(bounded("the held request", held).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_stream_whose_first_event_misses_the_deadline_is_cut_without_charging_the_worker() {
    let engine = WireEngine::start("vllm", Scripted::ok_stream()).await;
    let gateway = gateway_over(&[&engine], |c| {
        quick_breaker(c);
        c.admission.request_timeout = Duration::from_millis(300);
    })
    .await;
    let id = ids(&gateway).await[0].clone();
    let never = Arc::new(Notify::new());
    for _ in 0..4 {
        engine.then(Scripted::ok_stream().held(&never));
        let a = chat(&gateway, true).await;
        assert_eq!(a.status, 200, "the head, held until the deadline");
        let last = a.events().last().cloned().unwrap();
        assert!(last.contains("request_timeout"), "{last}");
    }
    assert_eq!(
        worker_view(&gateway, &id).await["circuit"]["state"],
        "closed",
        "the gateway's deadline is not the worker's failure"
    );
}

#[tokio::test]
async fn an_engine_preempting_is_over_its_kv_ceiling_whatever_its_usage_reads() {
    let page = |preemptions: u32| {
        format!(
            "vllm:num_requests_running{{engine=\"0\"}} 30\nvllm:kv_cache_usage_perc{{engine=\"0\"}} 0.6\nvllm:num_preemptions_total{{engine=\"0\"}} {preemptions}\n"
        )
    };
    let vllm = WireEngine::start("vllm", Scripted::ok_stream()).await;
    vllm.set_load("/metrics", 200, page(3));
    let sglang = WireEngine::start("sglang", Scripted::ok_stream()).await;
    sglang.set_load("/v1/loads", 200, fixture("sglang/v1-loads-retracting.json"));
    let gateway = gateway_over(&[&vllm, &sglang], |c| {
        // The KV ceiling above the retracting engine's usage (0.984): only preemption trips.
        c.control.load.ceilings.token_usage = Some(0.99);
        c.control.load.ceilings.waiting_requests = Some(100);
    })
    .await;
    let [vllm_id, sglang_id] = <[String; 2]>::try_from(ids(&gateway).await).unwrap();
    let preempting = |w: &Value| w["engine_load"]["overload"]["signal"] == "preempting";
    until_worker(&gateway, &sglang_id, "retracting", preempting).await;
    let view = worker_view(&gateway, &vllm_id).await;
    assert_eq!(
        view["vetoes"]["overloaded"], false,
        "a steady counter: {view}"
    );
    vllm.set_load("/metrics", 200, page(5));
    until_worker(&gateway, &vllm_id, "preempting", preempting).await;
    until_worker(&gateway, &vllm_id, "no new preemption", |w| {
        w["vetoes"]["overloaded"] == false
    })
    .await;
}

#[tokio::test]
async fn prefix_claims_the_engine_does_not_find_are_taken_at_what_it_found() {
    // vLLM's prefix-cache counters (vllm/v1/metrics/loggers.py: `vllm:prefix_cache_queries`,
    // `vllm:prefix_cache_hits`, prompt tokens looked up at admission and those found).
    let page = |queries: u64, hits: u64| {
        format!(
            "vllm:num_requests_running{{engine=\"0\"}} 0\nvllm:prefix_cache_queries_total{{engine=\"0\"}} {queries}\nvllm:prefix_cache_hits_total{{engine=\"0\"}} {hits}\n"
        )
    };
    let vllm = WireEngine::start("vllm", Scripted::ok_stream()).await;
    vllm.set_load("/metrics", 200, page(0, 0));
    let gateway = gateway_over(&[&vllm], |c| {
        c.route.policy = Policy::CacheAware(Default::default());
    })
    .await;
    let id = ids(&gateway).await[0].clone();
    let credit = |w: &Value| w["latency"]["prefix_claim_credit"].clone();
    let url = format!("{}/v1/chat/completions", gateway.url());
    let prompt = "the same long system prompt ".repeat(200);
    // The index claims the prompt cached on the worker from the second request on.
    for _ in 0..4 {
        let answer = post(&client(), &url, &chat_body("test-model", &prompt, 4, true)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(credit(&worker_view(&gateway, &id).await), Value::Null);
    // The engine looked the prompts up and found nothing: every claim was wrong.
    vllm.set_load("/metrics", 200, page(20_000, 0));
    until_worker(&gateway, &id, "claims found wanting", |w| {
        credit(w).as_f64() == Some(0.0)
    })
    .await;
    // Then it finds them all: the credit comes back.
    for _ in 0..4 {
        let answer = post(&client(), &url, &chat_body("test-model", &prompt, 4, true)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    vllm.set_load("/metrics", 200, page(1_000_000, 980_000));
    until_worker(&gateway, &id, "claims found", |w| {
        credit(w).as_f64().is_some_and(|c| c > 0.5)
    })
    .await;
}
