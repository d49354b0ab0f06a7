//! The overhead figures, as JSON rows and as Markdown tables.

use std::fmt::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::compare::{self, Ratio};
use super::row::{Layout, Load, Row};
use super::{Instructions, Measured, OverheadPlan};

/// Resident memory of one gateway.
#[derive(Clone, Debug, Serialize)]
pub struct Memory {
    pub target: String,
    pub rss_idle_bytes: u64,
    pub rss_peak_bytes: u64,
}

/// Every window of every target, plus how the run was set up.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadReport {
    pub rows: Vec<Row>,
    pub memory: Vec<Memory>,
    /// Counted under callgrind, when asked (`--instructions`).
    pub instructions: Vec<Instructions>,
    /// CPU against the plain proxy of the run, each marked like for like or not.
    pub ratios: Vec<Ratio>,
    pub engines: usize,
    pub stream_tokens: u32,
    pub warmup_secs: f64,
    pub window_secs: f64,
    pub gateway_core: usize,
    pub load_core: usize,
    /// Whether pinning with `taskset` worked; without it the core figures mean little.
    pub pinned: bool,
    /// What the figures were measured on (`procs::processor`): only figures from one run, on
    /// one machine, compare.
    pub processor: String,
    /// Where each process's output was written.
    pub logs: PathBuf,
}

impl OverheadReport {
    pub(super) fn new(plan: &OverheadPlan, logs: PathBuf) -> Self {
        Self {
            rows: Vec::new(),
            memory: Vec::new(),
            instructions: Vec::new(),
            ratios: Vec::new(),
            engines: plan.engines,
            stream_tokens: plan.stream_tokens,
            warmup_secs: plan.warmup.as_secs_f64(),
            window_secs: plan.window.as_secs_f64(),
            gateway_core: plan.gateway_core,
            load_core: plan.load_core,
            pinned: plan.pinned,
            processor: crate::procs::processor(),
            logs,
        }
    }

    pub(super) fn add(&mut self, measured: Measured) {
        if let (Some(idle), Some(peak)) = (measured.rss_idle, measured.rss_peak) {
            self.memory.push(Memory {
                target: measured.target.clone(),
                rss_idle_bytes: idle,
                rss_peak_bytes: peak,
            });
        }
        self.rows.extend(measured.rows);
        self.instructions.extend(measured.instructions);
    }

    /// Fills the added latencies from the `direct` row of the same load and connections, and
    /// the ratios against the run's plain proxy.
    pub(super) fn compare_with_direct(&mut self) {
        self.ratios = compare::ratios(&self.rows);
        let direct: Vec<Row> = self
            .rows
            .iter()
            .filter(|r| r.layout == Layout::Direct)
            .cloned()
            .collect();
        for row in self.rows.iter_mut().filter(|r| r.layout != Layout::Direct) {
            let base = direct
                .iter()
                .find(|d| d.load == row.load && d.connections == row.connections);
            if let Some(base) = base {
                row.added_p50_us = Some(row.p50_us - base.p50_us);
                row.added_p99_us = Some(row.p99_us - base.p99_us);
            }
        }
    }

    /// Markdown: small requests, streaming, memory.
    pub fn tables(&self) -> String {
        let mut out = format!("processor: {}\n", self.processor);
        let _ = writeln!(
            out,
            "{} instant engines; gateway on core {}, load generator and engines on core {}{}; \
             {} s warm-up, {} s measured per row\n",
            self.engines,
            self.gateway_core,
            self.load_core,
            if self.pinned {
                ""
            } else {
                " (NOT pinned: taskset or a core is missing, so the core figures mean little)"
            },
            self.warmup_secs,
            self.window_secs,
        );
        out.push_str(&self.small_table());
        out.push('\n');
        out.push_str(&self.stream_table());
        out.push('\n');
        out.push_str(&self.memory_table());
        if !self.ratios.is_empty() {
            out.push('\n');
            out.push_str(&self.ratio_table());
        }
        if !self.instructions.is_empty() {
            out.push('\n');
            out.push_str(&self.instruction_table());
        }
        out
    }

