//! Kubernetes discovery against a fake API server speaking list-and-watch: Ready pods become
//! workers and leave when they stop being Ready or go; the watch survives being dropped, a
//! resource version too old (a fresh list, swapped in whole), and a pod that flaps.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::kube_api::FakeApi;
use common::*;
use sluice_gateway::control::discovery::{Cluster, KubeConfig, Members, ModelFrom, Selector};
use sluice_gateway::fleet::WorkerType;

/// One engine at each of 127.0.0.2 and 127.0.0.3, on the same port (as pods of one Deployment
/// all serve on one).
async fn pods_engines() -> (SimFleet, SimFleet, u16) {
    let at = |last: u8, port: u16| FleetConfig {
        host: IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
        port,
        ..FleetConfig::local(1, instant(Flavor::Vllm))
    };
    let first = SimFleet::start(at(2, 0)).await.unwrap();
    let port: u16 = first.urls()[0].rsplit(':').next().unwrap().parse().unwrap();
    let second = SimFleet::start(at(3, port)).await.unwrap();
    (first, second, port)
}

fn urls(workers: &[Value]) -> Vec<String> {
    let mut urls: Vec<String> = workers
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect();
    urls.sort();
    urls
}

#[tokio::test]
async fn ready_pods_are_workers_through_dropped_watches_expired_versions_and_flapping() {
    let (_a, _b, port) = pods_engines().await;
    let (url_a, url_b) = (
        format!("http://127.0.0.2:{port}"),
        format!("http://127.0.0.3:{port}"),
    );
    let api = FakeApi::start().await;
    api.set("vllm-a", "127.0.0.2", true);
    api.set("vllm-b", "127.0.0.3", false);
    let mut config = Config::local(&[]);
    config.discovery.kubernetes = Some(KubeConfig {
        members: Members::Selected {
            selectors: vec![Selector {
                labels: "app=vllm".into(),
                role: WorkerType::Regular,
            }],
            port,
        },
        namespace: Some("llm".into()),
        model_from: Some(ModelFrom::Label("model".into())),
        cluster: Cluster::At(api.url().parse().unwrap()),
    });
    config.fleet.drain_settle = Duration::ZERO;
    let gateway = Gateway::start(config).await.unwrap();
    let client = client();
    let only = |url: &str| {
        let url = url.to_string();
        move |w: &[Value]| urls(w) == [url.clone()] && all_ready(w)
    };

    let workers = until_workers(&gateway, &client, "the Ready pod", only(&url_a)).await;
    assert_eq!(workers[0]["source"], "kubernetes");
    assert_eq!(
        workers[0]["spec"]["model_id"], "test-model",
        "from the label"
    );
    assert_eq!(api.selector(), "app=vllm");
    let both = |w: &[Value]| urls(w).len() == 2 && all_ready(w);
    api.set("vllm-b", "127.0.0.3", true);
    until_workers(&gateway, &client, "the second pod Ready", both).await;

    // The server ends the watch; the client watches again from where it was.
    let (watches, lists) = api.served();
    api.drop_watches();
    api.until_watches(watches + 1).await;
    api.set("vllm-a", "127.0.0.2", false);
    until_workers(&gateway, &client, "A not Ready", only(&url_b)).await;
    assert_eq!(api.served().1, lists, "resumed without listing again");

    // History expired: the resumed watch gets 410 Gone, and the client lists again. What
    // changed meanwhile arrives with the list.
    let (watches, lists) = api.served();
    api.expire_history();
    api.delete("vllm-b");
    api.set("vllm-a", "127.0.0.2", true);
    until_workers(&gateway, &client, "the relisted pods", only(&url_a)).await;
    assert!(api.served().1 > lists, "listed again after 410");
    api.until_watches(watches + 2).await;

    // A pod flapping: each change followed, and B keeps its id.
    api.set("vllm-b", "127.0.0.3", true);
    let workers = until_workers(&gateway, &client, "B back", both).await;
    let id_b = workers.iter().find(|w| w["url"] == url_b).unwrap()["id"].clone();
    for _ in 0..2 {
        api.set("vllm-b", "127.0.0.3", false);
        until_workers(&gateway, &client, "B not Ready", only(&url_a)).await;
        api.set("vllm-b", "127.0.0.3", true);
        let workers = until_workers(&gateway, &client, "B Ready", both).await;
        let again = workers.iter().find(|w| w["url"] == url_b).unwrap();
        assert_eq!(again["id"], id_b, "the same id each time");
    }
    let view = get_admin(&client, &format!("{}/workers", gateway.url()))
        .await
        .json();
    assert_eq!(view["discovery"][0]["source"], "kubernetes");
    assert!(view["discovery"][0]["error"].is_null(), "{view}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn prefill_and_decode_pods_are_found_by_their_selectors_and_serve_as_a_pair() {
    let at = |last: u8, port: u16, role: sluice_sim::PdRole, bootstrap: u16| {
        let mut engine = instant(Flavor::Sglang);
        engine.pd_role = Some(role);
        FleetConfig {
            host: IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
            port,
            bootstrap_port: bootstrap,
            ..FleetConfig::local(1, engine)
        }
    };
    let prefill = SimFleet::start(at(2, 0, sluice_sim::PdRole::Prefill, 0))
        .await
        .unwrap();
    let port: u16 = prefill.urls()[0]
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let bootstrap = prefill.engines()[0].bootstrap_addr().unwrap().port();
    let _decode = SimFleet::start(at(3, port, sluice_sim::PdRole::Decode, 0))
        .await
        .unwrap();
    let api = FakeApi::start().await;
    let labels = |role: &str| serde_json::json!({"app": "sglang", "role": role});
    let annotations = serde_json::json!({"sglang.ai/bootstrap-port": bootstrap.to_string()});
    api.set_labeled(
        "prefill-0",
        "127.0.0.2",
        true,
        labels("prefill"),
        annotations,
    );
    api.set_labeled(
        "decode-0",
        "127.0.0.3",
        true,
        labels("decode"),
        serde_json::json!({}),
    );
    api.set("unrelated", "127.0.0.4", true);
    let selector = |labels: &str, role| Selector {
        labels: labels.into(),
        role,
    };
    let mut config = Config::local(&[]);
    config.discovery.kubernetes = Some(KubeConfig {
        members: Members::Selected {
            selectors: vec![
                selector("app=sglang,role=prefill", WorkerType::Prefill),
                selector("app=sglang,role=decode", WorkerType::Decode),
            ],
            port,
        },
        namespace: Some("llm".into()),
        model_from: None,
        cluster: Cluster::At(api.url().parse().unwrap()),
    });
    let gateway = Gateway::start(config).await.unwrap();
    let client = client();
    let pair = |w: &[Value]| w.len() == 2 && all_ready(w);
    let workers = until_workers(&gateway, &client, "the pair", pair).await;
    let role_of = |url: &str| {
        workers
            .iter()
            .find(|w| w["url"] == url)
            .map(|w| (w["role"].clone(), w["spec"]["bootstrap_port"].clone()))
            .unwrap()
    };
    assert_eq!(
        role_of(&format!("http://127.0.0.2:{port}")),
        ("prefill".into(), bootstrap.into())
    );
    assert_eq!(
        role_of(&format!("http://127.0.0.3:{port}")),
        ("decode".into(), Value::Null)
    );
    let url = format!("{}/v1/chat/completions", gateway.url());
    let answer = post(&client, &url, &chat_body("test-model", "hello", 4, false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}
