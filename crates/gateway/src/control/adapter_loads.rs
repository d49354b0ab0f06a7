//! Loading a LoRA adapter onto a worker when a request for it is placed on a worker that does not
//! list it, which its spec's `lora` block allows (no worker holding the adapter was free).
//!
//! One load per worker and adapter at a time: every request placed there meanwhile waits for the
//! same outcome (and the route sends them there, the first one's adapter being in flight on it).
//! Each call to the engine is bounded by `--adapter-load-timeout-secs`, and the request's wait by
//! its deadline. When the spec's `max_loaded` would be passed, the adapter asked for least
//! recently through this gateway (none in flight, none the engine reports running) is unloaded
//! first. After the calls the worker's `/v1/models` is read again, so its pools follow what it
//! lists: that read is also what settles a refused load of an adapter already there (vLLM
//! answers 400 "has already been loaded").
//!
//! The endpoints: vLLM's `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (served with
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; vllm/entrypoints/openai/api_server.py), SGLang's
//! `POST /load_lora_adapter` and `/unload_lora_adapter` (python/sglang/srt/entrypoints/http_server.py),
//! both taking `lora_name` and `lora_path` and answering 200 on success.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use bytes::Bytes;
use sluice_core::lora;
use sluice_core::ModelName;
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::{info, warn};

use super::discover;
use crate::fleet::{Fleet, Worker};
use crate::upstream::{post_json, GetError, Upstream};

/// Why an adapter could not be loaded: a worker error, as the forward stage judges one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LoadError {
    /// Refused or reset: the transport failed.
    #[error("the load endpoint could not be reached")]
    Unreachable { connect: bool },
    #[error("the load took longer than {0:?}")]
    Timeout(Duration),
    #[error("the load endpoint answered {0}")]
    Status(u16),
}

type Outcome = Arc<OnceCell<Result<(), LoadError>>>;

/// The loads under way, and what they need.
pub(crate) struct AdapterLoads {
    upstream: Upstream,
    fleet: Weak<Fleet>,
    timeout: Duration,
    running: parking_lot::Mutex<HashMap<(u64, Arc<str>), Outcome>>,
}

impl std::fmt::Debug for AdapterLoads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterLoads")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Marks the gateway's own calls in the engine's access log.
fn marker() -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static("x-sluice-adapter-load"),
        HeaderValue::from_static("1"),
    )
}

impl AdapterLoads {
    pub(crate) fn new(upstream: Upstream, fleet: Weak<Fleet>, timeout: Duration) -> Self {
        Self {
            upstream,
            fleet,
            timeout,
            running: parking_lot::Mutex::default(),
        }
    }

    /// `adapter` on `worker`, loaded there first if it must be; the load's outcome is shared by
    /// every request that waits for it.
    pub(crate) async fn ensure(
        &self,
        worker: &Arc<Worker>,
        adapter: &Arc<str>,
    ) -> Result<(), LoadError> {
        if !worker.may_load(&ModelName::new(&**adapter)) {
            return Ok(());
        }
        let key = (worker.key, adapter.clone());
        let cell = self.running.lock().entry(key.clone()).or_default().clone();
        let outcome = cell
            .get_or_init(|| self.load(worker, adapter))
            .await
            .clone();
        // Settled: the next request asks afresh (the worker lists it now, or it may be tried
        // again).
        let mut running = self.running.lock();
        if running.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            running.remove(&key);
        }
        outcome
    }

    async fn load(&self, worker: &Arc<Worker>, adapter: &Arc<str>) -> Result<(), LoadError> {
        let Some(module) = worker.live().spec.lora.module(adapter).cloned() else {
            return Ok(());
        };
        self.make_room(worker, adapter).await;
        let body = serde_json::json!({"lora_name": &**adapter, "lora_path": module.path});
        let answer = self.call(worker, "load", body).await;
        let listed = self.read_models(worker, adapter).await;
        match answer {
            Ok(()) => {
                info!(worker = %worker.id, adapter = %adapter, "LoRA adapter loaded");
                Ok(())
            }
            Err(_) if listed => Ok(()),
            Err(e) => {
                warn!(worker = %worker.id, adapter = %adapter, error = %e, "LoRA adapter not loaded");
                Err(e)
            }
        }
    }

    /// Unloads the least recently asked-for adapters until one more fits the spec's
    /// `max_loaded`; an adapter in flight here or running on the engine is never one of them.
    async fn make_room(&self, worker: &Arc<Worker>, adapter: &str) {
        let Some(max) = worker.live().spec.lora.max_loaded else {
            return;
        };
        let listed = worker.listed_adapters();
        let running = worker
            .vetoes
            .load()
            .and_then(|l| l.report.adapters.clone())
            .map(|slots| slots.running)
            .unwrap_or_default();
        let held: Vec<lora::Held<'_, Instant>> = listed
            .iter()
            .map(|name| {
                let name = name.as_str();
                lora::Held {
                    name,
                    busy: worker.adapters.has(name) || running.iter().any(|r| r == name),
                    last_used: worker.adapters.last_sent(name),
                }
            })
            .collect();
        for victim in lora::to_unload(&held, adapter, max) {
            let body = serde_json::json!({"lora_name": victim});
            match self.call(worker, "unload", body).await {
                Ok(()) => {
                    worker.adapters.forget(victim);
                    info!(worker = %worker.id, adapter = %victim, "LoRA adapter unloaded to make room");
                }
                Err(e) => {
                    warn!(worker = %worker.id, adapter = %victim, error = %e, "LoRA adapter not unloaded")
                }
            }
        }
    }

    /// `POST` to the worker's `load` or `unload` endpoint, as its flavor names it.
    async fn call(
        &self,
        worker: &Worker,
        verb: &str,
        body: serde_json::Value,
    ) -> Result<(), LoadError> {
        let sglang = worker.info().is_some_and(|i| i.flavor == "sglang");
        let path = if sglang {
            format!("/{verb}_lora_adapter")
        } else {
            format!("/v1/{verb}_lora_adapter")
        };
        let authorization = worker.live().authorization.clone();
        let sent = post_json(
            &self.upstream,
            &worker.endpoint,
            authorization.as_ref(),
            &path,
            (Bytes::from(body.to_string()), marker()),
            self.timeout,
        )
        .await;
        match sent {
            Ok((status, _)) if status.is_success() => Ok(()),
            Ok((status, _)) => Err(LoadError::Status(status.as_u16())),
            Err(GetError::Timeout(after)) => Err(LoadError::Timeout(after)),
            Err(e) => Err(LoadError::Unreachable {
                connect: e.is_transport(),
            }),
        }
    }

    /// Reads the worker's `/v1/models` again and tells the fleet what changed; whether it lists
    /// `adapter` now.
    async fn read_models(&self, worker: &Arc<Worker>, adapter: &str) -> bool {
        let Ok(info) = discover::fetch(&self.upstream, worker).await else {
            return false;
        };
        let listed = info.models.iter().any(|m| m.id.as_str() == adapter);
        if let Some(fleet) = self.fleet.upgrade() {
            if worker.info().is_none_or(|now| !now.same_models(&info)) {
                fleet.models_changed(worker, info);
            }
        }
        listed
    }
}
