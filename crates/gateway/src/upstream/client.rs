//! The pooled HTTP client to workers: keep-alive connections per worker, HTTP/1.1 by default,
//! HTTP/2 for workers configured for it (prior knowledge over cleartext, ALPN `h2` over TLS);
//! `https` workers over rustls.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Request;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// TCP keep-alive on worker connections, so a vanished peer is noticed on idle connections.
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

pub type UpstreamRequest = Request<Full<Bytes>>;
pub type UpstreamResponse = axum::http::Response<Incoming>;

/// Clients to workers, shared by every request.
#[derive(Debug, Clone)]
pub struct Upstream {
    http1: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    http2: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// How connections to workers are made and kept.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `--connect-timeout-secs`.
    pub connect_timeout: Duration,
    /// `--upstream-pool-idle-timeout-secs`: an unused pooled connection is closed after this,
    /// before the engine's own keep-alive timeout closes it under a request.
    pub pool_idle_timeout: Duration,
    /// How `https` workers are verified and what they are shown (`crate::tls::client_config`).
    pub tls: Arc<rustls::ClientConfig>,
}

impl Upstream {
    pub fn new(config: &UpstreamConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_keepalive(Some(TCP_KEEPALIVE));
        // The TLS layer takes `https` URLs; plain ones pass through it untouched.
        connector.enforce_http(false);
        let https = || {
            HttpsConnectorBuilder::new()
                .with_tls_config(rustls::ClientConfig::clone(&config.tls))
                .https_or_http()
        };
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .build(https().enable_http1().wrap_connector(connector.clone()));
        let http2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(https().enable_http2().wrap_connector(connector));
        Self { http1, http2 }
    }

    /// Sends one request over the pool for its protocol.
    pub fn send(&self, http2: bool, request: UpstreamRequest) -> ResponseFuture {
        if http2 {
            self.http2.request(request)
        } else {
            self.http1.request(request)
        }
    }
}
