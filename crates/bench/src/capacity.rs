//! `sluice bench capacity`: closed-loop concurrency sweep of one engine.
//!
//! At each level C, C clients each keep one request in flight: when one ends, the next starts.
//! After a warm-up, the level is measured for a window of engine time: output tokens per second,
//! TTFT p50/p99 of requests whose first token came in the window, and preemptions per second.
//! Throughput rises with C while batching amortises the step's fixed cost, then falls once the KV
//! cache forces preemption and the engine recomputes what it threw away.
//!
//! Two ways to run the same sweep on the same seeded workload:
//! - `http` (default): a real engine from `sluice-sim` on loopback, time-scaled, driven over HTTP
//!   by streaming requests, exactly as a gateway would see it.
//! - `virtual`: the engine's scheduler stepped in virtual time with no I/O; exact, and
//!   instant. Agreement between the two shows the host CPU did not distort the HTTP run.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use sluice_sim::scheduler::FinishReason;
use sluice_sim::scheduler::{NewSeq, Scheduler, SeqEvent, SeqId};
use sluice_sim::EngineConfig;

use crate::stats::percentile;
use crate::workload::{Shape, ShapeSource, Workload};

/// The default levels: powers of two from 1 to 1024, with the steps between 128 and 1024
/// filled in, since that is where an H100-class engine's knee lies.
pub fn default_levels() -> Vec<u32> {
    vec![
        1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 320, 384, 512, 768, 1024,
    ]
}

/// The default workload: long generations (reasoning-style answers of ~2k tokens on short
/// prompts). Decode growth, not prompts, fills the KV cache, which is what forces a real engine
/// to preempt once it admits more than the cache can carry to completion.
pub fn default_workload() -> Workload {
    Workload {
        prompt_min: 64,
        prompt_max: 192,
        output_median: 2048.0,
        output_sigma: 0.4,
        output_max: 6000,
    }
}

/// How to run the sweep.
#[derive(Debug, Clone)]
pub struct CapacityPlan {
    pub levels: Vec<u32>,
    /// Engine time before measuring each level.
    pub warmup: Duration,
    /// Engine time measured at each level.
    pub window: Duration,
    pub workload: Workload,
    pub seed: u64,
}

/// One level's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LevelResult {
    pub concurrency: u32,
    pub output_tokens_per_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub preemptions_per_s: f64,
    /// Requests that finished in the window.
    pub completed: u64,
}

/// The sweep's result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CapacityReport {
    pub levels: Vec<LevelResult>,
}

impl CapacityReport {
    /// A Markdown table.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| concurrency | output tokens/s | TTFT p50 (s) | TTFT p99 (s) | preemptions/s | completed |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for l in &self.levels {
            out.push_str(&format!(
                "| {} | {:.0} | {:.3} | {:.3} | {:.1} | {} |\n",
                l.concurrency,
                l.output_tokens_per_s,
                l.ttft_p50_s,
                l.ttft_p99_s,
                l.preemptions_per_s,
                l.completed
            ));
        }
        out
    }
}

/// What a level measured, before it is turned into rates.
#[derive(Default)]
pub(crate) struct LevelTally {
    pub tokens: u64,
    pub ttfts: Vec<f64>,
    pub preemptions: u64,
    pub completed: u64,
}

impl LevelTally {
    /// A token at `now` of the sequence that `arrival` (when it arrived, whether a token of it
    /// was seen) tells of: counted while measuring, the first one's wait as a time to first token.
    fn token(&mut self, arrival: Option<&mut (Duration, bool)>, now: Duration, measuring: bool) {
        if measuring {
            self.tokens += 1;
        }
        if let Some((arrived, seen)) = arrival {
            if !std::mem::replace(seen, true) && measuring {
                self.ttfts.push((now - *arrived).as_secs_f64());
            }
        }
    }

    pub(crate) fn result(&self, concurrency: u32, window: Duration) -> LevelResult {
        let secs = window.as_secs_f64().max(f64::EPSILON);
        LevelResult {
            concurrency,
            output_tokens_per_s: self.tokens as f64 / secs,
            ttft_p50_s: percentile(&self.ttfts, 0.5),
            ttft_p99_s: percentile(&self.ttfts, 0.99),
            preemptions_per_s: self.preemptions as f64 / secs,
            completed: self.completed,
        }
    }
}

