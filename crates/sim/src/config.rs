//! One engine's settings, validated once when the engine starts.

use serde::{Deserialize, Serialize};

use crate::lora::{LoraSettings, SGLANG_MAX_LORAS_PER_BATCH, VLLM_MAX_LORAS};
use crate::pd::{PdRole, DEFAULT_BOOTSTRAP_TIMEOUT_SECS};
use crate::profile::Profile;
use crate::scheduler::{blocks_for, Eviction, LoraConfig, Preemption, SchedulerConfig};

/// Which engine the simulator imitates on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    Vllm,
    Sglang,
}

impl Flavor {
    /// The `owned_by` of `/v1/models`, which gateways read to detect the backend.
    pub fn owner(self) -> &'static str {
        match self {
            Flavor::Vllm => "vllm",
            Flavor::Sglang => "sglang",
        }
    }
}

/// Fraction of the KV blocks that must stay free after admitting a new request. vLLM's V1
/// engine (the one deployed today) reserves nothing for decode growth, so the default is 0; V0
/// kept 1% (`--kv-watermark 0.01`), which trades a little batch size for far fewer preemptions.
pub const DEFAULT_WATERMARK: f64 = 0.0;

/// Dynamo's default overflow queue behind `--engine-request-limit`.
pub const DEFAULT_REQUEST_QUEUE_LIMIT: u32 = 16;

/// The settings of one simulated engine. Every rank of a data-parallel engine gets the same
/// scheduler limits and its own KV cache, as vLLM's DP ranks do.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub flavor: Flavor,
    /// The served model name.
    pub model: String,
    pub profile: Profile,
    /// Every engine duration is divided by this: 10 runs ten seconds of engine time in one.
    pub time_scale: f64,
    /// Seeds answer lengths, token text and injected error choices.
    pub seed: u64,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    pub num_gpu_blocks: u32,
    pub block_size: u32,
    pub dp_size: u32,
    pub max_model_len: u32,
    pub preemption: Preemption,
    pub eviction: Eviction,
    /// Reject new requests with 503 once this many are waiting (off by default, as in vLLM).
    pub max_queued_requests: Option<u32>,
    /// Dynamo's worker-side cap: N requests in the engine...
    pub engine_request_limit: Option<u32>,
    /// ...plus Q waiting for a slot; the next one gets 529.
    pub request_queue_limit: u32,
    /// Bearer token the OpenAI routes require, as `vllm serve --api-key`.
    pub api_key: Option<String>,
    /// Fraction of KV blocks kept free at admission.
    pub watermark: f64,
    /// `--reasoning`: the model thinks about this many tokens (median) before it answers.
    pub reasoning: Option<u32>,
    /// Automatic prefix caching, on by default as in vLLM V1 (`--no-prefix-caching`).
    pub prefix_caching: bool,
    /// The half of disaggregated requests it serves (`--pd-role`); `None`: whole requests.
    pub pd_role: Option<PdRole>,
    /// A prefill engine's bootstrap deadline, in engine seconds.
    pub bootstrap_timeout_secs: f64,
    /// Served over SMG's gRPC protocol (`--grpc`) instead of HTTP; `None`: HTTP.
    pub grpc: Option<GrpcConfig>,
    /// KV events published over ZMQ (`--kv-events-config`); `None`: not published.
    pub kv_events_zmq: Option<crate::kv_events_config::KvEventsConfig>,
    /// HTTP prompts in the simulated model's tokens (`--model-tokenizer`) rather than 4 bytes
    /// a token.
    pub model_tokenizer: bool,
    /// LoRA adapters (`--enable-lora`); `None`: the base model only.
    pub lora: Option<LoraSettings>,
}

/// How the gRPC service behaves, as the servicer in front of a real engine is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcConfig {
    /// KV events published (SGLang's `--kv-events-config`): without them `SubscribeKvEvents`
    /// answers `UNIMPLEMENTED` and a gateway must poll `GetLoads`.
    pub kv_events: bool,
    /// The event stream carries a load record on every batch and heartbeats through quiet
    /// spells (smg-grpc-servicer 0.14); off: an older servicer, cache events only.
    pub load_records: bool,
    /// The records also say how long the engine has been silent while holding work
    /// (`engine_silence_ms`, with `engine_reports_steps` false: SGLang's wire carries token
    /// batches only) and the prefill in hand (`prefill_pending_tokens`): the fields of
    /// smg-grpc-proto 0.4.28 that 0.14.1's servicer does not yet fill.
    pub report_silence: bool,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            kv_events: true,
            load_records: true,
            report_silence: false,
        }
    }
}

/// A setting that cannot work, named so the user knows which flag to fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("--{flag} must be at least {min}, got {value}")]
    TooSmall {
        flag: &'static str,
        min: u64,
        value: u64,
    },
    #[error("--time-scale must be a positive number, got {0}")]
    TimeScale(f64),
    #[error("--pd-bootstrap-timeout-secs must be a positive number, got {0}")]
    BootstrapTimeout(f64),
    #[error("--kv-watermark must be a fraction in [0, 1), got {0}")]
    Watermark(f64),
    #[error(
        "--max-model-len {max_model_len} needs {needed} KV blocks but only {available} are \
         usable (--num-gpu-blocks minus the watermark): raise --num-gpu-blocks or lower --max-model-len"
    )]
    ContextDoesNotFit {
        max_model_len: u32,
        needed: u32,
        available: u32,
    },
    #[error(
        "--grpc serves SGLang's scheduler service (sglang.grpc.scheduler): use --flavor sglang"
    )]
    GrpcFlavor,
}

