//! `--smg-defaults` puts back SMG 1.13's default wherever sluice's differs, and only what was not
//! given: held to SMG's own launcher (`fixtures/smg/launch-defaults-1.13.0.tsv`, written by
//! `scripts/smg-flags`), and to docs/migrating-from-smg.md, which must list every difference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use clap::Args;
use serde_json::Value;
use sluice_gateway::Settings;

const FIXTURE: &str = include_str!("../../../fixtures/smg/launch-defaults-1.13.0.tsv");
const MIGRATING: &str = include_str!("../../../docs/migrating-from-smg.md");

/// Settings SMG's launcher leaves to its server, or whose shape differs, each with why the
/// comparison does not apply.
const NOT_COMPARED: [(&str, &str); 7] = [
    (
        "otlp_traces_endpoint",
        "unset resolves by --otlp-traces-protocol: localhost:4317 for gRPC, SMG's default and protocol",
    ),
    (
        "queue_size",
        "SMG's 100 holds only requests past --max-concurrent-requests: checked below",
    ),
    (
        "request_id_headers",
        "unset in the launcher: SMG's server picks its list; sluice reads x-request-id (the migration page)",
    ),
    (
        "prometheus_host",
        "unset in the launcher: SMG's server binds the unspecified address, as sluice's 0.0.0.0",
    ),
    (
        "discovery_check_interval_secs",
        "unset in the launcher, 30 by its help text, as sluice's",
    ),
    (
        "worker_overload_protection",
        "SMG's field is on; sluice's flag of that name is a no-op kept for launch lines, the protection on",
    ),
    (
        "disable_worker_overload_protection",
        "unset in the launcher (the protection on), off in sluice",
    ),
];

/// SMG's launcher defaults: setting -> JSON value.
fn smg() -> Vec<(String, Value)> {
    FIXTURE
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (key, value) = l.split_once('\t').unwrap();
            (key.to_string(), serde_json::from_str(value).unwrap())
        })
        .collect()
}

/// `sluice serve` with `args`, its settings as the binary loads them (and validates: they must
/// start a gateway), as JSON.
fn settings(args: &[&str]) -> Value {
    let command = Settings::augment_args(clap::Command::new("serve").no_binary_name(true));
    let matches = command.try_get_matches_from(args).unwrap();
    let settings = sluice_gateway::config::load(&matches).unwrap();
    settings.validate().expect("settings a gateway starts with");
    serde_json::to_value(settings).unwrap()
}

/// Whether a sluice value means what SMG's does: numbers by value, unset as an empty list.
fn same(sluice: &Value, smg: &Value) -> bool {
    let empty = |v: &Value| {
        v.is_null()
            || v.as_array().is_some_and(Vec::is_empty)
            || v.as_object().is_some_and(|o| o.is_empty())
    };
    match (sluice.as_f64(), smg.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => sluice == smg || (empty(sluice) && empty(smg)),
    }
}

/// The settings both have whose sluice value differs from SMG's, under `args`.
fn differing(args: &[&str]) -> BTreeSet<String> {
    let ours = settings(args);
    let skipped: BTreeSet<&str> = NOT_COMPARED.iter().map(|(k, _)| *k).collect();
    smg()
        .into_iter()
        .filter(|(key, _)| !skipped.contains(key.as_str()))
        .filter_map(|(key, theirs)| {
            let value = ours.get(&key)?;
            (!same(value, &theirs)).then(|| format!("{key} = {value} (SMG: {theirs})"))
        })
        .collect()
}

#[test]
fn the_fixture_is_smgs_launcher_resolved() {
    let smg = smg();
    assert!(smg.len() > 200, "every setting of SMG 1.13: {}", smg.len());
    let get = |k: &str| &smg.iter().find(|(key, _)| key == k).unwrap().1;
    assert_eq!(get("queue_size"), 100);
    assert_eq!(get("retry_max_retries"), 5);
    assert_eq!(
        get("routing_key_headers"),
        &serde_json::json!(["x-smg-routing-key"])
    );
}

#[test]
fn with_smg_defaults_every_setting_both_have_takes_smgs_default() {
    assert_eq!(differing(&["--smg-defaults"]), BTreeSet::new());
    let ours = settings(&["--smg-defaults"]);
    assert_eq!(ours["queue_size"], 0, "SMG queues nothing without a cap");
    assert_eq!(
        ours["max_buffered_body_bytes"],
        1 << 30,
        "two of SMG's largest bodies"
    );
    assert_eq!(ours["smg_defaults"], true);
    let capped = settings(&["--smg-defaults", "--max-concurrent-requests", "8"]);
    assert_eq!(capped["queue_size"], 100, "SMG's queue past its cap");
}

#[test]
fn every_default_that_differs_from_smgs_is_on_the_migration_page() {
    let differences = differing(&[]);
    assert!(
        differences.len() >= 10,
        "sluice's defaults differ from SMG's in the retry schedule, limits, addresses: {differences:?}"
    );
    let section = MIGRATING
        .split("## Defaults that differ from SMG's")
        .nth(1)
        .expect("the page has a section on the defaults")
        .split("\n## ")
        .next()
        .unwrap();
    for difference in differences.iter().map(String::as_str).chain(["queue_size"]) {
        let key = difference.split(' ').next().unwrap();
        let flag = format!("`--{}`", key.replace('_', "-"));
        assert!(
            section.contains(&flag),
            "{flag} differs ({difference}) but the page's section does not list it"
        );
    }
}

#[test]
fn a_setting_given_keeps_its_value_under_smg_defaults() {
    let given = settings(&[
        "--smg-defaults",
        "--queue-size",
        "7",
        "--retry-max-retries",
        "2",
        "--host",
        "127.0.0.1",
    ]);
    assert_eq!(given["queue_size"], 7);
    assert_eq!(given["retry_max_retries"], 2);
    assert_eq!(given["host"], "127.0.0.1");
    assert_eq!(
        given["retry_max_backoff_ms"], 30_000,
        "what was not given is SMG's"
    );

    let dir = std::env::temp_dir().join(format!("sluice-smg-defaults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sluice.toml");
    std::fs::write(
        &file,
        "smg_defaults = true\nretry_max_retries = 3\nqueue_size = 64\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let from_file = settings(&["--config", path, "--retry-jitter-factor", "0.4"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        from_file["smg_defaults"], true,
        "the switch works from the file"
    );
    assert_eq!(
        from_file["retry_max_retries"], 3,
        "the file wins over SMG's"
    );
    assert_eq!(from_file["queue_size"], 64);
    assert_eq!(
        from_file["retry_jitter_factor"], 0.4,
        "the flag wins over all"
    );
    assert_eq!(from_file["retry_backoff_multiplier"], 1.5);
}

#[test]
fn sluices_own_defaults_hold_a_burst_in_the_gateway_queue() {
    let ours = settings(&[]);
    assert_eq!(ours["queue_size"], 1024);
    assert_eq!(ours["disable_codel"], false);
    assert_eq!(ours["smg_defaults"], false);
}
