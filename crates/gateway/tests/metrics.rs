//! `/metrics` as Prometheus servers and tools read it: text 0.0.4 that `promtool check metrics`
//! accepts (the real promtool, from Debian's `prometheus` package, which `scripts/test` installs),
//! OpenMetrics on request, every family from startup, and no series left behind by a removed
//! worker.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

/// `promtool check metrics` on `text`: its verdict and what it said.
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool is needed ({e}): run scripts/test, or apt-get install prometheus")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && said.trim().is_empty(), said)
}

/// The families a page declares.
fn families(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn promtool_accepts_the_page_and_every_family_is_there_from_startup() {
    let s = start(2, instant(Flavor::Vllm), |_| {}).await;
    let fresh = get(&s.client, &s.url("/metrics")).await;
    assert_eq!(
        fresh.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let at_start = families(&fresh.text());
    let (ok, said) = promtool(&fresh.text());
    assert!(ok, "promtool on a fresh gateway: {said}\n{}", fresh.text());

    // Traffic of every kind: answers, refusals, a stream, a retried failure.
    s.chat(&chat_body("test-model", "hi", 2, false)).await;
    s.chat(&chat_body("test-model", "hi", 2, true)).await;
    s.chat(&chat_body("nope", "hi", 2, false)).await;
    s.sims.engine(0).unwrap().crash().await;
    for i in 0..4 {
        s.chat(&chat_body("test-model", &format!("q{i}"), 1, false))
            .await;
    }
    let busy = get(&s.client, &s.url("/metrics")).await.text();
    let (ok, said) = promtool(&busy);
    assert!(ok, "promtool after traffic: {said}\n{busy}");
    assert_eq!(families(&busy), at_start, "no family appears later");
    for counter in ["sluice_requests_total", "sluice_retries_total"] {
        assert!(
            busy.contains(&format!("# TYPE {counter} counter")),
            "{counter}: {busy}"
        );
    }

    let om = send(
        &s.client,
        "GET",
        &s.url("/metrics"),
        None,
        &[("accept", "application/openmetrics-text; version=1.0.0")],
    )
    .await;
    assert!(om.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(om.text().ends_with("# EOF\n"));
    assert!(om.text().contains("# TYPE sluice_requests counter"));
}

#[tokio::test]
async fn duration_buckets_can_be_set_as_in_smg() {
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.telemetry.duration_buckets = Some(vec![0.25, 7.5]);
    })
    .await;
    s.chat(&chat_body("test-model", "hi", 1, false)).await;
    let text = get(&s.client, &s.url("/metrics")).await.text();
    assert!(
        text.contains(
            r#"sluice_request_duration_seconds_bucket{le="7.5",route="/v1/chat/completions"}"#
        ),
        "{text}"
    );
    assert!(
        !text.contains(r#"le="160.0",route="/v1/chat/completions""#),
        "{text}"
    );
    let (ok, said) = promtool(&text);
    assert!(ok, "{said}");
}