impl EngineConfig {
    /// An engine with the profile's defaults.
    pub fn new(flavor: Flavor, model: impl Into<String>, profile: Profile) -> Self {
        Self {
            flavor,
            model: model.into(),
            time_scale: 1.0,
            seed: 0,
            max_num_seqs: profile.max_num_seqs,
            max_num_batched_tokens: profile.max_num_batched_tokens,
            num_gpu_blocks: profile.num_gpu_blocks,
            block_size: profile.block_size,
            dp_size: 1,
            max_model_len: profile.max_model_len,
            preemption: Preemption::default(),
            eviction: Eviction::default(),
            max_queued_requests: None,
            engine_request_limit: None,
            request_queue_limit: DEFAULT_REQUEST_QUEUE_LIMIT,
            api_key: None,
            watermark: DEFAULT_WATERMARK,
            reasoning: None,
            prefix_caching: true,
            pd_role: None,
            bootstrap_timeout_secs: DEFAULT_BOOTSTRAP_TIMEOUT_SECS,
            grpc: None,
            kv_events_zmq: None,
            model_tokenizer: false,
            lora: None,
            profile,
        }
    }

    /// KV blocks every admission must leave free.
    pub fn watermark_blocks(&self) -> u32 {
        (f64::from(self.num_gpu_blocks) * self.watermark).ceil() as u32
    }

    /// Lowers the profile's context length to what the KV cache holds, when no other was
    /// chosen. vLLM refuses to start instead (its estimate of the longest context that fits is in
    /// the error); the simulator lets `--num-gpu-blocks` shrink a GPU without `--max-model-len`.
    pub fn fit_context(&mut self) {
        if self.max_model_len == self.profile.max_model_len {
            let usable = self.num_gpu_blocks.saturating_sub(self.watermark_blocks());
            let held = usable.saturating_mul(self.block_size).max(1);
            self.max_model_len = self.max_model_len.min(held);
        }
    }

    /// Checks that the engine can run; the error names the flag to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let at_least = |flag, min: u64, value: u64| {
            if value < min {
                Err(ConfigError::TooSmall { flag, min, value })
            } else {
                Ok(())
            }
        };
        at_least("max-num-seqs", 1, self.max_num_seqs.into())?;
        at_least(
            "max-num-batched-tokens",
            1,
            self.max_num_batched_tokens.into(),
        )?;
        at_least("block-size", 1, self.block_size.into())?;
        at_least("dp-size", 1, self.dp_size.into())?;
        at_least("max-model-len", 1, self.max_model_len.into())?;
        if let Some(limit) = self.engine_request_limit {
            at_least("engine-request-limit", 1, limit.into())?;
            at_least("request-queue-limit", 2, self.request_queue_limit.into())?;
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(ConfigError::TimeScale(self.time_scale));
        }
        if !(self.bootstrap_timeout_secs.is_finite() && self.bootstrap_timeout_secs > 0.0) {
            return Err(ConfigError::BootstrapTimeout(self.bootstrap_timeout_secs));
        }
        if !(0.0..1.0).contains(&self.watermark) {
            return Err(ConfigError::Watermark(self.watermark));
        }
        if self.grpc.is_some() && self.flavor != Flavor::Sglang {
            return Err(ConfigError::GrpcFlavor);
        }
        let needed = blocks_for(self.max_model_len, self.block_size);
        let available = self.num_gpu_blocks.saturating_sub(self.watermark_blocks());
        if needed > available {
            return Err(ConfigError::ContextDoesNotFit {
                max_model_len: self.max_model_len,
                needed,
                available,
            });
        }
        Ok(())
    }

    /// The bootstrap deadline in host time.
    pub fn bootstrap_deadline(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.bootstrap_timeout_secs / self.time_scale)
    }

    /// The scheduler settings of one rank.
    pub fn scheduler(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            num_gpu_blocks: self.num_gpu_blocks,
            block_size: self.block_size,
            watermark_blocks: self.watermark_blocks(),
            preemption: self.preemption,
            eviction: self.eviction,
            cost: self.profile.cost,
            lora: self.lora.as_ref().map(|l| lora_scheduler(l, self.flavor)),
        }
    }
}

/// The scheduler's view of `--enable-lora`: the cap (counting the base model where SGLang
/// does), the host-memory bound with each flavor's default, the load times.
fn lora_scheduler(lora: &LoraSettings, flavor: Flavor) -> LoraConfig {
    let (max_loras, max_cpu_loras) = match flavor {
        Flavor::Vllm => {
            let slots = lora.max_loras.unwrap_or(VLLM_MAX_LORAS);
            (slots, Some(lora.max_cpu_loras.unwrap_or(slots)))
        }
        Flavor::Sglang => (
            lora.max_loras.unwrap_or(SGLANG_MAX_LORAS_PER_BATCH),
            lora.max_cpu_loras,
        ),
    };
    LoraConfig {
        max_loras,
        base_takes_slot: flavor == Flavor::Sglang,
        max_cpu_loras,
        load_from_cpu: lora.load_from_cpu,
        load_from_disk: lora.load_from_disk,
    }
}
