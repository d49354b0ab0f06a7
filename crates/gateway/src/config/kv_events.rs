//! Where the gateway hears engines' KV events (`--kv-events-port`, `--kv-events-ranks`,
//! `--kv-events-max-blocks`): the blocks each engine holds, for precise prefix routing.

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::invalid;
use super::{ConfigError, Settings};
use crate::control::KvEventsConfig;

/// The KV-event subscriptions.
#[derive(Debug, Clone, Args, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct KvEventsSettings {
    /// Subscribe to every HTTP worker's KV events on its host at this port: the ZMQ publisher
    /// vLLM and SGLang start when their KV-events config names publisher zmq and endpoint
    /// tcp://*:PORT. The cache-aware policy then scores a worker by the blocks its engine
    /// holds rather than by where prompts were sent (prompts are tokenized: needs
    /// --model-path). A worker spec's kv_events_endpoint overrides it. gRPC workers' events
    /// come on their own stream.
    #[arg(long, value_name = "PORT")]
    #[arg(help_heading = "KV events")]
    pub(crate) kv_events_port: Option<u16>,

    /// Data-parallel ranks per engine: rank r publishes on the port plus r (vLLM's and SGLang's
    /// rule). A worker spec's kv_events_ranks overrides it.
    #[arg(long, value_name = "N", default_value_t = 1)]
    #[arg(help_heading = "KV events")]
    pub(crate) kv_events_ranks: u32,

    /// KV blocks remembered per engine rank at most; past it, newly stored blocks are not
    /// indexed until evictions make room (about 100 bytes each).
    #[arg(long, value_name = "N", default_value_t = 262_144)]
    #[arg(help_heading = "KV events")]
    pub(crate) kv_events_max_blocks: usize,
}

impl Default for KvEventsSettings {
    fn default() -> Self {
        Self {
            kv_events_port: None,
            kv_events_ranks: 1,
            kv_events_max_blocks: 262_144,
        }
    }
}

impl Settings {
    pub(super) fn kv_events(&self) -> Result<KvEventsConfig, ConfigError> {
        let s = &self.kv_events;
        if s.kv_events_port == Some(0) {
            return Err(invalid("kv-events-port", "must be a port number (1-65535)"));
        }
        if s.kv_events_ranks == 0 || s.kv_events_ranks > 1024 {
            return Err(invalid("kv-events-ranks", "must be between 1 and 1024"));
        }
        if s.kv_events_max_blocks == 0 {
            return Err(invalid("kv-events-max-blocks", "must be at least 1"));
        }
        Ok(KvEventsConfig {
            port: s.kv_events_port,
            ranks: s.kv_events_ranks,
            max_blocks: s.kv_events_max_blocks,
        })
    }
}
