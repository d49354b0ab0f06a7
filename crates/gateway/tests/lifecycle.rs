//! The gateway as a service: its models list, probes, metrics, HTTP/2 to workers, and a
//! shutdown that waits for exactly the requests in flight.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use http_body_util::BodyExt;
use sluice_gateway::Stopped;

#[tokio::test]
async fn models_are_the_union_of_routable_workers() {
    let a = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let b = SimFleet::start(FleetConfig::local(
        1,
        EngineConfig::new(
            Flavor::Sglang,
            "second-model",
            sluice_sim::Profile::named("instant").unwrap(),
        ),
    ))
    .await
    .unwrap();
    let gateway = Gateway::start(Config::local(&[a.urls()[0].clone(), b.urls()[0].clone()]))
        .await
        .unwrap();
    let c = client();
    until_workers(&gateway, &c, "ready", all_ready).await;
    let models = get(&c, &format!("{}/v1/models", gateway.url()))
        .await
        .json();
    assert_eq!(models["object"], "list");
    assert_eq!(model_ids(&models), ["second-model", "test-model"]);
    assert_eq!(
        models["data"][1]["owned_by"], "vllm",
        "the worker's own card"
    );
    let ready = get(&c, &format!("{}/readiness", gateway.url()))
        .await
        .json();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["healthy_workers"], 2);
    assert_eq!(ready["total_workers"], 2);
}

#[tokio::test]
async fn metrics_describe_requests_workers_and_circuits() {
    let s = start(2, instant(Flavor::Vllm), |_| {}).await;
    for _ in 0..3 {
        assert_eq!(
            s.chat(&chat_body("test-model", "hi", 3, true)).await.status,
            200
        );
    }
    assert_eq!(s.chat(&chat_body("nope", "hi", 3, true)).await.status, 404);
    let text = get(&s.client, &s.url("/metrics")).await.text();
    for expected in [
        r#"sluice_requests_total{route="/v1/chat/completions",status="200",code="none"} 3"#,
        r#"sluice_requests_total{route="/v1/chat/completions",status="404",code="model_not_found"} 1"#,
        "sluice_worker_ttft_seconds_bucket",
        "sluice_worker_inter_chunk_seconds_count",
        "sluice_worker_selections_total{policy=\"cache_aware\"",
        "sluice_worker_circuit_state{worker=",
        "sluice_worker_in_flight{worker=",
        "sluice_worker_info{worker=",
        "sluice_request_duration_seconds_count{route=\"/v1/chat/completions\"} 4",
    ] {
        assert!(text.contains(expected), "missing {expected}:\n{text}");
    }
}

#[tokio::test]
async fn http2_to_workers_with_prior_knowledge() {
    let s = start(1, instant(Flavor::Vllm), |c| c.upstream.http2 = true).await;
    assert_eq!(s.workers().await[0]["http2"], true);
    let a = s.chat(&chat_body("test-model", "hi", 5, true)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.events().last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn embeddings_are_routed() {
    let s = start(1, instant(Flavor::Vllm), |_| {}).await;
    let a = post(
        &s.client,
        &s.url("/v1/embeddings"),
        r#"{"model":"test-model","input":["a","b"]}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["data"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests_and_stops_when_none_are_left() {
    let s = start(1, timed(Flavor::Vllm, 4.0), |_| {}).await;
    let response = open_stream(&s, "hi", 60).await;

    s.gateway.begin_shutdown();
    let ready = get(&s.client, &s.url("/readiness")).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["reason"], "draining");
    let refused = s.chat(&chat_body("test-model", "late", 1, false)).await;
    assert_eq!(refused.status, 503);
    assert_eq!(code(&refused).as_deref(), Some("shutting_down"));
    assert_eq!(get(&s.client, &s.url("/liveness")).await.status, 200);

    let Setup { gateway, sims, .. } = s;
    let stopping = tokio::spawn(gateway.shutdown());
    let rest = bounded("the stream's end", response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"),
        "the stream finished normally"
    );
    assert_eq!(
        bounded("the stop", stopping).await.unwrap(),
        Stopped::Drained
    );
    drop(sims);
}

#[tokio::test]
async fn a_single_api_key_is_also_the_workers_key_as_in_smg() {
    let mut engine = instant(Flavor::Vllm);
    engine.api_key = Some("shared-key".into());
    let sims = SimFleet::start(FleetConfig::local(1, engine))
        .await
        .unwrap();
    let mut settings = sluice_gateway::Settings::defaults();
    settings.listen.port = 0;
    settings.worker_urls = sims.urls();
    settings.access.api_keys = vec!["shared-key".into()];
    let gateway = Gateway::start(settings.validate().unwrap()).await.unwrap();
    let c = client();
    // The engine answers /v1/models only with its key: ready means the key was sent.
    until_workers(&gateway, &c, "ready with the shared key", all_ready).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let body = chat_body("test-model", "hi", 1, false);
    assert_eq!(
        post(&c, &url, &body).await.status,
        401,
        "clients need it too"
    );
    let a = send(
        &c,
        "POST",
        &url,
        Some(&body),
        &[("authorization", "Bearer shared-key")],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());

    let mut own = sluice_gateway::Settings::defaults();
    own.access.api_keys = vec!["client-key".into()];
    own.worker_api_key = Some("worker-key".into());
    assert_eq!(own.default_worker_key().as_deref(), Some("worker-key"));
    own.worker_api_key = None;
    own.access.api_keys = vec!["a".into(), "b".into()];
    assert_eq!(
        own.default_worker_key(),
        None,
        "which of several would be a guess"
    );
}
