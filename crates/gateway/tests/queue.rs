//! The gateway queue, black-box: a request that cannot go now waits in the gateway and goes the
//! moment room opens, most urgent tier first; a full queue evicts the least urgent, or the
//! newest waiter of a tenant over its share for one under its own; a waiter
//! times out (by default once its tier's first-token objective can no longer be met), passes its
//! deadline, or leaves with its client without reaching an engine.
//!
//! Room is made and taken with `--max-concurrent-requests 1`: a stream left open holds the one
//! place, and dropping it frees it — an event the tests cause, never a timer they wait out.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::admission::Tier;
use sluice_gateway::admit::QueueConfig;
use sluice_gateway::Settings;
use tokio::task::JoinHandle;

/// A queue of `size` without shedding, each tier waiting at most its `timeouts` in seconds.
fn queue(size: usize, timeouts: [u64; 3]) -> Option<QueueConfig> {
    Some(QueueConfig {
        size,
        timeouts: timeouts.map(Duration::from_secs),
        shed: false,
        shed_retry_after: Duration::from_secs(10),
        // CoDel's own tests are in tests/adaptive.rs; these hold queues on purpose.
        codel: None,
    })
}

fn one_at_a_time(c: &mut Config, size: usize, timeouts: [u64; 3]) {
    // Requests may ask for any tier: the default tenant's is the most urgent.
    c.admission.default_tier = Tier::Interactive;
    c.admission.max_concurrent = Some(1);
    c.admission.queue = queue(size, timeouts);
}

/// A stream holding the gateway's one place, its first chunk read.
async fn hold(s: &Setup) -> hyper::Response<hyper::body::Incoming> {
    open_stream(s, "a long answer", 4000).await
}

/// A chat request sent on its own task, with `headers`.
fn spawn_chat(
    s: &Setup,
    tag: &str,
    headers: &[(&'static str, &'static str)],
) -> JoinHandle<Answer> {
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let body = chat_body("test-model", tag, 2, false);
    let headers = headers.to_vec();
    tokio::spawn(async move { send(&client, "POST", &url, Some(&body), &headers).await })
}

#[tokio::test]
async fn a_waiter_goes_the_moment_room_opens_most_urgent_first() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        one_at_a_time(c, 10, [30, 30, 30])
    })
    .await;
    let engine = s.sims.engine(0).unwrap();
    let holder = hold(&s).await;

    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let record = |task: JoinHandle<Answer>, tag: &'static str| {
        let order = order.clone();
        tokio::spawn(async move {
            let a = task.await.unwrap();
            order.lock().push(tag);
            a
        })
    };
    let batch = record(
        spawn_chat(&s, "b", &[("x-sluice-priority", "batch")]),
        "batch",
    );
    until_depth(&s, 2, 1).await;
    let chat = record(
        spawn_chat(&s, "c", &[("x-sluice-priority", "interactive")]),
        "interactive",
    );
    until_depth(&s, 0, 1).await;
    assert_eq!(
        engine.state().requests_received,
        1,
        "only the holder reached the engine"
    );

    drop(holder);
    let (chat, batch) = (
        bounded("chat", chat).await.unwrap(),
        bounded("batch", batch).await.unwrap(),
    );
    assert_eq!(
        (chat.status, batch.status),
        (200, 200),
        "{} {}",
        chat.text(),
        batch.text()
    );
    assert_eq!(*order.lock(), ["interactive", "batch"], "strict tiers");
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains(r#"sluice_admission_wait_seconds_count{tier="batch"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_full_queue_evicts_the_least_urgent_and_refuses_the_rest() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        one_at_a_time(c, 1, [30, 30, 30])
    })
    .await;
    let holder = hold(&s).await;
    let batch = spawn_chat(&s, "b", &[("x-sluice-priority", "2")]);
    until_depth(&s, 2, 1).await;
    let chat = spawn_chat(&s, "c", &[("x-sluice-priority", "0")]);
    let evicted = bounded("the eviction", batch).await.unwrap();
    assert_eq!(evicted.status, 503);
    assert_eq!(code(&evicted).as_deref(), Some("queue_evicted"));
    assert!(evicted.headers.contains_key("retry-after"));
    until_depth(&s, 0, 1).await;

    let refused = spawn_chat(&s, "d", &[("x-sluice-priority", "batch")]);
    let refused = bounded("the refusal", refused).await.unwrap();
    assert_eq!(refused.status, 503);
    assert_eq!(code(&refused).as_deref(), Some("queue_full"));

    drop(holder);
    assert_eq!(bounded("chat", chat).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_waiter_times_out_passes_its_deadline_or_leaves_with_its_client_unseen_by_engines() {
    // Batch waits 1 s at most; the others long enough never to time out here.
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        one_at_a_time(c, 10, [60, 60, 1])
    })
    .await;
    let engine = s.sims.engine(0).unwrap();
    let holder = hold(&s).await;

    let timed_out = spawn_chat(&s, "t", &[("x-sluice-priority", "batch")]);
    let timed_out = bounded("the timeout", timed_out).await.unwrap();
    assert_eq!(timed_out.status, 503);
    assert_eq!(code(&timed_out).as_deref(), Some("queue_timeout"));

    let late = spawn_chat(&s, "d", &[("x-request-deadline-ms", "1000")]);
    let late = bounded("the deadline", late).await.unwrap();
    assert_eq!(late.status, 504);
    assert_eq!(code(&late).as_deref(), Some("deadline_exceeded"));
    // A request the queue refused is its tenant's rejected request, never also an admitted one.
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    for (tier, admitted, rejected) in [("interactive", 1, 1), ("batch", 0, 1)] {
        for (outcome, n) in [("admitted", admitted), ("rejected", rejected)] {
            let series = format!(
                r#"sluice_tenant_requests_total{{tenant="default",tier="{tier}",outcome="{outcome}"}} {n}"#
            );
            assert!(metrics.contains(&series), "{series} in:\n{metrics}");
        }
    }

    let leaving = spawn_chat(&s, "l", &[("x-sluice-priority", "agent")]);
    until_depth(&s, 1, 1).await;
    leaving.abort();
    until_depth(&s, 1, 0).await;

    drop(holder);
    bounded("the abort", engine.until(|st| st.aborted == 1)).await;
    let after = s.chat(&chat_body("test-model", "after", 2, false)).await;
    assert_eq!(after.status, 200);
    assert_eq!(
        engine.state().requests_received,
        2,
        "none of the waiters that gave up reached the engine"
    );
}

