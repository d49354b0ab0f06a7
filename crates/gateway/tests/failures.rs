//! Workers failing under the gateway: a crash under load, a circuit that opens and recovers on
//! time, a worker that cannot be reached at startup.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sluice_core::breaker::BreakerConfig;
use sluice_core::policy::Policy;

#[tokio::test]
async fn a_crash_under_steady_load_loses_no_request() {
    let s = start(3, timed(Flavor::Vllm, 20.0), |c| {
        c.route.policy = Policy::RoundRobin
    })
    .await;
    let mut clients = Vec::new();
    for worker in 0..8 {
        let client = s.client.clone();
        let url = s.url("/v1/chat/completions");
        clients.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..12 {
                let body = chat_body("test-model", &format!("c{worker} r{i}"), 30, false);
                let a = post(&client, &url, &body).await;
                statuses.push((a.status, a.text()));
            }
            statuses
        }));
    }
    let victim = s.sims.engine(0).unwrap();
    bounded("load on the victim", victim.until(|st| st.running >= 2)).await;
    victim.crash().await;
    for c in clients {
        for (status, text) in bounded("clients", c).await.unwrap() {
            assert_eq!(status, 200, "{text}");
        }
    }
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains("sluice_retries_total"),
        "the lost attempts were retried"
    );
}

#[tokio::test]
async fn the_breaker_opens_and_recovers_on_time() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        c.route.policy = Policy::RoundRobin;
        // Each 500 reaches the client here, to count them (retrying them is tested below).
        c.forward.retry.status_codes.clear();
        c.fleet.breaker = Some(BreakerConfig {
            failure_threshold: 3,
            success_threshold: 1,
            // Long enough that the requests below all see it open on a loaded machine.
            open_timeout: Duration::from_secs(3),
            half_open_trials: 1,
            failure_rate: None,
        });
    })
    .await;
    let sick = s.sims.engine(0).unwrap();
    sick.fault(Fault::ErrorRate { rate: 1.0 }).await.unwrap();
    let sick_id = s.worker_id(0).await;
    let circuit = |s: &Setup| {
        let url = s.url(&format!("/workers/{sick_id}"));
        let client = s.client.clone();
        async move { get(&client, &url).await.json()["circuit"]["state"].clone() }
    };
    let mut errors = 0;
    for i in 0..12 {
        let a = s
            .chat(&chat_body("test-model", &format!("q{i}"), 1, false))
            .await;
        if a.status == 500 {
            errors += 1;
        }
        if circuit(&s).await == "open" {
            break;
        }
    }
    assert_eq!(errors, 3, "the circuit opened at the third failure");
    let view = get(&s.client, &s.url(&format!("/workers/{sick_id}")))
        .await
        .json();
    assert_eq!(view["circuit"]["state"], "open");
    assert_eq!(view["routable"], false);

    // While open, every request goes to the healthy worker.
    for i in 0..6 {
        assert_eq!(
            s.chat(&chat_body("test-model", &format!("o{i}"), 1, false))
                .await
                .status,
            200
        );
    }
    sick.fault(Fault::Clear).await.unwrap();
    // Half-open on time, without a request to notice it.
    s.until_worker(&sick_id, "half-open", |w| {
        w["circuit"]["state"] == "half_open"
    })
    .await;
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains(&format!(
            "sluice_worker_circuit_state{{worker=\"{sick_id}\"}} 2"
        )),
        "{metrics}"
    );
    // One successful trial closes it.
    for i in 0..4 {
        assert_eq!(
            s.chat(&chat_body("test-model", &format!("t{i}"), 1, false))
                .await
                .status,
            200
        );
    }
    s.until_workers("closed", |workers| {
        workers.iter().all(|w| w["circuit"]["state"] == "closed")
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_worker_stays_visible_and_its_model_is_unavailable_not_unknown() {
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let engine = sims.engine(0).unwrap();
    engine.crash().await;
    let mut config = Config::local(&sims.urls());
    config.control.startup_check_interval = Duration::from_millis(50);
    let gateway = Gateway::start(config).await.unwrap();
    let c = client();
    let workers = get(&c, &format!("{}/workers", gateway.url())).await.json();
    assert_eq!(workers["total"], 1);
    assert_eq!(workers["workers"][0]["status"], "pending");
    assert_eq!(workers["workers"][0]["routable"], false);

    let a = post(
        &c,
        &format!("{}/v1/chat/completions", gateway.url()),
        &chat_body("test-model", "hi", 1, false),
    )
    .await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(code(&a).as_deref(), Some("no_available_workers"));
    assert!(a.headers.get("retry-after").is_some());
    let ready = get(&c, &format!("{}/readiness", gateway.url())).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["reason"], "insufficient healthy workers");

    engine.fault(Fault::Restart).await.unwrap();
    until_workers(&gateway, &c, "registration", all_ready).await;
    let a = post(
        &c,
        &format!("{}/v1/chat/completions", gateway.url()),
        &chat_body("test-model", "hi", 1, false),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        get(&c, &format!("{}/readiness", gateway.url()))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn connection_failures_on_every_worker_end_in_502_without_urls() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        c.route.policy = Policy::RoundRobin
    })
    .await;
    for e in s.sims.engines() {
        e.crash().await;
    }
    let a = s.chat(&chat_body("test-model", "hi", 1, false)).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(code(&a).as_deref(), Some("upstream_unreachable"));
    assert!(!a.text().contains("127.0.0.1"), "{}", a.text());
}

