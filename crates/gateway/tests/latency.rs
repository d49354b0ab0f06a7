//! Each worker's latency model learns from this gateway's requests to it, and `/workers` shows
//! what it learned.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sluice_core::admission::Tier;
use sluice_core::policy::{CacheAware, Policy};
use sluice_core::slo::{Slo, Slos};
use sluice_gateway::admit::QueueConfig;

#[tokio::test]
async fn a_workers_prefill_rate_is_learned_from_its_first_tokens() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    let before = &s.workers().await[0]["latency"];
    assert_eq!(
        before["prefill_rate"],
        Value::Null,
        "nothing learned yet: {before}"
    );
    let prompt = "word ".repeat(2000);
    for _ in 0..3 {
        let answer = s.chat(&chat_body("test-model", &prompt, 1, false)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let after = &s.workers().await[0]["latency"];
    let rate = after["prefill_rate"].as_f64().unwrap_or(0.0);
    assert!(rate > 0.0, "{after}");
}

#[tokio::test]
async fn a_workers_pace_is_learned_from_its_streams_and_each_prediction_judged() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    for i in 0..3 {
        let body = chat_body("test-model", &format!("count to {i}"), 12, true);
        let answer = s.chat(&body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let latency = &s.workers().await[0]["latency"];
    assert_eq!(
        latency["tpot_judged"], 2,
        "every stream after the first: {latency}"
    );
    let error = latency["tpot_error"].as_f64().unwrap();
    assert!(
        (0.0..1.0).contains(&error),
        "one engine, one pace: {latency}"
    );
    let id = s.worker_id(0).await;
    let series = format!("sluice_worker_prediction_error{{worker=\"{id}\",kind=\"tpot\"}}");
    let metric = s.metric(&series).await.unwrap();
    // The same figure, each printed shortest for its own format (JSON, the exposition's).
    assert!(
        (metric - error).abs() < 1e-12,
        "the view's figure: {metric} vs {error}"
    );
}

/// `--policy predicted` with the tiers' objectives `slos` (the route's, the queue's room).
fn predicted(c: &mut Config, slos: Slos) {
    c.route.policy = Policy::Predicted(CacheAware::default());
    c.route.slos = slos;
    c.telemetry.slos = slos;
    c.fleet.room_by_prediction = Some(slos);
}

/// Every tier's first token within `ttft_ms`, its tokens 100 ms apart.
fn within(ttft_ms: u64) -> Slos {
    Slos::new(
        [Slo {
            ttft: Some(Duration::from_millis(ttft_ms)),
            tpot: Some(Duration::from_millis(100)),
        }; 3],
    )
}

#[tokio::test]
async fn predicted_sends_requests_where_they_are_predicted_to_answer_soonest() {
    let s = start(2, timed(Flavor::Vllm, 1.0), |c| predicted(c, within(5_000))).await;
    s.fault(1, Fault::Slow { factor: 8.0 }).await;
    // Both learned first: until then the cache-aware rule places (distinct prompts, idle
    // workers: in turn).
    let mut i = 0;
    let learned = |w: &Value| w["latency"]["prefill_rate"].is_f64();
    while !s.workers().await.iter().all(learned) {
        assert!(i < 20, "both workers learned within 20 requests");
        let body = chat_body(
            "test-model",
            &format!("{i} {}", "word ".repeat(500)),
            4,
            true,
        );
        assert_eq!(s.chat(&body).await.status, 200);
        i += 1;
    }
    let before = s.received();
    for j in 0..8 {
        let body = chat_body(
            "test-model",
            &format!("{j} again {}", "word ".repeat(500)),
            4,
            true,
        );
        assert_eq!(s.chat(&body).await.status, 200);
    }
    let after = s.received();
    assert_eq!(
        after[1], before[1],
        "none to the slow worker: {before:?} -> {after:?}"
    );
    assert_eq!(after[0], before[0] + 8);
}

/// Engine 0 four times slower, and its latency learned from two short requests.
async fn slowed_and_learned(s: &Setup) {
    s.fault(0, Fault::Slow { factor: 4.0 }).await;
    for i in 0..2 {
        let short = s
            .chat(&chat_body("test-model", &format!("hi {i}"), 2, false))
            .await;
        assert_eq!(short.status, 200, "{}", short.text());
    }
}

#[tokio::test]
async fn a_request_no_worker_is_predicted_to_answer_in_time_is_refused_with_a_retry_after() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| predicted(c, within(300))).await;
    slowed_and_learned(&s).await;
    let received = s.received()[0];
    let id = s.worker_id(0).await;
    let selections =
        format!("sluice_worker_selections_total{{policy=\"predicted\",worker=\"{id}\"}}");
    assert_eq!(s.metric(&selections).await, Some(2.0), "the two short ones");
    let long = chat_body("test-model", &"word ".repeat(30_000), 2, false);
    let refused = s.chat(&long).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.headers["x-sluice-error-code"], "predicted_late");
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1, "{retry}");
    let error = refused.json();
    assert_eq!(error["error"]["code"], "predicted_late", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(!message.contains("127.0.0.1"), "no worker named: {message}");
    assert_eq!(s.received()[0], received, "the engine never saw it");
    assert_eq!(
        s.metric(&selections).await,
        Some(2.0),
        "a request refused is not counted as a pick"
    );
    let short = s.chat(&chat_body("test-model", "hi again", 2, false)).await;
    assert_eq!(short.status, 200, "a prompt that fits still goes");
}

