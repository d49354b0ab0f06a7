//! Which worker each policy picks, seen from the engines' own request counts.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sluice_core::policy::{CacheAware, Policy};

async fn with_policy(engines: usize, engine: EngineConfig, policy: Policy) -> Setup {
    start(engines, engine, |c| c.route.policy = policy).await
}

#[tokio::test]
async fn round_robin_spreads_evenly() {
    let s = with_policy(3, instant(Flavor::Vllm), Policy::RoundRobin).await;
    for i in 0..30 {
        let a = s
            .chat(&chat_body("test-model", &format!("q{i}"), 2, false))
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(s.received(), vec![10, 10, 10]);
}

#[tokio::test]
async fn random_reaches_every_worker() {
    let s = with_policy(3, instant(Flavor::Vllm), Policy::Random).await;
    for i in 0..60 {
        assert_eq!(
            s.chat(&chat_body("test-model", &format!("q{i}"), 2, false))
                .await
                .status,
            200
        );
    }
    let got = s.received();
    assert_eq!(got.iter().sum::<u64>(), 60);
    assert!(got.iter().all(|&n| n >= 5), "{got:?}");
}

/// Opens `n` long streams and returns them once each has its first chunk (they hold the load).
async fn hold_streams(s: &Setup, n: usize) -> Vec<hyper::Response<hyper::body::Incoming>> {
    let mut held = Vec::new();
    for i in 0..n {
        held.push(open_stream(s, &format!("long {i}"), 4000).await);
    }
    held
}

fn busy_engines(s: &Setup) -> Vec<usize> {
    s.sims
        .engines()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.state().running > 0)
        .map(|(i, _)| i)
        .collect()
}

#[tokio::test]
async fn least_load_avoids_busy_workers() {
    let s = with_policy(3, timed(Flavor::Vllm, 1.0), Policy::LeastLoad).await;
    let held = hold_streams(&s, 2).await;
    let busy = busy_engines(&s);
    assert_eq!(busy.len(), 2, "the two streams went to different workers");
    let before = s.received();
    for i in 0..6 {
        assert_eq!(
            s.chat(&chat_body("test-model", &format!("s{i}"), 1, false))
                .await
                .status,
            200
        );
    }
    let after = s.received();
    for b in busy {
        assert_eq!(
            after[b], before[b],
            "a busy worker got a request: {after:?}"
        );
    }
    drop(held);
}

#[tokio::test]
async fn power_of_two_never_picks_the_one_busy_worker() {
    let s = with_policy(3, timed(Flavor::Vllm, 1.0), Policy::PowerOfTwo).await;
    let held = hold_streams(&s, 1).await;
    let busy = busy_engines(&s)[0];
    let before = s.received()[busy];
    for i in 0..12 {
        assert_eq!(
            s.chat(&chat_body("test-model", &format!("s{i}"), 1, false))
                .await
                .status,
            200
        );
    }
    assert_eq!(s.received()[busy], before);
    drop(held);
}

#[tokio::test]
async fn consistent_hash_sticks_to_the_session_header_or_the_user() {
    let s = with_policy(4, instant(Flavor::Vllm), Policy::ConsistentHash).await;
    let url = s.url("/v1/chat/completions");
    let mut homes = std::collections::HashSet::new();
    for session in 0..8 {
        let before = s.received();
        for _ in 0..5 {
            let a = send(
                &s.client,
                "POST",
                &url,
                Some(&chat_body("test-model", "hi", 1, false)),
                &[("x-session-id", &format!("session-{session}"))],
            )
            .await;
            assert_eq!(a.status, 200);
        }
        let after = s.received();
        let moved: Vec<usize> = (0..4).filter(|&i| after[i] != before[i]).collect();
        assert_eq!(
            moved.len(),
            1,
            "one session, one worker: {before:?} -> {after:?}"
        );
        assert_eq!(after[moved[0]] - before[moved[0]], 5);
        homes.insert(moved[0]);
    }
    assert!(homes.len() >= 2, "sessions spread over workers");

    let before = s.received();
    for _ in 0..4 {
        let body = r#"{"model":"test-model","user":"alice","messages":[{"role":"user","content":"x"}],"max_tokens":1}"#;
        assert_eq!(s.chat(body).await.status, 200);
    }
    let after = s.received();
    assert_eq!((0..4).filter(|&i| after[i] != before[i]).count(), 1);
}

