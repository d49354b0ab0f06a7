//! `sluice bench scenario` end to end, on short runs: each starts its engines and gateway,
//! reports, and stops them. Only the shape is checked; the figures belong in docs/benchmarks.md.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

fn scenario(out: &std::path::Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "scenario"])
        .args(args)
        .args([
            "--configs",
            "direct",
            "--time-scale",
            "8",
            "--json",
            "--out",
        ])
        .arg(out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scenario failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn out_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_worker_crash_fails_requests_on_the_naive_fleet_and_the_engine_rejoins() {
    let dir = out_dir("crash");
    let report = scenario(
        &dir,
        &["worker-crash", "--capacity", "4", "--phases", "1:1.5:1"],
    );
    assert_eq!(report["incident"], "worker-crash");
    assert_eq!(report["engines"], 3);
    let row = &report["rows"][0];
    assert_eq!(row["config"], "direct");
    let requests = row["requests"].as_u64().unwrap();
    assert!(requests > 20, "{row}");
    assert!(
        row["failed"].as_u64().unwrap() > 0,
        "round robin without retries sends the dead engine its share: {row}"
    );
    assert!(row["rejoined_after"].is_number(), "{row}");
    let offered: u64 = row["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["offered"].as_u64().unwrap())
        .sum();
    assert_eq!(offered, requests, "every request lands in a slice");
    assert!(dir.join("worker-crash.svg").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_overload_sweep_with_a_given_capacity_measures_each_level() {
    let dir = out_dir("sweep");
    let report = scenario(
        &dir,
        &[
            "overload-sweep",
            "--quick",
            "--capacity",
            "4",
            "--window-secs",
            "2",
        ],
    );
    assert_eq!(report["capacity"], 8.0, "4 per engine, 2 engines");
    let offered: Vec<f64> = report["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offered"].as_f64().unwrap())
        .collect();
    assert_eq!(offered, [8.0, 16.0, 24.0]);
    assert!(dir.join("overload-sweep.svg").exists());
    assert!(dir.join("capacity.json").exists(), "C kept for later runs");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_tiered_overload_reports_each_tier_for_sluice_with_admission() {
    let dir = out_dir("tiered");
    let report = scenario(
        &dir,
        &[
            "tiered-overload",
            "--quick",
            "--capacity",
            "4",
            "--window-secs",
            "2",
            "--configs",
            "sluice-tiers",
        ],
    );
    let points = report["points"].as_array().unwrap();
    let shape: Vec<(&str, f64)> = points
        .iter()
        .map(|p| {
            (
                p["config"].as_str().unwrap(),
                p["offered"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("direct", 8.0),
            ("direct", 24.0),
            ("sluice-tiers", 8.0),
            ("sluice-tiers", 24.0)
        ]
    );
    for p in points {
        let tiers: Vec<&str> = p["report"]["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(tiers, ["interactive", "agent", "batch"], "{p}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_noisy_tenant_reports_each_tenant_for_sluice_with_tenants_at_each_queue_size() {
    let dir = out_dir("noisy");
    let report = scenario(
        &dir,
        &[
            "noisy-tenant",
            "--capacity",
            "4",
            "--window-secs",
            "2",
            "--queue-size",
            "1024,16",
            "--configs",
            "sluice-tenants,sluice-tenants-q16",
        ],
    );
    let points = report["points"].as_array().unwrap();
    let configs: Vec<&str> = points
        .iter()
        .map(|p| p["config"].as_str().unwrap())
        .collect();
    assert_eq!(
        configs,
        ["direct", "sluice-tenants", "sluice-tenants-q16"],
        "each queue size a configuration"
    );
    for p in points {
        assert_eq!(p["offered"], 8.0 * 5.25, "A's ten shares and B's half: {p}");
        let tenants = p["report"]["tiers"].as_array().unwrap();
        let names: Vec<&str> = tenants
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["tenant-a", "tenant-b"], "{p}");
        let requests = |i: usize| tenants[i]["requests"].as_u64().unwrap();
        assert!(
            requests(0) > 10 * requests(1),
            "A offers twenty times what B does: {p}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn many_streams_are_held_open_through_both_upstream_protocols_and_envoy_and_all_complete() {
    let dir = out_dir("many-streams");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "scenario", "many-streams", "--engines", "2"])
        .args(["--configs", "sluice-http2,sluice-http1,envoy"])
        .args(["--streams", "40", "--stream-tokens", "3", "--json", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scenario failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["processor"].as_str().unwrap().contains("cores"));
    let rows = report["rows"].as_array().unwrap();
    let configs: Vec<&str> = rows.iter().map(|r| r["config"].as_str().unwrap()).collect();
    assert_eq!(configs, ["sluice-http2", "sluice-http1", "envoy"]);
    for row in rows {
        let streams = &row["streams"];
        assert_eq!(streams["streams"], 40, "{row}");
        assert_eq!(streams["completed"], 40, "{row}");
        assert_eq!(streams["failed"], 0, "{row}");
        // Three tokens, the closing chunk and [DONE] at least, on every stream.
        assert!(streams["events"].as_u64().unwrap() >= 40 * 4, "{row}");
        assert!(streams["rss_bytes"].as_u64().unwrap() > 0, "{row}");
        let idle = &row["idle"];
        assert_eq!(idle["connections"], 40, "{row}");
        assert_eq!(idle["still_open"], 40, "{row}");
    }
    if let Some(files) = report["open_files"].as_u64() {
        let room = |i: usize| rows[i]["room"].as_u64().unwrap();
        assert!(
            room(0) > room(1),
            "HTTP/2 to the engines leaves room for more clients"
        );
        assert_eq!(room(1), (files - 64) / 2);
        assert_eq!(room(2), room(1), "Envoy holds two connections a stream too");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The liveness matrix at CI size: two failures, sixteen impatient streaming clients (the
/// quick kind), sluice's defaults beside the naive fleet. Only what today's rules always give
/// is checked — the order of events and counts, no timings (those are docs/benchmarks.md's).
#[test]
fn the_liveness_matrix_reports_each_cell_sluice_takes_a_wedged_engine_out_and_the_naive_fleet_keeps_feeding_it(
) {
    let dir = out_dir("liveness");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "scenario", "liveness", "--quick"])
        .args([
            "--configs",
            "sluice,direct",
            "--failures",
            "vllm-wedged,crash",
        ])
        .args(["--phases", "2:6:4", "--json", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scenario failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let cells: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["failure"].as_str().unwrap(),
                r["gateway"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cells,
        [
            ("vllm-wedged", "sluice"),
            ("vllm-wedged", "direct"),
            ("crash", "sluice"),
            ("crash", "direct")
        ]
    );
    for row in rows {
        assert_eq!(row["clients"], "stream sdk 3s x16", "{row}");
        assert!(row["requests"].as_u64().unwrap() > 16, "{row}");
        assert_eq!(
            row["failed"][0], 0,
            "nothing fails on healthy engines: {row}"
        );
        if let Some(vetoed) = row["vetoed_after"].as_f64() {
            assert!(vetoed >= 0.0, "a veto comes after the failure: {row}");
        }
        let logged = row["gateway"] == "sluice";
        assert_eq!(
            row["vetoes"].is_number(),
            logged,
            "sluice's log is read: {row}"
        );
    }
    let wedged = &rows[0];
    assert!(
        wedged["vetoed_after"].is_number(),
        "sluice takes the wedged engine out: {wedged}"
    );
    assert_eq!(
        wedged["sent_after_veto"], 0,
        "and sends it nothing after: {wedged}"
    );
    assert!(
        wedged["readmitted_after"].is_number(),
        "it comes back once the engine steps again: {wedged}"
    );
    let naive = &rows[1];
    assert!(
        naive["sent_during"].as_u64().unwrap() > 0,
        "round robin keeps sending the wedged engine its share: {naive}"
    );
    assert!(
        naive["failed"][1].as_u64().unwrap() > 0,
        "and what it sends there fails: {naive}"
    );
    assert!(naive["readmitted_after"].is_number(), "{naive}");
    assert!(
        rows[3]["sent_during"].is_null(),
        "a killed engine's counter is not read"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
