//! Reads of a gateway started over workers the test runs itself (scripted or raw ones, not the
//! simulator's fleet): its workers' ids and views, a metric, a chat.

use sluice_gateway::Gateway;
use sluice_sim::testkit::*;

use super::{chat_body, get_admin, Value};

/// The ids of the workers, in the order they were given.
pub async fn ids(gateway: &Gateway) -> Vec<String> {
    let view = get_admin(&client(), &format!("{}/workers", gateway.url()))
        .await
        .json();
    view["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect()
}

/// `GET /workers/{id}`.
pub async fn worker_view(gateway: &Gateway, id: &str) -> Value {
    get_admin(&client(), &format!("{}/workers/{id}", gateway.url()))
        .await
        .json()
}

/// The value of `series` (name and labels as `/metrics` writes them), 0 when absent.
pub async fn metric(gateway: &Gateway, series: &str) -> f64 {
    let text = get(&client(), &format!("{}/metrics", gateway.url()))
        .await
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A small chat completion for `test-model`.
pub async fn chat(gateway: &Gateway, stream: bool) -> Answer {
    let url = format!("{}/v1/chat/completions", gateway.url());
    post(&client(), &url, &chat_body("test-model", "hi", 8, stream)).await
}
