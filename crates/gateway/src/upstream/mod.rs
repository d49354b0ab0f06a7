//! The HTTP client to workers, shared by the forward stage (the requests clients sent) and the
//! control loops (the gateway's own probes, load polls and model lists).
//!
//! It sits at the bottom of the crate: it knows endpoints, not workers, and imports nothing of the
//! gateway above it but `tls` and `tokens` (which import nothing), so both of its users can depend
//! on it without depending on each other. `grpc` speaks to `grpc://` workers and answers like an
//! HTTP worker.

mod client;
mod collector;
mod exchange;
mod get;
pub(crate) mod grpc;
mod pool;
mod wire;

pub use client::{Upstream, UpstreamConfig};
pub(crate) use collector::UpstreamCollector;
pub use exchange::{ExchangeError, SendError, UpstreamRequest};
pub(crate) use get::{get, post_json, GetError};
pub use pool::{UpstreamBody, UpstreamResponse};

use axum::http::uri::{Authority, PathAndQuery, Scheme};
use axum::http::Uri;

/// Where a worker is reached and how: fixed for a registration (a new URL is a new one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub(crate) scheme: Scheme,
    pub(crate) authority: Authority,
    /// HTTP/2 with prior knowledge, else HTTP/1.1.
    pub(crate) http2: bool,
}

impl Endpoint {
    /// A `grpc://` worker: SGLang's scheduler service over HTTP/2 (`grpc`).
    pub(crate) fn grpc(&self) -> bool {
        self.scheme.as_str() == grpc::SCHEME
    }

    /// Reached over TLS (`https`).
    pub(crate) fn tls(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// The endpoint as an `ip:port` address, when its host is an IP address: what a data plane
    /// that connects where it is told (Envoy's original-destination cluster) can use.
    pub fn socket_addr(&self) -> Option<std::net::SocketAddr> {
        let host = self.authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let ip: std::net::IpAddr = host.parse().ok()?;
        let port = self
            .authority
            .port_u16()
            .unwrap_or(if self.tls() { 443 } else { 80 });
        Some(std::net::SocketAddr::new(ip, port))
    }

    /// The absolute URI of `path` on this endpoint.
    pub(crate) fn uri(&self, path: PathAndQuery) -> Uri {
        let mut parts = axum::http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path);
        Uri::from_parts(parts).unwrap_or_default()
    }
}
