//! Liveness vetoes against simulated engine faults: a frozen engine (health and metrics still
//! fine) stops getting requests within the wedge bound — through the pile of streams, or with
//! only non-streaming traffic through its own token counter — and gets them again when it
//! resumes; a hung engine is vetoed within the stale bound; a crashed one as unreachable before
//! the health checker would demote it.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sluice_core::breaker::BreakerConfig;
use sluice_core::policy::Policy;
use sluice_sim::WedgedPolls;
use tokio::time::Instant;

const WEDGE: Duration = Duration::from_millis(300);

fn fast(c: &mut Config) {
    c.route.policy = Policy::RoundRobin;
    c.control.load.interval = Duration::from_millis(50);
    c.control.load.min_interval = Duration::from_millis(10);
    c.control.load.poll_timeout = Duration::from_millis(200);
    c.control.liveness.as_mut().expect("on by default").wedge = WEDGE;
    c.control.liveness.as_mut().expect("on by default").stall = Duration::from_millis(300);
    c.control.liveness.as_mut().expect("on by default").stale = Duration::from_secs(1);
}

/// The reason `/workers` gives a worker's liveness veto, in the terms of
/// `sluice_worker_stalled{reason}`: `unreachable` (unreachable, stale) or `wedged` (a wedged
/// queue or pile, a silent engine).
fn reason(view: &Value) -> Option<&'static str> {
    match view["vetoes"]["liveness"].as_str()? {
        "unreachable" | "stale" => Some("unreachable"),
        "wedged_queue" | "wedged_pile" | "engine_silent" => Some("wedged"),
        "unresponsive" => Some("unresponsive"),
        other => panic!("an unknown liveness veto: {other}"),
    }
}

/// Waits until worker `id`'s liveness veto has `want` as its reason (`None`: no veto).
async fn until_vetoed(s: &Setup, id: &str, what: &str, want: Option<&str>) -> Value {
    s.until_worker(id, what, |w| reason(w) == want).await
}

/// Sends `n` short requests and returns how many each engine received meanwhile.
async fn spread(s: &Setup, n: usize) -> Vec<u64> {
    let before = s.received();
    for i in 0..n {
        let a = s
            .chat(&chat_body("test-model", &format!("q{i}"), 1, false))
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    s.received()
        .iter()
        .zip(before)
        .map(|(a, b)| a - b)
        .collect()
}

fn spawn_requests(
    s: &Setup,
    n: usize,
    max_tokens: u32,
    stream: bool,
) -> Vec<tokio::task::JoinHandle<Answer>> {
    (0..n)
        .map(|i| {
            let client = s.client.clone();
            let url = s.url("/v1/chat/completions");
            let body = chat_body("test-model", &format!("long {i}"), max_tokens, stream);
            tokio::spawn(async move { post(&client, &url, &body).await })
        })
        .collect()
}

#[tokio::test]
async fn a_frozen_engine_with_streams_is_wedged_and_returns_when_it_resumes() {
    let s = start(2, instant(Flavor::Vllm), fast).await;
    let id = s.worker_id(0).await;
    let frozen = s.sims.engine(0).unwrap();
    frozen.fault(Fault::Pause).await.unwrap();
    let froze = Instant::now();
    let streams = spawn_requests(&s, 4, 8, true); // two land on the frozen engine
    until_vetoed(&s, &id, "wedged", Some("wedged")).await;
    assert!(froze.elapsed() >= WEDGE, "not before the wedge bound");
    assert_eq!(
        spread(&s, 6).await,
        [0, 6],
        "no new request for the frozen engine"
    );
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    let series = format!("sluice_worker_stalled{{worker=\"{id}\",reason=\"wedged\"}} 1");
    assert!(metrics.contains(&series), "{metrics}");

    frozen.fault(Fault::Clear).await.unwrap();
    until_vetoed(&s, &id, "re-admitted", None).await;
    for stream in streams {
        let answer = bounded("the held streams", stream).await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.events().last().map(String::as_str), Some("[DONE]"));
    }
    let got = spread(&s, 4).await;
    assert!(got[0] > 0, "back in rotation: {got:?}");
}

