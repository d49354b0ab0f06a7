//! LoRA adapters an engine serves (`--enable-lora`): its limits and load times, the adapters
//! named at start, and whether they may be loaded and unloaded at run time.
//!
//! Defaults are the engines': vLLM's `--max-loras` 1 and `--max-cpu-loras` equal to it
//! (vllm/config/lora.py); SGLang's `--max-loras-per-batch` 8 with no bound on the adapters held
//! in host memory (`--max-loaded-loras` unset; python/sglang/srt/server_args.py).

use std::time::Duration;

/// vLLM's `--max-loras` default.
pub const VLLM_MAX_LORAS: u32 = 1;
/// SGLang's `--max-loras-per-batch` default.
pub const SGLANG_MAX_LORAS_PER_BATCH: u32 = 8;

/// An adapter named at start: vLLM's `--lora-modules name=path`, SGLang's `--lora-paths
/// name=path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterModule {
    pub name: String,
    pub path: String,
}

/// How an engine serves LoRA adapters.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSettings {
    /// Distinct adapters in one running batch (and GPU slots); `None`: the flavor's default.
    pub max_loras: Option<u32>,
    /// Adapters kept in host memory; `None`: the flavor's default.
    pub max_cpu_loras: Option<u32>,
    /// Adapters loaded at start.
    pub modules: Vec<AdapterModule>,
    /// Copying an adapter from host memory into a GPU slot, in engine time.
    pub load_from_cpu: Duration,
    /// Reading an adapter from disk, in engine time.
    pub load_from_disk: Duration,
    /// The load and unload endpoints are served: vLLM only with
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; SGLang always.
    pub runtime_updates: bool,
}
