//! Worker specs: every field validated when it arrives, each error naming its field.

use super::*;

fn field_of(body: &str) -> String {
    WorkerSpec::parse(body.as_bytes()).unwrap_err().field
}

#[test]
fn intervals_under_their_floor_are_refused() {
    for (body, field) in [
        (
            r#"{"url":"http://x:1","health":{"check_interval_secs":0.000001}}"#,
            "health.check_interval_secs",
        ),
        (
            r#"{"url":"http://x:1","health":{"timeout_secs":0.001}}"#,
            "health.timeout_secs",
        ),
        (
            r#"{"url":"http://x:1","load_monitor_interval_secs":0.01}"#,
            "load_monitor_interval_secs",
        ),
    ] {
        assert_eq!(WorkerSpec::parse(body.as_bytes()).unwrap_err().field, field);
    }
    let floor =
        r#"{"url":"http://x:1","health":{"check_interval_secs":0.05,"drain_settle_secs":0}}"#;
    assert!(WorkerSpec::parse(floor.as_bytes()).is_ok());
}

#[test]
fn a_full_spec_parses_and_normalizes() {
    let s = WorkerSpec::parse(
        br#"{"url":"http://10.0.0.5:8000/","api_key":"k","model_id":"m","http2":true,"labels":{"gpu":"h100"}}"#,
    )
    .unwrap();
    assert_eq!(s.url, "http://10.0.0.5:8000");
    assert_eq!(s.api_key.as_deref(), Some("k"));
    assert_eq!(s.http2, Some(true));
    assert_eq!(s.labels["gpu"], "h100");
    assert_eq!(
        WorkerSpec::from_url("http://host", None).unwrap().url,
        "http://host:80"
    );
}

