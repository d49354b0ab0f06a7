//! The engine's command-line flags, shared by `sluice sim` and `sluice bench capacity`
//! (behind the `cli` feature, so library users do not pull in clap).

use clap::{Args, ValueEnum};

use crate::config::{ConfigError, DEFAULT_REQUEST_QUEUE_LIMIT, DEFAULT_WATERMARK};
use crate::profile::PROFILE_NAMES;
use crate::{EngineConfig, Eviction, Flavor, PdRole, Preemption, Profile};

/// Flags that do not make an engine.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("unknown profile {0:?}")]
    UnknownProfile(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    KvEvents(#[from] crate::zmq_events::KvEventsError),
    #[error("--lora-modules: {0:?} is not NAME=PATH")]
    LoraModule(String),
    #[error("--{0} must be a number of milliseconds, at least 0; got {1}")]
    LoraLoadTime(&'static str, f64),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum FlavorArg {
    Vllm,
    Sglang,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PdRoleArg {
    Prefill,
    Decode,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PreemptionArg {
    Recompute,
    Swap,
    Truncate,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum EvictionArg {
    Fcfs,
    Las,
    Srpt,
}

/// The engine's settings, shared by `sluice sim` and `sluice bench capacity`.
#[derive(Args, Clone)]
pub struct EngineArgs {
    /// Which engine to imitate on the wire.
    #[arg(long, value_enum, default_value = "vllm")]
    pub flavor: FlavorArg,
    /// Served model name.
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// Timing preset: step-time coefficients and KV capacity.
    #[arg(long, default_value = "llama3-8b-h100", value_parser = clap::builder::PossibleValuesParser::new(PROFILE_NAMES))]
    pub profile: String,
    /// Divide every engine duration by this (10 runs ten seconds of engine time in one).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Seed for answer lengths, token text and injected errors.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most requests in the running batch [default: the profile's].
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// Most tokens in one step, the chunked-prefill budget [default: the profile's].
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,
    /// KV cache blocks per data-parallel rank [default: the profile's].
    #[arg(long)]
    pub num_gpu_blocks: Option<u32>,
    /// Tokens per KV block [default: the profile's].
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Data-parallel ranks inside the engine, each with its own scheduler and KV cache.
    #[arg(long, default_value_t = 1)]
    pub dp_size: u32,
    /// Longest prompt plus output [default: the profile's (131,072 for the Llama profiles), or what
    /// the KV cache holds if less].
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// What happens to a request evicted from the KV cache.
    #[arg(long, value_enum, default_value = "recompute")]
    pub preemption: PreemptionArg,
    /// Which running request is evicted when the KV cache is full.
    #[arg(long, value_enum, default_value = "fcfs")]
    pub eviction: EvictionArg,
    /// SGLang's limit: once this many requests wait in the scheduler's queue, refuse the next
    /// with 503 "The request queue is full." (in a stream, an error event then [DONE]); off by
    /// default, and vLLM has none.
    #[arg(long)]
    pub max_queued_requests: Option<u32>,
    /// Worker-side cap: N requests in the engine; beyond N + --request-queue-limit, answer 529.
    #[arg(long)]
    pub engine_request_limit: Option<u32>,
    /// Overflow queue behind --engine-request-limit (at least 2).
    #[arg(long, default_value_t = DEFAULT_REQUEST_QUEUE_LIMIT)]
    pub request_queue_limit: u32,
    /// Fraction of KV blocks that must stay free after admitting a request (vLLM V1: 0; V0: 0.01).
    #[arg(long, default_value_t = DEFAULT_WATERMARK)]
    pub kv_watermark: f64,
    /// A reasoning model: chat answers start with `reasoning_content` deltas (vLLM's reasoning
    /// parser), shortened by `chat_template_kwargs.enable_thinking=false`, `reasoning_effort` and
    /// `thinking_token_budget`.
    #[arg(long)]
    pub reasoning: bool,
    /// With --reasoning: the median thinking length in tokens (log-normal around it).
    #[arg(long, default_value_t = 1000)]
    pub reasoning_median_tokens: u32,
    /// Require `Authorization: Bearer <key>` on the OpenAI routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Turn off automatic prefix caching (on by default, as in vLLM V1): every prompt is
    /// prefilled whole, even when its leading blocks were computed before.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Serve one half of disaggregated requests, as SGLang's `--disaggregation-mode`: `prefill`
    /// (computes the prompt once a decode engine claims the request's bootstrap room, failing it
    /// at the bootstrap deadline) or `decode` (admits within its running window, claims the room
    /// at the prefill's bootstrap server, and generates without prefilling).
    #[arg(long, value_enum)]
    pub pd_role: Option<PdRoleArg>,
    /// How long a prefill engine waits for the decode engine to claim a request, in engine
    /// seconds (SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT).
    #[arg(long, default_value_t = crate::pd::DEFAULT_BOOTSTRAP_TIMEOUT_SECS)]
    pub pd_bootstrap_timeout_secs: f64,
    /// Serve SMG's gRPC worker protocol (SGLang's scheduler service, `grpc://` workers) instead
    /// of HTTP, as SGLang behind smg-grpc-servicer; needs --flavor sglang.
    #[arg(long)]
    pub grpc: bool,
    /// With --grpc: publish no KV events (SGLang without --kv-events-config), so
    /// `SubscribeKvEvents` is unimplemented and the load must be polled.
    #[arg(long, requires = "grpc")]
    pub no_kv_events: bool,
    /// With --grpc: an older servicer whose event stream carries no load records or heartbeats.
    #[arg(long, requires = "grpc")]
    pub no_load_records: bool,
    /// With --grpc: a newer servicer whose records also carry the engine's own silence and the
    /// prefill it holds (engine_silence_ms, prefill_pending_tokens).
    #[arg(long, requires = "grpc")]
    pub report_engine_silence: bool,
    /// Publish the prefix cache's KV events over ZMQ, as the engines' own flag does (JSON:
    /// `{"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": ""}`; vLLM's
    /// `enable_kv_cache_events` too), in the flavor's encoding; rank r at the port plus r.
    #[arg(long, value_name = "JSON")]
    pub kv_events_config: Option<String>,
    /// Count and cache HTTP prompts in the simulated model's own tokens (its tokenizer and
    /// chat template, the files --write-model-dir writes), as a real engine does with its
    /// model's, rather than 4 bytes of text a token: a gateway given those files makes the same
    /// ids of a prompt, as precise prefix routing needs.
    #[arg(long)]
    pub model_tokenizer: bool,
    #[command(flatten)]
    pub lora: LoraArgs,
}

/// LoRA adapters, with each engine's flag names (vLLM's first, SGLang's as aliases).
#[derive(Debug, Clone, Args)]
pub struct LoraArgs {
    /// Serve LoRA adapters (given with --lora-modules or loaded at run time).
    #[arg(long)]
    pub enable_lora: bool,
    /// Distinct adapters in one running batch, and their GPU slots (SGLang counts the base model
    /// as one). Default: vLLM 1, SGLang 8.
    #[arg(long, alias = "max-loras-per-batch", requires = "enable_lora")]
    pub max_loras: Option<u32>,
    /// Adapters kept in host memory. Default: vLLM --max-loras, SGLang no bound.
    #[arg(long, alias = "max-loaded-loras", requires = "enable_lora")]
    pub max_cpu_loras: Option<u32>,
    /// Adapters loaded at start, NAME=PATH (SGLang's --lora-paths).
    #[arg(long, alias = "lora-paths", num_args = 1.., value_name = "NAME=PATH", requires = "enable_lora")]
    pub lora_modules: Vec<String>,
    /// Milliseconds (engine time) to copy an adapter from host memory into a GPU slot: an
    /// 84 MB rank-16 Llama-3-8B adapter over PCIe 4.0 x16 (docs/simulator.md).
    #[arg(long, default_value_t = crate::lora::FAST_LOAD.from_cpu_ms)]
    pub lora_load_from_cpu_ms: f64,
    /// Milliseconds (engine time) to read an adapter from disk into host memory.
    #[arg(long, default_value_t = crate::lora::FAST_LOAD.from_disk_ms)]
    pub lora_load_from_disk_ms: f64,
    /// Serve vLLM's load and unload endpoints, as `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` does
    /// (SGLang serves its own always).
    #[arg(long, env = "VLLM_ALLOW_RUNTIME_LORA_UPDATING")]
    pub allow_runtime_lora_updating: bool,
}

impl LoraArgs {
    /// The engine's LoRA settings, or none without --enable-lora.
    fn settings(&self, flavor: Flavor) -> Result<Option<crate::lora::LoraSettings>, ArgsError> {
        if !self.enable_lora {
            return Ok(None);
        }
        let modules = self
            .lora_modules
            .iter()
            .map(|m| match m.split_once('=') {
                Some((name, path)) if !name.is_empty() && !path.is_empty() => {
                    Ok(crate::lora::AdapterModule {
                        name: name.to_string(),
                        path: path.to_string(),
                    })
                }
                _ => Err(ArgsError::LoraModule(m.clone())),
            })
            .collect::<Result<_, _>>()?;
        let ms = |flag: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(std::time::Duration::from_secs_f64(v / 1000.0))
            } else {
                Err(ArgsError::LoraLoadTime(flag, v))
            }
        };
        Ok(Some(crate::lora::LoraSettings {
            max_loras: self.max_loras,
            max_cpu_loras: self.max_cpu_loras,
            modules,
            load_from_cpu: ms("lora-load-from-cpu-ms", self.lora_load_from_cpu_ms)?,
            load_from_disk: ms("lora-load-from-disk-ms", self.lora_load_from_disk_ms)?,
            runtime_updates: flavor == Flavor::Sglang || self.allow_runtime_lora_updating,
        }))
    }
}

impl EngineArgs {
    pub fn config(&self) -> Result<EngineConfig, ArgsError> {
        let mut cfg = self.config_for(&self.model, &self.profile)?;
        cfg.reasoning = self.reasoning.then_some(self.reasoning_median_tokens);
        Ok(cfg)
    }

    /// An engine of another model and profile with these flags' other settings (not
    /// `--reasoning`, which is the main model's): `--also-serve`.
    pub fn config_for(&self, model: &str, profile: &str) -> Result<EngineConfig, ArgsError> {
        let profile = Profile::named(profile)
            .ok_or_else(|| ArgsError::UnknownProfile(profile.to_string()))?;
        let flavor = match self.flavor {
            FlavorArg::Vllm => Flavor::Vllm,
            FlavorArg::Sglang => Flavor::Sglang,
        };
        let mut cfg = EngineConfig::new(flavor, model, profile);
        cfg.time_scale = self.time_scale;
        cfg.seed = self.seed;
        cfg.max_num_seqs = self.max_num_seqs.unwrap_or(cfg.max_num_seqs);
        cfg.max_num_batched_tokens = self
            .max_num_batched_tokens
            .unwrap_or(cfg.max_num_batched_tokens);
        cfg.num_gpu_blocks = self.num_gpu_blocks.unwrap_or(cfg.num_gpu_blocks);
        cfg.block_size = self.block_size.unwrap_or(cfg.block_size);
        cfg.max_model_len = self.max_model_len.unwrap_or(cfg.max_model_len);
        cfg.dp_size = self.dp_size;
        cfg.preemption = match self.preemption {
            PreemptionArg::Recompute => Preemption::Recompute,
            PreemptionArg::Swap => Preemption::Swap,
            PreemptionArg::Truncate => Preemption::Truncate,
        };
        cfg.eviction = match self.eviction {
            EvictionArg::Fcfs => Eviction::Fcfs,
            EvictionArg::Las => Eviction::Las,
            EvictionArg::Srpt => Eviction::Srpt,
        };
        cfg.max_queued_requests = self.max_queued_requests;
        cfg.engine_request_limit = self.engine_request_limit;
        cfg.request_queue_limit = self.request_queue_limit;
        cfg.api_key = self.api_key.clone();
        cfg.watermark = self.kv_watermark;
        cfg.prefix_caching = !self.no_prefix_caching;
        cfg.pd_role = self.pd_role.map(|role| match role {
            PdRoleArg::Prefill => PdRole::Prefill,
            PdRoleArg::Decode => PdRole::Decode,
        });
        cfg.bootstrap_timeout_secs = self.pd_bootstrap_timeout_secs;
        cfg.grpc = self.grpc.then_some(crate::config::GrpcConfig {
            kv_events: !self.no_kv_events,
            load_records: !self.no_load_records,
            report_silence: self.report_engine_silence,
        });
        cfg.kv_events_zmq = match &self.kv_events_config {
            Some(json) => crate::zmq_events::KvEventsConfig::parse(json)?,
            None => None,
        };
        cfg.model_tokenizer = self.model_tokenizer;
        cfg.lora = self.lora.settings(flavor)?;
        if self.max_model_len.is_none() {
            cfg.fit_context();
        }
        cfg.validate()?;
        Ok(cfg)
    }
}
