//! Health checks against simulated engines' faults: a crashed worker leaves rotation and rejoins
//! in place when restarted, a hung one fails its probes by timeout, failed workers are removed
//! under auto-recovery, a promotion readmits an open circuit, the health block can be patched,
//! and the dedicated probe port answers while the main runtime is saturated.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::breaker::BreakerConfig;
use sluice_core::health::Thresholds;
use sluice_core::policy::Policy;
use sluice_gateway::control::HealthConfig;
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_millis(30);

/// Probes every 30 ms, 2 failures to NotReady (6 more to Failed), 1 pass back to Ready.
fn fast_health(c: &mut Config) {
    c.route.policy = Policy::RoundRobin;
    c.control.health = HealthConfig {
        interval: INTERVAL,
        timeout: Duration::from_millis(200),
        thresholds: Thresholds {
            failure: 2,
            success: 1,
        },
        ..HealthConfig::default()
    };
    c.access.keys.admin = Some(ADMIN_KEY.into());
}

async fn first_worker(s: &Setup) -> String {
    s.worker_id(0).await
}

async fn metric(s: &Setup, series: &str) -> Option<f64> {
    s.metric(series).await
}

async fn worker_view(s: &Setup, id: &str) -> Value {
    let a = get_admin(&s.client, &s.url(&format!("/workers/{id}"))).await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()
}

async fn chats_all_ok(s: &Setup, n: usize) {
    for i in 0..n {
        let a = s
            .chat(&chat_body("test-model", &format!("q{i}"), 1, false))
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
}

#[tokio::test]
async fn a_crashed_worker_leaves_rotation_and_rejoins_in_place_when_restarted() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        fast_health(c);
        c.fleet.breaker = None; // only health checks keep requests off the dead worker
    })
    .await;
    let id = first_worker(&s).await;
    let victim = s.sims.engine(0).unwrap();

    victim.crash().await;
    let crashed = Instant::now();
    s.until_status(&id, "not_ready").await;
    assert!(
        crashed.elapsed() >= INTERVAL,
        "two failed probes, one interval apart"
    );
    let failures = metric(&s, "sluice_worker_health_checks_total{result=\"failure\"}").await;
    assert!(failures >= Some(2.0), "{failures:?}");
    assert_eq!(
        metric(&s, &format!("sluice_worker_health{{worker=\"{id}\"}}")).await,
        Some(0.0)
    );

    // Out of rotation: no request is even tried on it, so nothing is retried.
    let retries = metric(&s, "sluice_retries_total{reason=\"connect\"}").await;
    chats_all_ok(&s, 6).await;
    assert_eq!(
        metric(&s, "sluice_retries_total{reason=\"connect\"}").await,
        retries
    );

    s.until_status(&id, "failed").await;
    let view = worker_view(&s, &id).await;
    assert_eq!(view["status"], "failed");
    assert_eq!(view["health"]["last_probe"]["ok"], false);
    assert_eq!(s.workers().await.len(), 2, "kept: auto-recovery is off");

    let before = s.received()[0];
    victim.fault(Fault::Restart).await.unwrap();
    s.until_status(&id, "ready").await;
    let workers = s.workers().await;
    assert_eq!(workers.len(), 2);
    assert_eq!(workers[0]["id"], id.as_str(), "the same registration");
    chats_all_ok(&s, 4).await;
    assert!(s.received()[0] > before, "it takes requests again");
    assert_eq!(
        metric(&s, &format!("sluice_worker_health{{worker=\"{id}\"}}")).await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_hung_worker_fails_its_probes_by_timeout_and_workers_shows_why() {
    let s = start(2, instant(Flavor::Vllm), fast_health).await;
    let id = first_worker(&s).await;
    s.sims.engine(0).unwrap().fault(Fault::Hang).await.unwrap();
    s.until_status(&id, "not_ready").await;

    let list = get_admin(&s.client, &s.url("/workers")).await.json();
    let workers = list["workers"].as_array().unwrap();
    let hung = workers.iter().find(|w| w["id"] == id.as_str()).unwrap();
    assert_eq!(hung["status"], "not_ready");
    assert_eq!(hung["routable"], false);
    assert_eq!(hung["health"]["state"], "not_ready");
    assert_eq!(hung["health"]["failure_threshold"], 2);
    let error = hung["health"]["last_probe"]["error"].as_str().unwrap();
    assert!(error.starts_with("timeout"), "{error}");
    assert_eq!(
        hung["circuit"]["state"], "closed",
        "no request failed on it"
    );
    let other = workers.iter().find(|w| w["id"] != id.as_str()).unwrap();
    assert_eq!(other["status"], "ready");
    assert_eq!(other["health"]["last_probe"]["ok"], true);

    let ready = get(&s.client, &s.url("/readiness")).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["healthy_workers"], 1);
    assert_eq!(ready.json()["total_workers"], 2);
    chats_all_ok(&s, 4).await;
}

