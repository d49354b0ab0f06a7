//! Overload protection against simulated engines whose reported load is pinned: a worker over a
//! ceiling is skipped by every policy and returns after a report under it, a failed poll clears
//! the veto, a fleet all over is steered to its least loaded worker (or shed), and busy ranks
//! veto only when every rank is busy, and a full worker is polled again when a request on it
//! ends (the interactive reserve's tests are in reserve.rs).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::pinned::*;
use common::*;
use sluice_core::admission::Tier;
use sluice_core::health::Thresholds;
use sluice_core::policy::Policy;
use sluice_gateway::control::HealthConfig;

async fn chat_with_key(s: &Setup, key: &str) -> Answer {
    let body = chat_body("test-model", &format!("about {key}"), 1, false);
    send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some(&body),
        &[("x-session-id", key)],
    )
    .await
}

#[tokio::test]
async fn every_policy_skips_a_worker_over_its_ceiling() {
    let cache_aware = Config::local(&[]).route.policy;
    let policies = [
        Policy::RoundRobin,
        Policy::Random,
        Policy::LeastLoad,
        Policy::PowerOfTwo,
        cache_aware,
        Policy::ConsistentHash,
    ];
    for policy in policies {
        let name = policy.name();
        let s = start(2, instant(Flavor::Vllm), |c| {
            fast_load(c);
            c.route.policy = policy;
        })
        .await;
        overload_first_worker(&s).await;
        let before = s.received();
        for i in 0..12 {
            let a = chat_with_key(&s, &format!("session-{i}")).await;
            assert_eq!(a.status, 200, "{name}: {}", a.text());
        }
        let after = s.received();
        assert_eq!(
            after[0], before[0],
            "{name}: nothing for the overloaded worker"
        );
        assert_eq!(after[1], before[1] + 12, "{name}");
    }
}

#[tokio::test]
async fn the_veto_lifts_on_the_first_report_under_and_on_a_failed_poll() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        fast_load(c);
        // Agent requests: an interactive one goes only where it starts at once, while another
        // worker would start it.
        c.admission.default_tier = Tier::Agent;
        c.route.policy = Policy::RoundRobin;
    })
    .await;
    let id = s.worker_id(0).await;
    let engine = s.sims.engine(0).unwrap();
    engine.fault(pin_waiting(20)).await.unwrap();
    until_overloaded(&s, &id, "vetoed", true).await;
    let view = get_admin(&s.client, &s.url(&format!("/workers/{id}")))
        .await
        .json();
    assert_eq!(view["vetoes"]["overloaded"], true);
    assert_eq!(view["engine_load"]["waiting"], 20);
    assert_eq!(view["engine_load"]["overload"]["signal"], "waiting");
    let loads = get_admin(&s.client, &s.url("/loads")).await.json();
    assert_eq!(loads["aggregate"]["vetoed"], 1);
    assert_eq!(loads["aggregate"]["workers"], 2);

    engine.fault(pin_waiting(7)).await.unwrap();
    until_overloaded(&s, &id, "re-admitted", false).await;
    let before = s.received()[0];
    for i in 0..4 {
        assert_eq!(
            s.chat(&chat_body("test-model", &format!("q{i}"), 1, false))
                .await
                .status,
            200
        );
    }
    assert!(s.received()[0] > before, "back in rotation");

    engine.fault(pin_waiting(20)).await.unwrap();
    until_overloaded(&s, &id, "vetoed again", true).await;
    engine
        .fault(Fault::LoadEndpoint {
            mode: sluice_sim::LoadEndpointMode::Error,
        })
        .await
        .unwrap();
    until_overloaded(&s, &id, "fails open", false).await;
    let view = get_admin(&s.client, &s.url(&format!("/workers/{id}")))
        .await
        .json();
    assert!(view["engine_load"].is_null(), "no report, no opinion");
}

