//! `--discovery-dns NAME:PORT`: one worker per address a name resolves to.
//!
//! A Kubernetes headless Service answers with the address of every Ready pod behind it, so this
//! finds a fleet without RBAC. The name is resolved at once and every
//! `--discovery-check-interval-secs`; each address becomes `http://ADDRESS:PORT` with the
//! gateway's default spec. A failed lookup changes nothing (logged once until one succeeds); an
//! answer with no address drains every worker it had listed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::{Listing, Look, Source};
use crate::fleet::{Origin, WorkerSpec};

/// Resolves a name; tests hand in their own so they stay on loopback.
pub trait Resolve: Send + Sync + 'static {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system's resolver (`getaddrinfo`, on a blocking thread).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((name, port)).await?.collect()) })
    }
}

/// `--discovery-dns` and how often it is resolved.
#[derive(Clone)]
pub struct DnsConfig {
    pub name: String,
    pub port: u16,
    pub every: Duration,
    pub resolver: Arc<dyn Resolve>,
}

impl std::fmt::Debug for DnsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsConfig")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

/// A lookup that takes longer than this failed (the next one is due at the interval).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The name, resolved on schedule.
pub struct DnsSource {
    config: DnsConfig,
    next_lookup: Instant,
}

impl DnsSource {
    /// First lookup at the first poll.
    pub fn new(config: DnsConfig) -> Self {
        Self {
            config,
            next_lookup: Instant::now(),
        }
    }

    /// One worker per address, with the gateway's defaults (the default worker key is added at
    /// registration, as for any spec without a key).
    fn listing(addrs: &[SocketAddr]) -> Listing {
        addrs
            .iter()
            .filter_map(|addr| WorkerSpec::from_url(&format!("http://{addr}"), None).ok())
            .map(|spec| (spec.url.clone(), spec))
            .collect()
    }
}

impl Source for DnsSource {
    const ORIGIN: Origin = Origin::Dns;

    fn target(&self) -> String {
        format!("{}:{}", self.config.name, self.config.port)
    }

    async fn poll(&mut self, asked: bool) -> Look {
        let now = Instant::now();
        if !asked && now < self.next_lookup {
            return Look::Unchanged;
        }
        self.next_lookup = now + self.config.every;
        let lookup = self
            .config
            .resolver
            .resolve(&self.config.name, self.config.port);
        match tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => Look::Listed(Self::listing(&addrs)),
            Ok(Err(e)) => Look::Failed(e.to_string()),
            Err(_) => Look::Failed(format!("no answer within {LOOKUP_TIMEOUT:?}")),
        }
    }
}

/// `NAME:PORT` as `--discovery-dns` takes it.
pub fn parse_target(text: &str) -> Result<(String, u16), String> {
    let (name, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("'{text}' is not NAME:PORT"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("'{port}' is not a port"))?;
    let name = name.trim_start_matches('[').trim_end_matches(']');
    if name.is_empty() {
        return Err(format!("'{text}' names no host"));
    }
    Ok((name.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_name_and_port() {
        assert_eq!(
            parse_target("vllm.llm.svc.cluster.local:8000").unwrap(),
            ("vllm.llm.svc.cluster.local".to_string(), 8000)
        );
        assert_eq!(parse_target("[::1]:80").unwrap(), ("::1".to_string(), 80));
        assert!(parse_target("vllm").is_err());
        assert!(parse_target("vllm:0").is_err());
        assert!(parse_target(":8000").is_err());
        assert!(parse_target("vllm:http").is_err());
    }

    #[test]
    fn every_address_is_a_worker_and_v6_is_bracketed() {
        let listing = DnsSource::listing(&[
            "10.0.0.1:8000".parse().unwrap(),
            "[fd00::1]:8000".parse().unwrap(),
            "10.0.0.1:8000".parse().unwrap(),
        ]);
        assert_eq!(
            listing.keys().collect::<Vec<_>>(),
            ["http://10.0.0.1:8000", "http://[fd00::1]:8000"]
        );
    }
}