#[tokio::test]
async fn readiness_is_503_when_no_worker_is_healthy() {
    let s = start(1, instant(Flavor::Vllm), fast_health).await;
    let id = first_worker(&s).await;
    s.sims.engine(0).unwrap().crash().await;
    s.until_status(&id, "not_ready").await;
    let a = get(&s.client, &s.url("/readiness")).await;
    assert_eq!(a.status, 503);
    let body = a.json();
    assert_eq!(body["reason"], "insufficient healthy workers");
    assert_eq!(
        (
            body["healthy_workers"].as_u64(),
            body["total_workers"].as_u64()
        ),
        (Some(0), Some(1))
    );
    let a = s.chat(&chat_body("test-model", "hi", 1, false)).await;
    assert_eq!(a.status, 503);
    assert!(a.text().contains("failing health checks"), "{}", a.text());
    assert_eq!(get(&s.client, &s.url("/liveness")).await.status, 200);
}

#[tokio::test]
async fn failed_workers_are_removed_under_auto_recovery() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        fast_health(c);
        c.control.health.remove_unhealthy = true;
    })
    .await;
    let id = first_worker(&s).await;
    s.sims.engine(0).unwrap().crash().await;
    let workers = s
        .until_workers("removed", |w| w.iter().all(|w| w["id"] != id.as_str()))
        .await;
    assert_eq!(workers.len(), 1, "only that registration went");
    assert_eq!(
        metric(&s, &format!("sluice_worker_health{{worker=\"{id}\"}}")).await,
        None,
        "its series are deleted, not left at -1"
    );
    let engine_series = format!("sluice_engine_waiting_requests{{worker=\"{id}\"}}");
    assert_eq!(metric(&s, &engine_series).await, None, "engine gauges too");
    let text = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        !text.contains(&format!("worker=\"{id}\"")),
        "no series names it: {text}"
    );
    chats_all_ok(&s, 3).await;
}

#[tokio::test]
async fn a_promotion_readmits_an_open_circuit_at_once() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        fast_health(c);
        c.fleet.breaker = Some(BreakerConfig {
            failure_threshold: 1,
            success_threshold: 1,
            open_timeout: Duration::from_secs(600),
            half_open_trials: 1,
            failure_rate: None,
        });
    })
    .await;
    let id = first_worker(&s).await;
    let victim = s.sims.engine(0).unwrap();
    victim.crash().await;
    // Round robin sends one of these to the dead worker: it fails to connect (opening the
    // circuit) and is retried on the other.
    chats_all_ok(&s, 2).await;
    let circuit = |view: Value| view["circuit"]["state"].clone();
    assert_eq!(circuit(worker_view(&s, &id).await), "open");
    s.until_status(&id, "not_ready").await;

    victim.fault(Fault::Restart).await.unwrap();
    s.until_status(&id, "ready").await;
    assert_eq!(
        circuit(worker_view(&s, &id).await),
        "half_open",
        "promoted: the trial starts now, not after the 600 s open timeout"
    );
    chats_all_ok(&s, 2).await;
    assert_eq!(
        circuit(worker_view(&s, &id).await),
        "closed",
        "the trial passed"
    );
}