#[tokio::test]
async fn a_fleet_all_over_is_steered_to_its_least_loaded_worker() {
    let s = start(3, instant(Flavor::Vllm), |c| {
        fast_load(c);
        steer_at_once(c);
        c.route.policy = Policy::RoundRobin;
    })
    .await;
    for (i, waiting) in [(0, 12), (1, 9), (2, 10)] {
        s.fault(i, pin_waiting(waiting)).await;
    }
    until_all_overloaded(&s).await;
    let before = s.received();
    for i in 0..5 {
        let a = s
            .chat(&chat_body("test-model", &format!("q{i}"), 1, false))
            .await;
        assert_eq!(a.status, 200, "steered, not refused");
    }
    let after = s.received();
    assert_eq!(
        [
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2]
        ],
        [0, 5, 0],
        "the one with the shortest queue"
    );
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains("sluice_worker_overload_fallback_total 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_workers_overloaded{model=\"test-model\"} 3"),
        "{metrics}"
    );
}

#[tokio::test]
async fn by_default_a_fleet_all_over_holds_requests_in_the_gateway_until_one_has_room() {
    let s = start(2, instant(Flavor::Vllm), fast_load).await;
    for i in 0..2 {
        s.fault(i, pin_waiting(12)).await;
    }
    until_all_overloaded(&s).await;
    let before = s.received();
    let waiting: Vec<_> = (0..3)
        .map(|i| {
            let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
            let body = chat_body("test-model", &format!("held {i}"), 1, false);
            tokio::spawn(async move { post(&client, &url, &body).await })
        })
        .collect();
    // The default tenant's tier is the interactive tier (0).
    until_depth(&s, 0, 3).await;
    assert_eq!(s.received(), before, "none steered onto a full engine");
    s.fault(1, Fault::Clear).await;
    for answer in waiting {
        assert_eq!(bounded("served", answer).await.unwrap().status, 200);
    }
    let after = s.received();
    assert_eq!(
        [after[0] - before[0], after[1] - before[1]],
        [0, 3],
        "all three on the worker that had room"
    );
}

#[tokio::test]
async fn a_burst_onto_a_full_fleet_spreads_by_the_queues_it_builds_not_onto_one_worker() {
    // Reports 2 s apart, so the burst below falls between two of them.
    let s = start(3, timed(Flavor::Vllm, 1.0), |c| {
        fast_load(c);
        steer_at_once(c);
        c.control.load.interval = Duration::from_secs(2);
        c.route.policy = Policy::RoundRobin;
    })
    .await;
    for (i, waiting) in [(0, 20), (1, 21), (2, 22)] {
        s.fault(i, pin_waiting(waiting)).await;
    }
    until_all_overloaded(&s).await;
    let before = s.received();
    // Nine long answers at once: each waits on its worker, so each joins its projected queue.
    let burst: Vec<_> = (0..9)
        .map(|i| {
            let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
            let body = chat_body("test-model", &format!("burst {i}"), 4000, false);
            tokio::spawn(async move { post(&client, &url, &body).await })
        })
        .collect();
    let s = std::sync::Arc::new(s);
    bounded("the burst reached the engines", async {
        loop {
            let now = s.received();
            if (0..3).map(|i| now[i] - before[i]).sum::<u64>() == 9 {
                break now;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let after = s.received();
    let sent: Vec<u64> = (0..3).map(|i| after[i] - before[i]).collect();
    // Join the shortest projected queue: 20, 21, 22 reported, plus each worker's own share.
    assert_eq!(sent, [4, 3, 2], "spread by the queues the burst builds");
    for request in burst {
        request.abort();
    }
}

#[tokio::test]
async fn with_shedding_a_full_fleet_refuses_at_once() {
    let s = start(3, instant(Flavor::Vllm), |c| {
        fast_load(c);
        steer_at_once(c);
        c.route.policy = Policy::RoundRobin;
        c.route.shedding.enabled = true;
        c.control.health = HealthConfig {
            interval: Duration::from_millis(30),
            timeout: Duration::from_millis(200),
            thresholds: Thresholds {
                failure: 1,
                success: 1,
            },
            ..HealthConfig::default()
        };
    })
    .await;
    for i in 0..3 {
        s.fault(i, pin_waiting(30)).await;
    }
    until_all_overloaded(&s).await;
    let before = s.received();
    let a = s.chat(&chat_body("test-model", "hi", 1, false)).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.headers["retry-after"], "10");
    assert_eq!(code(&a).as_deref(), Some("worker_overload_shed"));
    assert_eq!(
        a.json(),
        serde_json::json!({"error": {
            "message": "All workers for model 'test-model' are overloaded",
            "type": "server_error",
            "param": null,
            "code": "worker_overload_shed"
        }})
    );
    assert_eq!(s.received(), before, "not sent anywhere, not retried");
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains("sluice_worker_overload_shed_total{stage=\"select\"} 1"),
        "{metrics}"
    );

    // Mixed causes: one worker out for its health, the rest full — plain unavailability.
    let sick = s.worker_id(2).await;
    s.sims.engine(2).unwrap().crash().await;
    s.until_worker(&sick, "one unhealthy", |w| w["routable"] == false)
        .await;
    let a = s.chat(&chat_body("test-model", "hi", 1, false)).await;
    assert_eq!(a.status, 503);
    assert_eq!(
        code(&a).as_deref(),
        Some("no_available_workers"),
        "{}",
        a.text()
    );
}

#[tokio::test]
async fn the_shed_status_can_be_529_for_dynamo_style_clients() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        fast_load(c);
        steer_at_once(c);
        c.route.shedding.enabled = true;
        c.front.answers.overload = axum::http::StatusCode::from_u16(529).unwrap();
    })
    .await;
    overload_first_worker(&s).await;
    let a = s.chat(&chat_body("test-model", "hi", 1, false)).await;
    assert_eq!(a.status, 529);
    assert_eq!(code(&a).as_deref(), Some("worker_overload_shed"));
}