#[tokio::test]
async fn cache_aware_keeps_a_conversation_on_one_worker() {
    let s = with_policy(
        3,
        instant(Flavor::Vllm),
        Policy::CacheAware(CacheAware::default()),
    )
    .await;
    let system = "You are a careful assistant. ".repeat(40);
    let mut homes = Vec::new();
    for conversation in 0..3 {
        let before = s.received();
        for turn in 0..4 {
            let body = serde_json::json!({
                "model": "test-model",
                "max_tokens": 1,
                "messages": [
                    {"role": "system", "content": format!("conversation {conversation}. {system}")},
                    {"role": "user", "content": format!("turn {turn}")},
                ],
            });
            assert_eq!(s.chat(&body.to_string()).await.status, 200);
        }
        let after = s.received();
        let moved: Vec<usize> = (0..3).filter(|&i| after[i] != before[i]).collect();
        assert_eq!(
            moved.len(),
            1,
            "a shared prefix stays on one worker: {before:?} -> {after:?}"
        );
        homes.push(moved[0]);
    }
    homes.sort();
    homes.dedup();
    assert!(homes.len() >= 2, "different prefixes spread: {homes:?}");
}

#[tokio::test]
async fn a_request_for_n_choices_weighs_n_in_its_workers_load() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_| {}).await;
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let body = r#"{"model":"test-model","messages":[{"role":"user","content":"hi"}],"n":4,"max_tokens":4000,"ignore_eos":true}"#;
    let held = tokio::spawn(async move { post(&client, &url, body).await });
    let engine = s.sims.engine(0).unwrap();
    bounded("four sequences running", engine.until(|st| st.running >= 4)).await;
    let worker = &s.workers().await[0];
    assert_eq!(worker["in_flight"], 4, "{worker}");
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    let series = format!(
        "sluice_worker_in_flight{{worker=\"{}\"}} 4",
        worker["id"].as_str().unwrap()
    );
    assert!(metrics.contains(&series), "{metrics}");
    held.abort();
}

#[tokio::test]
async fn the_first_routing_key_header_present_wins() {
    let s = start(4, instant(Flavor::Vllm), |c| {
        c.route.policy = Policy::ConsistentHash;
        c.route.routing_key_headers = vec![
            http::HeaderName::from_static("x-tenant"),
            http::HeaderName::from_static("x-session-id"),
        ];
    })
    .await;
    let url = s.url("/v1/chat/completions");
    let before = s.received();
    for session in 0..6 {
        let session = format!("session-{session}");
        let a = send(
            &s.client,
            "POST",
            &url,
            Some(&chat_body("test-model", "hi", 1, false)),
            &[("x-tenant", "acme"), ("x-session-id", session.as_str())],
        )
        .await;
        assert_eq!(a.status, 200);
    }
    let after = s.received();
    let moved = (0..4).filter(|&i| after[i] != before[i]).count();
    assert_eq!(
        moved, 1,
        "keyed by x-tenant, not the session: {before:?} -> {after:?}"
    );
}

#[tokio::test]
async fn a_model_alias_is_served_by_its_model_which_is_sent_the_real_name() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.admission.aliases = [(
            "gpt-4o".to_string(),
            sluice_core::ModelName::new("test-model"),
        )]
        .into_iter()
        .collect();
    })
    .await;
    // The engine answers 404 to any model but its own: a 200 means it was told `test-model`.
    let a = s.chat(&chat_body("gpt-4o", "hi", 1, false)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let models = get(&s.client, &s.url("/v1/models")).await.json();
    assert_eq!(model_ids(&models), ["test-model", "gpt-4o"]);
    let card = get(&s.client, &s.url("/v1/models/gpt-4o")).await.json();
    assert_eq!(card["root"], "test-model");
}
