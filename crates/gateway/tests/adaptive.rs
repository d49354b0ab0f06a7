//! Adaptive control, black-box: a worker's concurrency limit learned from the latency of the
//! responses the gateway relays (`--adaptive-concurrency`), and CoDel on each tier of the gateway
//! queue. The decisions themselves are unit-tested on injected time in `sluice_core::adaptive`;
//! here the real gateway shows them on its HTTP surface (`/workers`, `/admission`, `/metrics`).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::adaptive::{AimdConfig, CodelConfig};
use sluice_core::admission::Tier;
use sluice_core::policy::Policy;
use sluice_gateway::admit::QueueConfig;
use sluice_gateway::control::AdaptiveConfig;
use tokio::task::JoinHandle;

/// Limits judged every `window`, on as few as `min_samples` responses, starting at `initial`
/// and kept within `floor..=ceiling`.
fn adaptive(
    c: &mut Config,
    window: Duration,
    min_samples: u64,
    initial: u64,
    ceiling: Option<u64>,
) {
    c.control.adaptive = Some(AdaptiveConfig {
        window,
        aimd: AimdConfig {
            min_samples,
            ceiling,
            ..AimdConfig::default()
        },
        initial_limit: initial,
    });
    c.route.policy = Policy::RoundRobin;
    c.access.keys.admin = Some(ADMIN_KEY.into());
}

/// Worker `i`'s `concurrency` block in `/workers`.
async fn concurrency(s: &Setup, i: usize) -> Value {
    s.workers().await[i]["concurrency"].clone()
}

/// One streamed chat, read to its end: its status and whether it ended with `[DONE]`.
async fn stream_to_end(client: &HttpClient, url: &str, tag: &str, tokens: u32) -> (u16, bool) {
    let body = chat_body("test-model", tag, tokens, true);
    let answer = send(client, "POST", url, Some(&body), &[]).await;
    let done = answer.events().last().is_some_and(|e| e == "[DONE]");
    (answer.status, done)
}

#[tokio::test]
async fn a_slowed_engines_limit_falls_and_it_gets_fewer_new_requests_while_none_fails() {
    // Round robin would give each engine half; the slowed one's limit must take that away.
    let s = start(2, timed(Flavor::Vllm, 1.0), |c| {
        adaptive(c, Duration::from_millis(500), 3, 6, None)
    })
    .await;
    s.sims
        .engine(1)
        .unwrap()
        .fault(Fault::Slow { factor: 8.0 })
        .await
        .unwrap();
    let slow_id = s.worker_id(1).await;

    // Six clients, each sending one stream after another until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let clients: Vec<JoinHandle<()>> = (0..6)
        .map(|i| {
            let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
            let (stop, done) = (stop.clone(), done_tx.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let answer = stream_to_end(&client, &url, &format!("c{i} r{n}"), 12).await;
                    let _ = done.send(answer);
                }
            })
        })
        .collect();

    // Each finished request is the moment to look again.
    let mut answers = Vec::new();
    let fell = bounded("the slowed engine's limit to fall", async {
        loop {
            answers.push(done_rx.recv().await.unwrap());
            let view = concurrency(&s, 1).await;
            if view["limit"].as_u64().unwrap() < 6 {
                return view;
            }
        }
    })
    .await;
    assert_eq!(fell["last_window"]["decision"], "decrease", "{fell}");
    assert!(
        fell["last_window"]["itl_p95_ms"].as_f64().unwrap() >= 25.0,
        "lowered for its inter-token latency: {fell}"
    );

    // From here on, the share of new requests each engine gets.
    let before = s.received();
    for _ in 0..30 {
        answers.push(bounded("a request to end", done_rx.recv()).await.unwrap());
    }
    let after = s.received();
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        bounded("the clients to stop", client).await.unwrap();
    }
    while let Ok(answer) = done_rx.try_recv() {
        answers.push(answer);
    }
    let fast = after[0] - before[0];
    let slow = after[1] - before[1];
    assert!(
        slow * 3 < fast + slow,
        "the slowed engine got {slow} of {} new requests; round robin alone gives it half",
        fast + slow
    );
    assert!(
        answers.iter().all(|a| *a == (200, true)),
        "no request failed: {:?}",
        answers
            .iter()
            .filter(|a| **a != (200, true))
            .collect::<Vec<_>>()
    );
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        metrics.contains(&format!(
            "sluice_worker_concurrency_limit{{worker=\"{slow_id}\"}}"
        )),
        "the limit is a gauge per worker"
    );
}

