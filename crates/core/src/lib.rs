//! # sluice-core: the gateway's decisions, with no I/O
//!
//! Everything that decides lives here as plain code over plain data, so it can be tested
//! exhaustively without a network or a runtime.
//!
//! ## Layout
//!
//! - `prom_text` — the Prometheus text format engines serve on `/metrics` (vLLM's `vllm:*` names
//!   included), parsed strictly.

pub mod prom_text;