fn pin_rank_kv(rank: u32, kv_usage: f64) -> Fault {
    Fault::Report {
        rank: Some(rank),
        waiting: None,
        running: None,
        kv_usage: Some(kv_usage),
    }
}

#[tokio::test]
async fn a_two_rank_worker_is_busy_only_when_both_ranks_are() {
    let mut engine = instant(Flavor::Vllm);
    engine.dp_size = 2;
    let s = start(2, engine, |c| {
        fast_load(c);
        c.route.policy = Policy::RoundRobin;
        c.control.load.ceilings = Default::default(); // the busy check alone
        c.control.load.busy.active_decode_blocks_threshold = Some(0.8);
    })
    .await;
    let id = s.worker_id(0).await;
    let engine0 = s.sims.engine(0).unwrap();
    engine0.fault(pin_rank_kv(0, 0.95)).await.unwrap();
    let reported = s
        .until_worker(&id, "rank 0 reported", |w| {
            w["engine_load"]["ranks"]
                .as_array()
                .is_some_and(|ranks| ranks.iter().any(|r| r["kv_usage"] == 0.95))
        })
        .await;
    assert_eq!(reported["vetoes"]["busy"], false, "rank 1 can still admit");

    engine0.fault(pin_rank_kv(1, 0.9)).await.unwrap();
    let busy = |yes: bool| move |w: &Value| w["vetoes"]["busy"] == yes;
    s.until_worker(&id, "both ranks busy", busy(true)).await;
    let before = s.received()[0];
    for i in 0..4 {
        assert_eq!(
            s.chat(&chat_body("test-model", &format!("q{i}"), 1, false))
                .await
                .status,
            200
        );
    }
    assert_eq!(s.received()[0], before, "skipped while busy");

    // Raised at runtime: the next report judges the worker by the new value.
    let auth = format!("Bearer {ADMIN_KEY}");
    let url = s.url("/busy_threshold");
    let raised = r#"{"active_decode_blocks_threshold":0.97}"#;
    let a = send(
        &s.client,
        "POST",
        &url,
        Some(raised),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["active_decode_blocks_threshold"], 0.97);
    assert_eq!(
        get_admin(&s.client, &url).await.json()["active_decode_blocks_threshold"],
        0.97
    );
    s.until_worker(&id, "not busy under the new threshold", busy(false))
        .await;
    let refused = send(&s.client, "POST", &url, Some(raised), &[]).await;
    assert_eq!(
        refused.status, 401,
        "changing thresholds needs the admin key"
    );
}

