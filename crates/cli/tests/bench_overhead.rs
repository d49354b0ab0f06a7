//! `sluice bench overhead` end to end: it starts engines and a gateway, measures both, and
//! stops them. Only that it works is checked here; its figures belong in docs/benchmarks.md.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

#[test]
fn overhead_measures_direct_and_sluice_and_reports_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "overhead",
            "--targets",
            "direct,sluice",
            "--connections",
            "1,4",
            "--stream-connections",
            "2",
            "--stream-tokens",
            "20",
            "--warmup-secs",
            "0.1",
            "--window-secs",
            "0.3",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let shape: Vec<(&str, &str, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["target"].as_str().unwrap(),
                r["layout"].as_str().unwrap(),
                r["load"].as_str().unwrap(),
                r["connections"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("direct", "direct", "small", 1),
            ("direct", "direct", "small", 4),
            ("direct", "direct", "stream", 2),
            ("sluice", "own_core", "small", 1),
            ("sluice", "own_core", "small", 4),
            ("sluice", "own_core", "stream", 2),
            ("sluice", "shared_core", "small", 1),
        ]
    );
    for row in rows {
        assert!(row["completed"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(row["failed"], 0, "{row}");
        let gateway = row["target"] == "sluice";
        assert_eq!(row["gateway_cpu_secs"].is_number(), gateway, "{row}");
        assert_eq!(row["added_p50_us"].is_number(), gateway, "{row}");
        if row["load"] == "stream" {
            // 20 token events and [DONE]: at least 20 per stream.
            let streams = row["completed"].as_u64().unwrap();
            let events = row["sse_events_per_sec"].as_f64().unwrap();
            let per_stream = events / row["requests_per_sec"].as_f64().unwrap();
            assert!(streams > 0 && per_stream >= 20.0, "{row}");
        }
    }
    assert_eq!(
        report["instructions"].as_array().unwrap().len(),
        0,
        "counted only with --instructions"
    );
    let memory = report["memory"].as_array().unwrap();
    assert_eq!(memory.len(), 1);
    assert!(memory[0]["rss_idle_bytes"].as_u64().unwrap() > 0);
    assert!(memory[0]["rss_peak_bytes"].as_u64() >= memory[0]["rss_idle_bytes"].as_u64());
    assert!(
        report["processor"].as_str().unwrap().contains("cores"),
        "every figure names what it was measured on"
    );
}

/// `--instructions` starts the gateway once more under callgrind and counts what it spends per
/// request and per event (valgrind is one of the packages `scripts/test` installs).
#[test]
fn instructions_are_counted_under_callgrind() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "overhead",
            "--targets",
            "sluice",
            "--no-shared-core",
        ])
        .args(["--connections", "2", "--stream-connections", "2"])
        // Streams long enough that their work, not the idle work taken off them (the status
        // page's sampler, a tick of which costs a debug build tens of millions of
        // instructions), is what the per-event figure measures.
        .args(["--stream-tokens", "200", "--warmup-secs", "0.1"])
        .args(["--window-secs", "0.3", "--json", "--instructions"])
        .args(["--instruction-requests", "80"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let counted = report["instructions"].as_array().unwrap();
    assert_eq!(counted.len(), 1, "{report}");
    let sluice = &counted[0];
    assert_eq!(sluice["target"], "sluice");
    assert_eq!(sluice["requests"], 80);
    // 16 streams of 200 tokens, each event counted once.
    assert!(sluice["events"].as_u64().unwrap() >= 16 * 200, "{sluice}");
    // A request crosses a server, a client and the gateway's stages: tens of thousands of
    // instructions, not hundreds, and not millions.
    let per_request = sluice["per_request"].as_f64().unwrap();
    assert!((10_000.0..1_000_000.0).contains(&per_request), "{sluice}");
    let per_event = sluice["per_sse_event"].as_f64().unwrap();
    assert!((100.0..100_000.0).contains(&per_event), "{sluice}");
    assert!(sluice["idle_per_sec"].as_f64().unwrap() > 0.0, "{sluice}");
}

/// `bench symbol-order` profiles `sluice serve` under callgrind, from its start to its exit, and
/// writes the functions it ran, once each: the request path among them, which is what
/// `scripts/release` lays out together.
#[test]
fn a_symbol_order_names_each_function_the_gateway_ran_once() {
    let out_file = std::env::temp_dir().join(format!("sluice-order-test-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "symbol-order",
            "--requests",
            "40",
            "--idle-secs",
            "0.2",
        ])
        .arg("--out")
        .arg(&out_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "symbol-order failed: {stderr}");
    let order = std::fs::read_to_string(&out_file).unwrap();
    std::fs::remove_file(&out_file).unwrap();
    let names: Vec<&str> = order.lines().collect();
    let unique: std::collections::HashSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "each name once");
    assert!(names.iter().all(|n| !n.is_empty() && !n.contains(' ')));
    // Mangled as the linker knows them: the forward stage and the worker connection ran.
    for module in ["14sluice_gateway7forward", "14sluice_gateway8upstream4wire"] {
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("_ZN") && n.contains(module)),
            "{module} not in the {} names",
            names.len()
        );
    }
}
