//! What the gateway's log lines say, read from the log as an operator reads it: the request that
//! opened a circuit, the figures a concurrency limit was lowered on.
//!
//! This binary holds one test on purpose: tracing decides once per call site, process-wide,
//! whether anyone listens. A log-reading test that shares its process with tests that hit the
//! same call sites with no subscriber can find that call site already switched off — it did in
//! CI when this was a unit test. Here the subscriber is the global default before any call site
//! is reached.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::breaker::BreakerConfig;
use sluice_core::policy::Policy;

/// Log output, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().clone()).unwrap()
    }
}

#[tokio::test]
async fn an_opened_circuit_names_its_request_and_a_lowered_limit_its_figures() {
    let captured = Captured::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish(),
    )
    .unwrap();
    let s = start(1, instant(Flavor::Vllm), |c| {
        c.route.policy = Policy::RoundRobin;
        c.forward.retry.status_codes.clear();
        c.fleet.breaker = Some(BreakerConfig {
            failure_threshold: 1,
            success_threshold: 1,
            open_timeout: Duration::from_secs(30),
            half_open_trials: 1,
            failure_rate: None,
        });
    })
    .await;
    s.sims
        .engine(0)
        .unwrap()
        .fault(Fault::ErrorRate { rate: 1.0 })
        .await
        .unwrap();
    let failed = send(
        &s.client,
        "POST",
        &s.url("/v1/chat/completions"),
        Some(&chat_body("test-model", "hi", 1, false)),
        &[("x-request-id", "req-9")],
    )
    .await;
    assert_eq!(failed.status, 500, "{}", failed.text());
    let id = s.worker_id(0).await;
    s.until_worker(&id, "an open circuit", |w| w["circuit"]["state"] == "open")
        .await;

    let text = captured.text();
    let line = text
        .lines()
        .find(|l| l.contains("circuit opened"))
        .unwrap_or_else(|| panic!("no line says the circuit opened:\n{text}"));
    assert!(
        line.contains("request_id") && line.contains("req-9"),
        "{line}"
    );

    limit_lowered(&captured).await;
}

/// A slowed engine's adaptive limit falls, and the log says so with the figures it fell on.
async fn limit_lowered(captured: &Captured) {
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        c.control.adaptive = Some(sluice_gateway::control::AdaptiveConfig {
            window: Duration::from_millis(300),
            aimd: sluice_core::adaptive::AimdConfig {
                min_samples: 2,
                ..Default::default()
            },
            initial_limit: 4,
        });
    })
    .await;
    s.sims
        .engine(0)
        .unwrap()
        .fault(Fault::Slow { factor: 8.0 })
        .await
        .unwrap();
    let id = s.worker_id(0).await;
    let url = s.url("/v1/chat/completions");
    bounded("a lowered limit", async {
        loop {
            // Two streams at a time; after each pair, a look at the limit.
            let body = chat_body("test-model", "slow answers", 8, true);
            let (a, b) = tokio::join!(
                send(&s.client, "POST", &url, Some(&body), &[]),
                send(&s.client, "POST", &url, Some(&body), &[])
            );
            assert_eq!((a.status, b.status), (200, 200));
            let worker = &s.workers().await[0];
            if worker["concurrency"]["limit"].as_u64().unwrap() < 4 {
                break;
            }
        }
    })
    .await;
    let text = captured.text();
    let line = text
        .lines()
        .find(|l| l.contains("concurrency limit lowered"))
        .unwrap_or_else(|| panic!("no line says the limit was lowered:\n{text}"));
    for field in [
        format!("worker={id}"),
        "from=4".into(),
        "to=3".into(),
        "itl_p95_ms=".into(),
    ] {
        assert!(line.contains(&field), "{field} in {line}");
    }
}
