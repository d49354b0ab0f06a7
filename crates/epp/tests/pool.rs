//! The picker following an InferencePool through a fake Kubernetes API server (list and watch):
//! the pool's Ready pods are its workers, on the pool's port; watches the server drops (resumed),
//! a pod leaving, a pod flapping (its id kept), a selector and a port change, history expired (a
//! relist) and the pool gone are all followed without a restart; the InferenceObjectives naming the pool set the
//! tiers of the requests that name them, and follow their changes.
#![allow(clippy::unwrap_used)]

mod common;
#[allow(dead_code)]
#[path = "../../gateway/tests/common/kube_api.rs"]
mod kube_api;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use common::*;
use kube_api::FakeApi;
use serde_json::json;
use sluice_gateway::control::discovery::{Cluster, KubeConfig, Members, PoolRef};

/// One engine at each of 127.0.0.2 and 127.0.0.3, on one port (as a Deployment's pods are).
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

/// A picker whose workers are pool `llama`'s pods, as `--pool-name llama --pool-namespace llm`
/// sets it up, against `api`.
async fn picker_of_pool(api: &FakeApi) -> Picker {
    let mut config = Config::local(&[]);
    config.discovery.kubernetes = Some(KubeConfig {
        members: Members::Pool(PoolRef {
            name: "llama".into(),
        }),
        namespace: Some("llm".into()),
        model_from: None,
        cluster: Cluster::At(api.url().parse().unwrap()),
    });
    config.fleet.drain_settle = std::time::Duration::ZERO;
    Picker::start(config, &epp_settings()).await.unwrap()
}

/// The workers' URLs and ids, once they are `want` (all routable); awaited on change notices.
async fn until_workers(picker: &Picker, what: &str, want: &[String]) -> BTreeMap<String, String> {
    let gateway = picker.gateway();
    let mut changes = gateway.changes();
    let mut want = want.to_vec();
    want.sort();
    bounded(what, async {
        loop {
            changes.borrow_and_update();
            let workers: BTreeMap<String, String> = gateway
                .fleet()
                .snapshot()
                .workers
                .iter()
                .map(|w| (w.live().spec.url.clone(), w.id.to_string()))
                .collect();
            let routable = gateway
                .fleet()
                .snapshot()
                .workers
                .iter()
                .all(|w| w.is_routable());
            if workers.keys().cloned().collect::<Vec<_>>() == want && routable {
                return workers;
            }
            changes.changed().await.unwrap();
        }
    })
    .await
}

