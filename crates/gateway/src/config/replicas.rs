//! Running several replicas: the Redis they share budgets and caps through.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::invalid;
use super::ConfigError;
use crate::shared::{RedisTls, SharedConfig};

/// Replica flags (`sluice serve --help`, "Replicas").
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
pub(crate) struct ReplicaSettings {
    /// Share tenant budgets and caps, --rate-limit-tokens-per-second and
    /// --max-concurrent-requests with every replica naming the same Redis
    /// (redis://[user:password@]host:port[/db]; rediss:// over TLS, trusting --ca-cert-paths
    /// when given and showing --client-cert-path to a Redis that asks). Each replica claims
    /// budget in chunks and holds a lease on its slots, so most requests need no round trip.
    #[arg(long, value_name = "URL")]
    #[serde(default)]
    #[arg(help_heading = "Replicas")]
    pub(crate) redis_url: Option<String>,

    /// While Redis cannot be reached, admit on local limits (each replica the global limit over
    /// the replicas it last counted); false refuses requests a shared limit applies to with 503
    /// `shared_state_unavailable`. Alone, the flag means true.
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value_t = true,
        value_name = "BOOL"
    )]
    #[arg(help_heading = "Replicas")]
    pub(crate) redis_fail_open: bool,

    /// The longest a request waits on Redis; slower counts as unreachable.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    #[arg(help_heading = "Replicas")]
    pub(crate) redis_timeout_ms: u64,
}

impl ReplicaSettings {
    /// `ca` and `identity`: the TLS files of the flags that name them, used for `rediss://`.
    pub(super) fn validate(
        &self,
        ca: &[PathBuf],
        identity: Option<(&Path, &Path)>,
    ) -> Result<Option<SharedConfig>, ConfigError> {
        let Some(url) = &self.redis_url else {
            return Ok(None);
        };
        redis::Client::open(url.as_str()).map_err(|e| invalid("redis-url", e.to_string()))?;
        let tls = if url.starts_with("rediss://") && (!ca.is_empty() || identity.is_some()) {
            Some(redis_tls(ca, identity)?)
        } else {
            None
        };
        if self.redis_timeout_ms == 0 {
            return Err(invalid("redis-timeout-ms", "must be at least 1"));
        }
        Ok(Some(SharedConfig {
            url: url.clone(),
            fail_open: self.redis_fail_open,
            timeout: Duration::from_millis(self.redis_timeout_ms),
            lease: crate::shared::LEASE,
            tls,
        }))
    }
}

/// The PEM files for a Redis over TLS, read now (a missing one stops the start).
fn redis_tls(ca: &[PathBuf], identity: Option<(&Path, &Path)>) -> Result<RedisTls, ConfigError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut roots = Vec::new();
    for path in ca {
        roots.extend(read(path)?);
        roots.push(b'\n');
    }
    Ok(RedisTls {
        roots: (!roots.is_empty()).then_some(roots),
        identity: match identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        },
    })
}