    fn instruction_table(&self) -> String {
        let reference = compare::REFERENCES
            .iter()
            .find_map(|name| self.instructions.iter().find(|i| i.target == *name));
        let mut out = format!(
            "Instructions under callgrind (whole process tree, what it spends idle in the same \
             time taken off; every target saturated, so like for like){}:\n\n\
             | target | requests | per small request | SSE events | per SSE event | idle per s | request ratio | event ratio |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            reference.map_or_else(String::new, |r| format!(", ratios against {}", r.target)),
        );
        for i in &self.instructions {
            let ratio = |own: Option<f64>, base: Option<f64>| match (own, base) {
                (Some(own), Some(base)) if base > 0.0 => format!("{:.2}x", own / base),
                _ => "–".into(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {} | {} | {:.0} | {} | {} |",
                i.target,
                i.requests,
                i.per_request,
                i.events,
                opt(i.per_sse_event, 0),
                i.idle_per_sec,
                ratio(Some(i.per_request), reference.map(|r| r.per_request)),
                ratio(i.per_sse_event, reference.and_then(|r| r.per_sse_event)),
            );
        }
        out
    }

    fn ratio_table(&self) -> String {
        let mut out = String::from(
            "Gateway CPU against the plain proxy, window by window (a ratio between cores in \
             different regimes is not like for like):\n\n\
             | target | against | gateway on | load | conns | CPU ratio | its core | the proxy's core | like for like |\n\
             | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |\n",
        );
        for r in &self.ratios {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.2}x | {} | {} | {} |",
                r.target,
                r.reference,
                r.layout.label(),
                match r.load {
                    Load::Small => "small",
                    Load::Stream => "stream",
                },
                r.connections,
                r.ratio,
                share(r.target_busy),
                share(r.reference_busy),
                if r.like_for_like { "yes" } else { "no" },
            );
        }
        out
    }

    fn small_table(&self) -> String {
        let mut out = String::from(
            "Small non-streaming chat completions (1 token):\n\n\
             | target | gateway on | conns | requests/s | p50 µs | p99 µs | added p50 µs | added p99 µs | gateway CPU-µs/req | gateway core | load core | limited by | failed |\n\
             | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n",
        );
        for r in self.rows.iter().filter(|r| r.load == Load::Small) {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
                r.target,
                r.layout.label(),
                r.connections,
                r.requests_per_sec,
                r.p50_us,
                r.p99_us,
                opt(r.added_p50_us, 0),
                opt(r.added_p99_us, 0),
                opt(r.gateway_cpu_us_per_request, 1),
                share(r.gateway_core_busy),
                share(r.load_core_busy),
                r.limited_by(),
                r.failed,
            );
        }
        out
    }

    fn stream_table(&self) -> String {
        let mut out = format!(
            "Streaming completions ({} tokens each, one SSE event per token):\n\n\
             | target | conns | streams/s | SSE events/s | gateway CPU-µs/event | gateway core | load core | limited by | failed |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n",
            self.stream_tokens
        );
        for r in self.rows.iter().filter(|r| r.load == Load::Stream) {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {:.0} | {} | {} | {} | {} | {} |",
                r.target,
                r.connections,
                r.requests_per_sec,
                r.sse_events_per_sec,
                opt(r.gateway_cpu_us_per_sse_event, 2),
                share(r.gateway_core_busy),
                share(r.load_core_busy),
                r.limited_by(),
                r.failed,
            );
        }
        out
    }

    fn memory_table(&self) -> String {
        let mut out = String::from(
            "Resident memory (process tree):\n\n\
             | target | RSS idle (MB) | RSS peak under load (MB) |\n\
             | --- | ---: | ---: |\n",
        );
        for m in &self.memory {
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1} |",
                m.target,
                m.rss_idle_bytes as f64 / 1e6,
                m.rss_peak_bytes as f64 / 1e6
            );
        }
        out
    }
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{v:.decimals$}"))
}

fn share(value: Option<f64>) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{:.0}%", v * 100.0))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::load::Tally;
    use super::super::row::Sample;
    use super::*;

    fn tally(latencies: &[u32], events: u64) -> Tally {
        Tally {
            elapsed: Duration::from_secs(2),
            latencies_us: latencies.to_vec(),
            failed: 1,
            reconnects: 0,
            events,
            bytes: 0,
        }
    }

    fn row(target: &str, latencies: &[u32], cpu: Option<Duration>) -> Row {
        Row::new(Sample {
            target,
            layout: if cpu.is_some() {
                Layout::OwnCore
            } else {
                Layout::Direct
            },
            load: Load::Small,
            connections: 1,
            tally: &tally(latencies, 0),
            gateway_cpu: cpu,
            gateway_core_busy: cpu.map(|_| 0.97),
            load_core_busy: Some(0.5),
        })
    }

    #[test]
    fn rows_divide_gateway_cpu_by_the_requests_served() {
        let r = row(
            "sluice",
            &[100, 200, 300, 400],
            Some(Duration::from_micros(120)),
        );
        assert_eq!(r.completed, 4);
        assert_eq!(r.requests_per_sec, 2.0);
        assert_eq!(r.gateway_cpu_us_per_request, Some(30.0));
        assert_eq!(r.gateway_cpu_us_per_sse_event, None);
        assert_eq!(r.p50_us, 200.0);
        assert_eq!(r.limited_by(), "gateway core");
    }

    #[test]
    fn added_latency_is_against_direct_at_the_same_load() {
        let mut report = OverheadReport {
            rows: vec![
                row("direct", &[100, 100, 100, 500], None),
                row(
                    "sluice",
                    &[130, 130, 130, 700],
                    Some(Duration::from_micros(100)),
                ),
            ],
            memory: Vec::new(),
            instructions: Vec::new(),
            ratios: Vec::new(),
            engines: 2,
            stream_tokens: 10,
            warmup_secs: 1.0,
            window_secs: 2.0,
            gateway_core: 0,
            load_core: 1,
            pinned: true,
            processor: "test".into(),
            logs: PathBuf::new(),
        };
        report.compare_with_direct();
        assert_eq!(report.rows[0].added_p50_us, None);
        assert_eq!(report.rows[1].added_p50_us, Some(30.0));
        assert_eq!(report.rows[1].added_p99_us, Some(200.0));
        let tables = report.tables();
        assert!(tables.contains("| sluice | own core | 1 | 2 | 130 | 700 | 30 | 200 | 25.0 | 97% | 50% | gateway core | 1 |"));
    }
}
