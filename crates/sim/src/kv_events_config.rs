//! `--kv-events-config`: the JSON both engines take to publish their KV events, as the
//! simulator reads it (the publisher in `zmq_events` serves it).

use serde::Deserialize;

/// `--kv-events-config`, as both engines read it (the fields the simulator uses).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KvEventsConfig {
    /// `zmq` publishes; `null` (or, in vLLM, `enable_kv_cache_events` false) does not.
    #[serde(default)]
    pub publisher: Option<String>,
    #[serde(default)]
    pub enable_kv_cache_events: Option<bool>,
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    "tcp://*:5557".to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    #[error("--kv-events-config is not the engines' JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("--kv-events-config endpoint {0}: only tcp://HOST:PORT is served")]
    Endpoint(String),
    #[error("cannot bind the KV event publisher at {endpoint}: {reason}")]
    Bind { endpoint: String, reason: String },
}

impl KvEventsConfig {
    /// The config from the flag's JSON; `None` when it publishes nothing.
    pub fn parse(json: &str) -> Result<Option<Self>, KvEventsError> {
        let cfg: Self = serde_json::from_str(json)?;
        let zmq = match cfg.publisher.as_deref() {
            Some(publisher) => publisher == "zmq",
            None => cfg.enable_kv_cache_events == Some(true),
        };
        if !cfg.endpoint.starts_with("tcp://") {
            return Err(KvEventsError::Endpoint(cfg.endpoint));
        }
        Ok(zmq.then_some(cfg))
    }

    /// Rank `rank`'s endpoint: the port plus the rank, as vLLM's and SGLang's publishers offset
    /// it (port 0 stays 0: any free port), a wildcard host as every address.
    pub(crate) fn endpoint_of(&self, rank: u32) -> Result<String, KvEventsError> {
        let bad = || KvEventsError::Endpoint(self.endpoint.clone());
        let (host, port) = self.endpoint["tcp://".len()..]
            .rsplit_once(':')
            .ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let port = if port == 0 {
            0
        } else {
            port.checked_add(rank as u16).ok_or_else(bad)?
        };
        let host = if host == "*" { "0.0.0.0" } else { host };
        Ok(format!("tcp://{host}:{port}"))
    }
}
