//! The settings as people type them, turned into a `Config`: defaults, files, flags, values.

use super::*;
use crate::control::discovery::Members;
use crate::control::{HealthConfig, LoadConfig};
use clap::{CommandFactory, Parser};
use sluice_core::admission::Tier;
use sluice_core::liveness::LivenessConfig;
use sluice_core::overload::Ceilings;
use std::time::Duration;

mod admission;
mod files;
mod traces;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    settings: Settings,
}

fn load_args(args: &[&str]) -> Result<Settings, ConfigError> {
    let matches = Cli::command().try_get_matches_from(args)?;
    load(&matches)
}

/// The config from these flags (the program name is added).
fn validated(args: &[&str]) -> Result<Config, ConfigError> {
    let mut full = vec!["sluice"];
    full.extend_from_slice(args);
    load_args(&full)?.validate()
}

#[test]
fn cors_origins_are_a_list_or_a_star_alone() {
    let cors = |args: &[&str]| validated(args).map(|c| c.access.cors);
    assert_eq!(cors(&[]).unwrap(), None);
    assert_eq!(
        cors(&["--cors-allowed-origins", "*"]).unwrap(),
        Some(CorsOrigins::Any)
    );
    assert!(matches!(
        cors(&["--cors-allowed-origins", "http://a", "https://b"]).unwrap(),
        Some(CorsOrigins::List(l)) if l.len() == 2
    ));
    assert!(cors(&["--cors-allowed-origins", "*", "http://a"]).is_err());
}

#[test]
fn model_aliases_are_pairs_of_two_names() {
    let aliases = |args: &[&str]| validated(args).map(|c| c.admission.aliases);
    let ok = aliases(&[
        "--model-alias",
        "gpt-4o=llama",
        "--model-alias",
        "small=llama",
    ])
    .unwrap();
    assert_eq!(ok["gpt-4o"].as_str(), "llama");
    assert_eq!(ok.len(), 2);
    for bad in ["nothing", "=llama", "same=same"] {
        let err = aliases(&["--model-alias", bad]).unwrap_err();
        assert!(err.to_string().starts_with("--model-alias"), "{bad}: {err}");
    }
}

#[test]
fn duration_buckets_must_increase() {
    let buckets = |args: &[&str]| validated(args).map(|c| c.telemetry.duration_buckets);
    assert_eq!(buckets(&[]).unwrap(), None);
    assert_eq!(
        buckets(&["--prometheus-duration-buckets", "0.1", "1", "10"]).unwrap(),
        Some(vec![0.1, 1.0, 10.0])
    );
    let err = buckets(&["--prometheus-duration-buckets", "1,0.5"]).unwrap_err();
    assert!(
        err.to_string().starts_with("--prometheus-duration-buckets"),
        "{err}"
    );
}

#[test]
fn the_prefix_index_is_sized_in_characters_as_in_smg() {
    let capacity = |args: &[&str]| validated(args).unwrap().fleet.prefix_capacity;
    assert_eq!(
        capacity(&[]),
        (1 << 24) / 64,
        "2^24 characters, 262144 blocks"
    );
    assert_eq!(capacity(&["--max-tree-size", "6400"]), 100);
    assert_eq!(capacity(&["--max-tree-size", "1"]), 1);
}

