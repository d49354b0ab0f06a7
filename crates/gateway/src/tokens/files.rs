//! Where a model's tokenizer and chat template are: a model directory as Hugging Face lays it out
//! (`tokenizer.json`, `tokenizer_config.json`, perhaps `chat_template.jinja`), found from SMG's
//! flags. `--tokenizer-path` names the tokenizer file or its directory and wins over
//! `--model-path`; `--chat-template` names a template file (Jinja, or JSON with a
//! `chat_template` key) and wins over the directory's. sluice does not download models: a path
//! that is not on disk is an error that says so.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Why the tokenizer or the template could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error(
        "{flag} {path}: no such file or directory (sluice reads a model's files from disk and \
         downloads nothing: download the model's tokenizer files and give their directory)"
    )]
    Missing { flag: &'static str, path: PathBuf },
    #[error(
        "no tokenizer: give --tokenizer-path or --model-path (a directory with tokenizer.json)"
    )]
    NoTokenizerPath,
    #[error("{0}: no tokenizer.json there")]
    NoTokenizerFile(PathBuf),
    #[error("{path}: not a tokenizer Hugging Face's tokenizers can read: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("the chat template from {origin} does not parse: {reason}")]
    TemplateSyntax { origin: String, reason: String },
    #[error("the model has no chat template: give --chat-template, or use /v1/completions")]
    NoTemplate,
    #[error("the chat template failed on this conversation: {0}")]
    Render(String),
    #[error("the prompt could not be tokenized: {0}")]
    Encode(String),
}

/// SMG's flags for a model's files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelFiles {
    pub model_path: Option<PathBuf>,
    pub tokenizer_path: Option<PathBuf>,
    pub chat_template: Option<PathBuf>,
}

/// A chat template's text and the special tokens it is rendered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TemplateSource {
    pub(crate) source: String,
    pub(crate) bos_token: String,
    pub(crate) eos_token: String,
    /// Where it came from, for errors.
    pub(crate) origin: String,
}

/// The files found.
#[derive(Debug)]
pub(super) struct Found {
    pub(crate) tokenizer: PathBuf,
    pub(crate) template: Option<TemplateSource>,
}

fn existing(flag: &'static str, path: &Path) -> Result<(), TokensError> {
    if path.exists() {
        Ok(())
    } else {
        Err(TokensError::Missing {
            flag,
            path: path.to_path_buf(),
        })
    }
}

fn read_json(path: &Path) -> Result<Value, TokensError> {
    let unreadable = |reason: String| TokensError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| unreadable(e.to_string()))
}

/// A special token as `tokenizer_config.json` gives it: a string, or an object with `content`.
fn token_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

/// `chat_template` as `tokenizer_config.json` gives it: a string, or a list of named templates
/// of which the one named `default` is used.
fn template_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

impl ModelFiles {
    /// True when no flag names a model's files.
    pub(crate) fn is_empty(&self) -> bool {
        self.model_path.is_none() && self.tokenizer_path.is_none() && self.chat_template.is_none()
    }

    pub(super) fn locate(&self) -> Result<Found, TokensError> {
        let (flag, given) = match (&self.tokenizer_path, &self.model_path) {
            (Some(path), _) => ("--tokenizer-path", path),
            (None, Some(path)) => ("--model-path", path),
            (None, None) => return Err(TokensError::NoTokenizerPath),
        };
        existing(flag, given)?;
        let (tokenizer, dir) = if given.is_dir() {
            (given.join("tokenizer.json"), given.clone())
        } else {
            let dir = given.parent().map(Path::to_path_buf).unwrap_or_default();
            (given.clone(), dir)
        };
        if !tokenizer.is_file() {
            return Err(TokensError::NoTokenizerFile(dir));
        }
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            read_json(&config_path)?
        } else {
            Value::Null
        };
        let bos_token = token_text(&config["bos_token"]);
        let eos_token = token_text(&config["eos_token"]);
        let source = match &self.chat_template {
            Some(path) => {
                existing("--chat-template", path)?;
                Some(Self::template_file(path)?)
            }
            None => {
                let jinja = dir.join("chat_template.jinja");
                if jinja.is_file() {
                    Some(Self::template_file(&jinja)?)
                } else {
                    template_text(&config["chat_template"])
                        .map(|text| (text, config_path.display().to_string()))
                }
            }
        };
        Ok(Found {
            tokenizer,
            template: source.map(|(source, origin)| TemplateSource {
                source,
                bos_token,
                eos_token,
                origin,
            }),
        })
    }

    /// A template file: Jinja text, or JSON holding a `chat_template`.
    fn template_file(path: &Path) -> Result<(String, String), TokensError> {
        let origin = path.display().to_string();
        if path.extension().is_some_and(|e| e == "json") {
            let value = read_json(path)?;
            let text = template_text(&value["chat_template"]).ok_or(TokensError::Unreadable {
                path: path.to_path_buf(),
                reason: "no chat_template in it".into(),
            })?;
            return Ok((text, origin));
        }
        let text = std::fs::read_to_string(path).map_err(|e| TokensError::Unreadable {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok((text, origin))
    }
}
