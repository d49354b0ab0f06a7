//! # sluice-gateway: the server
//!
//! A request travels one way through the modules named after its stages:
//!
//! ```text
//! client -> front -> route -> forward -> stream -> client
//! ```
//!
//! ## Layout
//!
//! - `front` — the HTTP surface: API keys, content type, body limit, the JSON facts routing needs
//!   (`parse`), the request id; bad input ends here. Also `/v1/models`.
//! - `route` — the model's pool, the candidates a request could use, the policy's pick and its
//!   breaker permit.
//! - `forward` — the pooled upstream client, safe retries with backoff and a budget, headers
//!   that may cross.
//! - `stream` — the response relayed frame by frame, timed, with the mid-stream failure and
//!   client-disconnect endings.
//! - `fleet` — the workers: specs, registration (`/v1/models`), circuit breakers and their
//!   timers, the registry that is the one writer of the snapshot every request reads.
//! - `admin` — `/workers`: list, register, replace, patch, drain and remove.
//! - `probes` — `/liveness`, `/health`, `/readiness`, `/metrics`.
//! - `error` — every answer the gateway makes itself: status, code, OpenAI error body.
//! - `metrics`, `access_log`, `config`, `server` — what their names say.
//!
//! The decisions (policies, breaker, retry rules) are pure code in `sluice-core`; this crate
//! feeds them events and acts on their answers.

pub mod access_log;
pub mod admin;
pub mod config;
pub mod error;
pub mod fleet;
pub mod forward;
pub mod front;
pub mod metrics;
pub mod probes;
pub mod route;
mod server;
pub mod stream;

mod gateway;
pub mod inflight;

pub use config::{Config, ConfigError, Settings};
pub use error::GatewayError;
pub use gateway::{Gateway, StartError, Stopped};
