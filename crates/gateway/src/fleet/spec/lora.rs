//! The spec's `lora` block: the LoRA adapters the gateway may load onto this worker's engine
//! when a request names one that no worker serves, and how many it may hold.
//!
//! ```json
//! "lora": {"modules": ["sql=/adapters/sql", {"name": "med", "path": "/adapters/med"}],
//!          "max_loaded": 8}
//! ```
//!
//! A module is written as vLLM's `--lora-modules` takes one: `name=path`, or an object with
//! `name`, `path` and optionally `base_model_name` (vllm/entrypoints/openai/cli_args.py,
//! `LoRAParserAction`). The path is the engine's, sent as the load endpoint's `lora_path`.

use serde::Serialize;
use serde_json::{Map, Value};

use super::{spec_error, SpecError};

/// One adapter the engine may load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoraModule {
    pub(crate) name: String,
    pub(crate) path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) base_model_name: Option<String>,
}

/// The adapters a worker's engine may be told to load, and its allowance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LoraSpec {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) modules: Vec<LoraModule>,
    /// Adapters the engine may hold at once; loading one more first unloads the least recently
    /// used. `None`: no limit (the engine's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_loaded: Option<u32>,
}

impl LoraSpec {
    pub(crate) fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The module named `adapter`, if the engine may load it.
    pub(crate) fn module(&self, adapter: &str) -> Option<&LoraModule> {
        self.modules.iter().find(|m| m.name == adapter)
    }
}

const FIELDS: &[&str] = &["modules", "max_loaded"];

/// The `lora` block of `object`, empty when absent.
pub(super) fn lora_block(object: &Map<String, Value>) -> Result<LoraSpec, SpecError> {
    let block = match object.get("lora") {
        None | Some(Value::Null) => return Ok(LoraSpec::default()),
        Some(Value::Object(block)) => block,
        Some(_) => return Err(spec_error("lora", "must be an object")),
    };
    if let Some(unknown) = block.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(spec_error(
            &format!("lora.{unknown}"),
            format!("unknown field (known: {})", FIELDS.join(", ")),
        ));
    }
    let modules = match block.get("modules") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| module(item).map_err(|m| spec_error(&format!("lora.modules[{i}]"), m)))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(spec_error("lora.modules", "must be a list")),
    };
    if let Some(twice) = modules
        .iter()
        .enumerate()
        .find_map(|(i, m): (usize, &LoraModule)| {
            modules[..i]
                .iter()
                .any(|o| o.name == m.name)
                .then_some(&m.name)
        })
    {
        return Err(spec_error("lora.modules", format!("names {twice} twice")));
    }
    let max_loaded = match block.get("max_loaded") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    spec_error("lora.max_loaded", "must be a whole number, at least 1")
                })?,
        ),
    };
    Ok(LoraSpec {
        modules,
        max_loaded,
    })
}

/// One module: `name=path`, or `{"name", "path", "base_model_name"}`.
fn module(item: &Value) -> Result<LoraModule, &'static str> {
    const MUST: &str = "must be \"name=path\" or an object with name and path";
    let (name, path, base_model_name) = match item {
        Value::String(text) => {
            let (name, path) = text.split_once('=').ok_or(MUST)?;
            (name.trim().to_string(), path.trim().to_string(), None)
        }
        Value::Object(fields) => {
            let text = |key: &str| fields.get(key).and_then(Value::as_str).map(str::to_string);
            if fields
                .keys()
                .any(|k| !["name", "path", "base_model_name"].contains(&k.as_str()))
            {
                return Err("has a field other than name, path and base_model_name");
            }
            (
                text("name").ok_or(MUST)?,
                text("path").ok_or(MUST)?,
                text("base_model_name"),
            )
        }
        _ => return Err(MUST),
    };
    if name.is_empty() || path.is_empty() {
        return Err("needs a name and a path");
    }
    Ok(LoraModule {
        name,
        path,
        base_model_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(json: &str) -> Result<LoraSpec, SpecError> {
        let object: Map<String, Value> = serde_json::from_str(json).unwrap();
        lora_block(&object)
    }

    #[test]
    fn modules_read_as_vllm_takes_them() {
        let spec = parsed(
            r#"{"lora": {"modules": ["sql=/a/sql", {"name": "med", "path": "/a/med",
                "base_model_name": "base"}], "max_loaded": 2}}"#,
        )
        .unwrap();
        assert_eq!(spec.module("sql").map(|m| m.path.as_str()), Some("/a/sql"));
        assert_eq!(
            spec.module("med")
                .and_then(|m| m.base_model_name.as_deref()),
            Some("base")
        );
        assert_eq!(spec.max_loaded, Some(2));
        assert!(parsed("{}").unwrap().is_empty());
    }

    #[test]
    fn a_bad_block_names_its_field() {
        for (json, field) in [
            (r#"{"lora": []}"#, "lora"),
            (r#"{"lora": {"modules": "sql"}}"#, "lora.modules"),
            (r#"{"lora": {"modules": ["sql"]}}"#, "lora.modules[0]"),
            (r#"{"lora": {"modules": ["=/p"]}}"#, "lora.modules[0]"),
            (
                r#"{"lora": {"modules": [{"name": "a"}]}}"#,
                "lora.modules[0]",
            ),
            (r#"{"lora": {"modules": ["a=/x", "a=/y"]}}"#, "lora.modules"),
            (r#"{"lora": {"max_loaded": 0}}"#, "lora.max_loaded"),
            (r#"{"lora": {"slots": 1}}"#, "lora.slots"),
        ] {
            assert_eq!(parsed(json).unwrap_err().field, field, "{json}");
        }
    }
}
