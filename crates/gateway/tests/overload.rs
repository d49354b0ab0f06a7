//! Overload protection against simulated engines whose reported load is pinned: a worker over a
//! ceiling is skipped by every policy and returns after a report under it, a failed poll clears
//! the veto, a fleet all over is steered to its least loaded worker (or shed), and busy ranks
//! veto only when every rank is busy; with an interactive reserve, an interactive request goes
//! where it starts at once.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sluice_core::admission::Tier;
use sluice_core::health::Thresholds;
use sluice_core::policy::Policy;
use sluice_gateway::control::HealthConfig;

/// Polls every 50 ms.
fn fast_load(c: &mut Config) {
    c.load.interval = Duration::from_millis(50);
    c.load.min_interval = Duration::from_millis(10);
    c.load.poll_timeout = Duration::from_millis(500);
    c.shedding.retry_after = Duration::from_secs(10);
    c.admin_api_key = Some(ADMIN_KEY.into());
}

fn pin_waiting(waiting: u64) -> Fault {
    Fault::Report {
        rank: None,
        waiting: Some(waiting),
        running: None,
        kv_usage: None,
    }
}

/// Waits until `/workers` shows worker `id` vetoed as overloaded (its last report reached a
/// ceiling), or not.
async fn until_overloaded(s: &Setup, id: &str, what: &str, yes: bool) {
    s.until_worker(id, what, |w| w["vetoes"]["overloaded"] == yes)
        .await;
}

/// Waits until every worker's last report reached a ceiling.
async fn until_all_overloaded(s: &Setup) {
    s.until_workers("all vetoed", |workers| {
        workers.iter().all(|w| w["vetoes"]["overloaded"] == true)
    })
    .await;
}

/// Pins the first engine's queue at the default ceiling (8) and waits for its veto.
async fn overload_first_worker(s: &Setup) -> String {
    let id = s.worker_id(0).await;
    s.fault(0, pin_waiting(8)).await;
    until_overloaded(s, &id, "vetoed", true).await;
    id
}

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
    let cache_aware = Config::local(&[]).policy;
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
            c.policy = policy;
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
        c.policy = Policy::RoundRobin;
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
        c.policy = Policy::RoundRobin;
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
async fn a_burst_onto_a_full_fleet_spreads_by_the_queues_it_builds_not_onto_one_worker() {
    // Reports 2 s apart, so the burst below falls between two of them.
    let s = start(3, timed(Flavor::Vllm, 1.0), |c| {
        fast_load(c);
        c.load.interval = Duration::from_secs(2);
        c.policy = Policy::RoundRobin;
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
        c.policy = Policy::RoundRobin;
        c.shedding.enabled = true;
        c.health = HealthConfig {
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
        c.shedding.enabled = true;
        c.shedding.status = 529;
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
        c.policy = Policy::RoundRobin;
        c.load.ceilings = Default::default(); // the busy check alone
        c.load.busy.active_decode_blocks_threshold = Some(0.8);
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
        c.load.interval = Duration::from_secs(3600);
        c.load.ceilings.waiting_requests = Some(2);
        c.shedding.enabled = true;
        c.liveness.as_mut().expect("on by default").wedge = Duration::from_secs(60);
    })
    .await;
    let id = s.worker_id(0).await;
    s.until_worker(&id, "the first report", |w| !w["engine_load"].is_null())
        .await;
    let engine = s.sims.engine(0).unwrap();
    engine.fault(Fault::Freeze).await.unwrap();
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

/// One engine under `fault` from the start, behind a gateway tuned by `tune` whose polls are an
/// hour apart: the only regular report is the first, as soon as it is ready; any other is early.
async fn reported_once(fault: Fault, tune: impl FnOnce(&mut Config)) -> Setup {
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    sims.engine(0).unwrap().fault(fault).await.unwrap();
    let mut config = Config::local(&sims.urls());
    fast_load(&mut config);
    config.load.interval = Duration::from_secs(3600);
    tune(&mut config);
    let gateway = Gateway::start(config).await.unwrap();
    let client = client();
    until_workers(&gateway, &client, "workers ready", all_ready).await;
    Setup {
        sims,
        gateway,
        client,
    }
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

/// A worker whose last report left no room beyond the interactive reserve is polled again soon
/// after one of its requests ends: the place it freed is room less urgent requests may take
/// (on an engine of short answers, much of the batch ends between two reports).
#[tokio::test]
async fn a_worker_with_no_room_beyond_the_reserve_is_polled_again_when_a_request_on_it_ends() {
    let s = reported_once(one_place_left(), |c| c.interactive_reserve = 0.1).await;
    let id = s.worker_id(0).await;
    s.until_worker(&id, "the first report", |w| w["vetoes"]["start_room"] == 1)
        .await;
    s.fault(0, Fault::Clear).await;

    let a = s
        .chat(&chat_body("test-model", "a request that ends", 2, false))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    // The clean report: nothing running, room for the ceiling over the size the first
    // report's requests held (0.8 / 0.0375: 21).
    s.until_worker(&id, "a report after the request ended", |w| {
        w["vetoes"]["start_room"] == 21
    })
    .await;
}

#[tokio::test]
async fn without_the_queue_room_kept_for_the_interactive_tier_is_not_shed() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        fast_load(c);
        c.shedding.enabled = true;
        // Requests may ask for any tier.
        c.admission.default_tier = Tier::Interactive;
        c.interactive_reserve = 0.1;
    })
    .await;
    // The first engine full; the second with room for one, within what the reserve keeps.
    overload_first_worker(&s).await;
    s.fault(1, one_place_left()).await;
    let roomy = s.worker_id(1).await;
    s.until_worker(&roomy, "room for one", |w| w["vetoes"]["start_room"] == 1)
        .await;
    let as_tier = |tier| [("x-sluice-priority", tier)];
    for tier in ["interactive", "batch"] {
        let body = chat_body("test-model", tier, 2, false);
        let a = send(
            &s.client,
            "POST",
            &s.url("/v1/chat/completions"),
            Some(&body),
            &as_tier(tier),
        )
        .await;
        assert_eq!(a.status, 200, "{tier}: {}", a.text());
    }
    assert_eq!(
        s.received(),
        [0, 2],
        "the batch request on the worker with room, not shed"
    );
}