/// The queue as the defaults configure it, but for a first-token objective of 1 s for the
/// interactive tier and none for the others: interactive waits 0.5 s, the others 60 s.
fn objectives_set_the_waits(c: &mut Config) {
    let mut settings = Settings::defaults();
    settings.status.slo_ttft_ms_by_tier = vec![1000, 0, 0];
    let derived = settings.validate().unwrap();
    c.telemetry.slos = derived.telemetry.slos;
    c.admission.queue = derived.admission.queue;
    c.admission.default_tier = Tier::Interactive;
    c.admission.max_concurrent = Some(1);
}

#[tokio::test]
async fn by_default_a_waiter_leaves_when_its_first_token_objective_can_no_longer_be_met() {
    let s = start(1, timed(Flavor::Vllm, 1.0), objectives_set_the_waits).await;
    let engine = s.sims.engine(0).unwrap();
    let holder = hold(&s).await;

    let agent = spawn_chat(&s, "a", &[("x-sluice-priority", "agent")]);
    until_depth(&s, 1, 1).await;
    let sent = tokio::time::Instant::now();
    let chat = spawn_chat(&s, "c", &[("x-sluice-priority", "interactive")]);
    let chat = bounded("the interactive timeout", chat).await.unwrap();
    assert_eq!(chat.status, 503, "{}", chat.text());
    assert_eq!(code(&chat).as_deref(), Some("queue_timeout"));
    assert!(chat.headers.contains_key("retry-after"));
    assert!(
        sent.elapsed() >= Duration::from_millis(500),
        "it waited its 0.5 s: {:?}",
        sent.elapsed()
    );
    assert_eq!(
        depth(&s, 1).await,
        1,
        "the agent tier, without an objective, waits on"
    );

    drop(holder);
    let agent = bounded("the agent request", agent).await.unwrap();
    assert_eq!(agent.status, 200, "{}", agent.text());
    assert_eq!(
        engine.state().requests_received,
        2,
        "the holder and the agent request; the interactive one never reached the engine"
    );
}