/// Requests piling up on an engine that had room at its last report ask for an early report,
/// and from then on its queue is judged request by request: with the next poll an hour away, the
/// queue is still held at its ceiling, and freed as the requests in it start.
#[tokio::test]
async fn a_queue_building_between_polls_is_judged_before_the_next_poll() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        fast_load(c);
        steer_at_once(c);
        c.control.load.interval = Duration::from_secs(3600);
        c.control.load.ceilings.waiting_requests = Some(2);
        c.route.shedding.enabled = true;
        c.control.liveness.as_mut().expect("on by default").wedge = Duration::from_secs(60);
    })
    .await;
    let id = s.worker_id(0).await;
    s.until_worker(&id, "the first report", |w| !w["engine_load"].is_null())
        .await;
    let engine = s.sims.engine(0).unwrap();
    engine.fault(Fault::Pause).await.unwrap();
    let send = || {
        let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
        let body = chat_body("test-model", "held", 4, true);
        tokio::spawn(async move { post(&client, &url, &body).await })
    };
    let mut held = vec![send()];
    bounded("one waiting", engine.until(|st| st.waiting == 1)).await;
    held.push(send()); // a ceiling's worth since the report: an early poll
                       // Saturated: the report saw a queue (KV cannot fill on this engine).
    s.until_worker(&id, "an early report", |w| {
        w["engine_load"]["waiting"].as_u64() > Some(0)
    })
    .await;
    bounded("two waiting", engine.until(|st| st.waiting == 2)).await;
    // When the last report was taken is not on any HTTP surface (only its age, which moves):
    // read from the fleet.
    let fleet = s.gateway.fleet().clone();
    let last_report = || {
        fleet
            .snapshot()
            .worker(&id)
            .unwrap()
            .vetoes
            .load()
            .unwrap()
            .at
    };
    let report_at = last_report();
    // The early report saw one or both of the two; either way at most one more gets in.
    let mut shed = None;
    for _ in 0..2 {
        let a = s.chat(&chat_body("test-model", "one more", 4, false)).await;
        if a.status == 503 {
            shed = Some(a);
            break;
        }
    }
    let shed = shed.expect("shed at the queue's ceiling, an hour before the next poll");
    assert_eq!(code(&shed).as_deref(), Some("worker_overload_shed"));
    assert!(s.received()[0] <= 3, "{:?}", s.received());

    engine.fault(Fault::Clear).await.unwrap();
    for request in held {
        assert_eq!(bounded("held requests", request).await.unwrap().status, 200);
    }
    let a = s.chat(&chat_body("test-model", "after", 4, false)).await;
    assert_eq!(a.status, 200, "the queue started: room again");
    assert_eq!(last_report(), report_at, "without another report");
}

/// A worker whose last report found it full is polled again soon after one of its requests ends,
/// not at the next interval: with the next poll an hour away, the veto lifts once the request
/// that went to it (the fleet's least loaded, all being full) is done.
#[tokio::test]
async fn a_full_worker_is_polled_again_when_a_request_on_it_ends() {
    let s = reported_once(pin_kv(0.99), |_| {}).await;
    let id = s.worker_id(0).await;
    until_overloaded(&s, &id, "vetoed by its first report", true).await;
    s.fault(0, Fault::Clear).await;

    let a = s
        .chat(&chat_body("test-model", "on a full fleet", 2, false))
        .await;
    assert_eq!(a.status, 200, "steered to the least loaded: {:?}", a.body);
    until_overloaded(&s, &id, "the veto lifted by an early report", false).await;
}
