//! Two picker replicas sharing a tenant's budget through a real Redis, as `sluice serve`
//! replicas do: requests spread over both are admitted within one budget between them, and what
//! one refuses is a 429 with sluice's code. Both stay ready: neither waits to be a leader.
#![allow(clippy::unwrap_used)]

#[path = "../../gateway/tests/common/certs.rs"]
mod certs;
mod common;
#[allow(dead_code)]
#[path = "../../gateway/tests/common/redis.rs"]
mod redis;

use std::time::Duration;

use common::*;
use redis::RedisServer;
use sluice_gateway::admit::TenantConfig;
use sluice_gateway::shared::SharedConfig;

/// Requests a minute for tenant acme, between the replicas.
const BUDGET: u64 = 4;

async fn replica(sims: &SimFleet, redis: &RedisServer) -> Picker {
    let mut config = Config::local(&sims.urls());
    config.admission.tenants = vec![TenantConfig {
        id: sluice_core::TenantId::new("acme"),
        api_keys: vec!["acme-key".into()],
        tier: sluice_core::admission::Tier::Agent,
        weight: 1.0,
        tokens_per_minute: None,
        requests_per_minute: Some(BUDGET),
        max_concurrent: None,
    }];
    config.shared = Some(SharedConfig {
        url: redis.url(),
        fail_open: true,
        // Generous: a loaded test machine must not read as Redis away.
        timeout: Duration::from_secs(1),
        lease: Duration::from_secs(1),
        tls: None,
    });
    let picker = Picker::start(config, &epp_settings()).await.unwrap();
    let gateway = picker.gateway();
    let mut changes = gateway.changes();
    bounded("the worker routable", async {
        while !gateway
            .fleet()
            .snapshot()
            .workers
            .iter()
            .any(|w| w.is_routable())
        {
            changes.changed().await.unwrap();
        }
    })
    .await;
    picker
}

#[tokio::test]
async fn two_pickers_admit_no_more_than_one_budget_between_them() {
    let redis = RedisServer::start();
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let pickers = [replica(&sims, &redis).await, replica(&sims, &redis).await];
    for picker in &pickers {
        let mut state = picker.gateway().shared_state().unwrap();
        bounded(
            "both replicas counted",
            state.wait_for(|s| s.up && s.replicas == 2),
        )
        .await
        .unwrap();
        assert!(picker.gateway().probes().is_ready(), "every replica ready");
    }
    let mut planes = [
        DataPlane::connect(pickers[0].grpc_addr()).await,
        DataPlane::connect(pickers[1].grpc_addr()).await,
    ];
    let mut admitted = [0u64; 2];
    for i in 0..4 * BUDGET as usize {
        let answer = planes[i % 2]
            .chat(
                &chat_body(&format!("q{i}"), 1, false),
                &[("authorization", "Bearer acme-key")],
            )
            .await;
        match answer.status {
            200 => admitted[i % 2] += 1,
            429 => assert_eq!(
                answer.code(),
                Some("rate_limit_exceeded"),
                "{}",
                answer.text()
            ),
            other => panic!("{other}: {}", answer.text()),
        }
    }
    let total: u64 = admitted.iter().sum();
    // Alone, each would admit the whole budget (2 x 4); shared, one budget and at most one
    // request refilled while the test ran.
    assert!(
        (1..=BUDGET + 1).contains(&total),
        "{admitted:?}: one budget between them"
    );
    for picker in pickers {
        picker.shutdown().await;
    }
}
