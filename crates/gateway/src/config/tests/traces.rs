//! `--enable-trace` and its settings as people type them.

use super::*;

#[test]
fn traces_take_smgs_endpoint_by_protocol_and_refuse_what_cannot_work() {
    use crate::trace::Protocol;
    assert_eq!(
        validated(&[]).unwrap().telemetry.trace,
        None,
        "off by default"
    );
    let on = validated(&["--enable-trace"])
        .unwrap()
        .telemetry
        .trace
        .unwrap();
    assert_eq!(
        (on.endpoint.as_str(), on.protocol, on.sample_ratio),
        ("localhost:4317", Protocol::Grpc, 1.0)
    );
    let http = validated(&["--enable-trace", "--otlp-traces-protocol", "http"])
        .unwrap()
        .telemetry
        .trace
        .unwrap();
    assert_eq!(http.endpoint, "localhost:4318");
    let given = validated(&[
        "--enable-trace",
        "--otlp-traces-endpoint",
        "collector.observability:4317",
        "--trace-sample-ratio",
        "0.01",
    ])
    .unwrap()
    .telemetry
    .trace
    .unwrap();
    assert_eq!(
        (given.endpoint.as_str(), given.sample_ratio),
        ("collector.observability:4317", 0.01)
    );
    for bad in [
        ["--otlp-traces-endpoint", "collector"],
        ["--otlp-traces-endpoint", ":4317"],
        ["--trace-sample-ratio", "1.5"],
        ["--trace-sample-ratio", "-0.1"],
    ] {
        let mut args = vec!["--enable-trace"];
        args.extend(bad);
        assert!(validated(&args).is_err(), "{bad:?}");
    }
}
