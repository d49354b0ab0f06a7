//! Adaptive control (seed 003): limits learned from the latency users feel instead of static
//! caps, and a queue that tells a passing burst from a standing one.
//!
//! ## Layout
//!
//! - `aimd` — a worker's concurrency limit, moved once per window by the p95 of its time to
//!   first token and inter-token latency (additive increase, multiplicative decrease).
//! - `buckets` — latency samples as counts in log-linear buckets, and their quantiles.
//! - `codel` — Controlled Delay on one tier of the gateway queue: head drops by the paper's
//!   control law, and arrivals past the target refused, once the sojourn time has stood above
//!   target for a whole interval, until an interval passes with nothing to refuse.

pub mod aimd;
pub mod buckets;
pub mod codel;

pub use aimd::{admits, decide, AimdConfig, Decision, WindowSamples, WindowStats};
pub use buckets::Histogram;
pub use codel::{Codel, CodelConfig, HeadVerdict};