#[tokio::test]
async fn with_shedding_a_batch_request_that_would_wait_is_refused_at_once() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        one_at_a_time(c, 10, [30, 30, 30]);
        if let Some(q) = &mut c.admission.queue {
            q.shed = true;
        }
    })
    .await;
    let holder = hold(&s).await;
    let batch = spawn_chat(&s, "b", &[("x-sluice-priority", "batch")]);
    let batch = bounded("the refusal", batch).await.unwrap();
    assert_eq!(batch.status, 503);
    assert_eq!(code(&batch).as_deref(), Some("worker_overload_shed"));
    // An interactive request still waits for its turn.
    let chat = spawn_chat(&s, "c", &[("x-sluice-priority", "interactive")]);
    until_depth(&s, 0, 1).await;
    drop(holder);
    assert_eq!(bounded("chat", chat).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_request_for_a_fully_vetoed_pool_waits_and_goes_when_a_veto_lifts() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        c.control.load.interval = Duration::from_millis(50);
        c.control.load.min_interval = Duration::from_millis(10);
        c.admission.queue = queue(10, [30, 30, 30]);
    })
    .await;
    let full = Fault::Report {
        rank: None,
        waiting: Some(100),
        running: None,
        kv_usage: None,
    };
    for i in 0..2 {
        s.sims.engine(i).unwrap().fault(full.clone()).await.unwrap();
    }
    s.until_workers("every worker vetoed", |w| {
        w.iter().all(|w| w["vetoes"]["overloaded"] == true)
    })
    .await;
    let received = |s: &Setup| s.received().iter().sum::<u64>();
    let before = received(&s);

    let waiting = spawn_chat(&s, "w", &[]);
    // The default tenant's tier: interactive.
    until_depth(&s, 0, 1).await;
    assert_eq!(received(&s), before, "not steered onto a full engine");

    // The second engine's queue drains: its next report lifts its veto, and the waiter goes.
    s.sims.engine(1).unwrap().fault(Fault::Clear).await.unwrap();
    let answer = bounded("the waiter", waiting).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(s.received()[1], 1, "it went to the worker that freed");
}

#[tokio::test]
async fn a_noisy_tenant_waits_behind_a_quiet_ones_request_not_the_other_way() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        one_at_a_time(c, 50, [30, 30, 30]);
        c.admission.tenants = vec![tenant("noisy", "kn"), tenant("quiet", "kq")];
        c.access.keys.client = vec!["holder".into()];
    })
    .await;
    let holder = open_stream_as(
        &s,
        "a long answer",
        4000,
        &[("authorization", "Bearer holder")],
    )
    .await;
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let task = spawn_chat(&s, "n", &[("authorization", "Bearer kn")]);
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            assert_eq!(task.await.unwrap().status, 200);
            order.lock().push(format!("noisy-{i}"));
        }));
        until_depth(&s, 1, i + 1).await;
    }
    let quiet = spawn_chat(&s, "q", &[("authorization", "Bearer kq")]);
    let quiet_done = {
        let order = order.clone();
        tokio::spawn(async move {
            assert_eq!(quiet.await.unwrap().status, 200);
            order.lock().push("quiet".into());
        })
    };
    until_depth(&s, 1, 9).await;
    drop(holder);
    bounded("the quiet tenant", quiet_done).await.unwrap();
    for t in tasks {
        bounded("the noisy tenant", t).await.unwrap();
    }
    let order = order.lock().clone();
    let quiet_at = order.iter().position(|o| o == "quiet").unwrap();
    assert!(
        quiet_at <= 1,
        "the quiet tenant's one request goes first or second, not after the eight: {order:?}"
    );
}

#[tokio::test]
async fn a_full_queue_makes_room_for_a_tenant_under_its_share() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        one_at_a_time(c, 4, [30, 30, 30]);
        c.admission.tenants = vec![tenant("noisy", "kn"), tenant("quiet", "kq")];
        c.access.keys.client = vec!["holder".into()];
    })
    .await;
    let holder = open_stream_as(
        &s,
        "a long answer",
        4000,
        &[("authorization", "Bearer holder")],
    )
    .await;
    let noisy_key = [("authorization", "Bearer kn")];
    let quiet_key = [("authorization", "Bearer kq")];
    let mut noisy = Vec::new();
    for i in 0..4 {
        noisy.push(spawn_chat(&s, "n", &noisy_key));
        until_depth(&s, 1, i + 1).await;
    }
    // Two quiet arrivals each take the place of the noisy tenant's newest waiter.
    let mut quiet = Vec::new();
    for newest in [3, 2] {
        quiet.push(spawn_chat(&s, "q", &quiet_key));
        let evicted = bounded("the eviction", noisy.remove(newest)).await.unwrap();
        assert_eq!(evicted.status, 503, "{}", evicted.text());
        assert_eq!(code(&evicted).as_deref(), Some("queue_evicted"));
        until_depth(&s, 1, 4).await;
    }
    // Two each: both tenants hold their share, and a full queue refuses either.
    for key in [&quiet_key, &noisy_key] {
        let refused = bounded("the refusal", spawn_chat(&s, "r", key))
            .await
            .unwrap();
        assert_eq!(code(&refused).as_deref(), Some("queue_full"));
    }
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    for (tenant, n) in [("noisy", 2), ("quiet", 0)] {
        let series =
            format!(r#"sluice_queue_evictions_total{{tenant="{tenant}",tier="agent"}} {n}"#);
        assert!(metrics.contains(&series), "{series} in:\n{metrics}");
    }

    drop(holder);
    for waiter in noisy.into_iter().chain(quiet) {
        assert_eq!(bounded("a waiter", waiter).await.unwrap().status, 200);
    }
}

