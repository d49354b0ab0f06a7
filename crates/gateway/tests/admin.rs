//! The admin API: who may change workers, and what each change does.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

const KEY: &str = ADMIN_KEY;

async fn admin(
    s: &Setup,
    method: &str,
    path: &str,
    body: Option<&str>,
    key: Option<&str>,
) -> Answer {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    send(&s.client, method, &s.url(path), body, &headers).await
}

#[tokio::test]
async fn without_an_admin_key_mutations_are_refused_with_a_hint() {
    let s = start(1, instant(Flavor::Vllm), |_| {}).await;
    let a = admin(
        &s,
        "POST",
        "/workers",
        Some(r#"{"url":"http://127.0.0.1:1"}"#),
        Some("guess"),
    )
    .await;
    assert_eq!(a.status, 403);
    assert_eq!(code(&a).as_deref(), Some("admin_api_disabled"));
    assert!(a.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--admin-api-key"));
    let id = s.worker_id(0).await;
    assert_eq!(
        admin(&s, "DELETE", &format!("/workers/{id}"), None, None)
            .await
            .status,
        403
    );
    assert_eq!(
        admin(&s, "GET", "/workers", None, None).await.status,
        200,
        "reading is open"
    );
}

#[tokio::test]
async fn workers_are_registered_changed_and_removed() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.access.keys.admin = Some(KEY.into());
        c.fleet.drain_settle = Duration::from_millis(100);
    })
    .await;
    let extra = SimFleet::start(FleetConfig::local(1, instant(Flavor::Sglang)))
        .await
        .unwrap();
    let url = extra.urls()[0].clone();
    let spec = format!(r#"{{"url":"{url}","labels":{{"zone":"a"}}}}"#);

    assert_eq!(
        admin(&s, "POST", "/workers", Some(&spec), None)
            .await
            .status,
        401
    );
    assert_eq!(
        admin(&s, "POST", "/workers", Some(&spec), Some("wrong"))
            .await
            .status,
        401
    );
    let bad = admin(
        &s,
        "POST",
        "/workers",
        Some(r#"{"url":"ftp://x:1"}"#),
        Some(KEY),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "url");
    let bad = admin(
        &s,
        "POST",
        "/workers",
        Some(&format!(r#"{{"url":"{url}","helth":{{}}}}"#)),
        Some(KEY),
    )
    .await;
    assert_eq!(bad.json()["error"]["param"], "helth");
    assert_eq!(s.workers().await.len(), 1, "nothing invalid was registered");

    let created = admin(&s, "POST", "/workers", Some(&spec), Some(KEY)).await;
    assert_eq!(created.status, 202, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        created.headers["location"],
        format!("/workers/{id}").as_str()
    );
    let dup = admin(&s, "POST", "/workers", Some(&spec), Some(KEY)).await;
    assert_eq!(dup.status, 409);
    assert!(dup.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("PUT"));

    s.until_workers("the new worker ready", |w| all_ready(w) && w.len() == 2)
        .await;
    let shown = admin(&s, "GET", &format!("/workers/{id}"), None, Some(KEY))
        .await
        .json();
    assert_eq!(shown["status"], "ready");
    assert_eq!(shown["flavor"], "sglang");
    assert_eq!(shown["spec"]["labels"]["zone"], "a");
    assert_eq!(shown["circuit"]["state"], "closed");

    let patched = admin(
        &s,
        "PATCH",
        &format!("/workers/{id}"),
        Some(r#"{"labels":{"zone":"b"}}"#),
        Some(KEY),
    )
    .await;
    assert_eq!(patched.status, 200);
    assert_eq!(patched.json()["spec"]["labels"]["zone"], "b");
    let refused = admin(
        &s,
        "PATCH",
        &format!("/workers/{id}"),
        Some(r#"{"url":"http://127.0.0.1:2"}"#),
        Some(KEY),
    )
    .await;
    assert_eq!(refused.status, 400);

    let replaced = admin(
        &s,
        "PUT",
        &format!("/workers/{id}"),
        Some(&format!(r#"{{"url":"{url}"}}"#)),
        Some(KEY),
    )
    .await;
    assert_eq!(replaced.status, 202);
    assert_eq!(replaced.json()["id"], id.as_str(), "same id");

    s.until_workers("ready again", all_ready).await;
    let gone = admin(&s, "DELETE", &format!("/workers/{id}"), None, Some(KEY)).await;
    assert_eq!(gone.status, 202);
    assert_eq!(gone.json()["status"], "draining");
    let drained = admin(&s, "GET", &format!("/workers/{id}"), None, Some(KEY))
        .await
        .json();
    assert_eq!(drained["status"], "draining");
    assert_eq!(drained["routable"], false, "no new requests");
    s.until_workers("removed", |w| w.len() == 1).await;
    assert_eq!(
        admin(&s, "GET", &format!("/workers/{id}"), None, Some(KEY))
            .await
            .status,
        404
    );
    assert_eq!(
        admin(&s, "DELETE", "/workers/nope", None, Some(KEY))
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn with_an_admin_key_reads_need_it_too_and_metrics_and_probes_stay_open() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.access.keys.admin = Some(KEY.into())
    })
    .await;
    let id = s.worker_id(0).await;
    for path in [
        "/workers".to_string(),
        format!("/workers/{id}"),
        "/loads".into(),
        "/busy_threshold".into(),
    ] {
        let refused = admin(&s, "GET", &path, None, None).await;
        assert_eq!(refused.status, 401, "{path}");
        assert_eq!(
            code(&refused).as_deref(),
            Some("invalid_admin_key"),
            "{path}"
        );
        assert!(
            !refused.text().contains("127.0.0.1"),
            "{path}: no address leaks"
        );
        assert_eq!(
            admin(&s, "GET", &path, None, Some("guess")).await.status,
            401
        );
        assert_eq!(
            admin(&s, "GET", &path, None, Some(KEY)).await.status,
            200,
            "{path}"
        );
    }
    for open in ["/metrics", "/readiness", "/liveness", "/health"] {
        assert_eq!(
            admin(&s, "GET", open, None, None).await.status,
            200,
            "{open}"
        );
    }

    let opened = start(1, instant(Flavor::Vllm), |c| {
        c.access.keys.admin = Some(KEY.into());
        c.access.keys.reads_open = true;
    })
    .await;
    assert_eq!(
        admin(&opened, "GET", "/workers", None, None).await.status,
        200
    );
    let change = admin(&opened, "POST", "/busy_threshold", Some("{}"), None).await;
    assert_eq!(change.status, 401, "changes still need the key");
}

#[tokio::test]
async fn one_engine_is_one_worker_however_its_address_is_spelled_and_absurd_specs_are_refused() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.access.keys.admin = Some(KEY.into())
    })
    .await;
    let port = s.sims.urls()[0].rsplit(':').next().unwrap().to_string();
    let id = s.worker_id(0).await;
    for spelling in ["localhost", "127.1", "0x7f000001", "2130706433"] {
        let spec = format!(r#"{{"url":"http://{spelling}:{port}"}}"#);
        let a = admin(&s, "POST", "/workers", Some(&spec), Some(KEY)).await;
        assert_eq!(a.status, 409, "{spelling}: {}", a.text());
        assert_eq!(code(&a).as_deref(), Some("worker_exists"));
        assert!(
            a.text().contains(&id),
            "names the registration it is: {}",
            a.text()
        );
    }
    for (spec, param) in [
        (r#"{"url":"http://127.0.0.1:0"}"#, "url"),
        (
            r#"{"url":"http://127.0.0.1:1","health":{"check_interval_secs":0.000001}}"#,
            "health.check_interval_secs",
        ),
    ] {
        let a = admin(&s, "POST", "/workers", Some(spec), Some(KEY)).await;
        assert_eq!(a.status, 400, "{spec}");
        assert_eq!(a.json()["error"]["param"], param);
    }
    assert_eq!(s.workers().await.len(), 1);
}

#[tokio::test]
async fn browsers_from_the_allowed_origins_may_call_the_gateway() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.access.cors = Some(sluice_gateway::config::CorsOrigins::List(vec![
            http::HeaderValue::from_static("http://localhost:3000"),
        ]));
    })
    .await;
    let url = s.url("/v1/chat/completions");
    let preflight = send(
        &s.client,
        "OPTIONS",
        &url,
        None,
        &[
            ("origin", "http://localhost:3000"),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "content-type,authorization",
            ),
        ],
    )
    .await;
    assert_eq!(preflight.status, 200);
    assert_eq!(
        preflight.headers["access-control-allow-origin"],
        "http://localhost:3000"
    );
    let body = chat_body("test-model", "hi", 1, false);
    let allowed = send(
        &s.client,
        "POST",
        &url,
        Some(&body),
        &[("origin", "http://localhost:3000")],
    )
    .await;
    assert_eq!(allowed.status, 200);
    assert_eq!(
        allowed.headers["access-control-allow-origin"],
        "http://localhost:3000"
    );
    let elsewhere = send(
        &s.client,
        "POST",
        &url,
        Some(&body),
        &[("origin", "http://evil.example")],
    )
    .await;
    assert!(elsewhere
        .headers
        .get("access-control-allow-origin")
        .is_none());

    let closed = start(1, instant(Flavor::Vllm), |_| {}).await;
    let plain = send(
        &closed.client,
        "POST",
        &closed.url("/v1/chat/completions"),
        Some(&body),
        &[("origin", "http://localhost:3000")],
    )
    .await;
    assert!(
        plain.headers.get("access-control-allow-origin").is_none(),
        "no allowance unless configured"
    );
}

#[tokio::test]
async fn smgs_control_plane_keys_give_admin_and_read_only_access() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.access.keys.control_plane = vec![
            "ops:Operators:admin:adm-secret".parse().unwrap(),
            "dash:Dashboards:user:read-secret".parse().unwrap(),
            // What the test helpers read /workers with.
            format!("tests:Tests:user:{ADMIN_KEY}").parse().unwrap(),
        ];
    })
    .await;
    assert_eq!(admin(&s, "GET", "/workers", None, None).await.status, 401);
    assert_eq!(
        admin(&s, "GET", "/workers", None, Some("read-secret"))
            .await
            .status,
        200
    );
    let spec = r#"{"url":"http://127.0.0.1:1"}"#;
    let refused = admin(&s, "POST", "/workers", Some(spec), Some("read-secret")).await;
    assert_eq!(refused.status, 401, "a user key only reads");
    let created = admin(&s, "POST", "/workers", Some(spec), Some("adm-secret")).await;
    assert_eq!(created.status, 202, "{}", created.text());
}
