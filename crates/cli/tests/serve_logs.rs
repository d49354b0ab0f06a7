//! `sluice serve`'s logs as a process writes them: no terminal colours into a pipe, JSON lines
//! with `--log-json`, SMG's level names, and an unknown level refused at startup.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// `sluice serve` on a free loopback port with `extra` flags, stderr piped.
fn serve(extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// The first of its first 50 stderr lines that contains `needle`; the process is then stopped
/// by its PID.
fn line_with(mut child: Child, needle: &str) -> Option<String> {
    let stderr = child.stderr.take().unwrap();
    let line = BufReader::new(stderr)
        .lines()
        .take(50)
        .map(|l| l.unwrap())
        .find(|l| l.contains(needle));
    child.kill().unwrap();
    child.wait().unwrap();
    line
}

/// The stderr line that says the gateway is listening.
fn listening_line(child: Child) -> String {
    line_with(child, "sluice gateway listening").expect("the gateway said it is listening")
}

#[test]
fn logs_into_a_pipe_have_no_colours_and_json_lines_parse() {
    let text = listening_line(serve(&["--log-level", "warning,sluice_gateway=info"]));
    assert!(
        !text.contains('\u{1b}'),
        "no ANSI escapes into a pipe: {text:?}"
    );

    let json = listening_line(serve(&["--log-json"]));
    let line: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["fields"]["message"], "sluice gateway listening");
}

#[test]
fn smgs_level_names_work_and_an_unknown_level_is_refused() {
    let quiet = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--log-level", "verbose", "--port", "0"])
        .output()
        .unwrap();
    assert!(!quiet.status.success());
    let said = String::from_utf8_lossy(&quiet.stderr);
    assert!(said.contains("--log-level"), "{said}");

    // `warning` keeps warnings: a worker that cannot be reached yet is one.
    let child = serve(&[
        "--log-level",
        "warning",
        "--worker-urls",
        "http://127.0.0.1:9",
    ]);
    let warned = line_with(child, "not reachable yet");
    assert!(warned.is_some(), "warnings are logged at `warning`");
}

#[test]
fn the_help_names_every_bench_subcommand() {
    for args in [&["--help"][..], &["bench", "--help"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for word in ["capacity", "overhead", "goodput", "scenario"] {
            assert!(help.contains(word), "{args:?} lacks {word}: {help}");
        }
    }
}

#[test]
fn the_protective_settings_in_force_are_logged_once_at_startup() {
    let plain = line_with(serve(&["--log-json"]), "protective settings")
        .expect("a line with the protective settings");
    let plain: serde_json::Value = serde_json::from_str(&plain).unwrap();
    let fields = &plain["fields"];
    assert_eq!(fields["defaults"], "sluice", "{fields}");
    assert_eq!(fields["waiting_ceiling"], "Some(8)", "{fields}");
    assert_eq!(fields["queue_size"], 1024, "{fields}");
    assert_eq!(
        fields["codel_targets_ms"], "Some([200, 1000, 30000])",
        "{fields}"
    );
    assert_eq!(fields["overload_shed"], false, "{fields}");
    let smg = line_with(
        serve(&[
            "--log-json",
            "--smg-defaults",
            // SMG's metrics listener (29000 on every interface) kept on loopback.
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            "0",
        ]),
        "protective settings",
    )
    .unwrap();
    let smg: serde_json::Value = serde_json::from_str(&smg).unwrap();
    let fields = &smg["fields"];
    assert_eq!(fields["defaults"], "smg", "{fields}");
    assert_eq!(fields["queue_size"], 0, "{fields}");
    assert_eq!(fields["max_retries"], 4, "SMG's 5 attempts: {fields}");
    let tuned = line_with(
        serve(&[
            "--log-json",
            "--queue-size",
            "64",
            "--worker-overload-shed",
            "--codel-target-ms",
            "50",
        ]),
        "protective settings",
    )
    .unwrap();
    let tuned: serde_json::Value = serde_json::from_str(&tuned).unwrap();
    let fields = &tuned["fields"];
    assert_eq!(fields["queue_size"], 64, "{fields}");
    assert_eq!(fields["overload_shed"], true, "{fields}");
    assert_eq!(fields["codel_targets_ms"], "Some([50, 50, 50])", "{fields}");
}

#[test]
fn serving_on_loopback_only_is_said_at_startup() {
    let said =
        line_with(serve(&[]), "loopback only").expect("a warning that only loopback is served");
    assert!(said.contains("--host 0.0.0.0"), "{said}");
}

#[test]
fn serve_help_is_grouped_under_headings() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for heading in [
        "Listener:",
        "Workers:",
        "Routing policy:",
        "Authentication:",
        "Retries:",
        "Circuit breaker:",
        "Health checks:",
        "Load monitoring and overload:",
        "Liveness:",
        "Metrics and logs:",
    ] {
        assert!(help.lines().any(|l| l == heading), "{heading}: {help}");
    }
}

#[test]
fn logs_also_go_to_the_log_dir() {
    let dir = std::env::temp_dir().join(format!("sluice-log-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let line = listening_line(serve(&["--log-dir", dir.to_str().unwrap()]));
    assert!(line.contains("listening"));
    let file = std::fs::read_to_string(dir.join("sluice.log")).unwrap();
    assert!(file.contains("sluice gateway listening"), "{file}");
    assert!(!file.contains('\u{1b}'), "no colours in the file");
    std::fs::remove_dir_all(&dir).unwrap();
}
