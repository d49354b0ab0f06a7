//! TLS both ways, with certificates made in the test: the listener serves HTTPS
//! (`--tls-cert-path`, `--tls-key-path`), HTTP/2 by ALPN; https workers are verified against
//! `--ca-cert-paths` and shown `--client-cert-path` when they ask (mTLS).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::certs::Certs;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::crypto::ring;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sluice_gateway::config::Settings;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

fn roots(certs: &Certs) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&certs.ca).unwrap())
        .unwrap();
    roots
}

/// A client trusting the test CA, offering `alpn` (HTTP/2 and HTTP/1.1, or HTTP/1.1 alone).
fn https_client(certs: &Certs, h2: bool) -> HttpsClient {
    let tls = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(certs))
        .with_no_client_auth();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1();
    let connector = if h2 {
        connector.enable_http2().build()
    } else {
        connector.build()
    };
    Client::builder(TokioExecutor::new()).build(connector)
}

/// `GET url`: the status and the protocol version it came over.
async fn https_get(client: &HttpsClient, url: &str) -> (u16, http::Version) {
    let request = http::Request::get(url).body(Full::default()).unwrap();
    let response = client.request(request).await.unwrap();
    let version = response.version();
    let status = response.status().as_u16();
    response.into_body().collect().await.unwrap();
    (status, version)
}

/// The defaults on an ephemeral loopback port, in front of `workers`, adjusted by `tune`.
fn settings(workers: &[String], tune: impl FnOnce(&mut Settings)) -> Config {
    let mut settings = Settings::defaults();
    settings.listen.port = 0;
    settings.worker_urls = workers.to_vec();
    tune(&mut settings);
    settings.validate().unwrap()
}

#[tokio::test]
async fn the_listener_serves_https_with_h2_by_alpn_and_http1() {
    let certs = Certs::make("listener");
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let config = settings(&sims.urls(), |s| {
        s.tls.tls_cert_path = Some(certs.server_cert.clone());
        s.tls.tls_key_path = Some(certs.server_key.clone());
    });
    let gateway = Gateway::start(config).await.unwrap();
    assert!(gateway.url().starts_with("https://"), "{}", gateway.url());

    let h2 = https_client(&certs, true);
    let readiness = format!("{}/readiness", gateway.url());
    let mut changes = gateway.changes();
    bounded("a ready worker", async {
        loop {
            changes.borrow_and_update();
            if https_get(&h2, &readiness).await.0 == 200 {
                return;
            }
            changes.changed().await.unwrap();
        }
    })
    .await;
    let models = format!("{}/v1/models", gateway.url());
    assert_eq!(https_get(&h2, &models).await, (200, http::Version::HTTP_2));
    let http1 = https_client(&certs, false);
    assert_eq!(
        https_get(&http1, &models).await,
        (200, http::Version::HTTP_11)
    );

    // Cleartext to the TLS port gets no HTTP answer.
    let plain = client();
    let request = http::Request::get(format!("http://{}/v1/models", gateway.addr()))
        .body(Full::default())
        .unwrap();
    assert!(plain.request(request).await.is_err());
}

/// A TLS terminator for `target` that requires a client certificate from the test CA: an
/// https engine, as far as the gateway can tell.
async fn https_worker(certs: &Certs, target: SocketAddr) -> (String, JoinHandle<()>) {
    let provider = Arc::new(ring::default_provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(certs)), provider.clone())
            .build()
            .unwrap();
    let tls = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_file(&certs.server_cert).unwrap()],
            PrivateKeyDer::from_pem_file(&certs.server_key).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://localhost:{}",
        listener.local_addr().unwrap().port()
    );
    let front = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut client) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut engine = TcpStream::connect(target).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
            });
        }
    });
    (url, front)
}

/// The address of an `http://host:port` URL.
fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

#[tokio::test]
async fn https_workers_are_verified_by_the_ca_and_shown_the_client_certificate() {
    let certs = Certs::make("workers");
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    let (worker, front) = https_worker(&certs, addr_of(&sims.urls()[0])).await;
    let http = client();

    let trusted = Gateway::start(settings(std::slice::from_ref(&worker), |s| {
        s.tls.ca_cert_paths = vec![certs.ca.clone()];
        s.tls.client_cert_path = Some(certs.client_cert.clone());
        s.tls.client_key_path = Some(certs.client_key.clone());
    }))
    .await
    .unwrap();
    until_workers(&trusted, &http, "the https worker ready", all_ready).await;
    let body = chat_body("test-model", "hi", 2, false);
    let answer = post(
        &http,
        &format!("{}/v1/chat/completions", trusted.url()),
        &body,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    // Without the CA the worker's certificate is not trusted; without the client certificate
    // the worker refuses the gateway. Either way it never registers: it fails at the startup
    // timeout instead of becoming ready.
    let untrusting = |tune: fn(&mut Settings, &Certs)| {
        let mut config = settings(std::slice::from_ref(&worker), |s| {
            s.registration.worker_startup_timeout_secs = 1.0;
            s.registration.worker_startup_check_interval_secs = 0.2;
            tune(s, &certs);
        });
        config.control.startup_check_interval = Duration::from_millis(200);
        Gateway::start(config)
    };
    let no_ca = untrusting(|s, certs| {
        s.tls.client_cert_path = Some(certs.client_cert.clone());
        s.tls.client_key_path = Some(certs.client_key.clone());
    })
    .await
    .unwrap();
    let no_client_cert = untrusting(|s, certs| s.tls.ca_cert_paths = vec![certs.ca.clone()])
        .await
        .unwrap();
    for gateway in [&no_ca, &no_client_cert] {
        let failed = |w: &[Value]| w.iter().all(|w| w["status"] == "failed");
        until_workers(gateway, &http, "the untrusted worker failed", failed).await;
    }
    front.abort();
}

#[tokio::test]
async fn a_malformed_answer_from_an_https_worker_is_a_bad_answer_too() {
    let certs = Certs::make("bad-answer");
    let raw = common::raw::RawWorker::start(common::raw::Generation::Writes(
        b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok",
    ))
    .await;
    let (worker, _front) = https_worker(&certs, addr_of(&raw.url)).await;
    let gateway = Gateway::start(settings(std::slice::from_ref(&worker), |s| {
        s.tls.ca_cert_paths = vec![certs.ca.clone()];
        s.tls.client_cert_path = Some(certs.client_cert.clone());
        s.tls.client_key_path = Some(certs.client_key.clone());
    }))
    .await
    .unwrap();
    until_workers(&gateway, &client(), "the https worker ready", all_ready).await;
    let answer = common::over::chat(&gateway, false).await;
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_eq!(
        answer.headers["x-sluice-error-code"],
        "upstream_bad_response"
    );
    let id = common::over::ids(&gateway).await.remove(0);
    let series = format!("sluice_upstream_errors_total{{worker=\"{id}\",kind=\"bad_answer\"}}");
    assert_eq!(common::over::metric(&gateway, &series).await, 1.0);
}
