//! # sluice-bench: benchmarks for sluice and the engines behind it
//!
//! ## Layout
//!
//! - `arrivals` — open-loop arrival times: Poisson or gamma gaps over a rate schedule with
//!   steps and ramps.
//! - `capacity` — closed-loop concurrency sweep of one engine (`sluice bench capacity`), in
//!   virtual time on the scheduler or over HTTP against a time-scaled simulated engine.
//! - `overhead` — what a gateway costs per request, against going direct
//!   (`sluice bench overhead`).
//! - `scenario` — whole experiments (`sluice bench scenario`): a simulated fleet, each gateway
//!   configuration in turn, the load, and the teardown.
//! - `run` — one open-loop run (`sluice bench run`): jobs from a seed, sent when due.
//! - `goodput` — per-request outcomes summed into goodput (requests per second within every
//!   objective of their tier), attainment, latencies, rejections and retry amplification.
//! - `procs` — the processes a benchmark starts (own process groups, stopped by PID) and their
//!   CPU and memory from `/proc`.
//! - `workload` — seeded request shapes.
//! - `prompts` — the prompts of each mix, and the share of their tokens they repeat.
//! - `stats` — percentiles.
//! - `client` — one open-loop request as a client sends it: no retries, or the OpenAI SDK's.
//! - `demo` — `sluice demo`: an embedded fleet, the gateway, and a story of load and incidents,
//!   watched on one page.
//! - `cli` — the `sluice bench` subcommands.

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod arrivals;
pub mod capacity;
pub mod cli;
pub mod client;
pub mod demo;
pub mod goodput;
pub mod http_capacity;
pub mod overhead;
pub mod procs;
pub mod prompts;
pub mod run;
pub mod scenario;
pub mod stats;
pub mod workload;
