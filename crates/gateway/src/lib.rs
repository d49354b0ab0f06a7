//! # sluice-gateway: the server
//!
//! A request travels one way through the folders named after its stages, each taking the
//! previous stage's hand-off by value and returning its own, or its typed refusal:
//!
//! ```text
//! client -> front -> admit -> route -> forward -> stream -> client
//!             Asked   Admitted  Placement  Answer
//! ```
//!
//! ## Layout
//!
//! The request path (`front` runs the stages in order; a later stage may name an earlier one's
//! hand-off, never the reverse, and none names `front` — `tests/layout.rs` checks both):
//!
//! - `front` — the OpenAI routes: draining, the API key, the content type, the body limit, the
//!   JSON facts routing needs; bad input ends here. It makes the request's context and its
//!   immutable `request::Asked`, and runs the stages. Also `/v1/models`. `front::pick` is the
//!   same path for a data plane that sends requests itself (`sluice epp`): it ends in a worker
//!   handed over (`forward::Handover`), and the answer the data plane streams back is relayed as
//!   a worker's.
//! - `admit` — whether a request goes on, to which pool and when: tenants, tiers, deadlines,
//!   budgets and caps, the degradation ladder (`admit::degrade`), the model's pool (with aliases
//!   and the ladder's cascade), feasibility, the gateway queue, and the body the worker gets.
//!   Its hand-off is `admit::Admitted`: the pool, the terms, the queue's turn, the grants.
//! - `route` — the first worker: the candidates a request could use, the policy's pick and its
//!   breaker permit, the all-vetoed rule (steer or shed). Its hand-off is `route::Placement`:
//!   the first worker's lease and the request's own `Chooser`, which the forward stage asks on
//!   each retry.
//! - `forward` — the exchange with the worker: safe retries with backoff and a budget, every
//!   outcome into the worker's breaker; or, for a data plane, the leased worker handed over
//!   (`forward::handover`). Its hand-off is `forward::Answer`.
//! - `stream` — the response relayed frame by frame, timed, with the mid-stream failure and
//!   client-disconnect endings.
//! - `request` — what every stage reads of the request: its arrival and the parsed body, one
//!   immutable value.
//! - `context` — the request's record: what the stages observed, lent to each to write; its
//!   `Drop` accounts for the request however it ends, and gives back admission's grants. Also
//!   the in-flight count shutdown waits on.
//!
//! The workers and the loops that watch them:
//!
//! - `fleet` — the registry and its snapshot; each worker's facts grouped by their one writer
//!   (health, traffic, vetoes, signals, circuit), in typed atomic cells.
//! - `control` — the loops that own facts about workers: registration, the health prober, the load
//!   monitor, the liveness checker, service discovery.
//! - `shared` — budgets and caps shared with the other replicas through Redis (`--redis-url`),
//!   below `admit`, which spends them.
//! - `upstream` — the HTTP client to workers, at the bottom: used by `forward` and `control`,
//!   importing nothing above it; cleartext HTTP/1.1 on connections of its own (`upstream::wire`),
//!   TLS and HTTP/2 on hyper's. `tls` beside it: the certificates both ways.
//! - `tokens` — the model's tokenizer and chat template (SMG's `--model-path`,
//!   `--tokenizer-path`, `--chat-template`) and streamed detokenization, for workers that take
//!   token ids; at the bottom with `upstream`, importing nothing of the gateway.
//!
//! Around them:
//!
//! - `admin` — `/workers`, `/loads`, `/busy_threshold`.
//! - `probes` — `/liveness`, `/health`, `/readiness`, `/metrics`.
//! - `status` — the status page `/ui` and its live feed, made from the fleet, admission and the
//!   gateway's own metrics.
//! - `http` — what every HTTP surface shares: the accept loop, keys, the request id, bodies,
//!   headers that may cross.
//! - `app` — the one place the routers are assembled; `gateway` starts and stops it all.
//! - `error` — every answer the gateway makes itself: status, code, OpenAI error body.
//! - `trace` — `--enable-trace`: a sampled request's spans, exported over OTLP off the request
//!   path; `traceparent` to every worker.
//! - `metrics`, `access_log`, `config` — what their names say.
//!
//! No folder imports one that imports it back (`tests/layout.rs` checks the `use` lines). The
//! decisions (policies, breaker, health, liveness, retry rules) are pure code in `sluice-core`;
//! this crate feeds them events and acts on their answers.

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub(crate) mod access_log;
pub(crate) mod admin;
pub mod admit;
mod app;
pub mod config;
pub(crate) mod context;
pub mod control;
pub mod error;
pub mod fleet;
pub(crate) mod forward;
pub mod front;
mod gateway;
pub mod http;
pub(crate) mod metrics;
pub mod probes;
pub(crate) mod request;
pub(crate) mod route;
pub mod shared;
pub(crate) mod status;
pub(crate) mod stream;
pub(crate) mod tls;
pub mod tokens;
pub mod trace;
pub mod upstream;

pub use config::{Config, ConfigError, Settings};
pub use front::GatewayError;
pub use gateway::{Gateway, StartError, Stopped};