/// With a reserve set, an interactive request goes where it starts at once: not to a worker
/// whose engine has a queue (under its ceiling, so not vetoed), though the policy, round robin,
/// would send every other one there.
#[tokio::test]
async fn an_interactive_request_goes_where_it_starts_at_once() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        fast_load(c);
        c.policy = Policy::RoundRobin;
        c.admission.default_tier = Tier::Interactive;
        c.interactive_reserve = 0.1;
    })
    .await;
    s.fault(0, pin_waiting(2)).await;
    s.fault(1, one_place_left()).await;
    let (queueing, roomy) = (s.worker_id(0).await, s.worker_id(1).await);
    s.until_worker(&queueing, "a queue, under the ceiling", |w| {
        w["vetoes"]["start_room"] == 0 && w["vetoes"]["overloaded"] == false
    })
    .await;
    s.until_worker(&roomy, "room for one", |w| w["vetoes"]["start_room"] == 1)
        .await;
    for i in 0..4 {
        let a = s
            .chat(&chat_body("test-model", &format!("turn {i}"), 2, false))
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(s.received(), [0, 4], "every one where it started at once");
}

/// The reserve counts room in the size a worker's requests settle at, learnt from its reports:
/// a burst of fresh requests (small now, as large later) or an idle engine is not read as room
/// for as many requests as their size now would say.
#[tokio::test]
async fn room_is_counted_in_the_size_the_workers_requests_settle_at() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        fast_load(c);
        c.interactive_reserve = 0.1;
    })
    .await;
    let id = s.worker_id(0).await;
    // 20 running at 0.75 of the KV: 0.0375 each, room for one under the 0.8 ceiling.
    s.fault(0, one_place_left()).await;
    let w = s
        .until_worker(&id, "room for one", |w| w["vetoes"]["start_room"] == 1)
        .await;
    let learnt = w["engine_load"]["kv_per_request"].as_f64().unwrap();
    assert!((learnt - 0.0375).abs() < 1e-3, "{w}");
    // Ten fresh requests at 0.01 each: by their size, room for 70 under the ceiling; grown to
    // the size this worker's requests settle at, they hold 0.375, and the ceiling leaves room
    // for 11 more of that size.
    s.fault(0, pin_load(10, 0.1)).await;
    let room = |w: &serde_json::Value| w["vetoes"]["start_room"].as_u64();
    let grown = s
        .until_worker(&id, "a report of fresh requests", |w| {
            room(w).is_some_and(|r| r > 1)
        })
        .await;
    let grown = room(&grown).unwrap();
    assert!((9..=13).contains(&grown), "room for {grown}, not 70");
    // Idle: the room is known (21 of the grown size under the ceiling), not left unknown
    // until requests run again.
    s.fault(0, pin_load(0, 0.0)).await;
    let idle = s
        .until_worker(&id, "an idle report", |w| room(w).is_some_and(|r| r > 20))
        .await;
    assert!(room(&idle).unwrap() <= 25, "{idle}");
}

/// Reports of `running` requests holding `kv_usage` of the cache, and no queue.
fn pin_load(running: u64, kv_usage: f64) -> Fault {
    Fault::Report {
        rank: None,
        waiting: Some(0),
        running: Some(running),
        kv_usage: Some(kv_usage),
    }
}

fn pin_kv(kv_usage: f64) -> Fault {
    Fault::Report {
        rank: None,
        waiting: None,
        running: None,
        kv_usage: Some(kv_usage),
    }
}