/// Interactive and agent requests' first tokens within `ttft_ms`; batch without an objective.
fn interactive_within(ttft_ms: u64) -> Slos {
    let bound = Slo {
        ttft: Some(Duration::from_millis(ttft_ms)),
        tpot: None,
    };
    Slos::new([bound, bound, Slo::default()])
}

#[tokio::test]
async fn with_a_queue_a_request_predicted_late_waits_for_predicted_room_instead_of_a_refusal() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        predicted(c, interactive_within(300));
        c.admission.default_tier = Tier::Interactive;
        c.admission.queue = Some(QueueConfig {
            size: 8,
            timeouts: [Duration::from_secs(60); 3],
            shed: false,
            shed_retry_after: Duration::from_secs(1),
            codel: None,
        });
    })
    .await;
    slowed_and_learned(&s).await;
    // A long prompt of the batch tier (no objective: never refused) fills the prefill backlog.
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let long = chat_body("test-model", &"word ".repeat(6_000), 2, false);
    let before = s.received()[0];
    let batch = tokio::spawn(async move {
        send(
            &client,
            "POST",
            &url,
            Some(&long),
            &[("x-sluice-priority", "batch")],
        )
        .await
    });
    bounded("the long prompt reaches the engine", async {
        while s.received()[0] == before {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // An interactive request now is predicted behind it, past 300 ms: it waits in its queue...
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let short = chat_body("test-model", "and now?", 2, false);
    let waiter = tokio::spawn(async move { send(&client, "POST", &url, Some(&short), &[]).await });
    until_depth(&s, 0, 1).await;
    assert_eq!(s.received()[0], before + 1, "not sent while predicted late");
    // ...and goes once the backlog is predicted to have drained, rather than being refused.
    let answer = bounded("the waiter's answer", waiter).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(bounded("the long answer", batch).await.unwrap().status, 200);
}

/// The interactive tier's first token within `interactive_ms`, the agent tier's within a
/// minute; batch without an objective.
fn interactive_and_agent(interactive_ms: u64) -> Slos {
    let within = |ms| Slo {
        ttft: Some(Duration::from_millis(ms)),
        tpot: None,
    };
    Slos::new([within(interactive_ms), within(60_000), Slo::default()])
}

/// How long the oldest waiter of `tier` has waited, in seconds.
async fn oldest_wait(s: &Setup, tier: usize) -> f64 {
    let view = get_admin(&s.client, &s.url("/admission")).await.json();
    view["queue"]["tiers"][tier]["oldest_wait_secs"]
        .as_f64()
        .unwrap()
}

/// Sends `body` at `tier` on its own task.
fn spawn_at(s: &Setup, body: String, tier: &'static str) -> tokio::task::JoinHandle<Answer> {
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    tokio::spawn(async move {
        send(
            &client,
            "POST",
            &url,
            Some(&body),
            &[("x-sluice-priority", tier)],
        )
        .await
    })
}

#[tokio::test]
async fn a_waiter_out_of_time_goes_after_one_that_can_still_be_in_time() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        predicted(c, interactive_and_agent(300));
        c.admission.max_concurrent = Some(1);
        c.admission.queue = Some(QueueConfig {
            size: 8,
            timeouts: [Duration::from_secs(60); 3],
            shed: false,
            shed_retry_after: Duration::from_secs(1),
            codel: None,
        });
    })
    .await;
    slowed_and_learned(&s).await;
    // A batch request (no objective) holds the one place while the others queue.
    let long = |what: &str| chat_body("test-model", what, 100, false);
    let holder = spawn_at(&s, long("hold the place"), "batch");
    bounded("the holder reaches the engine", async {
        while s.received()[0] < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let interactive = spawn_at(
        &s,
        chat_body("test-model", "quick?", 2, false),
        "interactive",
    );
    until_depth(&s, 0, 1).await;
    let agent = spawn_at(
        &s,
        chat_body("test-model", "and the agent", 300, false),
        "agent",
    );
    until_depth(&s, 1, 1).await;
    // The interactive waiter spends its 300 ms: it can no longer be in time anywhere.
    bounded("the interactive waiter out of time", async {
        while oldest_wait(&s, 0).await < 0.35 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(depth(&s, 0).await, 1, "the holder still holds the place");
    assert_eq!(bounded("the holder", holder).await.unwrap().status, 200);
    // The place goes to the agent, which can still be in time; the interactive one waits.
    until_depth(&s, 1, 0).await;
    assert_eq!(
        depth(&s, 0).await,
        1,
        "the waiter out of time goes after the one in time"
    );
    assert_eq!(bounded("the agent", agent).await.unwrap().status, 200);
    let late = bounded("the late one", interactive).await.unwrap();
    assert_eq!(
        late.status,
        200,
        "sent once nothing in time waits: {}",
        late.text()
    );
}
