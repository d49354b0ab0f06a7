//! LoRA adapters an engine serves (`--enable-lora`): its limits and load times, the adapters
//! named at start, whether they may be loaded and unloaded at run time, and the registry of
//! those loaded (names, numbers, paths).
//!
//! Defaults are the engines': vLLM's `--max-loras` 1 and `--max-cpu-loras` equal to it
//! (vllm/config/lora.py); SGLang's `--max-loras-per-batch` 8 with no bound on the adapters held
//! in host memory (`--max-loaded-loras` unset; python/sglang/srt/server_args.py).

use std::time::Duration;

use crate::scheduler::{Adapter, AdapterId};

/// vLLM's `--max-loras` default.
pub const VLLM_MAX_LORAS: u32 = 1;
/// SGLang's `--max-loras-per-batch` default.
pub const SGLANG_MAX_LORAS_PER_BATCH: u32 = 8;

/// What moving an adapter costs, in milliseconds of engine time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadTimes {
    /// From host memory into a GPU slot.
    pub from_cpu_ms: f64,
    /// From disk into host memory.
    pub from_disk_ms: f64,
}

/// Small adapters, loaded the fast way: a rank-16 adapter of Llama-3-8B on all seven
/// projections is 42 M parameters, 84 MB in bf16, which PCIe 4.0 x16 (about 22 GB/s from pinned
/// memory) copies in 4 ms; SGLang's zero-copy loading reads even a rank-128 Llama-3.1-70B
/// adapter from disk in 0.05 s (sgl-project/sglang#20875, measured by its author).
pub const FAST_LOAD: LoadTimes = LoadTimes {
    from_cpu_ms: 4.0,
    from_disk_ms: 50.0,
};

/// Large adapters, loaded the common way: 0.5 s to read a rank-128 Llama-3.1-70B adapter
/// without zero-copy loading (sgl-project/sglang#20875), and 0.5 to 1 s to copy an adapter to
/// the GPU layer by layer (about 20 ms a layer; predibase/lorax#433).
pub const SLOW_LOAD: LoadTimes = LoadTimes {
    from_cpu_ms: 500.0,
    from_disk_ms: 500.0,
};

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

impl LoraSettings {
    /// Adapters `names` at `/adapters/NAME`, loaded at start with `load` times and the flavor's
    /// defaults otherwise; no run-time loading (vLLM's default).
    pub fn serving(names: &[&str], load: LoadTimes) -> Self {
        let ms = |ms: f64| Duration::from_secs_f64(ms / 1000.0);
        Self {
            max_loras: None,
            max_cpu_loras: None,
            modules: names
                .iter()
                .map(|n| AdapterModule {
                    name: (*n).to_string(),
                    path: format!("/adapters/{n}"),
                })
                .collect(),
            load_from_cpu: ms(load.from_cpu_ms),
            load_from_disk: ms(load.from_disk_ms),
            runtime_updates: false,
        }
    }
}

/// Why an adapter could not be loaded or unloaded, in the engine's own words
/// (vllm/entrypoints/openai/models/serving.py, `_check_load_lora_adapter_request` and
/// `_check_unload_lora_adapter_request`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    #[error("Both 'lora_name' and 'lora_path' must be provided.")]
    MissingFields,
    #[error("'lora_name' needs to be provided to unload a LoRA adapter.")]
    MissingName,
    #[error("The lora adapter '{0}' has already been loaded.")]
    AlreadyLoaded(String),
    #[error("The lora adapter '{0}' cannot be found.")]
    NotFound(String),
}

/// SGLang's refusal of a request for an adapter it has not loaded (a 400 over HTTP,
/// `INVALID_ARGUMENT` over gRPC): python/sglang/srt/lora/lora_registry.py, `acquire`, whose
/// list is the repr of its registry's keys.
pub fn not_loaded(name: &str, loaded: &[Loaded]) -> String {
    let names: Vec<String> = loaded
        .iter()
        .map(|l| format!("'{}'", l.adapter.name))
        .collect();
    format!(
        "The following requested LoRA adapters are not loaded: {name}\nLoaded adapters: odict_keys([{}]).",
        names.join(", ")
    )
}

