//! The interactive reserve against simulated engines whose reported load is pinned: a worker with
//! no room beyond the reserve is polled again when a request on it ends, room the reserve keeps
//! is not shed without the queue, an interactive request goes where it starts at once, and room
//! is counted in the size a worker's requests settle at.
#![allow(clippy::unwrap_used)]

mod common;

use common::pinned::*;
use common::*;
use sluice_core::admission::Tier;
use sluice_core::policy::Policy;

/// A worker whose last report left no room beyond the interactive reserve is polled again soon
/// after one of its requests ends: the place it freed is room less urgent requests may take
/// (on an engine of short answers, much of the batch ends between two reports).
#[tokio::test]
async fn a_worker_with_no_room_beyond_the_reserve_is_polled_again_when_a_request_on_it_ends() {
    let s = reported_once(one_place_left(), |c| c.fleet.interactive_reserve = 0.1).await;
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
        steer_at_once(c);
        c.route.shedding.enabled = true;
        // Requests may ask for any tier.
        c.admission.default_tier = Tier::Interactive;
        c.fleet.interactive_reserve = 0.1;
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
        c.route.policy = Policy::RoundRobin;
        c.admission.default_tier = Tier::Interactive;
        c.fleet.interactive_reserve = 0.1;
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
        c.fleet.interactive_reserve = 0.1;
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
