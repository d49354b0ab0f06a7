//! SMG launch lines against `sluice serve`, as docs/migrating-from-smg.md promises: every flag
//! the page says works is used in a launch line below that starts and serves, and every flag it
//! says is refused stops `sluice serve` with the page's message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::Command;

use sluice_gateway::config::smg;

#[path = "../../gateway/tests/common/certs.rs"]
mod certs;
#[path = "../../gateway/tests/common/kube_api.rs"]
#[allow(dead_code)]
mod kube_api;
#[path = "common/launched.rs"]
mod launched;
use launched::Launched;
use sluice_sim::testkit::{client, instant, send, HttpClient};
use sluice_sim::{Flavor, FleetConfig, SimFleet};

/// One row of the page's tables.
struct Row {
    /// Every spelling of the SMG flag.
    flags: Vec<String>,
    works: bool,
    notes: String,
}

fn rows() -> Vec<Row> {
    let page = include_str!("../../../docs/migrating-from-smg.md");
    page.lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().replace("\\|", "|"))
                .collect();
            assert_eq!(cells.len(), 3, "three cells: {line}");
            let flags = cells[0]
                .split(", ")
                .map(|f| f.trim_matches('`').to_string())
                .collect();
            let works = cells[1].starts_with("works");
            assert!(works || cells[1] == "refused", "a known status: {line}");
            Row {
                flags,
                works,
                notes: cells[2].clone(),
            }
        })
        .collect()
}

#[test]
fn every_refused_flag_is_refused_with_what_to_use_instead() {
    let refused: Vec<Row> = rows().into_iter().filter(|r| !r.works).collect();
    let page: BTreeSet<&str> = refused
        .iter()
        .flat_map(|r| r.flags.iter().map(String::as_str))
        .collect();
    let table: BTreeSet<&str> = smg::REFUSED.iter().map(|(f, _)| *f).collect();
    assert_eq!(page, table, "the page and sluice refuse the same flags");

    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--port", "0"])
        .args(&page)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "refused at startup");
    let said = String::from_utf8_lossy(&out.stderr);
    for row in &refused {
        for flag in &row.flags {
            let line = format!(
                "error: {flag} is SMG's flag, and sluice does not take it: {}",
                row.notes
            );
            assert!(said.lines().any(|l| l == line), "{line}\nnot in:\n{said}");
        }
    }
}

/// The gateway's address, once it is listening and its worker is ready (in either order).
///
/// A worker can be Ready (its probes passed) a moment before its models are learned from
/// `/v1/models`, and a request in that moment finds no worker for its model: the gateway serves
/// once each worker is both.
fn serving(gateway: &mut Launched, workers: usize) -> String {
    let (mut addr, mut ready, mut learned) = (None, 0, 0);
    while addr.is_none() || ready < workers || learned < workers {
        let (listening, up, models) = gateway.until("listening and its workers ready", |l| {
            let listening = field(l, "addr").filter(|_| l.contains("sluice gateway listening"));
            let up = field(l, "to").as_deref() == Some("ready");
            let models = l.contains("worker models learned");
            (listening.is_some() || up || models).then_some((listening, up, models))
        });
        addr = addr.or(listening);
        ready += usize::from(up);
        learned += usize::from(models);
    }
    addr.unwrap()
}

/// A field of a log line, text (`key=value`) or JSON (`"fields": {"key": ...}`).
fn field(line: &str, key: &str) -> Option<String> {
    if line.starts_with('{') {
        let json: serde_json::Value = serde_json::from_str(line).ok()?;
        return json["fields"][key].as_str().map(str::to_string);
    }
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    let value = line[at..].split(' ').next()?;
    Some(value.trim_matches('"').to_string())
}

/// A chat request to the gateway at `addr`.
async fn chat(http: &HttpClient, addr: &str, model: &str, headers: &[(&str, &str)]) -> u16 {
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":2}}"#
    );
    let url = format!("http://{addr}/v1/chat/completions");
    send(http, "POST", &url, Some(&body), headers).await.status
}

/// Launch lines as SMG users write them, with every "works" flag of the page among them.
#[rustfmt::skip]
/// A disaggregated pair's URLs: (prefill, its bootstrap port, decode).
type PdPair = (String, String, String);