/// One engine with room for one more request, behind a gateway queue that sheds, with an
/// interactive reserve of 0.1.
async fn one_place_left_behind_a_reserve() -> Setup {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.control.load.interval = Duration::from_millis(50);
        c.control.load.min_interval = Duration::from_millis(10);
        c.admission.default_tier = Tier::Interactive;
        c.admission.queue = queue(10, [30, 30, 30]);
        if let Some(q) = &mut c.admission.queue {
            // Shedding refuses a batch request the fleet has no room for, not one the reserve
            // holds back.
            q.shed = true;
        }
        c.fleet.interactive_reserve = 0.1;
    })
    .await;
    s.sims
        .engine(0)
        .unwrap()
        .fault(one_place_left())
        .await
        .unwrap();
    s.until_workers("the report", |w| w[0]["vetoes"]["start_room"] == 1)
        .await;
    s
}

/// A chat request of `tier`, answered.
async fn chat_as(s: &Setup, tier: &str) -> Answer {
    let body = chat_body("test-model", tier, 2, false);
    send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some(&body),
        &[("x-sluice-priority", tier)],
    )
    .await
}

#[tokio::test]
async fn a_less_urgent_request_leaves_the_interactive_reserve_alone() {
    let s = one_place_left_behind_a_reserve().await;
    let engine = s.sims.engine(0).unwrap();
    let batch = chat_as(&s, "batch").await;
    assert_eq!(
        batch.status, 200,
        "no interactive request yet: nothing kept back"
    );

    assert_eq!(chat_as(&s, "interactive").await.status, 200);
    let batch = spawn_chat(&s, "b", &[("x-sluice-priority", "batch")]);
    until_depth(&s, 2, 1).await;
    let chat = chat_as(&s, "interactive").await;
    assert_eq!(
        chat.status, 200,
        "the interactive tier takes the room kept for it"
    );
    assert!(
        s.workers().await[0]["vetoes"]["interactive_answered_secs_ago"].is_f64(),
        "/workers says why the reserve is kept"
    );
    assert_eq!(depth(&s, 2).await, 1, "the batch request still waits");

    engine.fault(Fault::Clear).await.unwrap();
    let batch = bounded("the batch request", batch).await.unwrap();
    assert_eq!(batch.status, 200, "a report with room lets it go");
    assert_eq!(engine.state().requests_received, 4);

    // The engine's queue at its ceiling: the fleet is full, and a batch arrival is shed.
    let full = Fault::Report {
        rank: None,
        waiting: Some(8),
        running: Some(20),
        kv_usage: Some(0.85),
    };
    engine.fault(full).await.unwrap();
    s.until_workers("the full report", |w| w[0]["vetoes"]["overloaded"] == true)
        .await;
    let shed = chat_as(&s, "batch").await;
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert_eq!(code(&shed).as_deref(), Some("worker_overload_shed"));
    assert_eq!(engine.state().requests_received, 4);
}

