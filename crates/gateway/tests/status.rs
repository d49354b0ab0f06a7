//! The status page's HTTP surface: the embedded page, its live feed (server-sent events: the
//! charts' history, then an update per tick with a card per worker), and the admin key kept in
//! an HttpOnly cookie for a browser's `EventSource`. The page itself is driven in a real browser
//! by the cli crate's `tests/status_page.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use sluice_core::sse::SseParser;

/// An open `/ui/events` stream, read event by event.
struct Feed {
    body: hyper::body::Incoming,
    parser: SseParser,
    events: std::collections::VecDeque<(String, Value)>,
}

impl Feed {
    async fn open(s: &Setup, headers: &[(&str, &str)]) -> Self {
        let mut request = http::Request::get(s.url("/ui/events"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let response = s.client.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self {
            body: response.into_body(),
            parser: SseParser::new(),
            events: Default::default(),
        }
    }

    /// The next event: its name and its data as JSON.
    async fn next(&mut self) -> (String, Value) {
        loop {
            if let Some(event) = self.events.pop_front() {
                return event;
            }
            let frame = bounded("a feed event", self.body.frame())
                .await
                .expect("the feed stays open")
                .unwrap();
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let events = &mut self.events;
            self.parser
                .feed(&data, |e| {
                    if !e.data.is_empty() {
                        events.push_back((
                            String::from_utf8_lossy(e.kind).into_owned(),
                            serde_json::from_slice(e.data).unwrap(),
                        ));
                    }
                })
                .unwrap();
        }
    }

    /// Updates until one satisfies `done`.
    async fn until(&mut self, what: &str, mut done: impl FnMut(&Value) -> bool) -> Value {
        bounded(what, async {
            loop {
                let (kind, update) = self.next().await;
                if kind == "update" && done(&update) {
                    return update;
                }
            }
        })
        .await
    }
}

/// Twenty updates a second, so a test sees a change soon after it happens.
fn quick_updates(c: &mut Config) {
    c.ui = Some(sluice_gateway::config::UiConfig {
        interval: Duration::from_millis(50),
    });
}

fn states(update: &Value) -> Vec<String> {
    update["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["state"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_page_is_embedded_and_loads_only_its_own_files() {
    let s = start(1, instant(Flavor::Vllm), |_| {}).await;
    for (path, kind, needle) in [
        ("/ui", "text/html; charset=utf-8", "/ui/app.js"),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "EventSource",
        ),
        ("/ui/style.css", "text/css; charset=utf-8", "data-state"),
    ] {
        let a = get(&s.client, &s.url(path)).await;
        assert_eq!(a.status, 200, "{path}");
        assert_eq!(a.headers["content-type"], kind, "{path}");
        assert_eq!(
            a.headers["content-security-policy"], "default-src 'self'; img-src 'self' data:",
            "{path}"
        );
        assert!(a.text().contains(needle), "{path}");
        assert!(
            !a.text().contains("https://"),
            "{path} names nothing outside the gateway"
        );
    }
}

#[tokio::test]
async fn the_feed_sends_the_history_then_a_card_per_worker_and_the_charts_points() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        quick_updates(c);
    })
    .await;
    let mut feed = Feed::open(&s, &[]).await;
    let (kind, history) = feed.next().await;
    assert_eq!(kind, "history");
    assert!(history.is_array(), "{history}");
    let update = feed
        .until("both cards ready", |u| states(u) == ["ready", "ready"])
        .await;
    let card = &update["workers"][0];
    for field in [
        "id",
        "url",
        "role",
        "models",
        "health",
        "circuit",
        "vetoes",
        "in_flight",
        "pending",
    ] {
        assert!(!card[field].is_null(), "{field} in {card}");
    }
    assert_eq!(update["slos"][0]["tier"], "interactive");
    assert_eq!(update["slos"][0]["ttft_ms"], 2000);

    for _ in 0..4 {
        assert_eq!(
            s.chat(&chat_body("test-model", "hi", 4, true)).await.status,
            200
        );
    }
    let update = feed
        .until("the answers in a point", |u| {
            u["point"]["completed"].as_f64() > Some(0.0)
        })
        .await;
    let point = &update["point"];
    assert!(point["within_slo"].as_f64().unwrap() > 0.0, "{point}");
    assert!(point["admitted"].as_f64().unwrap() > 0.0, "{point}");
    assert!(point["ttft_p50"].as_f64().is_some(), "{point}");
    assert!(
        point["t"].as_f64().unwrap() > 1.7e9,
        "unix seconds: {point}"
    );
}