/// Launch lines as SMG users write them, with every "works" flag of the page among them.
#[rustfmt::skip]
fn launch_lines(worker: &str, log_dir: &str, listing: &str, certs: &certs::Certs, pd: &PdPair, model: &str) -> Vec<Vec<String>> {
    let worker_port = worker.rsplit(':').next().unwrap().to_string();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ca, server_cert, server_key) = (path(&certs.ca), path(&certs.server_cert), path(&certs.server_key));
    let (client_cert, client_key) = (path(&certs.client_cert), path(&certs.client_key));
    // The worker requires the key: SMG's --api-key is also the key it is sent.
    let common = ["--host", "127.0.0.1", "--port", "0", "--worker-urls", worker, "--api-key", "secret"];
    let (tokenizer, template) = (format!("{model}/tokenizer.json"), format!("{model}/chat.jinja"));
    let lines: [&[&str]; 10] = [
        // A keyed fleet behind a cache-aware gateway, with its logs, metrics and CORS.
        &[
            "--control-plane-api-keys", "k1:ops:admin:admin-secret",
            "--policy", "cache_aware",
            "--cache-threshold", "0.5",
            "--balance-abs-threshold", "32",
            "--balance-rel-threshold", "1.2",
            "--max-tree-size", "1048576",
            "--model-alias", "chat=test-model",
            "--enable-igw",
            "--request-id-headers", "x-trace-id",
            "--routing-key-headers", "x-session-id",
            "--cors-allowed-origins", "http://localhost:3000",
            "--log-level", "info",
            "--log-json",
            "--log-dir", log_dir,
            "--prometheus-port", "0",
            "--prometheus-host", "127.0.0.1",
            "--prometheus-duration-buckets", "0.1", "1", "10",
            "--health-check-port", "0",
            "--load-monitor-interval", "5",
            "--worker-auto-recovery",
            "--tenant-api-key", "acme:acme-key",
            "--trust-tenant-header",
            "--tenant-header-name", "x-tenant",
            "--max-concurrent-requests", "64",
            "--rate-limit-tokens-per-second", "100",
            "--queue-size", "100",
            "--queue-timeout-secs", "30",
        ],
        // Resilience tuned, traced (to a loopback port nothing listens on: the spans are
        // dropped and counted, and the requests served as ever).
        &[
            "--enable-trace",
            "--otlp-traces-endpoint", "127.0.0.1:9",
            "--policy", "consistent_hashing",
            "--retry-max-retries", "3",
            "--retry-initial-backoff-ms", "10",
            "--retry-max-backoff-ms", "100",
            "--retry-backoff-multiplier", "1.5",
            "--retry-jitter-factor", "0.2",
            "--cb-failure-threshold", "5",
            "--cb-success-threshold", "2",
            "--cb-timeout-duration-secs", "30",
            "--cb-window-duration-secs", "60",
            "--health-failure-threshold", "2",
            "--health-success-threshold", "1",
            "--health-check-timeout-secs", "3",
            "--health-check-interval-secs", "30",
            "--health-check-endpoint", "/health",
            "--remove-unhealthy-workers",
            "--worker-startup-timeout-secs", "600",
            "--worker-startup-delay", "0",
            "--worker-startup-check-interval", "10",
            "--request-timeout-secs", "600",
            "--shutdown-grace-period-secs", "30",
            "--header-read-timeout-secs", "30",
            "--max-payload-size", "1048576",
            "--worker-overload-protection",
            "--worker-overload-waiting-requests", "4",
            "--worker-overload-token-usage", "0.9",
            "--worker-overload-shed",
            "--worker-stall-secs", "2",
            "--worker-wedge-secs", "3",
            "--worker-stale-secs", "15",
        ],
        // Everything switched off, over HTTP/2, with the second spellings.
        &[
            "--upstream-http2",
            "--upstream-pool-idle-timeout-secs", "2",
            "--cache-match-threshold", "0.4",
            "--spill-abs-threshold", "10",
            "--spill-rel-threshold", "2",
            "--disable-retries",
            "--disable-circuit-breaker",
            "--disable-health-check",
            "--disable-worker-overload-protection",
            "--no-remove-unhealthy-workers",
        ],
        &["--no-worker-auto-recovery"],
        // HTTPS on the listener; the CA and client certificate for https workers.
        &[
            "--tls-cert-path", &server_cert,
            "--tls-key-path", &server_key,
            "--ca-cert-paths", &ca,
            "--client-cert-path", &client_cert,
            "--client-key-path", &client_key,
        ],
        // The worker listed in a file instead of --worker-urls.
        &[
            "--discovery-provider", "file",
            "--discovery-file", listing,
            "--discovery-check-interval-secs", "30",
        ],
        // The worker found as a Ready pod through the (fake) Kubernetes API.
        &[
            "--service-discovery",
            "--selector", "app=vllm",
            "--service-discovery-port", &worker_port,
            "--service-discovery-namespace", "llm",
            "--model-id-from", "label:model",
            // No pod has these labels: the flags are taken, the worker is the --selector one.
            "--pd-disaggregation",
            "--prefill-selector", "app=sglang", "role=prefill",
            "--decode-selector", "app=sglang", "role=decode",
        ],
        // A prefill/decode pair instead of --worker-urls.
        &[
            "--pd-disaggregation",
            "--prefill", &pd.0, &pd.1,
            "--decode", &pd.2,
            "--prefill-policy", "round_robin",
            "--decode-policy", "power_of_two",
            "--pd-admission-wait-secs", "10",
        ],
        // The model's files, for grpc:// workers (an HTTP fleet serves as before).
        &[
            "--model-path", model,
            "--tokenizer-path", &tokenizer,
            "--chat-template", &template,
        ],
        &["--model", model],
    ];
    lines
        .iter()
        .map(|extra| {
            let discovered = extra.contains(&"--discovery-file")
                || extra.contains(&"--service-discovery")
                || extra.contains(&"--prefill");
            let common = common.iter().enumerate().filter(|(at, _)| !(discovered && (4..6).contains(at)));
            common.map(|(_, s)| s).chain(extra.iter()).map(|s| s.to_string()).collect()
        })
        .collect()
}

