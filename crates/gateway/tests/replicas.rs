//! Replicas sharing a tenant's budget through a real Redis: a burst over two gateways admits no
//! more than the budget between them; with Redis killed no request is lost and each replica
//! admits its share alone; with Redis back, what was spent apart is charged and the replicas
//! converge on the shared budget again. Without fail-open, a lost Redis refuses with a clear
//! 503.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::redis::RedisServer;
use common::*;
use futures_util::future::join_all;
use sluice_core::admission::shared::chunk;
use sluice_gateway::shared::{RedisTls, SharedConfig, SharedState};

/// Short, so a dead replica's slots come back within the test.
const LEASE: Duration = Duration::from_secs(1);
use tokio::time::Instant;

/// A replica in front of `sims` whose tenant `acme` may send `rpm` requests a minute, shared
/// through `redis`.
async fn replica(sims: &SimFleet, redis: &RedisServer, rpm: u64, fail_open: bool) -> Gateway {
    let mut acme = tenant("acme", "acme-key");
    acme.requests_per_minute = Some(rpm);
    replica_of(sims, redis, acme, fail_open).await
}

async fn replica_of(
    sims: &SimFleet,
    redis: &RedisServer,
    acme: sluice_gateway::admit::TenantConfig,
    fail_open: bool,
) -> Gateway {
    let mut config = Config::local(&sims.urls());
    config.admission.tenants = vec![acme];
    config.shared = Some(SharedConfig {
        url: redis.url(),
        fail_open,
        // Generous: a loaded test machine must not read as Redis away.
        timeout: Duration::from_secs(1),
        lease: LEASE,
        tls: None,
    });
    let gateway = Gateway::start(config).await.unwrap();
    until_workers(&gateway, &client(), "the worker ready", all_ready).await;
    gateway
}

/// Awaits the replica's shared state until `done` holds.
async fn until_state(
    gateway: &Gateway,
    what: &str,
    done: impl Fn(&SharedState) -> bool,
) -> SharedState {
    let mut changes = gateway.shared_state().unwrap();
    bounded(what, async {
        loop {
            let state = *changes.borrow_and_update();
            if done(&state) {
                return state;
            }
            changes.changed().await.unwrap();
        }
    })
    .await
}

/// `n` requests of tenant acme at once, spread round the gateways; how many each admitted.
/// Every answer is a 200 or a 429: none is lost.
async fn burst(gateways: &[&Gateway], n: usize) -> Vec<usize> {
    let client = client();
    let asks = (0..n).map(|i| {
        let url = format!("{}/v1/chat/completions", gateways[i % gateways.len()].url());
        let client = client.clone();
        async move {
            let body = chat_body("test-model", &format!("q{i}"), 1, false);
            let auth = [("authorization", "Bearer acme-key")];
            let a = send(&client, "POST", &url, Some(&body), &auth).await;
            assert!(
                a.status == 200 || code(&a).as_deref() == Some("rate_limit_exceeded"),
                "{} {}",
                a.status,
                a.text()
            );
            (i % gateways.len(), a.status == 200)
        }
    });
    let mut admitted = vec![0; gateways.len()];
    for (at, ok) in join_all(asks).await {
        admitted[at] += usize::from(ok);
    }
    admitted
}