#[tokio::test]
async fn a_model_without_interactive_traffic_keeps_nothing_back() {
    let s = one_place_left_behind_a_reserve().await;
    for tier in ["batch", "agent"] {
        let a = chat_as(&s, tier).await;
        assert_eq!(a.status, 200, "{tier}: {}", a.text());
    }
    assert_eq!(s.sims.engine(0).unwrap().state().requests_received, 2);
    assert!(s.workers().await[0]["vetoes"]["interactive_answered_secs_ago"].is_null());
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    for tier in ["agent", "batch"] {
        let went = format!(r#"sluice_admission_wait_seconds_count{{tier="{tier}"}} 0"#);
        assert!(
            metrics.contains(&went),
            "the {tier} request took the room the reserve would keep, without waiting:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_backlog_is_released_only_into_the_room_a_report_showed() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.control.load.interval = Duration::from_millis(50);
        c.control.load.min_interval = Duration::from_millis(10);
        c.control.load.ceilings.waiting_requests = Some(2);
        c.admission.queue = queue(20, [30, 30, 30]);
    })
    .await;
    let engine = s.sims.engine(0).unwrap();
    // A frozen engine starts nothing: what it is sent waits there, as its reports say.
    engine.fault(Fault::Pause).await.unwrap();
    let running = |running| Fault::Report {
        rank: None,
        waiting: None,
        running: Some(running),
        kv_usage: None,
    };
    // Four running while three others (sent past the gateway) wait: its window is four, full.
    engine.fault(running(4)).await.unwrap();
    let url = format!("{}/v1/chat/completions", engine.url());
    let others: Vec<_> = (0..3)
        .map(|_| {
            let (client, url) = (s.client.clone(), url.clone());
            let body = chat_body("test-model", "x", 2, false);
            tokio::spawn(async move { send(&client, "POST", &url, Some(&body), &[]).await })
        })
        .collect();
    s.until_workers("the window learned and the worker full", |w| {
        w[0]["vetoes"]["overloaded"] == true && w[0]["engine_load"]["running_window"] == 4
    })
    .await;
    let waiters: Vec<_> = (0..10).map(|_| spawn_chat(&s, "w", &[])).collect();
    until_depth(&s, 0, 10).await;
    assert_eq!(s.received(), [3], "none steered onto a full engine");

    // Three running and, once the others leave, no queue: room for one, and the waiting
    // ceiling's two behind it. A hopeful reading of that report would release all ten at once.
    engine.fault(running(3)).await.unwrap();
    for other in others {
        other.abort();
    }
    bounded("the others gone", engine.until(|e| e.waiting == 0)).await;
    s.until_workers("the three it was given waiting there", |w| {
        w[0]["vetoes"]["pending_requests"] == 3 && w[0]["engine_load"]["waiting"] == 3
    })
    .await;
    assert_eq!(s.received(), [3 + 3]);
    assert_eq!(depth(&s, 0).await, 7, "the rest wait in the gateway");

    // Thawed, the engine serves what it holds, and the rest follow as room opens.
    engine.fault(Fault::Clear).await.unwrap();
    for waiter in waiters {
        assert_eq!(bounded("a waiter", waiter).await.unwrap().status, 200);
    }
    assert_eq!(s.received(), [3 + 10]);
}

#[tokio::test]
async fn a_traced_waiter_says_how_long_it_waited_in_the_queue() {
    let mut receiver = common::otlp::Receiver::grpc().await;
    let trace = sluice_gateway::trace::TraceConfig::new(
        receiver.endpoint(),
        sluice_gateway::trace::Protocol::Grpc,
        1.0,
    );
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        one_at_a_time(c, 10, [30, 30, 30]);
        c.telemetry.trace = Some(trace);
    })
    .await;
    let holder = hold(&s).await;
    let waiter = spawn_chat(&s, "w", &[]);
    until_depth(&s, 0, 1).await;
    drop(holder);
    let answer = bounded("the waiter", waiter).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    // The holder's three spans (its client left) and the waiter's three.
    let spans = bounded("both requests' spans", receiver.take(6)).await;
    let waited: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "admission")
        .filter(|s| {
            common::otlp::attribute(s, "sluice.admission.decision").as_deref()
                == Some("admitted after waiting")
        })
        .collect();
    assert_eq!(waited.len(), 1, "{spans:?}");
    let wait: f64 = common::otlp::attribute(waited[0], "sluice.queue.wait_ms")
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait > 0.0);
    let answered = spans
        .iter()
        .filter(|s| {
            common::otlp::attribute(s, "sluice.attempt.outcome").as_deref() == Some("answered")
        })
        .count();
    assert_eq!(answered, 2, "both attempts were answered");
    let left = spans
        .iter()
        .filter(|s| common::otlp::attribute(s, "sluice.cancelled").as_deref() == Some("true"))
        .count();
    assert_eq!(left, 1, "the holder's client left mid-answer");
}