#[tokio::test]
async fn the_pools_ready_pods_are_the_workers_and_every_change_is_followed() {
    let (_a, _b, port) = pods_engines().await;
    let (url_a, url_b) = (
        format!("http://127.0.0.2:{port}"),
        format!("http://127.0.0.3:{port}"),
    );
    let api = FakeApi::start().await;
    api.set("vllm-a", "127.0.0.2", true);
    api.set("vllm-b", "127.0.0.3", true);
    api.set_labeled(
        "unrelated",
        "127.0.0.4",
        true,
        json!({"app": "other"}),
        json!({}),
    );
    api.set_pool("llama", json!({"app": "vllm"}), port);
    let picker = picker_of_pool(&api).await;
    let both = [url_a.clone(), url_b.clone()];
    let first = until_workers(&picker, "the pool's two pods", &both).await;

    // Requests go to the pool's pods.
    let mut plane = DataPlane::connect(picker.grpc_addr()).await;
    let answer = plane.chat(&chat_body("hello", 2, false), &[]).await;
    let Decision::Routed { endpoint } = &answer.decision else {
        panic!("not routed: {answer:?}");
    };
    assert!(
        [address_of(&url_a), address_of(&url_b)].contains(endpoint),
        "{endpoint}"
    );

    // The server ends every watch (the pool's, the pods', the objectives'): each is resumed
    // from where it was, without a new list, and a change made then is seen.
    let (watches, lists) = api.served();
    api.drop_watches();
    api.until_watches(watches + 3).await;
    // A pod that stops being Ready leaves, and comes back with the same id.
    api.set("vllm-b", "127.0.0.3", false);
    until_workers(&picker, "B not Ready", std::slice::from_ref(&url_a)).await;
    api.set("vllm-b", "127.0.0.3", true);
    let back = until_workers(&picker, "B Ready again", &both).await;
    assert_eq!(back[&url_b], first[&url_b], "the same id");
    assert_eq!(api.served().1, lists, "resumed without listing again");

    // The pool's selector changes: its pods change with it, from what is already known.
    api.set_labeled(
        "vllm-b",
        "127.0.0.3",
        true,
        json!({"app": "vllm", "tier": "large"}),
        json!({}),
    );
    api.set_pool("llama", json!({"app": "vllm", "tier": "large"}), port);
    until_workers(&picker, "only B selected", std::slice::from_ref(&url_b)).await;

    // History expired while the pool changed back: the watches list again and see it.
    let (_, lists) = api.served();
    api.expire_history();
    api.set_pool("llama", json!({"app": "vllm"}), port);
    until_workers(&picker, "both again, after a relist", &both).await;
    assert!(api.served().1 > lists, "listed again after 410");

    // A pod deleted leaves; the pool's port changes and so does every worker's address.
    api.delete("vllm-a");
    until_workers(&picker, "A deleted", std::slice::from_ref(&url_b)).await;
    let spare = port.checked_add(1).unwrap_or(port - 1);
    api.set_pool("llama", json!({"app": "vllm"}), spare);
    let gateway = picker.gateway();
    let mut changes = gateway.changes();
    let moved = format!("http://127.0.0.3:{spare}");
    bounded("the new port", async {
        loop {
            changes.borrow_and_update();
            let urls: Vec<String> = gateway
                .fleet()
                .snapshot()
                .workers
                .iter()
                .map(|w| w.live().spec.url.clone())
                .collect();
            if urls == [moved.clone()] {
                return;
            }
            changes.changed().await.unwrap();
        }
    })
    .await;

    // The pool gone: no workers, and the picker says why.
    api.set_pool("llama", json!({"app": "vllm"}), port);
    until_workers(&picker, "back on its port", std::slice::from_ref(&url_b)).await;
    api.delete_pool("llama");
    until_workers(&picker, "no pool, no workers", &[]).await;
    let mut changes = gateway.changes();
    bounded("the missing pool named as the source's error", async {
        loop {
            changes.borrow_and_update();
            let view = get(&client(), &format!("{}/workers", gateway.url()))
                .await
                .json();
            if let Some(error) = view["discovery"][0]["error"].as_str() {
                assert_eq!(error, "no InferencePool llama in llm", "{view}");
                return;
            }
            changes.changed().await.unwrap();
        }
    })
    .await;
    picker.shutdown().await;
}

/// `sluice_slo_attained_total` by tier, from the picker's `/metrics`.
async fn attained(picker: &Picker, tier: &str) -> u64 {
    let text = metrics(picker).await;
    let prefix = format!("sluice_slo_attained_total{{tier=\"{tier}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test]
async fn the_objectives_naming_the_pool_set_the_tiers_and_their_changes_apply() {
    let (_a, _b, port) = pods_engines().await;
    let api = FakeApi::start().await;
    api.set("vllm-a", "127.0.0.2", true);
    api.set_pool("llama", json!({"app": "vllm"}), port);
    api.set_objective("chat", "llama", Some(10));
    api.set_objective("offline", "llama", Some(-1));
    api.set_objective("elsewhere", "mistral", Some(-1));
    let picker = picker_of_pool(&api).await;
    let mut objectives = picker.objective_changes();
    let url = format!("http://127.0.0.2:{port}");
    until_workers(&picker, "the pool's pod", std::slice::from_ref(&url)).await;
    bounded("the first priorities", objectives.wait_for(|n| *n >= 1))
        .await
        .unwrap();

    let mut plane = DataPlane::connect(picker.grpc_addr()).await;
    let objective = "x-gateway-inference-objective";
    for (name, tier) in [
        ("chat", "interactive"),
        ("offline", "batch"),
        ("elsewhere", "agent"),
    ] {
        let before = attained(&picker, tier).await;
        let answer = plane
            .chat(&chat_body(name, 2, false), &[(objective, name)])
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            attained(&picker, tier).await,
            before + 1,
            "{name} served as {tier}"
        );
    }

    // The owner lowers chat's priority: the next request follows it.
    let seen = *objectives.borrow_and_update();
    api.set_objective("chat", "llama", Some(-5));
    bounded("the new priority", objectives.wait_for(|n| *n > seen))
        .await
        .unwrap();
    let before = attained(&picker, "batch").await;
    let answer = plane
        .chat(&chat_body("chat", 2, false), &[(objective, "chat")])
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        attained(&picker, "batch").await,
        before + 1,
        "chat is batch now"
    );
    picker.shutdown().await;
}