/// The value of a metric series on `gateway`'s `/metrics`.
async fn metric(gateway: &Gateway, series: &str) -> Option<f64> {
    let text = get(&client(), &format!("{}/metrics", gateway.url()))
        .await
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test]
async fn two_replicas_admit_no_more_than_one_budget_between_them() {
    let redis = RedisServer::start();
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let a = replica(&sims, &redis, 60, true).await;
    let b = replica(&sims, &redis, 60, true).await;
    for g in [&a, &b] {
        until_state(g, "both counted", |s| s.up && s.replicas == 2).await;
    }

    let started = Instant::now();
    let admitted = burst(&[&a, &b], 200).await;
    let total: usize = admitted.iter().sum();
    // 60 a minute: one more for each second the burst took.
    let refilled = started.elapsed().as_secs_f64().ceil() as usize;
    assert!(
        total <= 60 + refilled,
        "{admitted:?}: never more than the budget between them"
    );
    let held = 2 * chunk(60, 2) as usize;
    assert!(
        total + held >= 60,
        "{admitted:?}: at most a chunk per replica left unspent"
    );
    assert!(admitted.iter().all(|n| *n > 0), "{admitted:?}: both spent");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn with_redis_gone_replicas_admit_their_share_and_converge_when_it_returns() {
    let mut redis = RedisServer::start();
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let a = replica(&sims, &redis, 40, true).await;
    let b = replica(&sims, &redis, 40, true).await;
    for g in [&a, &b] {
        until_state(g, "both counted", |s| s.up && s.replicas == 2).await;
    }
    assert_eq!(metric(&a, "sluice_redis_up").await, Some(1.0));

    redis.kill();
    // No request is lost; alone, a replica admits its share: 40 over 2 replicas.
    let alone = burst(&[&a], 30).await[0];
    assert!((20..=21).contains(&alone), "{alone} admitted alone");
    let state = until_state(&a, "A on local limits", |s| !s.up).await;
    assert_eq!(state.fallbacks, 1);
    assert_eq!(metric(&a, "sluice_redis_fallback_total").await, Some(1.0));
    assert_eq!(metric(&a, "sluice_redis_up").await, Some(0.0));
    until_state(&b, "B on local limits", |s| !s.up).await;

    redis.restart();
    for g in [&a, &b] {
        until_state(g, "shared limits again", |s| s.up).await;
    }
    let back = Instant::now();
    // Redis came back empty: a full 40, less the 20 A spent apart, charged when it rejoined.
    let after = burst(&[&b], 30).await[0];
    let refilled = (back.elapsed().as_secs_f64() * 40.0 / 60.0).ceil() as usize;
    assert!(
        after <= 20 + refilled,
        "{after} admitted: what A spent apart was charged"
    );
    assert!(after >= 20 - chunk(40, 2) as usize, "{after} admitted");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn without_fail_open_a_lost_redis_refuses_with_a_clear_503() {
    let mut redis = RedisServer::start();
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let a = replica(&sims, &redis, 600, false).await;
    until_state(&a, "shared limits", |s| s.up).await;
    redis.kill();
    let client = client();
    let url = format!("{}/v1/chat/completions", a.url());
    let body = chat_body("test-model", "hi", 1, false);
    let auth = [("authorization", "Bearer acme-key")];
    let refused = send(&client, "POST", &url, Some(&body), &auth).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(code(&refused).as_deref(), Some("shared_state_unavailable"));
    assert!(refused.headers.contains_key("retry-after"));
    assert!(
        !refused.text().contains("127.0.0.1"),
        "no address leaks: {}",
        refused.text()
    );
    a.shutdown().await;
}

/// A streaming request of tenant acme, once its first chunk has arrived (it then holds its slot).
async fn open_stream_on(gateway: &Gateway) -> hyper::Response<hyper::body::Incoming> {
    let auth = [("authorization", "Bearer acme-key")];
    open_stream_at(&client(), gateway, "a long answer", 4000, &auth).await
}

#[tokio::test]
async fn a_dead_replicas_slots_return_when_its_lease_runs_out() {
    let redis = RedisServer::start();
    let sims = SimFleet::start(FleetConfig::local(1, timed(Flavor::Vllm, 1.0)))
        .await
        .unwrap();
    let mut acme = tenant("acme", "acme-key");
    acme.max_concurrent = Some(2);
    let a = replica_of(&sims, &redis, acme.clone(), true).await;
    let b = replica_of(&sims, &redis, acme, true).await;
    for g in [&a, &b] {
        until_state(g, "both counted", |s| s.up && s.replicas == 2).await;
    }
    let streams = [open_stream_on(&a).await, open_stream_on(&b).await];

    let body = chat_body("test-model", "hi", 1, false);
    let auth = [("authorization", "Bearer acme-key")];
    let url = |g: &Gateway| format!("{}/v1/chat/completions", g.url());
    for g in [&a, &b] {
        let third = send(&client(), "POST", &url(g), Some(&body), &auth).await;
        assert_eq!(third.status, 429, "two in flight between them");
        assert_eq!(code(&third).as_deref(), Some("tenant_concurrency_exceeded"));
    }

    // A dies without a word: its task stops, its lease is no longer renewed.
    drop(a);
    until_state(&b, "A's lease run out", |s| s.replicas == 1).await;
    let answer = send(&client(), "POST", &url(&b), Some(&body), &auth).await;
    assert_eq!(answer.status, 200, "A's slot came back: {}", answer.text());
    drop(streams);
    b.shutdown().await;
}

#[tokio::test]
async fn each_replica_counts_the_others_requests_on_a_worker() {
    let redis = RedisServer::start();
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let a = replica(&sims, &redis, 6000, true).await;
    let b = replica(&sims, &redis, 6000, true).await;
    for g in [&a, &b] {
        until_state(g, "both counted", |s| s.up && s.replicas == 2).await;
    }
    // The engine stops answering: A's requests wait for a first byte that does not come.
    sims.engine(0).unwrap().fault(Fault::Hang).await.unwrap();
    let url = format!("{}/v1/chat/completions", a.url());
    let waiting: Vec<_> = (0..3)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let body = chat_body("test-model", &format!("q{i}"), 1, false);
                send(
                    &client(),
                    "POST",
                    &url,
                    Some(&body),
                    &[("authorization", "Bearer acme-key")],
                )
                .await
            })
        })
        .collect();
    let view = until_view(&b, &client(), "A's requests seen from B", "/workers", |v| {
        v["workers"][0]["vetoes"]["pending_elsewhere"] == 3
    })
    .await;
    let vetoes = &view["workers"][0]["vetoes"];
    assert_eq!(vetoes["pending_requests"], 0, "none of B's own: {vetoes}");
    assert_eq!(vetoes["in_flight_elsewhere"], 3, "in flight on A: {vetoes}");
    for request in waiting {
        request.abort();
    }
}