/// Runs the sweep on the scheduler alone, in virtual time.
pub fn run_virtual(engine: &EngineConfig, plan: &CapacityPlan) -> CapacityReport {
    let levels = plan
        .levels
        .iter()
        .map(|&c| virtual_level(engine, plan, c))
        .collect();
    CapacityReport { levels }
}

fn virtual_level(engine: &EngineConfig, plan: &CapacityPlan, concurrency: u32) -> LevelResult {
    let mut scheduler = Scheduler::new(engine.scheduler());
    let mut shapes = ShapeSource::new(plan.workload, plan.seed);
    let mut arrivals: HashMap<SeqId, (Duration, bool)> = HashMap::new();
    let mut next_id = 0u64;
    let mut submit = |scheduler: &mut Scheduler, now: Duration, arrivals: &mut HashMap<_, _>| {
        let shape: Shape = shapes.next_shape();
        let id = SeqId(next_id);
        next_id += 1;
        scheduler.add(NewSeq {
            id,
            prompt_tokens: shape.prompt_tokens.min(engine.max_model_len - 1),
            output_tokens: shape.output_tokens,
            finish: FinishReason::Length,
            prefix: std::sync::Arc::from([]),
            prompt: std::sync::Arc::from([]),
            preloaded: 0,
            adapter: None,
        });
        arrivals.insert(id, (now, false));
    };
    let mut now = Duration::ZERO;
    for _ in 0..concurrency {
        submit(&mut scheduler, now, &mut arrivals);
    }
    let start = plan.warmup;
    let end = plan.warmup + plan.window;
    let mut tally = LevelTally::default();
    let mut preemptions_at_start = None;
    while now < end {
        let Some(step) = scheduler.step() else {
            break;
        };
        now += step.duration;
        if now >= start && preemptions_at_start.is_none() {
            preemptions_at_start = Some(scheduler.counters().preemptions);
        }
        let measuring = now >= start && now < end;
        for event in step.events {
            match event {
                SeqEvent::Token(id) => tally.token(arrivals.get_mut(&id), now, measuring),
                SeqEvent::Finished(id, _) => {
                    arrivals.remove(&id);
                    if measuring {
                        tally.completed += 1;
                    }
                    submit(&mut scheduler, now, &mut arrivals);
                }
                SeqEvent::Preempted(_) => {}
            }
        }
    }
    tally.preemptions = scheduler.counters().preemptions - preemptions_at_start.unwrap_or(0);
    tally.result(concurrency, plan.window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sim::{Flavor, Profile};

    /// The sweep on the 8B/H100 profile, decided entirely by the scheduler: throughput must rise,
    /// then fall at least 10% once the KV cache forces preemption, while TTFT p50 at least doubles.
    #[test]
    fn the_default_sweep_shows_the_real_engines_knee() {
        let profile = Profile::named("llama3-8b-h100").unwrap();
        let engine = EngineConfig::new(Flavor::Vllm, "m", profile);
        let plan = CapacityPlan {
            levels: vec![64, 320, 1024],
            warmup: Duration::from_secs(300),
            window: Duration::from_secs(300),
            workload: default_workload(),
            seed: 1,
        };
        let report = run_virtual(&engine, &plan);
        let by = |c: u32| {
            report
                .levels
                .iter()
                .find(|l| l.concurrency == c)
                .unwrap()
                .clone()
        };
        let peak = report
            .levels
            .iter()
            .max_by(|a, b| a.output_tokens_per_s.total_cmp(&b.output_tokens_per_s))
            .unwrap()
            .clone();
        println!("{}", report.table());
        assert!(
            by(64).output_tokens_per_s < peak.output_tokens_per_s,
            "throughput rises first"
        );
        assert!(by(64).preemptions_per_s == 0.0);
        let last = by(1024);
        assert!(
            last.output_tokens_per_s <= 0.9 * peak.output_tokens_per_s,
            "throughput falls at least 10% past the knee"
        );
        assert!(
            last.preemptions_per_s > 0.0,
            "the fall comes with preemption"
        );
        assert!(
            last.ttft_p50_s >= 2.0 * peak.ttft_p50_s,
            "TTFT p50 at least doubles"
        );
    }
}