#[tokio::test]
async fn the_health_block_is_validated_and_patched_in_place() {
    let s = start(1, instant(Flavor::Vllm), fast_health).await;
    let id = first_worker(&s).await;
    let auth = format!("Bearer {ADMIN_KEY}");
    let patch = |body: &'static str| {
        let url = s.url(&format!("/workers/{id}"));
        let auth = auth.clone();
        let client = s.client.clone();
        async move {
            send(
                &client,
                "PATCH",
                &url,
                Some(body),
                &[("authorization", auth.as_str())],
            )
            .await
        }
    };
    let bad = patch(r#"{"health":{"timeout_secs":0}}"#).await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("health.timeout_secs"), "{}", bad.text());

    s.sims.engine(0).unwrap().fault(Fault::Hang).await.unwrap();
    s.until_status(&id, "not_ready").await;
    let a = patch(r#"{"health":{"disable_health_check":true,"check_interval_secs":0.05}}"#).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["health"]["checks_enabled"], false);
    assert_eq!(a.json()["health"]["check_interval_secs"], 0.05);
    assert_eq!(a.json()["spec"]["health"]["disable_health_check"], true);
    // Nothing but probes could bring it back, so with probes off it is Ready again.
    s.until_status(&id, "ready").await;

    let a = patch(r#"{"health":{"disable_health_check":null}}"#).await;
    assert_eq!(
        a.json()["health"]["checks_enabled"],
        true,
        "back to the gateway value"
    );
    assert_eq!(
        a.json()["health"]["check_interval_secs"],
        0.05,
        "left out: kept"
    );
    s.until_status(&id, "not_ready").await;
}

#[tokio::test]
async fn probes_use_the_endpoint_and_send_the_workers_key() {
    let mut engine = instant(Flavor::Vllm);
    engine.api_key = Some("worker-key".into());
    let s = start(1, engine, |c| {
        fast_health(c);
        // The engine guards /v1/* with its key (as vLLM does), so this probe needs it.
        c.control.health.endpoint = "/v1/models".into();
        c.workers[0].api_key = Some("worker-key".into());
    })
    .await;
    let id = first_worker(&s).await;
    s.until_worker(&id, "a passing probe", |w| {
        w["health"]["last_probe"]["ok"] == true
    })
    .await;

    let auth = format!("Bearer {ADMIN_KEY}");
    let url = s.url(&format!("/workers/{id}"));
    let wrong = r#"{"api_key":"not-the-key"}"#;
    let a = send(
        &s.client,
        "PATCH",
        &url,
        Some(wrong),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    s.until_status(&id, "not_ready").await;
    let view = worker_view(&s, &id).await;
    assert_eq!(view["health"]["last_probe"]["error"], "answered 401");
}

#[tokio::test]
async fn a_worker_drain_settle_override_is_used_on_removal() {
    let s = start(1, instant(Flavor::Vllm), fast_health).await;
    let other = fleet(instant(Flavor::Vllm)).await;
    let auth = format!("Bearer {ADMIN_KEY}");
    let spec = format!(
        r#"{{"url":"{}","health":{{"drain_settle_secs":0}}}}"#,
        other.urls()[0]
    );
    let created = send(
        &s.client,
        "POST",
        &s.url("/workers"),
        Some(&spec),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(created.status, 202, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_string();
    s.until_status(&id, "ready").await;
    let removed = send(
        &s.client,
        "DELETE",
        &s.url(&format!("/workers/{id}")),
        None,
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(
        removed.json()["status"],
        "removed",
        "no settle time: gone at once, though Ready"
    );
}

/// A raw `GET path` over a std socket (no runtime), bounded by `limit`.
fn raw_get(addr: std::net::SocketAddr, path: &str, limit: Duration) -> std::io::Result<String> {
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(limit))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

#[test]
fn the_probe_port_answers_while_the_main_runtime_is_saturated() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let s = runtime.block_on(start(1, instant(Flavor::Vllm), |c| {
        c.listener.health = Some("127.0.0.1:0".parse().unwrap());
    }));
    let probe_port = s.gateway.health_addr().unwrap();
    let main_port = s.gateway.addr();

    // Occupy the runtime's only worker thread until released.
    let release = Arc::new(AtomicBool::new(false));
    let (running, spinning) = std::sync::mpsc::channel();
    let held = release.clone();
    runtime.spawn(async move {
        running.send(()).unwrap();
        while !held.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
    });
    spinning.recv().unwrap();

    let answer = raw_get(probe_port, "/readiness", Duration::from_secs(10)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""status":"ready""#), "{answer}");
    let live = raw_get(probe_port, "/liveness", Duration::from_secs(10)).unwrap();
    assert!(live.starts_with("HTTP/1.1 200"), "{live}");
    let starved = raw_get(main_port, "/readiness", Duration::from_millis(200));
    assert!(starved.is_err(), "the main port is saturated: {starved:?}");

    release.store(true, Ordering::Release);
    let answer = raw_get(main_port, "/readiness", Duration::from_secs(10)).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    runtime.block_on(async move {
        let _ = s.gateway.shutdown().await;
    });
}