#[tokio::test]
async fn a_redis_over_tls_is_trusted_through_the_gateways_ca_and_only_then() {
    let certs = common::certs::Certs::make("redis-tls");
    let redis = RedisServer::start_tls(&certs);
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let start = |roots: Option<Vec<u8>>| {
        let mut config = Config::local(&sims.urls());
        let mut acme = tenant("acme", "acme-key");
        acme.requests_per_minute = Some(600);
        config.admission.tenants = vec![acme];
        config.shared = Some(SharedConfig {
            url: format!("rediss://127.0.0.1:{}", redis.port),
            fail_open: true,
            timeout: Duration::from_secs(1),
            lease: LEASE,
            tls: Some(RedisTls {
                roots,
                identity: None,
            }),
        });
        Gateway::start(config)
    };
    let trusted = start(Some(std::fs::read(&certs.ca).unwrap()))
        .await
        .unwrap();
    let state = until_state(&trusted, "shared limits over TLS", |s| s.up).await;
    assert_eq!(state.fallbacks, 0);
    until_workers(&trusted, &client(), "the worker ready", all_ready).await;
    assert_eq!(burst(&[&trusted], 5).await, [5]);
    trusted.shutdown().await;

    // Without the test's CA, the server's certificate is not trusted: local limits.
    let untrusted = start(None).await.unwrap();
    let state = until_state(&untrusted, "local limits", |s| s.fallbacks > 0).await;
    assert!(!state.up);
    untrusted.shutdown().await;
}
