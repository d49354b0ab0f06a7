//! Admission, adaptive control and the degradation ladder as the config file and flags give
//! them: tenants, tiers, AIMD and CoDel targets, ladder steps.

use super::*;

#[test]
fn tenants_come_from_the_file_and_smgs_tenant_keys_from_flags() {
    let dir = std::env::temp_dir().join(format!("sluice-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(
        &path,
        "[[tenants]]\nname = \"chat\"\napi_keys = [\"c1\"]\npriority = 0\nweight = 3\n\
         tokens_per_minute = 100000\n\n[[tenants]]\nname = \"batch\"\npriority = 2\n",
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let c = validated(&[
        "--config",
        file,
        "--tenant-api-key",
        "batch:b1",
        "--tenant-api-key",
        "new:n1",
    ])
    .unwrap();
    let tenants: Vec<(&str, Vec<String>, Tier, f64)> = c
        .admission
        .tenants
        .iter()
        .map(|t| (t.id.as_str(), t.api_keys.clone(), t.tier, t.weight))
        .collect();
    assert_eq!(
        tenants,
        [
            ("chat", vec!["c1".to_string()], Tier::Interactive, 3.0),
            ("batch", vec!["b1".to_string()], Tier::Batch, 1.0),
            // A tenant that sets no tier gets --default-priority's: 0, interactive.
            ("new", vec!["n1".to_string()], Tier::Interactive, 1.0),
        ]
    );
    assert_eq!(c.admission.tenants[0].tokens_per_minute, Some(100_000));
    // What --print-config prints loads back with the tenants.
    let printed = load_args(&["sluice", "--config", file])
        .unwrap()
        .to_toml()
        .unwrap();
    assert!(printed.contains("[[tenants]]"), "{printed}");

    let err = |args: &[&str]| validated(args).unwrap_err().to_string();
    assert!(err(&["--tenant-api-key", "nokey"]).starts_with("--tenant-api-key"));
    assert!(
        err(&["--api-key", "k", "--tenant-api-key", "t:k"]).contains("also a key of --api-key"),
        "one key, one owner"
    );
    assert!(err(&["--default-priority", "3"]).starts_with("--default-priority"));
    assert!(err(&["--max-concurrent-requests", "0"]).starts_with("--max-concurrent-requests"));
    assert_eq!(
        validated(&["--max-concurrent-requests", "-1"])
            .unwrap()
            .admission
            .max_concurrent,
        None
    );
    std::fs::write(&path, "[[tenants]]\nname = \"x\"\nburst = 5\n").unwrap();
    let unknown = load_args(&["sluice", "--config", file])
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("burst"), "{unknown}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn adaptive_concurrency_is_opt_in_with_the_seeds_targets() {
    assert_eq!(validated(&[]).unwrap().control.adaptive, None);
    let on = validated(&["--adaptive-concurrency"])
        .unwrap()
        .control
        .adaptive
        .unwrap();
    assert_eq!(on.window, Duration::from_secs(10));
    assert_eq!(on.aimd, sluice_core::adaptive::AimdConfig::default());
    assert_eq!(on.initial_limit, 32);
    let tuned = validated(&[
        "--adaptive-concurrency",
        "--adaptive-ttft-breach-ms",
        "2000",
        "--adaptive-ttft-healthy-ms",
        "800",
        "--adaptive-max-limit",
        "64",
        "--adaptive-min-limit",
        "2",
        "--adaptive-window-secs",
        "5",
    ])
    .unwrap()
    .control
    .adaptive
    .unwrap();
    assert_eq!(tuned.aimd.ttft_breach, Some(Duration::from_secs(2)));
    assert_eq!(tuned.aimd.ttft_healthy, Some(Duration::from_millis(800)));
    assert_eq!((tuned.aimd.floor, tuned.aimd.ceiling), (2, Some(64)));
    assert_eq!(tuned.window, Duration::from_secs(5));
    for (bad, setting) in [
        (
            &["--adaptive-itl-healthy-ms", "30"][..],
            "--adaptive-itl-healthy-ms",
        ),
        (
            &[
                "--adaptive-ttft-breach-ms",
                "500",
                "--adaptive-ttft-healthy-ms",
                "500",
            ][..],
            "--adaptive-ttft-healthy-ms",
        ),
        (
            &["--adaptive-min-limit", "8", "--adaptive-max-limit", "4"][..],
            "--adaptive-max-limit",
        ),
        (
            &["--adaptive-window-secs", "0"][..],
            "--adaptive-window-secs",
        ),
    ] {
        let mut args = vec!["--adaptive-concurrency"];
        args.extend_from_slice(bad);
        let err = validated(&args).unwrap_err().to_string();
        assert!(err.starts_with(setting), "{bad:?}: {err}");
    }
}

#[test]
fn codel_runs_on_the_queue_with_per_tier_targets_unless_disabled() {
    let codel = |args: &[&str]| {
        let mut all = vec!["--queue-size", "10"];
        all.extend_from_slice(args);
        validated(&all).map(|c| c.admission.queue.unwrap().codel)
    };
    let targets = |configs: [sluice_core::adaptive::CodelConfig; 3]| {
        configs.map(|c| (c.target.as_millis(), c.interval.as_millis()))
    };
    assert_eq!(
        targets(codel(&[]).unwrap().unwrap()),
        [(200, 5000), (1000, 5000), (30_000, 5000)],
        "the defaults: the seed's 200 ms, 30 s for batch work; 100 ms x 50"
    );
    assert_eq!(
        targets(
            codel(&["--codel-target-ms", "300", "--codel-interval-ms", "2000"])
                .unwrap()
                .unwrap()
        ),
        [(300, 2000); 3],
        "one target for every tier"
    );
    assert_eq!(
        targets(
            codel(&["--codel-target-ms-by-tier", "50,100,150"])
                .unwrap()
                .unwrap()
        ),
        [(50, 5000), (100, 5000), (150, 5000)]
    );
    assert_eq!(codel(&["--disable-codel"]).unwrap(), None);
    for bad in [
        &["--codel-target-ms-by-tier", "1,2"][..],
        &["--codel-interval-ms", "0"][..],
        &["--codel-target-ms", "0"][..],
    ] {
        let err = codel(bad).unwrap_err().to_string();
        assert!(err.starts_with("--codel"), "{bad:?}: {err}");
    }
}

#[test]
fn the_adaptive_settings_come_from_the_config_file_too() {
    let dir = std::env::temp_dir().join(format!("sluice-adaptive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(
        &path,
        "queue_size = 4\nadaptive_concurrency = true\nadaptive_itl_breach_ms = 40\n\
         codel_target_ms_by_tier = [100, 500, 2000]\ncodel_interval_ms = 3000\n",
    )
    .unwrap();
    let config = load_args(&["sluice", "--config", path.to_str().unwrap()])
        .unwrap()
        .validate()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let adaptive = config.control.adaptive.unwrap();
    assert_eq!(adaptive.aimd.itl_breach, Duration::from_millis(40));
    let codel = config.admission.queue.unwrap().codel.unwrap();
    assert_eq!(codel[2].target, Duration::from_secs(2));
    assert_eq!(codel[0].interval, Duration::from_secs(3));
}

/// The config from a file's `text` (written to a temporary file).
fn from_file(name: &str, text: &str) -> Result<Config, ConfigError> {
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(&path, text).unwrap();
    let loaded = load_args(&["sluice", "--config", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    loaded?.validate()
}

#[test]
fn the_degradation_ladder_comes_from_the_file_step_by_step() {
    use crate::admit::degrade::StepKind;
    assert_eq!(
        validated(&[]).unwrap().degradation,
        None,
        "off unless configured"
    );
    let ladder = from_file(
        "ladder",
        r#"
queue_size = 8
codel_interval_ms = 3000
load_monitor_interval = 1
[degradation]
shed = true
[[degradation.reasoning]]
model = "qwen3"
switch = "budget"
budget_tokens = 256
[[degradation.prune]]
tiers = [2]
token_budget = 4000
[[degradation.clamp]]
tiers = [1, 2]
[[cascade]]
from = "llama-70b"
to = "llama-8b"
"#,
    )
    .unwrap()
    .degradation
    .unwrap();
    assert!(ladder.shed);
    assert_eq!(
        ladder.interval,
        Duration::from_secs(3),
        "the CoDel interval, over two load-monitor intervals"
    );
    assert_eq!(
        ladder.references,
        [200, 1000, 30_000].map(Duration::from_millis),
        "the tiers' CoDel targets"
    );
    let kinds: Vec<(u8, &str)> = ladder
        .steps
        .iter()
        .map(|s| (s.kind.level(), s.kind.name()))
        .collect();
    assert_eq!(
        kinds,
        [
            (1, "reasoning"),
            (2, "cascade"),
            (3, "prune"),
            (4, "max_tokens")
        ]
    );
    assert_eq!(
        ladder.steps[3].kind,
        StepKind::Clamp(512),
        "the default cap"
    );
    assert_eq!(
        ladder.steps[1].scope.tiers,
        [Tier::Agent, Tier::Batch],
        "a cascade spares the interactive tier unless told"
    );
    let given = from_file(
        "references",
        "[degradation]\nshed = true\nreference_delay_ms_by_tier = [50, 250, 1250]\n",
    )
    .unwrap()
    .degradation
    .unwrap();
    assert_eq!(given.references, [50, 250, 1250].map(Duration::from_millis));
    assert_eq!(
        given.interval,
        Duration::from_secs(5),
        "the CoDel interval (5 s), over two load-monitor intervals (2 s)"
    );
    assert_eq!(
        given.shed_interval,
        Duration::from_secs(5),
        "shedding holds the CoDel interval"
    );
    for (bad, says) in [
        (
            "[[degradation.reasoning]]\nmodel = \"m\"\nswitch = \"maybe\"\n",
            "switch",
        ),
        (
            "[[degradation.reasoning]]\nmodel = \"m\"\nswitch = \"budget\"\n",
            "budget_tokens",
        ),
        ("[[degradation.clamp]]\ntiers = [3]\n", "tier 3"),
        ("[[degradation.clamp]]\nmax_tokens = 0\n", "max_tokens"),
        ("[[cascade]]\nfrom = \"a\"\nto = \"a\"\n", "itself"),
        ("[degradation]\ninterval_secs = 0\n", "interval_secs"),
        (
            "[degradation]\nreference_delay_ms_by_tier = [200, 1000]\n",
            "reference_delay_ms_by_tier",
        ),
        (
            "[degradation]\nreference_delay_ms_by_tier = [0, 1000, 5000]\n",
            "reference_delay_ms_by_tier",
        ),
    ] {
        let err = from_file("bad-ladder", bad).unwrap_err().to_string();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn slos_by_tier_default_to_the_documented_objectives_and_zero_sets_none() {
    use sluice_core::slo::{Slo, Slos};
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(validated(&[]).unwrap().telemetry.slos, Slos::default());
    let c = validated(&[
        "--slo-ttft-ms-by-tier",
        "500,0,60000",
        "--slo-tpot-ms-by-tier",
        "50,80,0",
    ])
    .unwrap();
    assert_eq!(
        [Tier::Interactive, Tier::Agent, Tier::Batch].map(|t| c.telemetry.slos.of(t)),
        [
            Slo {
                ttft: ms(500),
                tpot: ms(50)
            },
            Slo {
                ttft: None,
                tpot: ms(80)
            },
            Slo {
                ttft: ms(60_000),
                tpot: None
            },
        ]
    );
    let err = validated(&["--slo-tpot-ms-by-tier", "50,80"]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--slo-tpot-ms-by-tier: 2 values"),
        "{err}"
    );
    assert!(validated(&["--ui-interval-ms", "0"]).is_err());
    assert_eq!(validated(&["--disable-ui"]).unwrap().ui, None);
}

#[test]
fn each_tier_waits_in_the_queue_its_first_token_objective_less_the_engines_time() {
    let s = Duration::from_secs_f64;
    let cases: [(&[&str], [Duration; 3], &str); 6] = [
        (
            &[],
            [s(1.5), s(4.5), s(60.0)],
            "2 s and 5 s objectives less 0.5 s; batch, without one, --queue-timeout-secs",
        ),
        (
            &["--slo-ttft-ms-by-tier", "1000,0,30000"],
            [s(0.5), s(60.0), s(29.5)],
            "the waits follow the objectives given",
        ),
        (
            &["--queue-timeout-secs", "3"],
            [s(1.5), s(3.0), s(3.0)],
            "--queue-timeout-secs stays the longest wait",
        ),
        (
            &["--queue-timeout-by-tier", "5,30,120"],
            [s(5.0), s(30.0), s(120.0)],
            "given by tier, as given",
        ),
        (
            &["--smg-defaults", "--queue-size", "8"],
            [s(60.0); 3],
            "SMG: one timeout for every class",
        ),
        (
            &[
                "--smg-defaults",
                "--queue-size",
                "8",
                "--queue-timeout-secs",
                "9",
            ],
            [s(9.0); 3],
            "SMG's one timeout, as given",
        ),
    ];
    for (args, want, why) in cases {
        let timeouts = validated(args).unwrap().admission.queue.unwrap().timeouts;
        assert_eq!(timeouts, want, "{args:?}: {why}");
    }
}
