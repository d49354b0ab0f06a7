//! The engine's HTTP API, as vLLM or SGLang serves it.
//!
//! | route | vLLM | SGLang |
//! | --- | --- | --- |
//! | `POST /v1/chat/completions`, `POST /v1/completions` | yes | yes |
//! | `POST /v1/embeddings` (hash vectors, no scheduling) | yes | yes |
//! | `GET /v1/models` | `owned_by: vllm` | `owned_by: sglang` |
//! | `GET /health` | 200 while alive (also `/ping`) | fails after 20 s without output (also `/health_generate`) |
//! | `GET /metrics` | `vllm:*` | `sglang:*` |
//! | load | `/load` | `/v1/loads`, `/get_load` |
//! | info | `/version` | `/server_info`, `/get_server_info` |
//! | sleep (vLLM's dev mode) | `POST /sleep?level=1\|2`, `POST /wake_up`, `GET /is_sleeping` | |
//! | adapters (`--enable-lora`) | `POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter` (runtime updates allowed) | `POST /load_lora_adapter`, `/unload_lora_adapter` |
//!
//! The `hang` fault is applied here to every route: a request that arrives is never answered
//! while it lasts, and an answer already under way is held (a stream's chunks are held in
//! `generate`); under `one-way` a request runs and its answer is held until the fault is lifted.

mod embed;
mod errors;
pub(crate) mod generate;
pub(crate) mod intake;
pub(crate) mod load;
mod lora;
pub(crate) mod pd;
mod sse;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use rand::{Rng, SeedableRng};

pub use errors::{ApiError, STATUS_OVERLOADED};

use crate::config::{EngineConfig, Flavor};
use crate::engine::Engine;
use crate::request::Route;

/// What every handler of one engine incarnation shares.
pub struct ApiState {
    pub engine: Arc<Engine>,
    /// Unix time the engine started, for `created` fields.
    pub created: u64,
    responses: AtomicU64,
    /// Decides which requests the `error-rate` fault fails, reproducibly from the seed.
    error_rng: parking_lot::Mutex<rand::rngs::StdRng>,
    /// A prefill engine's bootstrap server, named in vLLM's `kv_transfer_params`.
    bootstrap: Option<std::net::SocketAddr>,
    /// The model's tokenizer, with `--model-tokenizer`.
    pub tokenizer: Option<crate::model_tokens::ModelTokenizer>,
}

impl ApiState {
    pub fn new(engine: Arc<Engine>) -> Self {
        let created = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let seed = engine.config().seed;
        let tokenizer = engine
            .config()
            .model_tokenizer
            .then(|| {
                crate::model_tokens::ModelTokenizer::new()
                    .inspect_err(|e| tracing::error!(error = %e, "prompts counted 4 bytes a token"))
                    .ok()
            })
            .flatten();
        Self {
            tokenizer,
            engine,
            created,
            responses: AtomicU64::new(0),
            error_rng: parking_lot::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
            bootstrap: None,
        }
    }

    /// With the address of the engine's bootstrap server (a prefill engine).
    pub fn with_bootstrap(mut self, bootstrap: Option<std::net::SocketAddr>) -> Self {
        self.bootstrap = bootstrap;
        self
    }

    /// The engine's bootstrap server, if it is a prefill engine.
    pub fn bootstrap(&self) -> Option<std::net::SocketAddr> {
        self.bootstrap
    }

    fn response_id(&self, route: Route) -> String {
        let n = self.responses.fetch_add(1, Ordering::Relaxed);
        let prefix = match route {
            Route::Chat => "chatcmpl",
            Route::Completions => "cmpl",
        };
        format!("{prefix}-{:08x}{n:08x}", self.created as u32)
    }

    /// The renderer of one answer of this engine's flavor.
    fn renderer(&self, route: Route, model: &str) -> sse::Renderer {
        let flavor = self.engine.config().flavor;
        sse::Renderer::new(route, flavor, self.response_id(route), self.created, model)
    }

    pub(crate) fn inject_error(&self) -> bool {
        let rate = self.engine.faults().error_rate;
        rate > 0.0 && self.error_rng.lock().random_bool(rate.min(1.0))
    }

    /// The status of the error event this request will fail with (the `error-event` fault).
    pub(crate) fn inject_error_event(&self) -> Option<u16> {
        let (rate, code) = self.engine.faults().error_event?;
        (rate > 0.0 && self.error_rng.lock().random_bool(rate.min(1.0))).then_some(code)
    }
}

/// `Authorization: Bearer <api key>` on the OpenAI routes, when the engine has a key.
fn authorize(cfg: &EngineConfig, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &cfg.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

async fn hang_if_faulted(
    State(st): State<Arc<ApiState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let mut faults = st.engine.fault_watch();
    if st.engine.faults().hang {
        if request.method() == axum::http::Method::POST && request.uri().path().starts_with("/v1/")
        {
            // It reached the engine's port: counted as an arrival, as the handler would.
            st.engine.totals().arrival(request.headers());
            st.engine.notify_changed();
            request.headers_mut().insert(
                crate::engine::COUNTED_WHILE_HUNG,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        // Nothing is read or answered until the process runs again; then it is served, as a
        // stalled event loop serves what waited when it resumes.
        let _ = faults.wait_for(|f| !f.hang).await;
    }
    let response = next.run(request).await;
    // A one-way link: the request reached the engine and runs; its answer is held until the
    // link carries again. A hung API process sends nothing until it runs again.
    let _ = faults.wait_for(|f| !f.one_way && !f.hang).await;
    response
}

/// The load and unload routes, where the engine serves them: with LoRA on, and for vLLM only
/// with runtime updates allowed.
fn with_adapter_routes(router: Router<Arc<ApiState>>, cfg: &EngineConfig) -> Router<Arc<ApiState>> {
    match (&cfg.lora, cfg.flavor) {
        (Some(lora), Flavor::Vllm) if lora.runtime_updates => router
            .route("/v1/load_lora_adapter", post(lora::load))
            .route("/v1/unload_lora_adapter", post(lora::unload)),
        (Some(lora), Flavor::Sglang) if lora.runtime_updates => router
            .route("/load_lora_adapter", post(lora::load))
            .route("/unload_lora_adapter", post(lora::unload)),
        _ => router,
    }
}

/// The engine's routes for its flavor.
pub fn router(state: Arc<ApiState>) -> Router {
    let common = Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/embeddings", post(embed::embeddings))
        .route("/v1/models", get(load::models))
        .route("/metrics", get(load::metrics));
    let flavored = match state.engine.config().flavor {
        Flavor::Vllm => common
            .route("/health", get(load::vllm_health))
            .route("/ping", get(load::vllm_health))
            .route("/load", get(load::vllm_load))
            .route("/sleep", post(load::vllm_sleep))
            .route("/wake_up", post(load::vllm_wake_up))
            .route("/is_sleeping", get(load::vllm_is_sleeping))
            .route("/version", get(load::vllm_version)),
        Flavor::Sglang => common
            .route("/health", get(load::sglang_health))
            .route("/health_generate", get(load::sglang_health))
            .route("/v1/loads", get(load::sglang_loads))
            .route("/get_load", get(load::sglang_get_load))
            .route("/server_info", get(load::sglang_server_info))
            .route("/get_server_info", get(load::sglang_server_info)),
    };
    with_adapter_routes(flavored, state.engine.config())
        .fallback(|| async { errors::not_found() })
        .method_not_allowed_fallback(|| async { errors::method_not_allowed() })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            hang_if_faulted,
        ))
        .with_state(state)
}
