//! Real SMG 1.13 (`pip install smg==1.13.0`; `scripts/test` installs it) against the simulated
//! engine's gRPC service: SMG fetches the model's tokenizer over `GetTokenizer`, routes a chat
//! through `Generate` and detokenizes the answer, and reads the engine's load from the records
//! its KV-event stream pushes; in prefill/decode mode it pairs a gRPC prefill engine with a gRPC
//! decode engine in the bootstrap rooms it names and gates the decode engine's running window.
//! A client nobody here wrote agreeing with the service is the check that the simulator speaks
//! the protocol as SMG expects of a servicer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_sim::testkit::{client, get, instant, post, sse_events, timed};
use sluice_sim::vocab::token_text;
use sluice_sim::{Flavor, FleetConfig, GrpcConfig, PdRole, SimFleet};

/// `smg` on the PATH, or `SLUICE_SMG`.
fn binary() -> String {
    std::env::var("SLUICE_SMG").unwrap_or_else(|_| "smg".to_string())
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A running `smg launch`, killed by its PID when dropped; its log lines, as they come.
struct Smg {
    child: Child,
    port: u16,
    metrics: u16,
    lines: mpsc::Receiver<String>,
}

impl Smg {
    fn launch(worker: &str) -> Self {
        Self::launch_with(&["--worker-urls", worker])
    }

    /// `smg launch` with `workers`, the arguments that name its workers.
    fn launch_with(workers: &[&str]) -> Self {
        let (port, metrics) = (free_port(), free_port());
        let mut child = Command::new(binary())
            .args(["launch", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--prometheus-port", &metrics.to_string()])
            .args(workers)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("smg (pip's smg==1.13.0; scripts/test installs it)");
        let (tx, lines) = mpsc::channel();
        fn pump(pipe: impl Read + Send + 'static, tx: mpsc::Sender<String>) {
            std::thread::spawn(move || {
                // Read to the end, so SMG never blocks on a full pipe.
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        pump(child.stdout.take().unwrap(), tx.clone());
        pump(child.stderr.take().unwrap(), tx);
        Self {
            child,
            port,
            metrics,
            lines,
        }
    }

    /// Waits for a log line containing `needle`; panics with what was logged if none comes.
    fn logged(&self, needle: &str) {
        let mut seen = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(60)) {
            if line.contains(needle) {
                return;
            }
            seen.push(line);
        }
        panic!(
            "SMG never logged {needle:?}; it logged:\n{}",
            seen.join("\n")
        );
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// One series of SMG's Prometheus metrics, if it has it.
    async fn metric(&self, series: &str) -> Option<f64> {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics);
        let text = get(&client(), &url).await.text();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }
}

impl Drop for Smg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_routes_a_chat_through_the_simulated_grpc_engine_and_reads_its_pushed_load() {
    let mut cfg = instant(Flavor::Sglang);
    cfg.grpc = Some(GrpcConfig::default());
    let fleet = SimFleet::start(FleetConfig::local(1, cfg)).await.unwrap();
    let worker = fleet.urls()[0].clone();
    let smg = Smg::launch(&worker);
    smg.logged("KV event stream connected");
    smg.logged("Successfully loaded tokenizer 'test-model'");

    let http = client();
    let chat = json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 8,
    });
    let whole = post(&http, &smg.url("/v1/chat/completions"), &chat.to_string()).await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    let body = whole.json();
    let tokens = body["usage"]["completion_tokens"].as_u64().unwrap() as u32;
    assert!((1..=8).contains(&tokens), "{body}");
    // A stop ends on the end-of-turn token, which decodes to nothing.
    let words = match body["choices"][0]["finish_reason"].as_str() {
        Some("stop") => tokens - 1,
        Some("length") => tokens,
        other => panic!("finish_reason {other:?}"),
    };
    let said: String = (0..words).map(|i| token_text(0, i)).collect();
    assert_eq!(
        body["choices"][0]["message"]["content"], said,
        "SMG decoded the engine's token ids with the tokenizer it fetched"
    );

    let mut streamed = chat;
    streamed["stream"] = json!(true);
    streamed["max_tokens"] = json!(4096);
    let answer = post(
        &http,
        &smg.url("/v1/chat/completions"),
        &streamed.to_string(),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let events = sse_events(&answer.text());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let finishes: Vec<Value> = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|e| e["choices"][0].get("finish_reason").cloned())
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(
        finishes,
        [json!("stop")],
        "the end of turn ended the answer"
    );

    // SMG's view of the engine's load turns from its registration poll's (versioned by the
    // engine) to the pushed records' once it has ingested one; it announces nothing to await,
    // so its view is read again until it turns (as the gateway tests read `/workers`), within a
    // bound.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let workers = loop {
        let workers = get(&http, &smg.url("/workers")).await.json();
        let pushed = workers["workers"][0]["engine_load"]["version"] == "pushed";
        if pushed || tokio::time::Instant::now() > deadline {
            break workers;
        }
        tokio::task::yield_now().await;
    };
    let load = &workers["workers"][0]["engine_load"];
    assert_eq!(load["version"], "pushed", "{workers}");
    let engine = fleet.engine(0).unwrap().config().clone();
    let capacity = u64::from(engine.num_gpu_blocks) * u64::from(engine.block_size);
    assert_eq!(load["loads"][0]["max_total_num_tokens"], capacity);
    assert_eq!(
        load["loads"][0]["max_running_requests"],
        engine.max_num_seqs
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_pairs_the_simulated_grpc_prefill_and_decode_engines_and_gates_the_decode_window() {
    // A prefill engine, and a decode engine that runs two requests at a time at an H100's pace.
    let mut prefill = instant(Flavor::Sglang);
    prefill.grpc = Some(GrpcConfig::default());
    prefill.pd_role = Some(PdRole::Prefill);
    let mut decode = timed(Flavor::Sglang, 1.0);
    decode.grpc = Some(GrpcConfig::default());
    decode.pd_role = Some(PdRole::Decode);
    decode.max_num_seqs = 2;
    let fleet = SimFleet::start(FleetConfig::local(1, prefill).also(1, decode))
        .await
        .unwrap();
    let bootstrap = fleet.engine(0).unwrap().bootstrap_addr().unwrap().port();
    let (p, d) = (fleet.urls()[0].clone(), fleet.urls()[1].clone());
    let bootstrap = bootstrap.to_string();
    let smg = Smg::launch_with(&[
        "--pd-disaggregation",
        "--prefill",
        &p,
        &bootstrap,
        "--decode",
        &d,
    ]);
    smg.logged("Successfully loaded tokenizer 'test-model'");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while smg
        .metric(&format!("smg_pd_admission_window{{worker=\"{d}\"}}"))
        .await
        != Some(2.0)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SMG never read the decode engine's running window"
        );
        tokio::task::yield_now().await;
    }

    // Four streams at once, each holding a decode slot for about a second: SMG dispatches two
    // and holds two until a slot frees.
    let streams = (0..4).map(|i| {
        let body = json!({
            "model": "test-model",
            "messages": [{"role": "user", "content": format!("question {i}")}],
            "max_tokens": 150, "ignore_eos": true, "stream": true,
        });
        let url = smg.url("/v1/chat/completions");
        async move { post(&client(), &url, &body.to_string()).await }
    });
    for answer in futures_util::future::join_all(streams).await {
        assert_eq!(answer.status, 200, "{}", answer.text());
        let events = sse_events(&answer.text());
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let pieces = events
            .iter()
            .filter(|e| e.contains(r#""content":""#) && !e.contains(r#""content":"""#))
            .count();
        assert_eq!(pieces, 150, "every token from the decode engine");
    }
    assert_eq!(smg.metric("smg_pd_admission_waits_total").await, Some(2.0));
    let (p, d) = (
        fleet.engine(0).unwrap().state(),
        fleet.engine(1).unwrap().state(),
    );
    assert_eq!(
        (
            p.transfer_failures,
            d.transfer_failures,
            p.bootstrap_timeouts
        ),
        (0, 0, 0),
        "each pair met in the room SMG named"
    );
    assert!(
        p.prompt_tokens_computed >= 4 * 20,
        "the prefill computed the prompts"
    );
    assert!(
        d.prompt_tokens_computed < 4 * 20,
        "the decode engine computed their last tokens (and SMG's one-token probes), no prompt"
    );
}