#[tokio::test]
async fn at_capacity_answers_are_retried_on_another_worker() {
    // A worker with a hard cap of 1 + 2 requests, filled directly; and a roomy one.
    let mut tight = timed(Flavor::Vllm, 1.0);
    tight.engine_request_limit = Some(1);
    tight.request_queue_limit = 2;
    let full = SimFleet::start(FleetConfig::local(1, tight)).await.unwrap();
    let roomy = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let c = client();
    let direct = format!("{}/v1/chat/completions", full.urls()[0]);
    let mut fillers = Vec::new();
    for i in 0..3 {
        let (c, url) = (c.clone(), direct.clone());
        fillers.push(tokio::spawn(async move {
            post(
                &c,
                &url,
                &chat_body("test-model", &format!("fill {i}"), 4000, false),
            )
            .await
        }));
    }
    let full_engine = full.engine(0).unwrap();
    bounded(
        "the cap is reached",
        full_engine
            .until(|st| st.engine_requests.unwrap_or(0) + st.queued_requests.unwrap_or(0) == 3),
    )
    .await;
    assert_eq!(
        post(&c, &direct, &chat_body("test-model", "x", 1, false))
            .await
            .status,
        529
    );

    let mut config = Config::local(&[full.urls()[0].clone(), roomy.urls()[0].clone()]);
    config.route.policy = Policy::RoundRobin;
    let gateway = Gateway::start(config).await.unwrap();
    until_workers(&gateway, &c, "ready", all_ready).await;
    let refused_before = full_engine.state().rejected;
    for i in 0..6 {
        let a = post(
            &c,
            &format!("{}/v1/chat/completions", gateway.url()),
            &chat_body("test-model", &format!("s{i}"), 1, false),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let metrics = get(&c, &format!("{}/metrics", gateway.url())).await.text();
    let refused = full_engine.state().rejected - refused_before;
    assert_eq!(
        refused, 1,
        "tried once: its at-capacity answer vetoes it for a second, and six requests take far less"
    );
    let line = format!(r#"sluice_retries_total{{reason="at_capacity"}} {refused}"#);
    assert!(metrics.contains(&line), "every 529 was retried: {metrics}");
    for f in fillers {
        f.abort();
    }
}

#[tokio::test]
async fn a_client_error_status_retried_by_choice_is_not_a_failure_of_the_worker() {
    // 408 added to the retried statuses; one failure would open a circuit.
    let s = start(2, instant(Flavor::Vllm), |c| {
        c.route.policy = Policy::RoundRobin;
        c.forward.retry.status_codes.push(408);
        c.fleet.breaker = Some(BreakerConfig {
            failure_threshold: 1,
            success_threshold: 1,
            open_timeout: Duration::from_secs(60),
            half_open_trials: 1,
            failure_rate: None,
        });
    })
    .await;
    let refusing = s.sims.engine(0).unwrap();
    refusing
        .fault(Fault::ErrorEvent {
            rate: 1.0,
            code: 408,
        })
        .await
        .unwrap();
    for i in 0..4 {
        let a = s
            .chat(&chat_body("test-model", &format!("r{i}"), 1, false))
            .await;
        assert_eq!(a.status, 200, "retried on the other worker: {}", a.text());
    }
    assert!(
        refusing.state().requests_received >= 2,
        "both workers tried"
    );
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains(r#"sluice_retries_total{reason="status"}"#),
        "the 408s were retried: {metrics}"
    );
    let status_errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_upstream_errors_total") && l.contains(r#"kind="status""#))
        .collect();
    assert_eq!(status_errors.len(), 2, "{metrics}");
    assert!(
        status_errors.iter().all(|l| l.ends_with(" 0")),
        "no upstream error counted for a 408: {status_errors:?}"
    );
    for worker in s.workers().await {
        assert_eq!(worker["circuit"]["state"], "closed", "{worker}");
    }
}

#[tokio::test]
async fn a_deadline_that_passes_during_a_retrys_backoff_is_charged_to_no_worker() {
    // Every retry waits 5 s, far past the 1 s the gateway gives a request.
    let s = start(2, instant(Flavor::Vllm), |c| {
        c.route.policy = Policy::RoundRobin;
        c.admission.request_timeout = Duration::from_secs(1);
        c.forward.retry.backoff = sluice_core::retry::Backoff {
            initial: Duration::from_secs(5),
            multiplier: 1.0,
            max: Duration::from_secs(5),
            jitter: 0.0,
        };
    })
    .await;
    let failing = s.sims.engine(0).unwrap();
    failing.fault(Fault::ErrorRate { rate: 1.0 }).await.unwrap();
    let healthy = s.sims.engine(1).unwrap();
    let mut answered = 0;
    let mut timed_out = 0;
    for i in 0..2 {
        let a = s
            .chat(&chat_body("test-model", &format!("r{i}"), 1, false))
            .await;
        match a.status {
            200 => answered += 1,
            504 => {
                assert_eq!(code(&a).as_deref(), Some("request_timeout"), "{}", a.text());
                timed_out += 1;
            }
            other => panic!("{other}: {}", a.text()),
        }
    }
    assert_eq!(
        (answered, timed_out),
        (1, 1),
        "one of two met the failing worker"
    );
    assert_eq!(
        healthy.state().requests_received,
        1,
        "the request whose deadline passed in its backoff never reached the next worker"
    );
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    let timeouts: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("sluice_upstream_errors_total") && l.contains(r#"kind="timeout""#)
        })
        .collect();
    assert_eq!(timeouts.len(), 2, "{metrics}");
    assert!(
        timeouts.iter().all(|l| l.ends_with(" 0")),
        "no worker charged a timeout: {timeouts:?}"
    );
}

#[tokio::test]
async fn a_worker_failing_part_of_its_requests_costs_clients_nothing_and_opens_on_its_rate() {
    let s = start(3, instant(Flavor::Vllm), |c| {
        c.route.policy = Policy::RoundRobin
    })
    .await;
    let sick = s.worker_id(0).await;
    s.sims
        .engine(0)
        .unwrap()
        .fault(Fault::ErrorRate { rate: 0.7 })
        .await
        .unwrap();
    let mut opened_after = None;
    for i in 0..300 {
        let a = s
            .chat(&chat_body("test-model", &format!("q{i}"), 1, false))
            .await;
        assert_eq!(a.status, 200, "retried on another worker: {}", a.text());
        let view = get_admin(&s.client, &s.url(&format!("/workers/{sick}")))
            .await
            .json();
        if view["circuit"]["state"] == "open" {
            opened_after = Some(i);
            break;
        }
    }
    let opened_after = opened_after.expect("the failure rate opened the circuit");
    assert!(
        opened_after >= 20,
        "not before 20 outcomes on it: {opened_after}"
    );
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains("sluice_retries_total{reason=\"status\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_worker_that_never_registers_fails_at_the_startup_timeout() {
    let mut config = Config::local(&["http://127.0.0.1:9".to_string()]);
    config.control.startup_check_interval = Duration::from_millis(100);
    config.control.startup_timeout = Some(Duration::from_millis(500));
    let gateway = Gateway::start(config).await.unwrap();
    let c = client();
    let workers = until_workers(&gateway, &c, "failed", |w| w[0]["status"] == "failed").await;
    assert_eq!(workers[0]["health"]["state"], "failed");

    let mut config = Config::local(&["http://127.0.0.1:9".to_string()]);
    config.control.startup_check_interval = Duration::from_millis(100);
    config.control.startup_timeout = Some(Duration::from_millis(500));
    config.control.health.remove_unhealthy = true;
    let gateway = Gateway::start(config).await.unwrap();
    until_workers(&gateway, &c, "removed", <[Value]>::is_empty).await;
}
