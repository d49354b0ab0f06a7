//! One measured window as a row: where the gateway ran, what load it served, and its figures
//! (what `report` tabulates and `compare` sets side by side).

use std::time::Duration;

use serde::Serialize;

use super::load::Tally;
use crate::stats::percentile;

/// A core busier than this during a window is what limited it.
pub(super) const SATURATED: f64 = 0.9;

/// The request shape of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Load {
    /// Non-streaming chat completion, one token out.
    Small,
    /// Streaming completion, one SSE event per token.
    Stream,
}

/// Where the gateway ran during a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// No gateway: load straight to the engines, all on the load core.
    Direct,
    /// The gateway alone on its core; every hop crosses cores.
    OwnCore,
    /// The gateway on the load and engines' core; no hop waits for another core to wake.
    SharedCore,
}

impl Layout {
    pub(super) fn label(self) -> &'static str {
        match self {
            Layout::Direct => "–",
            Layout::OwnCore => "own core",
            Layout::SharedCore => "shared core",
        }
    }
}

/// The figures of one window.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub target: String,
    pub layout: Layout,
    pub load: Load,
    pub connections: usize,
    pub completed: u64,
    pub failed: u64,
    pub reconnects: u64,
    pub requests_per_sec: f64,
    pub sse_events_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Against `direct` at the same load and connections; None without a direct row.
    pub added_p50_us: Option<f64>,
    pub added_p99_us: Option<f64>,
    /// The gateway process tree's CPU time during the window.
    pub gateway_cpu_secs: Option<f64>,
    pub gateway_cpu_us_per_request: Option<f64>,
    pub gateway_cpu_us_per_sse_event: Option<f64>,
    /// Busy share of the gateway's core and of the load generator's core, 0..=1.
    pub gateway_core_busy: Option<f64>,
    pub load_core_busy: Option<f64>,
}

/// What one window produced, before it becomes a row.
pub(super) struct Sample<'a> {
    pub target: &'a str,
    pub layout: Layout,
    pub load: Load,
    pub connections: usize,
    pub tally: &'a Tally,
    pub gateway_cpu: Option<Duration>,
    pub gateway_core_busy: Option<f64>,
    pub load_core_busy: Option<f64>,
}

impl Row {
    pub(super) fn new(s: Sample<'_>) -> Self {
        let secs = s.tally.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let latencies: Vec<f64> = s.tally.latencies_us.iter().map(|&l| f64::from(l)).collect();
        let completed = s.tally.completed();
        let cpu_us = s.gateway_cpu.map(|c| c.as_secs_f64() * 1e6);
        let per = |count: u64| cpu_us.filter(|_| count > 0).map(|us| us / count as f64);
        Self {
            target: s.target.into(),
            layout: s.layout,
            load: s.load,
            connections: s.connections,
            completed,
            failed: s.tally.failed,
            reconnects: s.tally.reconnects,
            requests_per_sec: completed as f64 / secs,
            sse_events_per_sec: s.tally.events as f64 / secs,
            p50_us: percentile(&latencies, 0.5),
            p99_us: percentile(&latencies, 0.99),
            added_p50_us: None,
            added_p99_us: None,
            gateway_cpu_secs: s.gateway_cpu.map(|c| c.as_secs_f64()),
            gateway_cpu_us_per_request: per(completed),
            gateway_cpu_us_per_sse_event: per(s.tally.events),
            gateway_core_busy: s.gateway_core_busy,
            load_core_busy: s.load_core_busy,
        }
    }

    /// Which side of the machine set this window's pace.
    pub fn limited_by(&self) -> &'static str {
        if self.layout == Layout::SharedCore {
            return "one core for all";
        }
        let busy = |b: Option<f64>| b.is_some_and(|b| b >= SATURATED);
        match (busy(self.gateway_core_busy), busy(self.load_core_busy)) {
            (true, false) => "gateway core",
            (false, true) => "load + engines core",
            (true, true) => "both cores",
            (false, false) => "latency (neither core saturated)",
        }
    }
}