/// An SGLang prefill engine and decode engine that want the launch lines' key.
async fn pd_pair() -> SimFleet {
    let mut prefill = instant(Flavor::Sglang);
    prefill.api_key = Some("secret".into());
    prefill.pd_role = Some(sluice_sim::PdRole::Prefill);
    let mut decode = prefill.clone();
    decode.pd_role = Some(sluice_sim::PdRole::Decode);
    SimFleet::start(FleetConfig::local(1, prefill).also(1, decode))
        .await
        .unwrap()
}

#[test]
fn smg_launch_lines_using_every_working_flag_start_and_serve() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut engine = instant(Flavor::Vllm);
    engine.api_key = Some("secret".into());
    let fleet = runtime
        .block_on(SimFleet::start(FleetConfig::local(1, engine)))
        .unwrap();
    let worker = fleet.urls()[0].clone();
    let pd_fleet = runtime.block_on(pd_pair());
    let pd = (
        pd_fleet.urls()[0].clone(),
        pd_fleet.engines()[0]
            .bootstrap_addr()
            .unwrap()
            .port()
            .to_string(),
        pd_fleet.urls()[1].clone(),
    );
    let log_dir = std::env::temp_dir().join(format!("sluice-smg-launch-{}", std::process::id()));
    let certs = certs::Certs::make("smg-launch");
    std::fs::create_dir_all(&log_dir).unwrap();
    let listing = log_dir.join("workers.json");
    std::fs::write(&listing, format!("[\"{worker}\"]")).unwrap();
    let model = log_dir.join("model");
    sluice_sim::vocab::Vocab::new()
        .write_model_dir(&model, "test-model")
        .unwrap();
    std::fs::write(model.join("chat.jinja"), sluice_sim::vocab::CHAT_TEMPLATE).unwrap();
    let lines = launch_lines(
        &worker,
        log_dir.to_str().unwrap(),
        listing.to_str().unwrap(),
        &certs,
        &pd,
        model.to_str().unwrap(),
    );
    // The API server --service-discovery asks, named by a kubeconfig: one Ready pod, the worker.
    let api = runtime.block_on(kube_api::FakeApi::start());
    api.set("vllm-0", "127.0.0.1", true);
    let kubeconfig = log_dir.join("kubeconfig");
    let config = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
         clusters:\n- name: fake\n  cluster:\n    server: {}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
         users:\n- name: fake\n  user: {{}}\n",
        api.url()
    );
    std::fs::write(&kubeconfig, config).unwrap();

    let used: BTreeSet<&str> = lines
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|a| a.starts_with("--"))
        .collect();
    for row in rows().iter().filter(|r| r.works) {
        for flag in &row.flags {
            assert!(used.contains(flag.as_str()), "no launch line uses {flag}");
        }
    }

    let http = client();
    for (i, line) in lines.iter().enumerate() {
        // --service-discovery reads its API server from the kubeconfig, never from a cluster.
        let env = [("KUBECONFIG", kubeconfig.as_os_str())];
        let mut gateway = Launched::start(line, &env);
        // A prefill/decode pair serves once both of its workers are ready.
        let workers = if line.iter().any(|a| a == "--prefill") {
            2
        } else {
            1
        };
        let addr = serving(&mut gateway, workers);
        if line.iter().any(|a| a == "--tls-cert-path") {
            // Spoken to over HTTPS in crates/gateway/tests/tls.rs; here, that it says so.
            let https = gateway.lines.said.iter().any(|l| {
                l.contains("sluice gateway listening")
                    && field(l, "scheme").as_deref() == Some("https")
            });
            assert!(https, "launch line {i}: {}", gateway.lines.said.join("\n"));
            continue;
        }
        let status = if i == 0 {
            // SMG's --api-key: clients must send it, and it is what the worker is sent.
            let refused = runtime.block_on(chat(&http, &addr, "chat", &[]));
            assert_eq!(refused, 401, "launch line {i}");
            runtime.block_on(chat(
                &http,
                &addr,
                "chat",
                &[("authorization", "Bearer secret"), ("x-trace-id", "t-1")],
            ))
        } else {
            runtime.block_on(chat(
                &http,
                &addr,
                "test-model",
                &[("authorization", "Bearer secret")],
            ))
        };
        assert_eq!(
            status,
            200,
            "launch line {i}: {}",
            gateway.lines.said.join("\n")
        );
    }
    let _ = std::fs::remove_dir_all(&log_dir);
}