#[tokio::test]
async fn a_worker_at_its_limit_is_never_steered_to_and_a_queue_holds_its_requests() {
    // Worker 0 at a fixed limit of 1; worker 1 vetoed as overloaded by its reported queue.
    let s = start(2, timed(Flavor::Vllm, 1.0), |c| {
        adaptive(c, Duration::from_secs(3600), 1_000, 1, Some(1));
        c.control.load.interval = Duration::from_millis(50);
        c.control.load.min_interval = Duration::from_millis(10);
        // Seed 000's steering, which the queue below replaces.
        c.admission.queue = None;
    })
    .await;
    let (limited, vetoed) = (s.worker_id(0).await, s.worker_id(1).await);
    s.sims
        .engine(1)
        .unwrap()
        .fault(Fault::Report {
            rank: None,
            waiting: Some(50),
            running: None,
            kv_usage: None,
        })
        .await
        .unwrap();
    s.until_worker(&vetoed, "worker 1 vetoed", |w| {
        w["vetoes"]["overloaded"] == true
    })
    .await;
    // Round robin's first pick is worker 0, the only unvetoed one: it takes the stream.
    let held = open_stream(&s, "a long answer", 4000).await;
    let view = concurrency(&s, 0).await;
    assert_eq!(
        (view["limit"].as_u64(), &view["at_limit"]),
        (Some(1), &true.into())
    );
    let before = s.received();

    // Steering takes the overloaded worker rather than the one at its limit.
    let answer = s.chat(&chat_body("test-model", "steered", 2, false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let after = s.received();
    assert_eq!(
        (after[0] - before[0], after[1] - before[1]),
        (0, 1),
        "worker {limited} at its limit was not the target of steering"
    );
    drop(held);
}

#[tokio::test]
async fn with_every_worker_at_its_limit_a_request_waits_in_the_queue_or_is_refused_without_one() {
    let tune = |queue: bool| {
        move |c: &mut Config| {
            adaptive(c, Duration::from_secs(3600), 1_000, 1, Some(1));
            c.admission.default_tier = Tier::Interactive;
            c.admission.queue = queue.then(|| QueueConfig {
                size: 10,
                timeouts: [Duration::from_secs(30); 3],
                shed: false,
                shed_retry_after: Duration::from_secs(10),
                codel: None,
            });
        }
    };
    // No queue: seed 000's rule, with nowhere to steer.
    let s = start(1, timed(Flavor::Vllm, 1.0), tune(false)).await;
    let held = open_stream(&s, "a long answer", 4000).await;
    let refused = s.chat(&chat_body("test-model", "refused", 2, false)).await;
    assert_eq!(refused.status, 503);
    assert_eq!(code(&refused).as_deref(), Some("no_available_workers"));
    assert!(
        refused.text().contains("at their concurrency limit"),
        "{}",
        refused.text()
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(s.received(), vec![1], "the engine never saw it");
    drop(held);

    // A queue: the request waits and goes the moment the place frees.
    let s = start(1, timed(Flavor::Vllm, 1.0), tune(true)).await;
    let held = open_stream(&s, "a long answer", 4000).await;
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let waiting = tokio::spawn(async move {
        let body = chat_body("test-model", "waits", 2, false);
        send(&client, "POST", &url, Some(&body), &[]).await
    });
    bounded("the request to wait in the queue", async {
        loop {
            let view = get_admin(&s.client, &s.url("/admission")).await.json();
            if view["queue"]["tiers"][0]["depth"] == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(s.received(), vec![1]);
    drop(held);
    let answer = bounded("the waiter's answer", waiting).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// A queue of one place at a time (`--max-concurrent-requests 1`) whose tiers run CoDel with
/// `target` and `interval`.
fn codel_queue(c: &mut Config, target: Duration, interval: Duration) {
    c.access.keys.admin = Some(ADMIN_KEY.into());
    c.admission.default_tier = Tier::Interactive;
    c.admission.max_concurrent = Some(1);
    c.admission.queue = Some(QueueConfig {
        size: 10,
        timeouts: [Duration::from_secs(60); 3],
        shed: false,
        shed_retry_after: Duration::from_secs(10),
        codel: Some([CodelConfig { target, interval }; 3]),
    });
}

/// The interactive tier of `/admission`'s queue view.
async fn interactive(s: &Setup) -> Value {
    let view = get_admin(&s.client, &s.url("/admission")).await.json();
    view["queue"]["tiers"][0].clone()
}

/// Reads `/admission` until the interactive tier's view satisfies `done`.
async fn until_interactive(s: &Setup, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    bounded(what, async {
        loop {
            let tier = interactive(s).await;
            if done(&tier) {
                return tier;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

fn spawn_chat(s: &Setup, tag: &str) -> JoinHandle<Answer> {
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let body = chat_body("test-model", tag, 2, false);
    tokio::spawn(async move { send(&client, "POST", &url, Some(&body), &[]).await })
}

/// `sluice_admission_rejected_total{reason="codel_drop"}` for the interactive tier.
async fn codel_drops(s: &Setup) -> f64 {
    let metrics = get(&s.client, &s.url("/metrics")).await.text();
    metrics
        .lines()
        .find(|l| {
            l.starts_with("sluice_admission_rejected_total")
                && l.contains("reason=\"codel_drop\"")
                && l.contains("tier=\"interactive\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("the codel_drop series exists from startup")
}

#[tokio::test]
async fn a_burst_that_drains_within_the_interval_passes_codel_untouched() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        codel_queue(c, Duration::from_millis(100), Duration::from_secs(5))
    })
    .await;
    let held = open_stream(&s, "a long answer", 4000).await;
    let burst: Vec<_> = (0..4)
        .map(|i| spawn_chat(&s, &format!("burst {i}")))
        .collect();
    // The burst stands above its target (its head waited past 100 ms, and the dispatcher saw
    // it), then drains well within the 5 s interval.
    let seen = until_interactive(&s, "the burst to stand above target", |t| {
        t["depth"] == 4 && t["codel"]["above_target"] == true
    })
    .await;
    assert_eq!(seen["codel"]["dropping"], false);
    drop(held);
    for request in burst {
        let answer = bounded("a burst request", request).await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(codel_drops(&s).await, 0.0);
}

#[tokio::test]
async fn a_standing_queue_is_cut_at_its_head_with_codel_drop_until_nothing_needs_refusing() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        codel_queue(c, Duration::from_millis(100), Duration::from_millis(1500))
    })
    .await;
    let held = open_stream(&s, "a long answer", 4000).await;
    let oldest = spawn_chat(&s, "oldest");
    until_interactive(&s, "the oldest to wait", |t| t["depth"] == 1).await;
    let mut others: Vec<_> = (0..3)
        .map(|i| spawn_chat(&s, &format!("later {i}")))
        .collect();
    until_interactive(&s, "four waiting", |t| t["depth"] == 4).await;

    // Nothing leaves: after a whole interval above target, CoDel drops the head.
    let dropped = bounded("the head to be cut", oldest).await.unwrap();
    assert!(
        others.iter().all(|o| !o.is_finished()),
        "the head went first (the next cut is interval / sqrt(2) later)"
    );
    assert_eq!(dropped.status, 503, "{}", dropped.text());
    assert_eq!(code(&dropped).as_deref(), Some("codel_drop"));
    assert!(dropped.headers.contains_key("retry-after"));
    assert_eq!(
        dropped.json()["error"]["type"],
        "server_error",
        "the OpenAI error shape"
    );
    let tier = interactive(&s).await;
    assert!(
        tier["codel"]["count"].as_u64().unwrap() >= 1,
        "the state shows the cut: {tier}"
    );
    assert!(codel_drops(&s).await >= 1.0);
    assert_eq!(tier["codel"]["dropping"], true, "{tier}");
    // While it is cut, an arrival that would wait past the target is refused at once.
    let late = s.chat(&chat_body("test-model", "late", 2, false)).await;
    assert_eq!(
        code(&late).as_deref(),
        Some("codel_drop"),
        "{}",
        late.text()
    );
    assert!(others.iter().all(|o| !o.is_finished()));

    // Room opens: what is left goes.
    drop(held);
    let mut statuses = Vec::new();
    for other in others.drain(..) {
        statuses.push(bounded("a later request", other).await.unwrap().status);
    }
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 503));
    assert_eq!(
        s.received(),
        vec![1 + statuses.iter().filter(|s| **s == 200).count() as u64]
    );
    // The queue drained, the state lasts until an interval has passed without a refusal.
    let refused = codel_drops(&s).await;
    let drained = interactive(&s).await;
    assert_eq!(drained["depth"], 0, "{drained}");
    assert_eq!(
        drained["codel"]["dropping"], true,
        "an empty queue does not end it: {drained}"
    );
    until_interactive(&s, "the state to end", |t| t["codel"]["dropping"] == false).await;
    assert_eq!(codel_drops(&s).await, refused, "nothing refused to end it");
}

#[tokio::test]
async fn whole_answers_are_measured_by_their_time_over_their_tokens() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        adaptive(c, Duration::from_secs(1), 4, 8, None)
    })
    .await;
    for i in 0..4 {
        let answer = s
            .chat(&chat_body("test-model", &format!("whole {i}"), 6, false))
            .await;
        assert_eq!(answer.status, 200);
    }
    // A window those four fell in is judged within a second (they may straddle two), and its
    // figures stay in view for a second.
    let judged = bounded("a window with the answers", async {
        loop {
            let view = concurrency(&s, 0).await;
            if view["last_window"]["samples"].as_u64().unwrap_or(0) > 0 {
                return view;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let window = &judged["last_window"];
    assert!(window["itl_p95_ms"].as_f64().unwrap() > 0.0, "{judged}");
    assert!(
        window["ttft_p95_ms"].is_null(),
        "a whole answer has no first token of its own: {judged}"
    );
}

#[tokio::test]
async fn a_limit_starts_at_the_running_window_sglang_reports_and_at_the_flag_for_vllm() {
    let tune = |c: &mut Config| {
        adaptive(c, Duration::from_millis(200), 1_000, 8, None);
        c.control.load.interval = Duration::from_millis(50);
        c.control.load.min_interval = Duration::from_millis(10);
    };
    // SGLang's `/v1/loads` carries `max_running_requests` (the sim reports its --max-num-seqs).
    let sglang = start(1, timed(Flavor::Sglang, 1.0), tune).await;
    let window = sglang
        .sims
        .engine(0)
        .unwrap()
        .engine()
        .unwrap()
        .config()
        .max_num_seqs;
    let followed = bounded("the limit to follow the engine's window", async {
        loop {
            let view = concurrency(&sglang, 0).await;
            if view["limit"] != 8 {
                return view;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        followed["limit"].as_u64(),
        Some(u64::from(window)),
        "{followed}"
    );

    // vLLM's metrics do not carry it: the flag's figure stands.
    let vllm = start(1, timed(Flavor::Vllm, 1.0), tune).await;
    let judged = bounded("a window judged after a load report", async {
        loop {
            let worker = vllm.workers().await.remove(0);
            let report_age = worker["engine_load"]["age_secs"].as_f64();
            let window_age = worker["concurrency"]["last_window"]["age_secs"].as_f64();
            if let (Some(report), Some(window)) = (report_age, window_age) {
                if window < report {
                    return worker;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(judged["concurrency"]["limit"], 8, "{judged}");
}
