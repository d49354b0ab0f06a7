//! The operators' own tools stay true to the gateway: the Grafana dashboard
//! (`deploy/grafana/sluice.json`) and the Prometheus alert rules (`deploy/prometheus/`) name
//! only metrics a gateway exports, and the rules pass the real `promtool check rules` and their
//! own `promtool test rules` (Debian's `prometheus` package, which `scripts/test` installs).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sluice_gateway::config::{ClampSpec, DegradationSpec};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

/// Every sample name a gateway with everything on exports: the queue, the degradation ladder
/// and adaptive limits beside the defaults, and one worker.
async fn exported() -> BTreeSet<String> {
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let mut settings = sluice_gateway::Settings::defaults();
    settings.listen.port = 0;
    settings.worker_urls = sims.urls();
    settings.admission.queue_size = 16;
    settings.adaptive.adaptive_concurrency = true;
    settings.degradation.degradation = Some(DegradationSpec {
        clamp: vec![ClampSpec {
            models: None,
            tiers: None,
            max_tokens: Some(64),
        }],
        ..DegradationSpec::default()
    });
    let s = serve(sims, settings.validate().unwrap()).await;
    // Histograms and labelled families show their series once something is observed.
    assert_eq!(
        s.chat(&chat_body("test-model", "hi", 4, true)).await.status,
        200
    );
    let text = get(&s.client, &s.url("/metrics")).await.text();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .chain(
            // A family with no series yet is still declared.
            text.lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .map(|l| l.split(' ').next().unwrap().to_string()),
        )
        .collect()
}

/// The metric names an expression uses (`sluice_*` identifiers).
fn names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("sluice_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// Every string under a key named `expr`, `query` or `definition`, anywhere in `value`.
fn queries(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "definition", Value::String(q)) => out.push(q.clone()),
                    ("query", Value::String(q)) if q.contains('(') => out.push(q.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

fn unknown_names(found: &[String], exported: &BTreeSet<String>) -> Vec<String> {
    found
        .iter()
        .flat_map(|q| names_in(q))
        .filter(|n| !exported.contains(n))
        .collect()
}

#[tokio::test]
async fn every_dashboard_and_alert_query_names_a_metric_sluice_exports() {
    let exported = exported().await;

    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy("grafana/sluice.json")).unwrap())
            .unwrap();
    let mut found = Vec::new();
    queries(&dashboard, &mut found);
    assert!(found.len() >= 20, "the dashboard's queries: {found:?}");
    for q in &found {
        assert!(!names_in(q).is_empty(), "a query on sluice's metrics: {q}");
    }
    assert_eq!(
        unknown_names(&found, &exported),
        Vec::<String>::new(),
        "dashboard"
    );

    let rules: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy("prometheus/sluice-alerts.yaml")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    queries(&rules, &mut exprs);
    assert_eq!(exprs.len(), 6, "{exprs:?}");
    assert_eq!(
        unknown_names(&exprs, &exported),
        Vec::<String>::new(),
        "alert rules"
    );
}

/// `promtool` with `args`, from deploy/prometheus: whether it passed, and what it said.
fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy("prometheus"))
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool is needed ({e}): run scripts/test, or apt-get install prometheus")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn the_alert_rules_pass_promtool_and_fire_on_the_series_that_should_fire_them() {
    let (ok, said) = promtool(&["check", "rules", "sluice-alerts.yaml"]);
    assert!(ok && said.contains("SUCCESS: 6 rules found"), "{said}");
    let (ok, said) = promtool(&["test", "rules", "sluice-alerts.test.yaml"]);
    assert!(ok, "{said}");
}

#[test]
fn names_are_read_from_expressions() {
    assert_eq!(
        names_in("sum(rate(sluice_a_total{x=\"1\"}[1m])) / sluice_b"),
        ["sluice_a_total", "sluice_b"]
    );
}
