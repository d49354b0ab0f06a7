//! `grpc://` workers that fail or leave, black-box: a worker whose every generation fails is
//! retried around and its circuit opens, as an HTTP worker's does; a worker taken out of the
//! fleet is let go of (its connection closed), not kept pinged for the gateway's lifetime.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::model::{grpc_setup_with, ModelDir};
use common::{bounded, chat_body, ADMIN_KEY};
use sluice_core::breaker::BreakerConfig;
use sluice_core::policy::Policy;
use sluice_sim::testkit::{instant, send};
use sluice_sim::{Fault, Flavor};

#[tokio::test]
async fn a_failing_grpc_worker_is_retried_around_and_its_circuit_opens() {
    let model = ModelDir::new("breaker");
    let s = grpc_setup_with(2, instant(Flavor::Sglang), &model, |c| {
        c.route.policy = Policy::RoundRobin;
        c.fleet.breaker = Some(BreakerConfig {
            failure_threshold: 3,
            success_threshold: 1,
            // Open for the rest of the test.
            open_timeout: Duration::from_secs(3600),
            half_open_trials: 1,
            failure_rate: None,
        });
    })
    .await;
    let sick = s.sims.engine(0).unwrap();
    // Every Generate fails with INTERNAL, before the first token.
    sick.fault(Fault::ErrorRate { rate: 1.0 }).await.unwrap();
    let sick_id = s.worker_id(0).await;
    for i in 0..8 {
        let answer = s
            .chat(&chat_body("test-model", &format!("q{i}"), 4, false))
            .await;
        assert_eq!(answer.status, 200, "retried elsewhere: {}", answer.text());
    }
    let view = s
        .until_worker(&sick_id, "the circuit open", |w| {
            w["circuit"]["state"] == "open"
        })
        .await;
    assert_eq!(view["routable"], false);
    let failed = sick.state().rejected;
    assert!(failed >= 3, "three failures opened it: {failed}");
    let served = s.sims.engine(1).unwrap().state().finished;
    assert!(served >= 8, "every request answered there: {served}");
}

#[tokio::test]
async fn a_removed_workers_connection_is_let_go() {
    let model = ModelDir::new("let-go");
    let s = grpc_setup_with(1, instant(Flavor::Sglang), &model, |c| {
        c.access.keys.admin = Some(ADMIN_KEY.into());
        c.fleet.drain_settle = Duration::ZERO;
    })
    .await;
    let answer = s.chat(&chat_body("test-model", "hi", 4, false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let engine = s.sims.engine(0).unwrap();
    // Requests, probes, polls and the event stream share one connection.
    bounded(
        "one connection",
        engine.until(|st| st.open_connections == 1),
    )
    .await;

    let id = s.worker_id(0).await;
    let auth = format!("Bearer {ADMIN_KEY}");
    let removed = send(
        &s.client,
        "DELETE",
        &s.url(&format!("/workers/{id}")),
        None,
        &[("authorization", auth.as_str())],
    )
    .await;
    assert_eq!(removed.status, 202, "{}", removed.text());
    assert_eq!(removed.json()["status"], "removed");
    bounded(
        "the connection closed",
        engine.until(|st| st.open_connections == 0),
    )
    .await;
}
