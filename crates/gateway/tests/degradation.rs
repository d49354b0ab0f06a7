//! The degradation ladder, black-box: under pressure a request reaches the engine shortened —
//! reasoning switched off, sent to the smaller model, its `max_tokens` clamped — and its answer
//! names each step; without pressure its body reaches the engine byte for byte.
//!
//! The engines here echo the body they received, so the test reads exactly what an engine got.
//! Pressure is made with the gateway queue: one place (`--max-concurrent-requests 1`) held by a
//! request the engine answers only when told, and a reference delay of 1 ms, so a waiter soon
//! stands at the top of the queue-delay scale.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::routing;
use axum::Router;
use bytes::Bytes;
use common::*;
use sluice_core::adaptive::CodelConfig;
use sluice_gateway::admit::QueueConfig;
use sluice_gateway::config::{
    CascadeSpec, ClampSpec, DegradationSettings, DegradationSpec, ReasoningSpec,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// An engine serving `model` that answers a chat with the body it received as its content; a
/// body that mentions "hold" is answered only once `release` is told.
async fn echo_engine(model: &'static str, release: Arc<Notify>) -> String {
    let chat = routing::post(move |body: Bytes| {
        let release = release.clone();
        async move {
            let text = String::from_utf8_lossy(&body).to_string();
            if text.contains("hold") {
                release.notified().await;
            }
            axum::Json(serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            }))
        }
    });
    let models = routing::get(move || async move {
        axum::Json(
            serde_json::json!({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm"}]}),
        )
    });
    let app = Router::new()
        .route("/v1/chat/completions", chat)
        .route("/v1/models", models);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A ladder that disables reasoning on `small`, cascades `big` to `small`, clamps output to 64
/// tokens, and sheds by tier when `shed`, its level judged from a 1 ms reference delay for every tier.
fn ladder(shed: bool) -> DegradationSettings {
    DegradationSettings {
        degradation: Some(DegradationSpec {
            interval_secs: Some(5.0),
            reference_delay_ms_by_tier: Some(vec![1; 3]),
            shed,
            reasoning: vec![ReasoningSpec {
                model: "small".into(),
                switch: "disable".into(),
                effort: None,
                budget_field: None,
                budget_tokens: None,
                tiers: None,
            }],
            prune: vec![],
            clamp: vec![ClampSpec {
                models: None,
                tiers: None,
                max_tokens: Some(64),
            }],
        }),
        cascade: vec![CascadeSpec {
            from: "big".into(),
            to: "small".into(),
            tiers: None,
        }],
    }
}

async fn gateway(urls: &[String], shed: bool) -> (Gateway, HttpClient) {
    let mut settings = sluice_gateway::Settings::defaults();
    settings.listen.port = 0;
    settings.worker_urls = urls.to_vec();
    settings.degradation = ladder(shed);
    let mut config = settings.validate().unwrap();
    config.access.keys.admin = Some(ADMIN_KEY.into());
    config.admission.max_concurrent = Some(1);
    // Agent requests: the cascade applies to tiers 1 and 2 unless told otherwise.
    config.admission.default_tier = sluice_core::admission::Tier::Agent;
    config.admission.queue = Some(QueueConfig {
        size: 10,
        timeouts: [Duration::from_secs(60); 3],
        shed: false,
        shed_retry_after: Duration::from_secs(1),
        codel: None::<[CodelConfig; 3]>,
    });
    let gateway = Gateway::start(config).await.unwrap();
    let c = client();
    until_workers(&gateway, &c, "ready", |w| {
        w.len() == urls.len() && all_ready(w)
    })
    .await;
    (gateway, c)
}

/// One request holding the gateway's one place and another waiting, until the ladder's level is
/// at least `level`: the holder's and the waiter's answers to come.
async fn under_pressure(
    gateway: &Gateway,
    c: &HttpClient,
    level: u64,
) -> (JoinHandle<Answer>, JoinHandle<Answer>) {
    let url = format!("{}/v1/chat/completions", gateway.url());
    let admission = format!("{}/admission", gateway.url());
    let holder = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { post(&c, &url, &chat("hold")).await })
    };
    bounded("the holder to take the place", async {
        while get_admin(c, &admission).await.json()["gateway"]["in_flight_under_cap"] != 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // A waiter: the queue's delay climbs past 16 x 1 ms, the top of its scale.
    let waiter = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { post(&c, &url, &chat("shorten me")).await })
    };
    bounded("the ladder's level", async {
        loop {
            let view = get_admin(c, &admission).await.json();
            if view["degradation"]["level"].as_u64().unwrap() >= level {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    (holder, waiter)
}

fn chat(content: &str) -> String {
    format!(
        r#"{{"model": "big", "messages": [{{"role": "user", "content": "{content}"}}], "max_tokens": 4000}}"#
    )
}

/// What the engine received, as it echoed it.
fn received(answer: &Answer) -> serde_json::Value {
    let content = answer.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    serde_json::from_str(&content).unwrap()
}

#[tokio::test]
async fn without_pressure_the_body_reaches_the_engine_byte_for_byte() {
    let release = Arc::new(Notify::new());
    let urls = [
        echo_engine("big", release.clone()).await,
        echo_engine("small", release.clone()).await,
    ];
    let (gateway, c) = gateway(&urls, false).await;
    let body = chat("hello");
    let answer = post(&c, &format!("{}/v1/chat/completions", gateway.url()), &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let echoed = answer.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(echoed, body, "byte for byte");
    assert!(!answer.headers.contains_key("x-sluice-degraded"));
    let view = get_admin(&c, &format!("{}/admission", gateway.url()))
        .await
        .json();
    assert_eq!(view["degradation"]["level"], 0);
}

#[tokio::test]
async fn under_pressure_the_engine_gets_the_shortened_request_and_the_answer_names_each_step() {
    let release = Arc::new(Notify::new());
    let urls = [
        echo_engine("big", release.clone()).await,
        echo_engine("small", release.clone()).await,
    ];
    let (gateway, c) = gateway(&urls, false).await;
    let (holder, waiter) = under_pressure(&gateway, &c, 4).await;
    // Room opens: the waiter goes, at the level the ladder holds (for at least 5 s).
    release.notify_waiters();
    let answer = bounded("the waiter's answer", waiter).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.json()["model"],
        "small",
        "the answer names the model that served it"
    );
    let got = received(&answer);
    assert_eq!(got["model"], "small", "cascaded");
    assert_eq!(got["max_tokens"], 64, "clamped");
    assert_eq!(
        got["chat_template_kwargs"]["enable_thinking"], false,
        "reasoning switched off in the form the small model's engine honours"
    );
    assert_eq!(got["messages"][0]["content"], "shorten me");
    let header = answer.headers["x-sluice-degraded"]
        .to_str()
        .unwrap()
        .to_string();
    for step in ["cascade=small", "reasoning=off", "max_tokens=64"] {
        assert!(header.contains(step), "{step} in {header}");
    }
    let holder = bounded("the holder's answer", holder).await.unwrap();
    assert_eq!(holder.status, 200);
    let metrics = get(&c, &format!("{}/metrics", gateway.url())).await.text();
    for step in ["cascade", "reasoning", "max_tokens"] {
        let line = format!("sluice_degraded_total{{step=\"{step}\",tier=\"agent\"}} 1");
        assert!(metrics.contains(&line), "{line}");
    }
    assert!(metrics.contains("sluice_degradation_level "));
}

#[tokio::test]
async fn cascaded_requests_are_counted_in_flight_until_they_end() {
    let release = Arc::new(Notify::new());
    let urls = [
        echo_engine("big", release.clone()).await,
        echo_engine("small", release.clone()).await,
    ];
    let (gateway, c) = gateway(&urls, false).await;
    let (holder, waiter) = under_pressure(&gateway, &c, 2).await;
    let held = {
        let (c, url) = (c.clone(), format!("{}/v1/chat/completions", gateway.url()));
        tokio::spawn(async move { post(&c, &url, &chat("hold me too")).await })
    };
    let admission = format!("{}/admission", gateway.url());
    let in_flight = |want: u64| {
        let (c, admission) = (c.clone(), admission.clone());
        bounded("the cascaded requests in flight", async move {
            while get_admin(&c, &admission).await.json()["degradation"]["cascaded_in_flight"]
                != want
            {
                tokio::task::yield_now().await;
            }
        })
    };
    // The holder ends; the two waiters go to the small model one after the other, and the
    // second is held there: counted while it is (the first may still be counted as it ends).
    release.notify_waiters();
    assert_eq!(bounded("the waiter", waiter).await.unwrap().status, 200);
    in_flight(1).await;
    // A stored permit: the held one goes whether it is waiting at the engine yet or not.
    release.notify_one();
    let held = bounded("the held one", held).await.unwrap();
    assert_eq!(held.json()["model"], "small", "{}", held.text());
    in_flight(0).await;
    assert_eq!(bounded("the holder", holder).await.unwrap().status, 200);
}

#[tokio::test]
async fn at_level_five_batch_requests_are_refused_at_arrival_and_agent_ones_are_not() {
    let release = Arc::new(Notify::new());
    let urls = [
        echo_engine("big", release.clone()).await,
        echo_engine("small", release.clone()).await,
    ];
    let (gateway, c) = gateway(&urls, true).await;
    let (holder, waiter) = under_pressure(&gateway, &c, 5).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let batch = send(
        &c,
        "POST",
        &url,
        Some(&chat("later")),
        &[("x-sluice-priority", "batch")],
    )
    .await;
    assert_eq!(batch.status, 503, "{}", batch.text());
    assert_eq!(code(&batch).as_deref(), Some("degradation_shed"));
    assert_eq!(
        batch.headers["retry-after"].to_str().unwrap(),
        "5",
        "the shedding hold: the CoDel interval"
    );
    release.notify_waiters();
    for task in [holder, waiter] {
        assert_eq!(bounded("an answer", task).await.unwrap().status, 200);
    }
    let interactive = send(
        &c,
        "POST",
        &url,
        Some(&chat("now")),
        &[("x-sluice-priority", "interactive")],
    )
    .await;
    assert_eq!(
        interactive.status, 200,
        "the interactive tier is never shed"
    );
    let metrics = get(&c, &format!("{}/metrics", gateway.url())).await.text();
    assert!(metrics.contains("sluice_degraded_total{step=\"shed\",tier=\"batch\"} 1"));
    assert!(metrics
        .contains("sluice_admission_rejected_total{tier=\"batch\",reason=\"degradation_shed\"} 1"));
}

#[tokio::test]
async fn a_cascade_to_a_model_nobody_serves_is_not_taken() {
    let release = Arc::new(Notify::new());
    let urls = [echo_engine("big", release.clone()).await];
    let (gateway, c) = gateway(&urls, false).await;
    let (holder, waiter) = under_pressure(&gateway, &c, 4).await;
    release.notify_waiters();
    let answer = bounded("the waiter's answer", waiter).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(received(&answer)["model"], "big");
    let header = answer.headers["x-sluice-degraded"].to_str().unwrap();
    assert!(!header.contains("cascade"), "{header}");
    assert!(
        header.contains("max_tokens=64"),
        "the other steps still apply: {header}"
    );
    assert_eq!(bounded("the holder", holder).await.unwrap().status, 200);
}

/// One simulated engine for "big" (engine 0) and one for "small" (engine 1), engine `full` over
/// its waiting ceiling, behind the ladder; returned once the ladder is at level 3 (a model's
/// whole fleet full), with the admission view then.
async fn one_model_full(full: usize) -> (SimFleet, Gateway, HttpClient, serde_json::Value) {
    let engine = |model: &str| {
        let mut cfg = instant(Flavor::Vllm);
        cfg.model = model.into();
        cfg
    };
    let mut fleet = FleetConfig::local(1, engine("big"));
    fleet.also.push((1, engine("small")));
    fleet.faults.push((
        Some(full),
        Fault::Report {
            rank: None,
            waiting: Some(8),
            running: None,
            kv_usage: None,
        },
    ));
    let sims = SimFleet::start(fleet).await.unwrap();
    let (gateway, c) = gateway(&sims.urls(), false).await;
    let admission = format!("{}/admission", gateway.url());
    let view = bounded("level 3", async {
        loop {
            let view = get_admin(&c, &admission).await.json();
            if view["degradation"]["level"] == 3 {
                return view;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    (sims, gateway, c, view)
}

/// The veto share is read per model: the big model's only engine over its waiting ceiling is the
/// big model's whole fleet full — level 3 — however idle the small model's engine beside it (the
/// whole fleet's share would be a half: level 1).
#[tokio::test]
async fn a_model_whose_workers_are_all_full_is_level_three_beside_an_idle_one() {
    let (_sims, _gateway, _c, view) = one_model_full(0).await;
    assert_eq!(view["degradation"]["pressure"]["vetoed_share"], 1.0);
}

/// A cascade never moves a request from a model with room for it to one without: the small
/// model's only engine over its waiting ceiling puts the ladder at level 3, where the big model's
/// requests are cascaded to it — but the big model, idle, has room, so they stay on it.
#[tokio::test]
async fn a_request_is_not_cascaded_to_a_full_model_from_one_with_room() {
    let (sims, gateway, c, _) = one_model_full(1).await;
    let url = format!("{}/v1/chat/completions", gateway.url());
    let answer = post(&c, &url, &chat("stay")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["model"], "big", "{}", answer.text());
    let steps = answer
        .headers
        .get("x-sluice-degraded")
        .map(|h| h.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert!(!steps.contains("cascade"), "{steps}");
    let received: Vec<u64> = sims
        .engines()
        .iter()
        .map(|e| e.state().requests_received)
        .collect();
    assert_eq!(received, [1, 0], "nothing reached the full model");
}
