//! # sluice-gateway: the server
//!
//! A request travels one way through the folders named after its stages, each taking the
//! request's context and returning a typed error:
//!
//! ```text
//! client -> front -> admit -> forward -> stream -> client
//!                      \         /
//!                       route            (the chooser both ask)
//! ```
//!
//! ## Layout
//!
//! The request path (`front` runs the stages in order; a stage never imports an earlier one, and
//! `route` imports none of them — `tests/layout.rs` checks both):
//!
//! - `front` — the OpenAI routes: draining, the API key, the content type, the body limit, the
//!   JSON facts routing needs (`parse`); bad input ends here. It makes the request's context,
//!   runs the stages and writes the body the worker gets. Also `/v1/models`. `front::pick` is
//!   the same path for a data plane that sends requests itself (`sluice epp`): it ends in a
//!   worker handed over (`forward::Handover`), and the answer the data plane streams back is
//!   relayed as a worker's.
//! - `admit` — whether a request goes on, where and when: tenants, tiers, deadlines, budgets and
//!   caps, the degradation ladder (`admit::degrade`), and placement — the pool (with the
//!   ladder's cascade), feasibility, the gateway queue, the pool found again after a wait. Its
//!   answer is one `route::Placement`, carrying the queue's turn.
//! - `forward` — consumes the placement: the worker for each attempt, safe retries with backoff
//!   and a budget, every outcome into the worker's breaker; or, for a data plane, one worker
//!   leased and handed over (`forward::handover`).
//! - `stream` — the response relayed frame by frame, timed, with the mid-stream failure and
//!   client-disconnect endings.
//! - `route` — the chooser below the stages: the model's pool, the candidates a request could
//!   use, the policy's pick and its breaker permit, the all-vetoed rule (steer or shed).
//! - `context` — the one owned request context the stages share; its `Drop` accounts for the
//!   request however it ends. Also the in-flight count shutdown waits on.
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

pub mod access_log;
pub mod admin;
pub mod admit;
mod app;
pub mod config;
pub mod context;
pub mod control;
pub mod error;
pub mod fleet;
pub mod forward;
pub mod front;
mod gateway;
pub mod http;
pub mod metrics;
pub mod probes;
pub mod route;
pub mod shared;
pub mod status;
pub mod stream;
pub mod tls;
pub mod tokens;
pub mod trace;
pub mod upstream;

pub use config::{Config, ConfigError, Settings};
pub use error::GatewayError;
pub use gateway::{Gateway, StartError, Stopped};