#[test]
fn routing_key_headers_are_a_list_under_either_name() {
    let headers = |args: &[&str]| {
        let mut full = vec!["sluice"];
        full.extend_from_slice(args);
        let c = load_args(&full).unwrap().validate().unwrap();
        c.route
            .routing_key_headers
            .iter()
            .map(|h| h.as_str().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(headers(&[]), ["x-session-id"]);
    assert_eq!(
        headers(&["--routing-key-headers", "x-tenant,x-session-id"]),
        ["x-tenant", "x-session-id"]
    );
    assert_eq!(headers(&["--routing-key-header", "x-user"]), ["x-user"]);
    let s = load_args(&["sluice", "--worker-startup-check-interval", "2.5"]).unwrap();
    assert_eq!(
        s.registration.worker_startup_check_interval_secs, 2.5,
        "SMG's name"
    );
}

#[test]
fn smgs_policy_names_mean_the_same_or_are_refused_with_an_alternative() {
    let policy = |name: &str| {
        let mut s = Settings::defaults();
        s.routing.policy = name.into();
        s.validate().map(|c| c.route.policy.name())
    };
    assert_eq!(policy("consistent_hashing").unwrap(), "consistent_hash");
    for refused in ["prefix_hash", "passthrough", "manual"] {
        let err = policy(refused).unwrap_err().to_string();
        assert!(err.starts_with("--policy"), "{err}");
        assert!(err.contains("use "), "names what to use instead: {err}");
    }
}

#[test]
fn retry_max_retries_counts_attempts_as_smg_does() {
    let retries = |args: &[&str]| validated(args).unwrap().forward.retry.max_retries;
    assert_eq!(
        retries(&["--retry-max-retries", "1"]),
        0,
        "one attempt: no retry"
    );
    assert_eq!(retries(&["--retry-max-retries", "5"]), 4);
    assert_eq!(retries(&["--retry-max-retries", "0"]), 0);
    assert_eq!(retries(&[]), 3, "four attempts by default");
    assert_eq!(retries(&["--disable-retries"]), 0);
}

#[test]
fn log_levels_take_smgs_names_and_refuse_unknown_ones() {
    let filter = |level: &str| {
        let mut s = Settings::defaults();
        s.telemetry.log_level = level.into();
        s.telemetry.log_filter()
    };
    assert_eq!(filter("warning").unwrap(), "warn");
    assert_eq!(filter("CRITICAL").unwrap(), "error");
    assert_eq!(filter("info").unwrap(), "info");
    assert_eq!(
        filter("info,sluice_gateway=debug").unwrap(),
        "info,sluice_gateway=debug"
    );
    let err = filter("verbose").unwrap_err().to_string();
    assert!(err.starts_with("--log-level"), "{err}");
}

#[test]
fn defaults_validate() {
    let c = Settings::defaults().validate().unwrap();
    assert_eq!(c.listener.addr, "127.0.0.1:30000".parse().unwrap());
    assert_eq!(c.route.policy.name(), "cache_aware");
    assert_eq!(c.forward.retry.max_retries, 3);
    assert_eq!(c.fleet.breaker.unwrap().failure_threshold, 10);
}

#[test]
fn health_defaults_follow_the_seed() {
    let h = Settings::defaults().validate().unwrap().control.health;
    assert_eq!(h, HealthConfig::default());
    assert_eq!(h.interval, Duration::from_secs(60));
    assert_eq!(h.timeout, Duration::from_secs(5));
    assert_eq!((h.thresholds.failure, h.thresholds.success), (3, 2));
    assert_eq!(h.endpoint, "/health");
    assert!(!h.disabled && !h.remove_unhealthy);
}

#[test]
fn overload_defaults_follow_the_seeds() {
    let c = Settings::defaults().validate().unwrap();
    assert_eq!(c.control.load, LoadConfig::default());
    assert_eq!(c.control.load.ceilings.waiting_requests, Some(8));
    assert_eq!(c.control.load.ceilings.token_usage, Some(0.8));
    assert!(!c.control.load.busy.any(), "busy checks are off unless set");
    let liveness = c
        .control
        .liveness
        .expect("liveness checks are on unless turned off");
    assert_eq!(liveness, LivenessConfig::default());
    assert_eq!(liveness.stall, Duration::from_secs(2));
    assert_eq!(liveness.wedge, Duration::from_secs(3));
    assert_eq!(liveness.stale, Duration::from_secs(15));
    assert!(!c.route.shedding.enabled);
    assert_eq!(c.front.answers.overload, 503);
    assert_eq!(
        c.route.shedding.retry_after,
        Duration::from_secs(1),
        "the load-monitor interval, 1 s where the seed's is 10 (docs/overload.md, Polling)"
    );
    let off = load_args(&[
        "sluice",
        "--disable-worker-overload-protection",
        "--worker-overload-shed",
        "--overload-status-code",
        "529",
        "--load-monitor-interval",
        "2.5",
    ])
    .unwrap()
    .validate()
    .unwrap();
    assert_eq!(off.control.load.ceilings, Ceilings::default());
    assert!(off.route.shedding.enabled);
    assert_eq!(off.front.answers.overload, 529);
    assert_eq!(
        off.route.shedding.retry_after,
        Duration::from_secs(3),
        "whole seconds, rounded up"
    );
}

#[test]
fn auto_recovery_takes_every_spelling() {
    let remove = |args: &[&str]| validated(args).unwrap().control.health.remove_unhealthy;
    assert!(!remove(&[]), "no service discovery: off by default");
    assert!(remove(&["--remove-unhealthy-workers"]));
    assert!(remove(&["--remove-unhealthy-workers=true"]));
    assert!(!remove(&["--remove-unhealthy-workers=false"]));
    assert!(remove(&["--worker-auto-recovery"]));
    assert!(!remove(&["--no-worker-auto-recovery"]));
    assert!(!remove(&[
        "--remove-unhealthy-workers",
        "--no-remove-unhealthy-workers"
    ]));
    assert!(remove(&[
        "--no-remove-unhealthy-workers",
        "--remove-unhealthy-workers"
    ]));
    let s = load_args(&["sluice", "--no-remove-unhealthy-workers"]).unwrap();
    assert!(s
        .to_toml()
        .unwrap()
        .contains("remove_unhealthy_workers = false"));
}

#[test]
fn discovery_turns_auto_recovery_on_unless_told_otherwise() {
    let remove = |args: &[&str]| validated(args).unwrap().control.health.remove_unhealthy;
    assert!(remove(&["--discovery-file", "workers.json"]));
    assert!(remove(&["--discovery-dns", "vllm.llm:8000"]));
    assert!(!remove(&[
        "--discovery-file",
        "workers.json",
        "--no-remove-unhealthy-workers"
    ]));
    assert!(!remove(&[
        "--discovery-dns",
        "vllm.llm:8000",
        "--remove-unhealthy-workers=false"
    ]));
}

#[test]
fn discovery_sources_are_checked() {
    let c = validated(&[
        "--discovery-provider",
        "file",
        "--discovery-file",
        "w.toml",
        "--discovery-check-interval-secs",
        "5",
    ])
    .unwrap();
    let file = c.discovery.file.unwrap();
    assert_eq!(file.path, std::path::Path::new("w.toml"));
    assert_eq!(file.every, Duration::from_secs(5));
    assert!(c.discovery.dns.is_none());
    let dns = validated(&["--discovery-dns", "vllm.llm.svc:8000"])
        .unwrap()
        .discovery
        .dns
        .unwrap();
    assert_eq!((dns.name.as_str(), dns.port), ("vllm.llm.svc", 8000));
    assert_eq!(dns.every, Duration::from_secs(30), "SMG's default interval");
    let refused: &[(&[&str], &str)] = &[
        (&["--discovery-provider", "file"], "needs --discovery-file"),
        (&["--discovery-provider", "dns"], "needs --discovery-dns"),
        (&["--discovery-provider", "kubernetes"], "--selector"),
        (&["--service-discovery", "--selector", "app"], "KEY=VALUE"),
        (
            &[
                "--service-discovery",
                "--selector",
                "a=b",
                "--model-id-from",
                "pod",
            ],
            "--model-id-from",
        ),
        (&["--discovery-provider", "consul"], "not one of"),
        (&["--discovery-dns", "vllm"], "NAME:PORT"),
        (
            &[
                "--discovery-file",
                "w.json",
                "--discovery-check-interval-secs",
                "0",
            ],
            "--discovery-check-interval-secs",
        ),
    ];
    for (args, says) in refused {
        let e = validated(args).unwrap_err().to_string();
        assert!(e.contains(says), "{args:?}: {e}");
    }
    let k8s = validated(&[
        "--service-discovery",
        "--selector",
        "app=vllm",
        "tier=gpu",
        "--service-discovery-namespace",
        "llm",
        "--model-id-from",
        "label:model",
    ])
    .unwrap();
    assert!(
        k8s.control.health.remove_unhealthy,
        "auto-recovery follows discovery"
    );
    let k8s = k8s.discovery.kubernetes.unwrap();
    let Members::Selected { selectors, port } = &k8s.members else {
        panic!("pods by selector: {:?}", k8s.members);
    };
    assert_eq!(selectors.len(), 1);
    assert_eq!(selectors[0].labels, "app=vllm,tier=gpu");
    assert_eq!(*port, 80, "SMG's default port");
    assert_eq!(k8s.namespace.as_deref(), Some("llm"));
    assert_eq!(
        k8s.model_from,
        Some(crate::control::discovery::ModelFrom::Label("model".into()))
    );
}

#[test]
fn prefill_workers_take_smgs_url_and_bootstrap_port_form() {
    use crate::fleet::WorkerType;
    let c = validated(&[
        "--pd-disaggregation",
        "--prefill",
        "http://p:1",
        "8998",
        "--prefill",
        "http://q:1",
        "none",
        "--prefill",
        "http://r:1",
        "--decode",
        "http://d:1",
        "--prefill-policy",
        "round_robin",
    ])
    .unwrap();
    let workers: Vec<(&str, WorkerType, Option<u16>)> = c
        .workers
        .iter()
        .map(|w| (w.url.as_str(), w.worker_type, w.bootstrap_port))
        .collect();
    assert_eq!(
        workers,
        [
            ("http://p:1", WorkerType::Prefill, Some(8998)),
            ("http://q:1", WorkerType::Prefill, None),
            ("http://r:1", WorkerType::Prefill, None),
            ("http://d:1", WorkerType::Decode, None),
        ]
    );
    assert_eq!(
        c.route.prefill_policy,
        sluice_core::policy::Policy::RoundRobin
    );
    assert_eq!(
        c.forward.pd.admission_wait,
        std::time::Duration::from_secs(30)
    );
    for (args, says) in [
        (&["--prefill", "http://p:1"][..], "--pd-disaggregation"),
        (
            &["--pd-disaggregation", "--prefill", "8998"][..],
            "URL [BOOTSTRAP_PORT|none]",
        ),
        (
            &["--pd-disaggregation", "--prefill", "http://p:1", "0"][..],
            "port 0",
        ),
    ] {
        let e = validated(args).unwrap_err().to_string();
        assert!(e.contains(says), "{args:?}: {e}");
    }
}

#[test]
fn prefill_and_decode_selectors_give_each_side_its_role_and_need_pd_mode() {
    use crate::fleet::WorkerType;
    let pd = validated(&[
        "--service-discovery",
        "--pd-disaggregation",
        "--prefill-selector",
        "app=sglang",
        "role=prefill",
        "--decode-selector",
        "app=sglang,role=decode",
    ])
    .unwrap();
    let k8s = pd.discovery.kubernetes.unwrap();
    let Members::Selected { selectors, .. } = &k8s.members else {
        panic!("pods by selector: {:?}", k8s.members);
    };
    let sides: Vec<(&str, WorkerType)> = selectors
        .iter()
        .map(|s| (s.labels.as_str(), s.role))
        .collect();
    assert_eq!(
        sides,
        [
            ("app=sglang,role=prefill", WorkerType::Prefill),
            ("app=sglang,role=decode", WorkerType::Decode)
        ]
    );
    let without = validated(&["--service-discovery", "--prefill-selector", "role=prefill"]);
    assert!(without
        .unwrap_err()
        .to_string()
        .contains("--pd-disaggregation"));
}

#[test]
fn invalid_values_name_their_setting() {
    let cases: &[(&[&str], &str)] = &[
        (&["--policy", "fastest"], "--policy"),
        (&["--cache-threshold", "1.5"], "--cache-threshold"),
        (&["--request-timeout-secs", "0"], "--request-timeout-secs"),
        (&["--cb-failure-threshold", "0"], "--cb-failure-threshold"),
        (&["--host", "not-an-ip"], "--host"),
        (&["--worker-urls", "ftp://x"], "--worker-urls"),
        (&["--api-key", ""], "--api-key"),
        (
            &["--health-check-interval-secs", "0"],
            "--health-check-interval-secs",
        ),
        (
            &["--health-check-timeout-secs", "nan"],
            "--health-check-timeout-secs",
        ),
        (
            &["--health-failure-threshold", "0"],
            "--health-failure-threshold",
        ),
        (
            &["--health-success-threshold", "0"],
            "--health-success-threshold",
        ),
        (
            &["--health-check-endpoint", "health"],
            "--health-check-endpoint",
        ),
    ];
    for (args, setting) in cases {
        let mut full = vec!["sluice"];
        full.extend_from_slice(args);
        let err = load_args(&full).unwrap().validate().unwrap_err();
        assert!(err.to_string().starts_with(setting), "{args:?}: {err}");
    }
}

#[test]
fn tls_files_are_read_at_startup_and_named_when_unusable() {
    let err = |args: &[&str]| validated(args).unwrap_err().to_string();
    assert_eq!(
        err(&["--tls-cert-path", "/nonexistent/cert.pem"]),
        "--tls-cert-path: needs --tls-key-path"
    );
    assert_eq!(
        err(&["--client-key-path", "/nonexistent/key.pem"]),
        "--client-key-path: needs --client-cert-path"
    );
    let missing = err(&[
        "--tls-cert-path",
        "/nonexistent/cert.pem",
        "--tls-key-path",
        "/nonexistent/key.pem",
    ]);
    assert!(
        missing.starts_with("--tls-cert-path: /nonexistent/cert.pem:"),
        "{missing}"
    );
    let dir = std::env::temp_dir().join(format!("sluice-tls-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let no_cert = err(&["--ca-cert-paths", empty.to_str().unwrap()]);
    assert!(
        no_cert.starts_with("--ca-cert-paths:") && no_cert.contains("no certificate"),
        "{no_cert}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn liveness_checks_are_on_unless_turned_off_whatever_their_thresholds() {
    assert!(validated(&[]).unwrap().control.liveness.is_some());
    let off = validated(&["--disable-liveness-checks", "--worker-stall-secs", "0"]).unwrap();
    assert_eq!(off.control.liveness, None);
    assert!(
        validated(&["--disable-liveness-checks", "--worker-wedge-secs", "-1"]).is_err(),
        "the thresholds are still checked"
    );
}
