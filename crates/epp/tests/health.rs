//! The picker's gRPC health service and its TLS, black-box: the cluster's probes and Envoy's
//! health checks ask by service name; the ext_proc port serves the certificate it was given.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

async fn status(channel: Channel, service: &str) -> ServingStatus {
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner();
    ServingStatus::try_from(answer.status).unwrap()
}

async fn plaintext(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn with_a_worker_ready_every_name_is_serving_on_both_ports_over_the_given_certificate() {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = std::env::temp_dir().join(format!("sluice-epp-cert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), made.cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), made.key_pair.serialize_pem()).unwrap();
    let cert_dir = dir.clone();
    let s = start(1, instant(Flavor::Vllm), move |_, epp| {
        epp.secure_serving = true;
        epp.cert_path = Some(cert_dir);
    })
    .await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(made.cert.pem()))
        .domain_name("localhost");
    let secure = Channel::from_shared(format!("https://{}", s.picker.grpc_addr()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("the picker serves the certificate in --cert-path");
    assert_eq!(
        status(secure, "envoy.service.ext_proc.v3.ExternalProcessor").await,
        ServingStatus::Serving
    );
    let probes = plaintext(s.picker.health_addr()).await;
    for name in ["liveness", "readiness", "inference-extension", ""] {
        assert_eq!(
            status(probes.clone(), name).await,
            ServingStatus::Serving,
            "{name}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn with_no_worker_to_use_it_is_alive_but_not_ready() {
    // A worker nothing answers at.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", down.local_addr().unwrap());
    drop(down);
    let picker = Picker::start(Config::local(&[url]), &epp_settings())
        .await
        .unwrap();
    let probes = plaintext(picker.health_addr()).await;
    assert_eq!(
        status(probes.clone(), "liveness").await,
        ServingStatus::Serving
    );
    for name in ["readiness", "inference-extension", ""] {
        assert_eq!(
            status(probes.clone(), name).await,
            ServingStatus::NotServing,
            "{name}"
        );
    }
    let stopped = picker.shutdown().await;
    assert_eq!(stopped, sluice_gateway::Stopped::Drained);
}
