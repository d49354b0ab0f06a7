//! `--access-log`: one line for every request however it ends — answered, refused, left by its
//! client mid-stream or while waiting — written out in full by the time shutdown returns.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sluice_gateway::Stopped;

/// The lines of the access log, parsed.
fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn every_ending_writes_its_line_and_shutdown_writes_them_out() {
    let dir = std::env::temp_dir().join(format!("sluice-access-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.jsonl");
    let _ = std::fs::remove_file(&path);
    let s = start(1, timed(Flavor::Vllm, 1.0), |c| {
        c.telemetry.access_log = Some(path.clone())
    })
    .await;
    let engine = s.sims.engine(0).unwrap();

    let ok = s.chat(&chat_body("test-model", "hi", 2, false)).await;
    assert_eq!(ok.status, 200);
    let unknown = s.chat(&chat_body("nope", "hi", 2, false)).await;
    assert_eq!(unknown.status, 404);
    let huge = s
        .chat(&chat_body(&"m".repeat(100_000), "hi", 2, false))
        .await;
    assert_eq!(huge.status, 404);

    // A client leaves mid-stream.
    let stream = open_stream(&s, "a long answer", 4000).await;
    drop(stream);
    bounded("the first abort", engine.until(|st| st.aborted == 1)).await;

    // A client leaves before any answer.
    let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
    let waiting = tokio::spawn(async move {
        post(&client, &url, &chat_body("test-model", "wait", 4000, false)).await
    });
    bounded("running", engine.until(|st| st.running == 1)).await;
    waiting.abort();
    bounded("the second abort", engine.until(|st| st.aborted == 2)).await;

    let Setup { gateway, sims, .. } = s;
    assert_eq!(
        bounded("the stop", gateway.shutdown()).await,
        Stopped::Drained
    );
    drop(sims);

    let log = lines(&path);
    let summary: Vec<(u64, Option<&str>, bool, bool)> = log
        .iter()
        .map(|l| {
            (
                l["status"].as_u64().unwrap(),
                l["code"].as_str(),
                l["stream"].as_bool().unwrap(),
                l["cancelled"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (200, None, false, false),
            (404, Some("model_not_found"), false, false),
            (404, Some("model_not_found"), false, false),
            (200, None, true, true),
            (499, None, false, true),
        ],
        "{log:#?}"
    );
    assert_eq!(log[0]["model"], "test-model");
    assert_eq!(
        log[1]["origin"], "client",
        "an unknown model is the client's doing"
    );
    assert!(
        log.iter()
            .filter(|l| l["code"].is_null())
            .all(|l| l.get("origin").is_none()),
        "an origin only where the gateway answered itself: {log:#?}"
    );
    assert_eq!(
        log[1]["model"], "nope",
        "the model asked for, though unknown"
    );
    let logged = log[2]["model"].as_str().unwrap();
    assert!(
        logged.len() <= 260,
        "a 100 kB model name is logged cut: {}",
        logged.len()
    );
    assert_eq!(log[4]["attempts"], 1, "it had reached a worker");
    assert!(log[0]["worker"]
        .as_str()
        .is_some_and(|w| w.starts_with('w')));
    assert!(log
        .iter()
        .all(|l| l["request_id"].as_str().unwrap().len() == 32));
    std::fs::remove_dir_all(&dir).unwrap();
}
