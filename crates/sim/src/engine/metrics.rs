//! The engine's Prometheus metrics, under the names the real engine uses for its flavor.
//!
//! Counters and histograms are moved by the rank loops as events happen; gauges are read from
//! the ranks' published state when `/metrics` is scraped. Latencies are observed on the host's
//! clock, that is, as a client of a time-scaled engine sees them.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::stats::RankView;
use crate::config::{EngineConfig, Flavor};
use crate::faults::{PinnedLoad, SleepLevel};
use crate::scheduler::FinishReason;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankLabels {
    model_name: String,
    engine: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishLabels {
    model_name: String,
    engine: String,
    finished_reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    model_name: String,
    engine: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SleepLabels {
    model_name: String,
    engine: String,
    sleep_state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheConfigLabels {
    block_size: String,
    cache_dtype: String,
    num_gpu_blocks: String,
    enable_prefix_caching: String,
    gpu_memory_utilization: String,
    engine: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;
type Histograms = Family<RankLabels, Histogram, fn() -> Histogram>;

/// vLLM's `iteration_tokens_total` buckets: powers of two up to its default batch token budget.
fn iteration_histogram() -> Histogram {
    Histogram::new([
        1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
    ])
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ])
}

/// The metric names of one flavor.
struct Names {
    running: &'static str,
    waiting: &'static str,
    kv_usage: &'static str,
    preemptions: &'static str,
    prompt_tokens: &'static str,
    generation_tokens: &'static str,
    success: &'static str,
    ttft: &'static str,
    itl: &'static str,
    e2e: &'static str,
}

const VLLM: Names = Names {
    running: "vllm:num_requests_running",
    waiting: "vllm:num_requests_waiting",
    kv_usage: "vllm:kv_cache_usage_perc",
    preemptions: "vllm:num_preemptions",
    prompt_tokens: "vllm:prompt_tokens",
    generation_tokens: "vllm:generation_tokens",
    success: "vllm:request_success",
    ttft: "vllm:time_to_first_token_seconds",
    itl: "vllm:inter_token_latency_seconds",
    e2e: "vllm:e2e_request_latency_seconds",
};

const SGLANG: Names = Names {
    running: "sglang:num_running_reqs",
    waiting: "sglang:num_queue_reqs",
    kv_usage: "sglang:token_usage",
    preemptions: "sglang:num_retracted_requests",
    prompt_tokens: "sglang:prompt_tokens",
    generation_tokens: "sglang:generation_tokens",
    success: "sglang:num_requests",
    ttft: "sglang:time_to_first_token_seconds",
    itl: "sglang:inter_token_latency_seconds",
    e2e: "sglang:e2e_request_latency_seconds",
};

/// One engine's registry and the handles the rank loops move.
#[derive(Debug)]
pub struct EngineMetrics {
    registry: Registry,
    /// Names of the counter families, whose descriptors are rewritten for the 0.0.4 format.
    counters: Vec<&'static str>,
    labels: Vec<RankLabels>,
    block_size: u32,
    running: Family<RankLabels, FloatGauge>,
    waiting: Family<RankLabels, FloatGauge>,
    kv_usage: Family<RankLabels, FloatGauge>,
    used_tokens: Family<RankLabels, FloatGauge>,
    gen_throughput: Family<RankLabels, FloatGauge>,
    cache_hit_rate: Family<RankLabels, FloatGauge>,
    prefix_queries: Family<RankLabels, FloatCounter>,
    prefix_hits: Family<RankLabels, FloatCounter>,
    preemptions: Family<RankLabels, FloatCounter>,
    /// SGLang's `num_retracted_reqs`: retracted since its last stats log.
    retracted: Family<RankLabels, FloatGauge>,
    waiting_by_reason: Family<ReasonLabels, FloatGauge>,
    sleep_state: Family<SleepLabels, FloatGauge>,
    iteration_tokens: Histograms,
    flavor: Flavor,
    prompt_tokens: Family<RankLabels, FloatCounter>,
    generation_tokens: Family<RankLabels, FloatCounter>,
    success: Family<FinishLabels, FloatCounter>,
    ttft: Histograms,
    itl: Histograms,
    e2e: Histograms,
}

impl EngineMetrics {
    pub fn new(cfg: &EngineConfig) -> Self {
        let names = match cfg.flavor {
            Flavor::Vllm => &VLLM,
            Flavor::Sglang => &SGLANG,
        };
        let mut registry = Registry::default();
        let labels = (0..cfg.dp_size)
            .map(|rank| RankLabels {
                model_name: cfg.model.clone(),
                engine: rank.to_string(),
            })
            .collect();
        let histograms = || Histograms::new_with_constructor(latency_histogram as fn() -> _);
        let mut m = Self {
            registry: Registry::default(),
            counters: vec![
                names.preemptions,
                names.prompt_tokens,
                names.generation_tokens,
                names.success,
            ],
            labels,
            block_size: cfg.block_size,
            running: Family::default(),
            waiting: Family::default(),
            kv_usage: Family::default(),
            used_tokens: Family::default(),
            gen_throughput: Family::default(),
            cache_hit_rate: Family::default(),
            prefix_queries: Family::default(),
            prefix_hits: Family::default(),
            preemptions: Family::default(),
            retracted: Family::default(),
            waiting_by_reason: Family::default(),
            sleep_state: Family::default(),
            iteration_tokens: Histograms::new_with_constructor(iteration_histogram as fn() -> _),
            flavor: cfg.flavor,
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            success: Family::default(),
            ttft: histograms(),
            itl: histograms(),
            e2e: histograms(),
        };
        let reg = &mut registry;
        m.register_common(reg, names);
        match cfg.flavor {
            Flavor::Vllm => m.register_vllm(reg, cfg),
            Flavor::Sglang => m.register_sglang(reg),
        }
        // Every rank's series exists from the start, zero until something happens, as the
        // engines' own clients create them.
        for labels in &m.labels {
            for histogram in [&m.ttft, &m.itl, &m.e2e, &m.iteration_tokens] {
                let _ = histogram.get_or_create(labels);
            }
            for counter in [&m.prompt_tokens, &m.generation_tokens, &m.preemptions] {
                let _ = counter.get_or_create(labels);
            }
        }
        Self { registry, ..m }
    }

    fn rank(&self, rank: usize) -> &RankLabels {
        &self.labels[rank.min(self.labels.len() - 1)]
    }

    pub fn observe_ttft(&self, rank: usize, seconds: f64) {
        self.ttft.get_or_create(self.rank(rank)).observe(seconds);
    }

    pub fn observe_itl(&self, rank: usize, seconds: f64) {
        self.itl.get_or_create(self.rank(rank)).observe(seconds);
    }

    pub fn finished(&self, rank: usize, reason: FinishReason, e2e_seconds: f64) {
        self.e2e.get_or_create(self.rank(rank)).observe(e2e_seconds);
        let labels = self.rank(rank);
        self.success
            .get_or_create(&FinishLabels {
                model_name: labels.model_name.clone(),
                engine: labels.engine.clone(),
                finished_reason: reason.as_str().into(),
            })
            .inc();
    }

    /// Records the tokens of a step that had outputs (vLLM's iteration stats; a step that only
    /// prefilled part of a prompt records none).
    pub fn iteration(&self, rank: usize, tokens: u64) {
        if self.flavor == Flavor::Vllm {
            self.iteration_tokens
                .get_or_create(self.rank(rank))
                .observe(tokens as f64);
        }
    }

    /// Adds a step's work to the token and preemption counters.
    pub fn progress(&self, rank: usize, prompt: u64, generated: u64, preemptions: u64) {
        let labels = self.rank(rank);
        self.prompt_tokens
            .get_or_create(labels)
            .inc_by(prompt as f64);
        self.generation_tokens
            .get_or_create(labels)
            .inc_by(generated as f64);
        self.preemptions
            .get_or_create(labels)
            .inc_by(preemptions as f64);
    }

    /// Adds prompt tokens looked up in the prefix cache and those found there.
    pub fn prefix_lookups(&self, rank: usize, queries: u64, hits: u64) {
        let labels = self.rank(rank);
        self.prefix_queries
            .get_or_create(labels)
            .inc_by(queries as f64);
        self.prefix_hits.get_or_create(labels).inc_by(hits as f64);
    }

    /// The Prometheus text for the ranks' current state, with any pinned report applied.
    /// vLLM counts every waiting request, its disaggregation ones `deferred`; SGLang's
    /// `num_queue_reqs` is its own waiting queue, and the request in chunked prefill is in
    /// neither of its counts.
    pub fn render(
        &self,
        ranks: &[RankView],
        pinned: &[PinnedLoad],
        asleep: Option<SleepLevel>,
    ) -> String {
        for (i, view) in ranks.iter().enumerate() {
            let pin = pinned.get(i).copied().unwrap_or_default();
            let labels = self.rank(i);
            let (running, waiting) = match self.flavor {
                Flavor::Vllm => (view.running, view.waiting),
                Flavor::Sglang => (view.running - view.chunked.min(view.running), view.queued()),
            };
            let running = pin.running.unwrap_or(running);
            self.running.get_or_create(labels).set(running as f64);
            let waiting = pin.waiting.unwrap_or(waiting);
            self.waiting.get_or_create(labels).set(waiting as f64);
            self.vllm_reasons(labels, view, pin.waiting, asleep);
            self.retracted
                .get_or_create(labels)
                .set(view.retracted as f64);
            let usage = pin.kv_usage.unwrap_or_else(|| view.kv_usage());
            self.kv_usage.get_or_create(labels).set(usage);
            let used_tokens = view.kv_blocks_used * u64::from(self.block_size);
            self.used_tokens
                .get_or_create(labels)
                .set(used_tokens as f64);
            self.gen_throughput
                .get_or_create(labels)
                .set(view.gen_throughput);
            self.cache_hit_rate
                .get_or_create(labels)
                .set(view.cache_hit_rate);
        }
        let mut open_metrics = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut open_metrics, &self.registry);
        to_prometheus_text(&open_metrics, &self.counters)
    }
}

impl EngineMetrics {
    /// vLLM's own families: the cache config, prefix cache counters, waiting reasons, sleep
    /// state and iteration histogram.
    /// The families both engines export, under `names`, each flavor's.
    fn register_common(&self, reg: &mut Registry, names: &Names) {
        reg.register(
            names.running,
            "Requests in the running batch.",
            self.running.clone(),
        );
        reg.register(
            names.waiting,
            "Requests waiting to be scheduled.",
            self.waiting.clone(),
        );
        reg.register(
            names.kv_usage,
            "Fraction of KV cache blocks in use (0..1).",
            self.kv_usage.clone(),
        );
        reg.register(
            names.preemptions,
            "Preempted requests.",
            self.preemptions.clone(),
        );
        reg.register(
            names.prompt_tokens,
            "Prefill tokens processed.",
            self.prompt_tokens.clone(),
        );
        reg.register(
            names.generation_tokens,
            "Generation tokens produced.",
            self.generation_tokens.clone(),
        );
        reg.register(
            names.success,
            "Finished requests by finish reason.",
            self.success.clone(),
        );
        reg.register(
            names.ttft,
            "Time to first token in seconds.",
            self.ttft.clone(),
        );
        reg.register(
            names.itl,
            "Inter-token latency in seconds.",
            self.itl.clone(),
        );
        reg.register(
            names.e2e,
            "End-to-end request latency in seconds.",
            self.e2e.clone(),
        );
    }

    fn register_vllm(&mut self, reg: &mut Registry, cfg: &EngineConfig) {
        let info = Family::<CacheConfigLabels, FloatGauge>::default();
        for rank in 0..cfg.dp_size {
            info.get_or_create(&CacheConfigLabels {
                block_size: cfg.block_size.to_string(),
                cache_dtype: "auto".into(),
                num_gpu_blocks: cfg.num_gpu_blocks.to_string(),
                enable_prefix_caching: if cfg.prefix_caching { "True" } else { "False" }.into(),
                gpu_memory_utilization: "0.9".into(),
                engine: rank.to_string(),
            })
            .set(1.0);
        }
        reg.register(
            "vllm:cache_config_info",
            "Information of the KV cache config",
            info,
        );
        reg.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_queries.clone(),
        );
        reg.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            self.prefix_hits.clone(),
        );
        self.counters
            .extend(["vllm:prefix_cache_queries", "vllm:prefix_cache_hits"]);
        reg.register(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason (capacity: no room; deferred: their KV is on its way).",
            self.waiting_by_reason.clone(),
        );
        reg.register(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means the engine is sleeping.",
            self.sleep_state.clone(),
        );
        reg.register(
            "vllm:iteration_tokens_total",
            "Histogram of the number of tokens per engine step (steps with outputs).",
            self.iteration_tokens.clone(),
        );
    }

    /// SGLang's own families.
    fn register_sglang(&mut self, reg: &mut Registry) {
        reg.register(
            "sglang:num_used_tokens",
            "KV tokens in use",
            self.used_tokens.clone(),
        );
        reg.register(
            "sglang:gen_throughput",
            "Generation throughput (tokens/s)",
            self.gen_throughput.clone(),
        );
        reg.register(
            "sglang:cache_hit_rate",
            "The prefix cache hit rate",
            self.cache_hit_rate.clone(),
        );
        reg.register(
            "sglang:num_retracted_reqs",
            "The number of retracted requests.",
            self.retracted.clone(),
        );
    }

    /// vLLM's waiting reasons and sleep state for one rank; a pinned waiting count is all
    /// `capacity`.
    fn vllm_reasons(
        &self,
        labels: &RankLabels,
        view: &RankView,
        pinned_waiting: Option<u64>,
        asleep: Option<SleepLevel>,
    ) {
        if self.flavor != Flavor::Vllm {
            return;
        }
        let (capacity, deferred) = match pinned_waiting {
            Some(waiting) => (waiting, 0),
            None => (
                view.waiting - view.transfer.min(view.waiting),
                view.transfer,
            ),
        };
        for (reason, count) in [("capacity", capacity), ("deferred", deferred)] {
            self.waiting_by_reason
                .get_or_create(&ReasonLabels {
                    model_name: labels.model_name.clone(),
                    engine: labels.engine.clone(),
                    reason,
                })
                .set(count as f64);
        }
        let states = [
            ("awake", asleep.is_none()),
            (
                "weights_offloaded",
                asleep == Some(SleepLevel::WeightsOffloaded),
            ),
            ("discard_all", asleep == Some(SleepLevel::DiscardAll)),
        ];
        for (sleep_state, on) in states {
            self.sleep_state
                .get_or_create(&SleepLabels {
                    model_name: labels.model_name.clone(),
                    engine: labels.engine.clone(),
                    sleep_state,
                })
                .set(if on { 1.0 } else { 0.0 });
        }
    }
}

/// Turns prometheus-client's OpenMetrics text into the Prometheus 0.0.4 text vLLM and SGLang
/// serve: a counter's HELP and TYPE lines name its `_total` samples, and there is no `# EOF`.
fn to_prometheus_text(open_metrics: &str, counters: &[&str]) -> String {
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|rest| (prefix, rest)));
        if let Some((prefix, rest)) = descriptor {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(&name) {
                out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_described_under_their_sample_names() {
        let text = "# HELP a:c Things.\n# TYPE a:c counter\na:c_total{x=\"1\"} 2.0\n# TYPE a:g gauge\na:g 1.0\n# EOF\n";
        assert_eq!(
            to_prometheus_text(text, &["a:c"]),
            "# HELP a:c_total Things.\n# TYPE a:c_total counter\na:c_total{x=\"1\"} 2.0\n# TYPE a:g gauge\na:g 1.0\n"
        );
    }
}
