//! The HTTP client to workers: keep-alive connections per worker, HTTP/1.1 by default (cleartext
//! ones in `pool`, on connections of our own, `wire`), HTTP/2 for workers configured for it (prior knowledge over cleartext, ALPN
//! `h2` over TLS); `https` workers over rustls.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::exchange::{SendError, UpstreamRequest};
use super::pool::{Http1Pool, UpstreamBody, UpstreamResponse};
use super::Endpoint;
use crate::tls::ClientTls;

/// TCP keep-alive on worker connections, so a vanished peer is noticed on idle connections.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

type Plain = Client<HttpConnector, Full<Bytes>>;
type Tls = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Clients to workers, shared by every request: cleartext ones, and TLS ones made when the first
/// `https` worker is reached, so a fleet of `http` workers pays nothing for TLS.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Cleartext HTTP/1.1: nearly every request.
    http1: Arc<Http1Pool>,
    http2: Plain,
    tls: Arc<LazyTls>,
    grpc: Arc<super::grpc::GrpcUpstream>,
}

/// How connections to workers are made and kept.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `--connect-timeout-secs`.
    pub(crate) connect_timeout: Duration,
    /// `--upstream-pool-idle-timeout-secs`: an unused pooled connection is closed after this,
    /// before the engine's own keep-alive timeout closes it under a request.
    pub(crate) pool_idle_timeout: Duration,
    /// `--upstream-http2`: HTTP/2 (prior knowledge) to workers whose spec does not say; read by
    /// the fleet, which decides each worker's protocol at registration.
    pub http2: bool,
    /// How `https` workers are verified and what they are shown.
    pub(crate) tls: ClientTls,
    /// The model's tokenizer and chat template, for `grpc://` workers (and the route stage).
    pub tokens: crate::tokens::SharedTokens,
}

/// The TLS clients, made on first use.
#[derive(Debug)]
struct LazyTls {
    config: UpstreamConfig,
    /// HTTP/1.1 and HTTP/2 (ALPN `h2`).
    clients: OnceLock<(Tls, Tls)>,
}

impl LazyTls {
    fn clients(&self) -> &(Tls, Tls) {
        self.clients.get_or_init(|| {
            let mut connector = connector(&self.config);
            // The TLS layer wraps the TCP connection for `https` URLs, which plain HTTP refuses.
            connector.enforce_http(false);
            let tls = self.config.tls.client_config();
            let https = || {
                HttpsConnectorBuilder::new()
                    .with_tls_config(rustls::ClientConfig::clone(&tls))
                    .https_only()
            };
            (
                http1(&self.config).build(https().enable_http1().wrap_connector(connector.clone())),
                http2(&self.config).build(https().enable_http2().wrap_connector(connector)),
            )
        })
    }
}

fn connector(config: &UpstreamConfig) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(config.connect_timeout));
    connector.set_keepalive(Some(TCP_KEEPALIVE));
    connector
}

fn http1(config: &UpstreamConfig) -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_idle_timeout(config.pool_idle_timeout)
        .pool_timer(TokioTimer::new());
    builder
}

fn http2(config: &UpstreamConfig) -> hyper_util::client::legacy::Builder {
    let mut builder = http1(config);
    builder.http2_only(true).timer(TokioTimer::new());
    builder
}

impl Upstream {
    pub fn new(config: &UpstreamConfig) -> Self {
        Self {
            http1: Arc::new(Http1Pool::new(
                config.connect_timeout,
                TCP_KEEPALIVE,
                config.pool_idle_timeout,
            )),
            http2: http2(config).build(connector(config)),
            tls: Arc::new(LazyTls {
                config: config.clone(),
                clients: OnceLock::new(),
            }),
            grpc: Arc::new(super::grpc::GrpcUpstream::new(
                config.connect_timeout,
                config.tokens.clone(),
            )),
        }
    }

    /// Requests resent after a keep-alive race on a cleartext HTTP/1.1 connection, since start.
    pub(crate) fn keepalive_resends(&self) -> u64 {
        self.http1.keepalive_resends()
    }

    /// The client to `grpc://` workers, for the control loops' own calls.
    pub(crate) fn grpc(&self) -> &super::grpc::GrpcUpstream {
        &self.grpc
    }

    /// Sends one request to `endpoint` over the pool for its scheme and protocol.
    pub(crate) async fn send(
        &self,
        endpoint: &Endpoint,
        request: UpstreamRequest,
    ) -> Result<UpstreamResponse, SendError> {
        if endpoint.grpc() {
            return self.grpc.send(endpoint, request).await;
        }
        let pooled = match (endpoint.tls(), endpoint.http2) {
            (false, false) => return self.http1.send(&endpoint.authority, request).await,
            (false, true) => self.http2.request(request.map(Full::new)),
            (true, false) => self.tls.clients().0.request(request.map(Full::new)),
            (true, true) => self.tls.clients().1.request(request.map(Full::new)),
        };
        let response = pooled.await.map_err(SendError::Pooled)?;
        Ok(response.map(UpstreamBody::from))
    }
}
