//! Service discovery, black-box: a gateway whose workers come from a file or from DNS follows
//! the listing (add, re-register on a changed spec, drain what is no longer listed), leaves
//! workers it did not register alone, keeps everything on a listing it cannot read, and brings
//! a worker it removed as failed back only once it answers its health endpoint again.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures_util::future::BoxFuture;
use sluice_core::health::Thresholds;
use sluice_gateway::config::Settings;
use sluice_gateway::control::discovery::{DnsConfig, FileConfig, Resolve};
use sluice_gateway::control::HealthConfig;

/// A listing file in the temp directory, removed when dropped.
struct ListingFile(PathBuf);

impl ListingFile {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-discovery-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir.join(name))
    }

    /// Replaces the file whole, as a deployment tool does (write aside, then rename).
    fn write(&self, text: &str) {
        let aside = self.0.with_extension("tmp");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, &self.0).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ListingFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn by_url<'a>(workers: &'a [Value], url: &str) -> Option<&'a Value> {
    workers.iter().find(|w| w["url"] == url)
}

async fn workers_view(gateway: &Gateway, client: &HttpClient) -> Value {
    get_admin(client, &format!("{}/workers", gateway.url()))
        .await
        .json()
}

async fn chats_ok(gateway: &Gateway, client: &HttpClient, n: usize) {
    for i in 0..n {
        let a = post(
            client,
            &format!("{}/v1/chat/completions", gateway.url()),
            &chat_body("test-model", &format!("q{i}"), 1, false),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
}

#[tokio::test]
async fn a_fleet_follows_its_discovery_file() {
    let sims = SimFleet::start(FleetConfig::local(4, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let urls = sims.urls();
    let file = ListingFile::new("follows.json");
    // Engine 3 comes from --worker-urls; the file lists it too, and it stays the flag's.
    file.write(
        &serde_json::json!([
            urls[0],
            {"url": urls[1], "labels": {"zone": "a"}},
            urls[3],
        ])
        .to_string(),
    );
    let mut config = Config::local(&urls[3..]);
    config.discovery.file = Some(FileConfig {
        path: file.path().to_path_buf(),
        every: Duration::from_secs(600),
    });
    // Long enough that a drained worker is still listed, draining, when the test looks.
    config.fleet.drain_settle = Duration::from_secs(60);
    let gateway = Gateway::start(config).await.unwrap();
    let client = client();

    let workers = until_workers(&gateway, &client, "three ready", |w| {
        w.len() == 3 && all_ready(w)
    })
    .await;
    for (url, source) in [
        (&urls[0], "discovery_file"),
        (&urls[1], "discovery_file"),
        (&urls[3], "worker_urls"),
    ] {
        assert_eq!(by_url(&workers, url).unwrap()["source"], source, "{url}");
    }
    let second = by_url(&workers, &urls[1]).unwrap()["id"].clone();
    let view = workers_view(&gateway, &client).await;
    assert_eq!(view["discovery"][0]["source"], "discovery_file");
    assert_eq!(view["discovery"][0]["listed"], 3);
    assert!(view["discovery"][0]["error"].is_null());
    chats_ok(&gateway, &client, 3).await;

    // Engine 0 goes, engine 1's spec changes, engine 2 comes, engine 3 is not listed any more.
    file.write(
        &serde_json::json!({"workers": [
            {"url": urls[1], "labels": {"zone": "b"}},
            urls[2],
        ]})
        .to_string(),
    );
    let workers = until_workers(&gateway, &client, "the new listing", |w| {
        by_url(w, &urls[0]).is_some_and(|w| w["status"] == "draining")
            && by_url(w, &urls[1]).is_some_and(|w| w["spec"]["labels"]["zone"] == "b")
            && by_url(w, &urls[2]).is_some_and(|w| w["status"] == "ready")
    })
    .await;
    let one = by_url(&workers, &urls[1]).unwrap();
    assert_eq!(one["id"], second, "re-registered under the same id");
    let three = by_url(&workers, &urls[3]).unwrap();
    assert_eq!(three["source"], "worker_urls");
    assert_eq!(three["status"], "ready", "never the file's to drain");
    let before = sims.engine(0).unwrap().state().requests_received;
    chats_ok(&gateway, &client, 6).await;
    let after = sims.engine(0).unwrap().state().requests_received;
    assert_eq!(before, after, "a draining worker takes no new request");

    // A listing that does not parse changes nothing, and says why.
    let listed = workers_view(&gateway, &client).await["workers"].clone();
    file.write("[\"http://127.0.0.1:1\",");
    let view = until_view(&gateway, &client, "the error shown", "/workers", |v| {
        v["discovery"][0]["error"].is_string()
    })
    .await;
    assert!(
        view["discovery"][0]["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{view}"
    );
    let ids = |workers: &Value| {
        workers
            .as_array()
            .unwrap()
            .iter()
            .map(|w| (w["id"].clone(), w["status"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&view["workers"]), ids(&listed));
    assert_eq!(
        view["discovery"][0]["listed"], 2,
        "the last good listing stands"
    );

    // Mended, it reads again.
    file.write(&serde_json::json!([urls[1], urls[2]]).to_string());
    let view = until_view(&gateway, &client, "the error cleared", "/workers", |v| {
        v["discovery"][0]["error"].is_null()
    })
    .await;
    let workers = view["workers"].as_array().unwrap();
    assert!(
        by_url(workers, &urls[1]).unwrap()["spec"]["labels"]["zone"].is_null(),
        "its label went with the spec that had it: {view}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_failed_listed_worker_returns_only_once_it_answers_again() {
    let sims = SimFleet::start(FleetConfig::local(2, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let urls = sims.urls();
    let file = ListingFile::new("recovery.toml");
    file.write(&format!(
        "[[workers]]\nurl = \"{}\"\n\n[[workers]]\nurl = \"{}\"\n",
        urls[0], urls[1]
    ));
    let mut settings = Settings::defaults();
    settings.listen.port = 0;
    settings.discovery.discovery_file = Some(file.path().to_path_buf());
    let mut config = settings.validate().unwrap();
    assert!(
        config.control.health.remove_unhealthy,
        "auto-recovery follows discovery"
    );
    config.control.health = HealthConfig {
        interval: Duration::from_millis(100),
        timeout: Duration::from_secs(1),
        thresholds: Thresholds {
            failure: 1,
            success: 1,
        },
        ..config.control.health
    };
    config.access.keys.admin = Some(ADMIN_KEY.into());
    let gateway = Gateway::start(config).await.unwrap();
    let client = client();
    until_workers(&gateway, &client, "both ready", |w| {
        w.len() == 2 && all_ready(w)
    })
    .await;

    let victim = sims.engine(0).unwrap();
    victim.crash().await;
    let view = until_view(&gateway, &client, "removed and held", "/workers", |v| {
        by_url(v["workers"].as_array().unwrap(), &urls[0]).is_none()
            && v["discovery"][0]["held"] == serde_json::json!([urls[0]])
    })
    .await;
    assert_eq!(view["total"], 1);
    chats_ok(&gateway, &client, 3).await;

    victim.fault(Fault::Restart).await.unwrap();
    let view = until_view(&gateway, &client, "back and ready", "/workers", |v| {
        by_url(v["workers"].as_array().unwrap(), &urls[0]).is_some_and(|w| w["status"] == "ready")
    })
    .await;
    assert_eq!(view["discovery"][0]["held"], serde_json::json!([]));
    assert_eq!(
        by_url(view["workers"].as_array().unwrap(), &urls[0]).unwrap()["source"],
        "discovery_file"
    );
    chats_ok(&gateway, &client, 4).await;
    assert!(
        victim.state().requests_received > 0,
        "it takes requests again"
    );
    gateway.shutdown().await;
}

/// A resolver whose answer the test sets.
struct FakeDns {
    answer: parking_lot::Mutex<Result<Vec<SocketAddr>, String>>,
}

impl FakeDns {
    fn new(first: Vec<SocketAddr>) -> Self {
        Self {
            answer: parking_lot::Mutex::new(Ok(first)),
        }
    }

    fn answer(&self, answer: Result<Vec<SocketAddr>, &str>) {
        *self.answer.lock() = answer.map_err(str::to_string);
    }
}

impl Resolve for FakeDns {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        assert_eq!((name, port), ("vllm.llm.svc.cluster.local", 8000));
        let answer = self.answer.lock().clone().map_err(std::io::Error::other);
        Box::pin(async move { answer })
    }
}

#[tokio::test]
async fn a_fleet_follows_what_its_name_resolves_to() {
    let sims = SimFleet::start(FleetConfig::local(2, instant(Flavor::Sglang)))
        .await
        .unwrap();
    let urls = sims.urls();
    let addrs: Vec<SocketAddr> = urls
        .iter()
        .map(|u| u.trim_start_matches("http://").parse().unwrap())
        .collect();
    let dns = Arc::new(FakeDns::new(addrs.clone()));
    let mut config = Config::local(&[]);
    config.discovery.dns = Some(DnsConfig {
        name: "vllm.llm.svc.cluster.local".into(),
        port: 8000,
        every: Duration::from_secs(1),
        resolver: dns.clone(),
    });
    config.fleet.drain_settle = Duration::ZERO;
    let gateway = Gateway::start(config).await.unwrap();
    let client = client();
    let workers = until_workers(&gateway, &client, "both ready", |w| {
        w.len() == 2 && all_ready(w)
    })
    .await;
    assert!(workers.iter().all(|w| w["source"] == "dns"));
    chats_ok(&gateway, &client, 2).await;

    dns.answer(Ok(vec![addrs[1]]));
    until_workers(&gateway, &client, "one left", |w| {
        w.len() == 1 && by_url(w, &urls[1]).is_some()
    })
    .await;

    dns.answer(Err("no such host"));
    let view = until_view(&gateway, &client, "the failure shown", "/workers", |v| {
        v["discovery"][0]["error"] == "no such host"
    })
    .await;
    assert_eq!(view["total"], 1, "a failed lookup changes nothing");
    assert_eq!(
        view["discovery"][0]["target"],
        "vllm.llm.svc.cluster.local:8000"
    );

    dns.answer(Ok(vec![]));
    until_workers(&gateway, &client, "none listed", |w| w.is_empty()).await;
    gateway.shutdown().await;
}