/// One loaded adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub adapter: Adapter,
    /// Where it was loaded from (`root` in vLLM's `/v1/models`).
    pub path: String,
}

/// The adapters an engine has loaded, in load order, each with the number vLLM's API server
/// gives it (`lora_id_counter`, from 1, never reused).
#[derive(Debug, Default)]
pub struct Registry {
    loaded: Vec<Loaded>,
    next_id: u32,
}

impl Registry {
    /// The adapters named at start, loaded in order.
    pub fn new(modules: &[AdapterModule]) -> Self {
        let mut registry = Self::default();
        for m in modules {
            // A name given twice at start keeps its first path, as a second load would fail.
            let _ = registry.load(&m.name, &m.path);
        }
        registry
    }

    /// The adapter called `name`, if loaded.
    pub fn get(&self, name: &str) -> Option<Adapter> {
        self.loaded
            .iter()
            .find(|l| l.adapter.name.as_ref() == name)
            .map(|l| l.adapter.clone())
    }

    /// Loads `name` from `path`; its new number.
    pub fn load(&mut self, name: &str, path: &str) -> Result<Adapter, AdapterError> {
        if name.is_empty() || path.is_empty() {
            return Err(AdapterError::MissingFields);
        }
        if self.get(name).is_some() {
            return Err(AdapterError::AlreadyLoaded(name.to_string()));
        }
        self.next_id += 1;
        let adapter = Adapter {
            id: AdapterId(self.next_id),
            name: name.into(),
        };
        self.loaded.push(Loaded {
            adapter: adapter.clone(),
            path: path.to_string(),
        });
        Ok(adapter)
    }

    /// Unloads `name`; the adapter it was.
    pub fn unload(&mut self, name: &str) -> Result<Adapter, AdapterError> {
        if name.is_empty() {
            return Err(AdapterError::MissingName);
        }
        let at = self
            .loaded
            .iter()
            .position(|l| l.adapter.name.as_ref() == name)
            .ok_or_else(|| AdapterError::NotFound(name.to_string()))?;
        Ok(self.loaded.remove(at).adapter)
    }

    /// Every loaded adapter, in load order.
    pub fn loaded(&self) -> &[Loaded] {
        &self.loaded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_are_numbered_in_load_order_and_a_number_is_never_reused() {
        let mut r = Registry::new(&[
            AdapterModule {
                name: "sql".into(),
                path: "/a/sql".into(),
            },
            AdapterModule {
                name: "med".into(),
                path: "/a/med".into(),
            },
        ]);
        assert_eq!(r.get("med").map(|a| a.id), Some(AdapterId(2)));
        assert_eq!(r.unload("sql").map(|a| a.id), Ok(AdapterId(1)));
        assert_eq!(r.load("sql", "/b/sql").map(|a| a.id), Ok(AdapterId(3)));
        assert_eq!(
            r.loaded()
                .iter()
                .map(|l| l.path.as_str())
                .collect::<Vec<_>>(),
            ["/a/med", "/b/sql"]
        );
    }

    #[test]
    fn loads_and_unloads_are_refused_as_vllm_refuses_them() {
        let mut r = Registry::default();
        assert_eq!(r.load("x", ""), Err(AdapterError::MissingFields));
        r.load("x", "/x").unwrap();
        assert_eq!(
            r.load("x", "/y").unwrap_err().to_string(),
            "The lora adapter 'x' has already been loaded."
        );
        assert_eq!(r.unload("y"), Err(AdapterError::NotFound("y".into())));
        assert_eq!(r.unload(""), Err(AdapterError::MissingName));
    }
}