#[test]
fn every_invalid_field_is_named() {
    assert_eq!(field_of(r#"{}"#), "url");
    assert_eq!(field_of(r#"{"url":5}"#), "url");
    assert_eq!(field_of(r#"{"url":"ftp://x:1"}"#), "url");
    assert_eq!(field_of(r#"{"url":"http://x:1/v1"}"#), "url");
    assert_eq!(field_of(r#"{"url":"http://u:p@x:1"}"#), "url");
    assert_eq!(field_of(r#"{"url":"not a url"}"#), "url");
    assert_eq!(field_of(r#"{"url":"http://x:1","http2":"yes"}"#), "http2");
    assert_eq!(field_of(r#"{"url":"http://x:1","api_key":""}"#), "api_key");
    assert_eq!(
        field_of(r#"{"url":"http://x:1","labels":{"a":1}}"#),
        "labels.a"
    );
    assert_eq!(field_of(r#"{"url":"http://x:1","helth":{}}"#), "helth");
    assert_eq!(field_of(r#"[1]"#), "body");
    assert_eq!(field_of(r#"{"url":"#), "body");
}

#[test]
fn the_health_block_is_validated_field_by_field() {
    let s = WorkerSpec::parse(
        br#"{"url":"http://x:1","health":{"check_interval_secs":15,"timeout_secs":2.5,"failure_threshold":5,"success_threshold":1,"disable_health_check":false,"drain_settle_secs":0}}"#,
    )
    .unwrap();
    assert_eq!(s.health.check_interval_secs, Some(15.0));
    assert_eq!(s.health.timeout_secs, Some(2.5));
    assert_eq!(s.health.failure_threshold, Some(5));
    assert_eq!(s.health.success_threshold, Some(1));
    assert_eq!(s.health.disable_health_check, Some(false));
    assert_eq!(s.health.drain_settle_secs, Some(0.0));
    let bad = [
        (r#"{"check_interval_secs":0}"#, "health.check_interval_secs"),
        (r#"{"timeout_secs":-1}"#, "health.timeout_secs"),
        (r#"{"timeout_secs":"5"}"#, "health.timeout_secs"),
        (r#"{"failure_threshold":0}"#, "health.failure_threshold"),
        (r#"{"success_threshold":1.5}"#, "health.success_threshold"),
        (
            r#"{"disable_health_check":"no"}"#,
            "health.disable_health_check",
        ),
        (r#"{"drain_settle_secs":-0.5}"#, "health.drain_settle_secs"),
        (r#"{"interval":5}"#, "health.interval"),
    ];
    for (block, field) in bad {
        let body = format!(r#"{{"url":"http://x:1","health":{block}}}"#);
        assert_eq!(field_of(&body), field, "{block}");
    }
    assert_eq!(field_of(r#"{"url":"http://x:1","health":5}"#), "health");
}

#[test]
fn the_overload_block_and_poll_interval_are_validated() {
    let s = WorkerSpec::parse(
        br#"{"url":"http://x:1","overload":{"waiting_requests":4,"token_usage":0.7},"load_monitor_interval_secs":2}"#,
    )
    .unwrap();
    assert_eq!(s.overload.waiting_requests, Some(4));
    assert_eq!(s.overload.token_usage, Some(0.7));
    assert_eq!(s.load_monitor_interval_secs, Some(2.0));
    for (body, field) in [
        (
            r#"{"overload":{"waiting_requests":0}}"#,
            "overload.waiting_requests",
        ),
        (
            r#"{"overload":{"waiting_requests":2.5}}"#,
            "overload.waiting_requests",
        ),
        (r#"{"overload":{"token_usage":0}}"#, "overload.token_usage"),
        (
            r#"{"overload":{"token_usage":1.2}}"#,
            "overload.token_usage",
        ),
        (r#"{"overload":{"queue":3}}"#, "overload.queue"),
        (r#"{"overload":[]}"#, "overload"),
        (
            r#"{"load_monitor_interval_secs":0}"#,
            "load_monitor_interval_secs",
        ),
    ] {
        let full = format!(r#"{{"url":"http://x:1",{}"#, &body[1..]);
        assert_eq!(field_of(&full), field, "{body}");
    }
    let e = WorkerPatch::parse(br#"{"overload":{"waiting_requests":3}}"#).unwrap_err();
    assert_eq!(e.field, "overload");
    assert!(e.message.contains("PUT"), "{}", e.message);
}

#[test]
fn a_health_patch_merges_field_by_field() {
    let mut s = WorkerSpec::parse(
        br#"{"url":"http://x:1","health":{"check_interval_secs":15,"failure_threshold":5}}"#,
    )
    .unwrap();
    let p =
        WorkerPatch::parse(br#"{"health":{"timeout_secs":3,"failure_threshold":null}}"#).unwrap();
    s.apply(p);
    assert_eq!(s.health.check_interval_secs, Some(15.0), "left out: kept");
    assert_eq!(s.health.timeout_secs, Some(3.0), "given: set");
    assert_eq!(
        s.health.failure_threshold, None,
        "null: back to the gateway value"
    );
    let shown = serde_json::to_value(&s).unwrap();
    assert_eq!(
        shown["health"],
        serde_json::json!({"check_interval_secs":15.0,"timeout_secs":3.0})
    );
}

#[test]
fn the_api_key_is_never_serialized() {
    let s = WorkerSpec::from_url("http://x:1", Some("secret".into())).unwrap();
    let shown = serde_json::to_string(&s).unwrap();
    assert!(!shown.contains("secret"), "{shown}");
}

#[test]
fn patches_touch_only_patchable_fields() {
    let p = WorkerPatch::parse(br#"{"labels":{"zone":"b"},"api_key":null}"#).unwrap();
    assert_eq!(p.api_key, Some(None));
    let mut s = WorkerSpec::from_url("http://x:1", Some("k".into())).unwrap();
    s.apply(p);
    assert_eq!(s.api_key, None);
    assert_eq!(s.labels["zone"], "b");
    let e = WorkerPatch::parse(br#"{"url":"http://y:1"}"#).unwrap_err();
    assert_eq!(e.field, "url");
    assert!(e.message.contains("PUT"));
}
