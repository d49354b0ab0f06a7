//! How the gateway talks to workers: the connect and request timeouts, HTTP/2, the idle pool.
//! They build `UpstreamConfig` (with the TLS and tokenizer sections' parts), which the upstream
//! client takes whole; the request timeout is admission's, which gives each request its deadline.

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::{positive_seconds, seconds};
use super::ConfigError;
use crate::tls::ClientTls;
use crate::tokens::SharedTokens;
use crate::upstream::UpstreamConfig;

/// The connection flags (`sluice serve --help`, "Workers").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub struct UpstreamSettings {
    /// Time to connect to a worker.
    #[arg(long, default_value_t = 5.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) connect_timeout_secs: f64,

    /// Longest a request may take end to end, streaming included.
    #[arg(long, default_value_t = 1800.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) request_timeout_secs: f64,

    /// Speak HTTP/2 (prior knowledge) to workers; a worker spec's `http2` overrides it.
    #[arg(long)]
    #[serde(default)]
    #[arg(help_heading = "Workers")]
    pub(crate) upstream_http2: bool,

    /// Seconds an unused pooled connection to a worker is kept (SMG's flag and default). Keep it
    /// under the engine's own keep-alive timeout (5 s in vLLM and SGLang), or a request can be
    /// sent on a connection the engine is closing.
    #[arg(long, default_value_t = 3.0)]
    #[arg(help_heading = "Workers")]
    pub(crate) upstream_pool_idle_timeout_secs: f64,
}

impl UpstreamSettings {
    pub(super) fn validate(
        &self,
        tls: ClientTls,
        tokens: SharedTokens,
    ) -> Result<UpstreamConfig, ConfigError> {
        Ok(UpstreamConfig {
            connect_timeout: positive_seconds("connect-timeout-secs", self.connect_timeout_secs)?,
            pool_idle_timeout: seconds(
                "upstream-pool-idle-timeout-secs",
                self.upstream_pool_idle_timeout_secs,
            )?,
            http2: self.upstream_http2,
            tls,
            tokens,
        })
    }

    /// `--request-timeout-secs`.
    pub(super) fn request_timeout(&self) -> Result<Duration, ConfigError> {
        positive_seconds("request-timeout-secs", self.request_timeout_secs)
    }
}
