//! `--worker-overload-shed` beside the default gateway queue, black-box: a request every worker
//! is too full for is answered at once (503 `worker_overload_shed`, Retry-After the load
//! interval) unless room is measured freeing on those workers fast enough to serve it within its
//! tier's wait; then it waits, and goes when room opens.
//!
//! Reports are pinned (`Fault::Report`) to stand over the ceiling, or come from a simulated
//! engine whose own queue drains.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::pinned::{fast_load, pin_waiting, until_all_overloaded};
use common::*;
use sluice_core::admission::Tier;
use sluice_gateway::Settings;
use tokio::task::JoinHandle;

/// The flags as a user gives them: `--worker-overload-shed --worker-overload-waiting-requests 4
/// --overload-status-code STATUS`, the queue as the defaults configure it but with `wait_secs`
/// for every tier; reports polled every 50 ms.
fn shedding(c: &mut Config, wait_secs: u64, status: u16) {
    let mut settings = Settings::defaults();
    settings.overload.worker_overload_shed = true;
    settings.overload.overload_status_code = status;
    settings.overload.worker_overload_waiting_requests = 4;
    let derived = settings.validate().unwrap();
    c.route.shedding = derived.route.shedding;
    c.front.answers = derived.front.answers;
    c.control.load.ceilings = derived.control.load.ceilings;
    c.admission.queue = derived.admission.queue.map(|mut q| {
        q.timeouts = [Duration::from_secs(wait_secs); 3];
        q
    });
    c.admission.default_tier = Tier::Interactive;
    let retry_after = c.route.shedding.retry_after;
    fast_load(c);
    c.route.shedding.retry_after = retry_after;
}

/// Requests that waited in the queue, by `/metrics` (the wait histogram's count, every tier).
async fn waited(s: &Setup) -> u64 {
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    metrics
        .lines()
        .filter(|l| l.starts_with("sluice_admission_wait_seconds_count"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[tokio::test]
async fn reports_that_stand_over_the_ceiling_shed_at_arrival_with_nothing_queued() {
    let s = start(2, instant(Flavor::Vllm), |c| shedding(c, 20, 503)).await;
    // Requests served while there is room: the queue has a drain rate to promise a wait with.
    for i in 0..8 {
        let a = s
            .chat(&chat_body("test-model", &format!("r{i}"), 1, false))
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    for i in 0..2 {
        s.fault(i, pin_waiting(5)).await;
    }
    until_all_overloaded(&s).await;
    let before = s.received();

    for tier in ["interactive", "agent", "batch"] {
        let a = send(
            &s.client,
            "POST",
            &s.url("/v1/chat/completions"),
            Some(&chat_body("test-model", "hi", 1, false)),
            &[("x-sluice-priority", tier)],
        )
        .await;
        assert_eq!(a.status, 503, "{tier}: {}", a.text());
        assert_eq!(code(&a).as_deref(), Some("worker_overload_shed"), "{tier}");
        assert_eq!(a.headers["retry-after"], "1", "{tier}: the load interval");
    }
    assert_eq!(waited(&s).await, 0, "nothing was queued");
    assert_eq!(depth(&s, 0).await + depth(&s, 1).await, 0);
    assert_eq!(s.received(), before, "nothing sent to the full engines");
}

/// One engine that runs two requests at a time, with ten sent to it directly (another
/// client's): eight wait, over the ceiling of 4, and its queue drains as they finish. Returns
/// once the reports have shown it over the ceiling and then two requests leaving its queue.
async fn draining() -> (Setup, Vec<JoinHandle<Answer>>) {
    let mut engine = timed(Flavor::Vllm, 1.0);
    engine.max_num_seqs = 2;
    let s = start(1, engine, |c| shedding(c, 20, 503)).await;
    let direct = s.sims.urls()[0].clone();
    let others = (0..10)
        .map(|i| {
            let client = s.client.clone();
            let url = format!("{direct}/v1/chat/completions");
            let body = chat_body("test-model", &format!("other {i}"), 100, false);
            tokio::spawn(async move { send(&client, "POST", &url, Some(&body), &[]).await })
        })
        .collect();
    let id = s.worker_id(0).await;
    let waiting = |w: &serde_json::Value| w["engine_load"]["waiting"].as_u64();
    let full = s
        .until_worker(&id, "over the ceiling", |w| {
            waiting(w).is_some_and(|n| n >= 6)
        })
        .await;
    let first = waiting(&full).unwrap();
    s.until_worker(&id, "two starts in the reports", |w| {
        waiting(w).is_some_and(|n| n + 2 <= first)
    })
    .await;
    (s, others)
}

/// An agent request through the gateway, on its own task.
fn ours(s: &Setup) -> JoinHandle<Answer> {
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let body = chat_body("test-model", "ours", 1, false);
    tokio::spawn(async move {
        send(
            &client,
            "POST",
            &url,
            Some(&body),
            &[("x-sluice-priority", "agent")],
        )
        .await
    })
}

#[tokio::test]
async fn a_fleet_whose_queue_drains_keeps_the_request_waiting_then_serves_it() {
    let (s, others) = draining().await;
    let ours = bounded("our request", ours(&s)).await.unwrap();
    assert_eq!(ours.status, 200, "{}", ours.text());
    assert_eq!(waited(&s).await, 1, "it waited in the queue for the room");
    for other in others {
        assert_eq!(bounded("another client", other).await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn a_waiter_is_shed_once_the_reports_stand_still_not_at_its_timeout() {
    let (s, others) = draining().await;
    // From now on the reports stand at 8 waiting: no request is seen to start again.
    s.fault(0, pin_waiting(8)).await;
    let ours = ours(&s);
    until_depth(&s, 1, 1).await;
    let ours = bounded("our request", ours).await.unwrap();
    assert_eq!(ours.status, 503, "{}", ours.text());
    assert_eq!(
        code(&ours).as_deref(),
        Some("worker_overload_shed"),
        "shed, not left to its 20-s timeout: {}",
        ours.text()
    );
    assert_eq!(ours.headers["retry-after"], "1");
    assert_eq!(depth(&s, 1).await, 0);
    for other in others {
        assert_eq!(bounded("another client", other).await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn a_request_shed_at_arrival_carries_the_configured_overload_status() {
    let s = start(1, instant(Flavor::Vllm), |c| shedding(c, 20, 529)).await;
    s.fault(0, pin_waiting(5)).await;
    until_all_overloaded(&s).await;
    let a = s.chat(&chat_body("test-model", "hi", 1, false)).await;
    assert_eq!(a.status, 529, "{}", a.text());
    assert_eq!(code(&a).as_deref(), Some("worker_overload_shed"));
    assert_eq!(waited(&s).await, 0, "nothing was queued");
}