#[tokio::test]
async fn a_frozen_engine_with_only_non_streaming_traffic_is_caught_by_its_token_counter() {
    let s = start(2, timed(Flavor::Vllm, 20.0), fast).await;
    let id = s.worker_id(0).await;
    let frozen = s.sims.engine(0).unwrap();
    let held = spawn_requests(&s, 4, 2000, false);
    bounded("running", frozen.until(|st| st.running >= 2)).await;
    frozen.fault(Fault::Pause).await.unwrap();
    s.until_worker(&id, "silent", |w| {
        w["vetoes"]["liveness"] == "engine_silent"
    })
    .await;
    // The pile of streams is not on any HTTP surface: read from the fleet.
    let worker = s.gateway.fleet().snapshot().worker(&id).unwrap().clone();
    assert_eq!(worker.signals.pile(), 0, "no stream to judge by");
    assert_eq!(spread(&s, 4).await, [0, 4]);

    frozen.fault(Fault::Clear).await.unwrap();
    until_vetoed(&s, &id, "re-admitted", None).await;
    for request in held {
        assert_eq!(bounded("held requests", request).await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn a_hung_engine_is_vetoed_within_the_stale_bound() {
    let s = start(2, instant(Flavor::Vllm), fast).await;
    let id = s.worker_id(0).await;
    let hung = s.sims.engine(0).unwrap();
    hung.fault(Fault::Hang).await.unwrap();
    let held = spawn_requests(&s, 2, 1, false); // one is held by the hung engine
    let worker = s
        .until_worker(&id, "stale", |w| w["vetoes"]["liveness"] == "stale")
        .await;
    assert_eq!(
        worker["status"], "ready",
        "long before its probes would tell"
    );
    assert_eq!(spread(&s, 4).await, [0, 4]);

    hung.fault(Fault::Clear).await.unwrap();
    until_vetoed(&s, &id, "heard from again", None).await;
    for request in held {
        request.abort();
    }
}

#[tokio::test]
async fn a_crashed_engine_is_unreachable_before_its_health_checks_demote_it() {
    let s = start(2, instant(Flavor::Vllm), fast).await;
    let id = s.worker_id(0).await;
    let crashed = s.sims.engine(0).unwrap();
    crashed.crash().await;
    // Its load polls now fail to connect: a transport failure, then silence.
    let worker = until_vetoed(&s, &id, "unreachable", Some("unreachable")).await;
    assert_eq!(
        worker["status"], "ready",
        "the health checker has not demoted it"
    );
    assert_eq!(worker["vetoes"]["liveness"], "unreachable");
    let retries = get(&s.client, &s.url("/metrics")).await.text();
    let connect_retries = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("sluice_retries_total{reason=\"connect\"}"))
            .map(str::to_string)
    };
    let before = connect_retries(&retries);
    assert_eq!(spread(&s, 4).await[1], 4);
    let after = get(&s.client, &s.url("/metrics")).await.text();
    assert_eq!(
        connect_retries(&after),
        before,
        "nothing was even tried on it"
    );

    crashed.fault(Fault::Restart).await.unwrap();
    until_vetoed(&s, &id, "re-admitted on contact", None).await;
    let got = spread(&s, 4).await;
    assert!(got[0] > 0, "{got:?}");
}

#[tokio::test]
async fn a_worker_that_looks_healthy_and_answers_nobody_is_unresponsive_and_its_requests_go_elsewhere(
) {
    let s = start(2, instant(Flavor::Vllm), |c| {
        fast(c);
        c.control
            .liveness
            .as_mut()
            .expect("on by default")
            .unresponsive = Duration::from_millis(300);
        // One failure opens a circuit, for an hour: the released requests open it.
        c.fleet.breaker = Some(BreakerConfig {
            failure_threshold: 1,
            success_threshold: 1,
            open_timeout: Duration::from_secs(3600),
            half_open_trials: 1,
            failure_rate: None,
        });
    })
    .await;
    let id = s.worker_id(0).await;
    let hung = s.sims.engine(0).unwrap();
    // It takes requests and never steps; its health passes and its reports say it holds nothing.
    hung.fault(Fault::Pause).await.unwrap();
    hung.fault(Fault::Report {
        rank: None,
        waiting: Some(0),
        running: Some(0),
        kv_usage: None,
    })
    .await
    .unwrap();
    let held = spawn_requests(&s, 4, 1, false); // two land on the hung engine
    let view = until_vetoed(&s, &id, "unresponsive", Some("unresponsive")).await;
    assert_eq!(view["status"], "ready", "its probes still pass");
    for request in held {
        let answer = bounded("the held requests", request).await.unwrap();
        assert_eq!(answer.status, 200, "retried elsewhere: {}", answer.text());
    }
    assert_eq!(spread(&s, 4).await, [0, 4], "no new request for it");
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    let stalled = format!("sluice_worker_stalled{{worker=\"{id}\",reason=\"unresponsive\"}} 1");
    assert!(metrics.contains(&stalled), "{metrics}");
    assert!(
        !metrics.contains("sluice_retries_total{reason=\"unresponsive\"} 0"),
        "{metrics}"
    );

    let view = s
        .until_worker(&id, "its circuit open", |w| w["circuit"]["state"] == "open")
        .await;
    assert_eq!(view["routable"], false, "{view}");

    // Its trial is answered: the veto lifts, and with it the circuit the outage opened.
    hung.fault(Fault::Clear).await.unwrap();
    until_vetoed(&s, &id, "re-admitted", None).await;
    s.until_worker(&id, "its circuit tries it again", |w| w["routable"] == true)
        .await;
    let got = spread(&s, 4).await;
    assert!(got[0] > 0, "it serves again: {got:?}");
}

/// A completion of `tokens` prompt tokens (token ids, as the engine counts them), all `token`:
/// prompts of different tokens share no prefix the engine could have cached.
fn prompt_of(token: u32, tokens: usize, max_tokens: u32) -> String {
    serde_json::json!({"model": "test-model", "prompt": vec![token; tokens],
                       "max_tokens": max_tokens, "stream": true})
    .to_string()
}

/// A long prompt's prefill produces no token, moves no counter (vLLM counts a prompt when its
/// first token comes) and finishes nothing for seconds, while the requests behind it wait: from
/// outside, a wedged engine with a queue. On the simulator it takes as long as on the engine,
/// attention growing with the square of the prompt, so the prefill rate measured on shorter
/// prompts understates it; the wedge bound must still cover it.
#[tokio::test]
async fn a_long_prefill_with_requests_waiting_behind_it_is_not_read_as_a_freeze() {
    for flavor in [Flavor::Vllm, Flavor::Sglang] {
        let s = start(1, timed(flavor, 8.0), fast).await;
        // The prefill rate, measured on 4k-token prompts, whose attention costs next to nothing.
        // Each is new to the engine: a prompt it had cached would answer in a fraction of its
        // prefill and read as a faster rate.
        for token in 1..=3 {
            let a = post(
                &s.client,
                &s.url("/v1/completions"),
                &prompt_of(token, 4096, 1),
            )
            .await;
            assert_eq!(a.status, 200, "{}", a.text());
        }
        // 120k tokens: 8.4 engine seconds (1 s here) before the first token; the engine gives
        // the prompt each step's whole budget, so the four requests sent after it wait.
        let long = tokio::spawn({
            let (client, url) = (s.client.clone(), s.url("/v1/completions"));
            async move { post(&client, &url, &prompt_of(7, 120_000, 2)).await }
        });
        s.sims.engines()[0].until(|e| e.running == 1).await;
        let behind = spawn_requests(&s, 4, 8, true);
        s.sims.engines()[0].until(|e| e.waiting == 4).await;
        let mut vetoes = std::collections::BTreeSet::new();
        while !long.is_finished() {
            let workers = s.workers().await;
            if let Some(veto) = workers[0]["vetoes"]["liveness"].as_str() {
                vetoes.insert(veto.to_string());
            }
        }
        let answer = long.await.unwrap();
        assert_eq!(answer.status, 200, "{flavor:?}: {}", answer.text());
        for request in behind {
            assert_eq!(request.await.unwrap().status, 200);
        }
        assert!(
            vetoes.is_empty(),
            "{flavor:?}: the engine prefilling a long prompt was vetoed: {vetoes:?}"
        );
    }
}

/// How an impatient client lets go of its request before any byte comes.
#[derive(Debug, Clone, Copy)]
enum Leaves {
    /// Its own timeout: it closes the connection.
    Timeout,
    /// Its `X-Request-Deadline-Ms`: the gateway ends the request.
    Deadline,
}

/// One request that is let go of after 100 ms without an answer; whether it was answered.
async fn impatient(s: &Setup, leaves: Leaves, stream: bool) -> bool {
    let body = chat_body("test-model", "hi", 4, stream);
    let url = s.url("/v1/chat/completions");
    let patience = Duration::from_millis(100);
    match leaves {
        Leaves::Timeout => tokio::time::timeout(patience, post(&s.client, &url, &body))
            .await
            .is_ok_and(|a| a.status == 200 && a.text().contains("[DONE]") == stream),
        Leaves::Deadline => {
            let headers = [("x-request-deadline-ms", "100")];
            let a = send(&s.client, "POST", &url, Some(&body), &headers).await;
            a.status == 200 && (!stream || a.events().last().map(String::as_str) == Some("[DONE]"))
        }
    }
}

/// Clients that give up long before any bound: every request to the wedged engine ends without
/// a byte, but its silence goes on across them. The engine (vLLM's engine core stuck inside a
/// step: its gauges stand, /health and /metrics still answer) is out once the silence reaches
/// the bound, gets nothing after, and a trial brings it back once it steps again.
#[tokio::test]
async fn a_wedged_engine_is_out_for_clients_that_give_up_and_a_trial_brings_it_back() {
    for (leaves, stream) in [(Leaves::Timeout, true), (Leaves::Deadline, false)] {
        let s = start(2, instant(Flavor::Vllm), |c| {
            fast(c);
            c.control
                .liveness
                .as_mut()
                .expect("on by default")
                .unresponsive = Duration::from_millis(400);
        })
        .await;
        let id = s.worker_id(0).await;
        let wedged = s.sims.engine(0).unwrap();
        wedged
            .fault(Fault::Wedge {
                polls: WedgedPolls::Stale,
            })
            .await
            .unwrap();
        let mut sent = 0;
        while reason(&s.workers().await[0]).is_none() {
            impatient(&s, leaves, stream).await;
            sent += 1;
            assert!(sent < 100, "{leaves:?}: never vetoed");
        }
        let view = &s.workers().await[0];
        assert_eq!(reason(view), Some("unresponsive"), "{leaves:?}: {view}");
        assert!(
            sent >= 4,
            "{leaves:?}: vetoed after {sent} requests, before the bound"
        );
        let at_veto = s.received()[0];
        for _ in 0..6 {
            assert!(
                impatient(&s, leaves, stream).await,
                "{leaves:?}: served elsewhere"
            );
        }
        assert_eq!(
            s.received()[0],
            at_veto,
            "{leaves:?}: nothing sent to it after the veto"
        );
        let view = s.workers().await;
        assert_eq!(
            reason(&view[0]),
            Some("unresponsive"),
            "an empty queue is no sign of life"
        );

        wedged.fault(Fault::Clear).await.unwrap();
        let view = until_vetoed(&s, &id, "re-admitted by a trial", None).await;
        assert_eq!(
            view["vetoes"]["liveness_trial"]["verdict"], "answered",
            "{view}"
        );
        let metrics = get(&s.client, &s.url("/metrics")).await.text();
        let trials = format!(
            "sluice_worker_liveness_trials_total{{worker=\"{id}\",verdict=\"answered\"}} 1"
        );
        assert!(metrics.contains(&trials), "{metrics}");
        assert!(
            wedged.state().trials_received >= 1,
            "a trial is marked as one, apart from the clients' requests"
        );
    }
}

/// An engine that steps — four times slower than it should, so every client gives up before its
/// first token — is busy, not wedged: its reports move, and no silence is held against it.
#[tokio::test]
async fn a_slow_engine_is_never_out_though_every_client_gives_up_on_it() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        fast(c);
        c.control
            .liveness
            .as_mut()
            .expect("on by default")
            .unresponsive = Duration::from_secs(1);
    })
    .await;
    let slow = s.sims.engine(0).unwrap();
    slow.fault(Fault::Slow { factor: 4.0 }).await.unwrap();
    let started = Instant::now();
    let (mut sent, mut answered) = (0, 0);
    while started.elapsed() < Duration::from_secs(3) {
        sent += 1;
        // A new 1024-token prompt each time: 70 ms of prefill at full speed, 280 ms slowed.
        let body = prompt_of(sent, 1024, 4);
        let url = s.url("/v1/completions");
        let post = post(&s.client, &url, &body);
        answered += u32::from(
            tokio::time::timeout(Duration::from_millis(100), post)
                .await
                .is_ok(),
        );
        let view = &s.workers().await[0];
        assert_eq!(reason(view), None, "the slow engine was vetoed: {view}");
    }
    assert_eq!(answered, 0, "every client gave up before its answer");
    assert!(sent >= 10, "{sent}");
}
