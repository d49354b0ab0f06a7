//! # sluice-sim: a simulated vLLM / SGLang engine
//!
//! Everything in sluice is tested against engines that cannot run here (no GPU). This crate is
//! an engine faithful enough on the wire that a gateway cannot tell it from vLLM or SGLang, and
//! faithful enough inside that it collapses under over-admission the way a real engine does.
//!
//! ## Layout
//!
//! - `scheduler` — continuous batching for one data-parallel rank as a pure state machine: chunked
//!   prefill, the KV block pool and its watermark, preemption (recompute, swap, truncate) by an
//!   eviction policy (FCFS, LAS, SRPT), and the step-time model. No clock, no I/O.
//! - `engine` — an engine incarnation: one task per rank stepping its scheduler in scaled real
//!   time, the submission path (with abort on drop), the worker-side N+Q cap, metrics, and the
//!   lock-free gauges the HTTP side reads.
//! - `request` — OpenAI request bodies: prompt token counts, choices, answer lengths.
//! - `api` — the HTTP routes of each flavor, their error shapes and SSE rendering.
//! - `grpc` — the gRPC service of `--grpc` (SGLang's scheduler service as SMG's servicer serves
//!   it): generation on token ids, abort, health, loads, the tokenizer, the KV-event stream with
//!   its load records and heartbeats.
//! - `vocab` — the simulated model's tokenizer and chat template, as a model directory's files.
//! - `pd` — prefill/decode disaggregation (`--pd-role`): bootstrap rooms and deadlines on the
//!   prefill side, the running window and the claim on the decode side.
//! - `server` — the accept loop that can crash for real (connections reset).
//! - `kv_events_config` — `--kv-events-config`, the engines' JSON, as read.
//! - `zmq_events` — the prefix cache's KV events over ZMQ, in vLLM's or SGLang's encoding.
//! - `faults` — injectable faults and the standing fault set.
//! - `fleet` — several engines in one process, crash and restart, ground-truth state.
//! - `control` — the control listener's routes over a fleet.
//! - `profile`, `config` — timing presets and validated engine settings.
//! - `lora` — the LoRA adapters an engine serves: limits, load times, the adapters named at start.
//! - `testkit` — a small HTTP client and fleet helpers for black-box tests against the sim.

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod api;
#[cfg(feature = "cli")]
pub mod args;
pub mod config;
pub mod control;
pub mod engine;
pub mod faults;
pub mod fleet;
pub mod grpc;
pub mod kv_events_config;
pub mod lora;
pub mod model_tokens;
pub mod pd;
pub mod profile;
pub mod reasoning;
pub mod request;
pub mod scheduler;
mod server;
pub mod testkit;
pub mod vocab;
pub mod zmq_events;

pub use config::{EngineConfig, Flavor, GrpcConfig};
pub use faults::{Fault, LoadEndpointMode, WedgedPolls};
pub use fleet::{EngineSlot, EngineState, FleetConfig, FleetError, SimFleet};
pub use pd::PdRole;
pub use profile::Profile;
pub use scheduler::{Eviction, Preemption};