#[tokio::test]
async fn a_frozen_engine_turns_its_card_vetoed_with_the_cause() {
    let s = start(2, instant(Flavor::Vllm), |c| {
        quick_updates(c);
        c.route.policy = sluice_core::policy::Policy::RoundRobin;
        c.control.load.interval = Duration::from_millis(50);
        c.control.liveness.as_mut().expect("on by default").wedge = Duration::from_millis(300);
    })
    .await;
    let mut feed = Feed::open(&s, &[]).await;
    s.sims.engine(0).unwrap().fault(Fault::Pause).await.unwrap();
    // Streams held by the frozen engine are what shows it wedged (round robin sends it two).
    let streams: Vec<_> = (0..4)
        .map(|i| {
            let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
            let body = chat_body("test-model", &format!("long {i}"), 8, true);
            tokio::spawn(async move { post(&client, &url, &body).await })
        })
        .collect();
    let update = feed
        .until("a vetoed card", |u| {
            states(u).contains(&"vetoed".to_string())
        })
        .await;
    let vetoed = update["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["state"] == "vetoed")
        .unwrap();
    assert_eq!(vetoed["id"], s.worker_id(0).await);
    let veto = &vetoed["vetoes"][0];
    assert_eq!(veto["kind"], "wedged", "{vetoed}");
    assert!(!veto["cause"].as_str().unwrap().is_empty(), "{vetoed}");

    s.sims.engine(0).unwrap().fault(Fault::Clear).await.unwrap();
    feed.until("ready again", |u| states(u) == ["ready", "ready"])
        .await;
    for stream in streams {
        assert_eq!(
            bounded("the held streams", stream).await.unwrap().status,
            200
        );
    }
}

#[tokio::test]
async fn with_an_admin_key_the_page_asks_once_and_keeps_it_in_an_httponly_cookie() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.access.keys.admin = Some(ADMIN_KEY.into());
    })
    .await;
    let session = |headers: Vec<(&'static str, String)>| {
        let (client, url) = (s.client.clone(), s.url("/ui/session"));
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            send(&client, "GET", &url, None, &h).await.status
        }
    };
    assert_eq!(
        get(&s.client, &s.url("/ui")).await.status,
        200,
        "the page itself is open"
    );
    assert_eq!(session(vec![]).await, 401);
    let events = get(&s.client, &s.url("/ui/events")).await;
    assert_eq!(events.status, 401);
    assert_eq!(code(&events).as_deref(), Some("invalid_admin_key"));

    let login = |body: &'static str| {
        let (client, url) = (s.client.clone(), s.url("/ui/login"));
        async move { post(&client, &url, body).await }
    };
    assert_eq!(login(r#"{"key":"wrong"}"#).await.status, 401);
    assert_eq!(login(r#"{"nokey":1}"#).await.status, 400);
    assert_eq!(login("not json").await.status, 400);
    let ok = login(r#"{"key":"admin-secret"}"#).await;
    assert_eq!(ok.status, 204);
    let cookie = ok.headers["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(cookie.contains("Path=/ui"), "{cookie}");
    assert!(
        !cookie.contains(ADMIN_KEY),
        "the key is not in the clear: {cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();

    assert_eq!(session(vec![("cookie", pair.clone())]).await, 204);
    assert_eq!(
        session(vec![("authorization", format!("Bearer {ADMIN_KEY}"))]).await,
        204,
        "tools send the key as for any admin read"
    );
    let mut feed = Feed::open(&s, &[("cookie", pair.as_str())]).await;
    assert_eq!(feed.next().await.0, "history");
    let tampered = format!("{}00", pair);
    assert_eq!(session(vec![("cookie", tampered)]).await, 401);

    let out = post(&s.client, &s.url("/ui/logout"), "").await;
    assert_eq!(out.status, 204);
    let cleared = out.headers["set-cookie"].to_str().unwrap();
    assert!(
        cleared.starts_with("sluice_ui=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
}

#[tokio::test]
async fn disable_ui_serves_no_page() {
    let s = start(1, instant(Flavor::Vllm), |c| c.ui = None).await;
    assert_eq!(get(&s.client, &s.url("/ui")).await.status, 404);
    assert_eq!(get(&s.client, &s.url("/ui/events")).await.status, 404);
}
