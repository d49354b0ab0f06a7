//! The model's files for `grpc://` workers (`--model-path`, `--tokenizer-path`,
//! `--chat-template`): loaded while the configuration is validated, so a file that is missing or
//! broken stops startup naming the flag.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::checks::invalid;
use super::{ConfigError, Settings};
use crate::tokens::{ModelFiles, Tokens};

/// The model's files, for `grpc://` workers.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize, PartialEq)]
pub(crate) struct TokenizerSettings {
    /// The model's directory (Hugging Face's layout: tokenizer.json, tokenizer_config.json with
    /// its chat template), for grpc:// workers, which take token ids: the gateway tokenizes
    /// prompts, applies the chat template and detokenizes answers. Read from disk at startup; a
    /// Hugging Face model id is not downloaded. HTTP workers need it only for precise prefix
    /// routing (--kv-events-port): prompts are matched in the engine's tokens.
    #[arg(long, alias = "model", value_name = "DIR")]
    #[serde(default)]
    #[arg(help_heading = "Tokenizer")]
    pub(crate) model_path: Option<PathBuf>,

    /// The tokenizer (a tokenizer.json, or the directory holding it), overriding --model-path's.
    #[arg(long, value_name = "PATH")]
    #[serde(default)]
    #[arg(help_heading = "Tokenizer")]
    pub(crate) tokenizer_path: Option<PathBuf>,

    /// The chat template (a Jinja file, or JSON with a chat_template key), overriding the model
    /// directory's (chat_template.jinja, or tokenizer_config.json's chat_template).
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    #[arg(help_heading = "Tokenizer")]
    pub(crate) chat_template: Option<PathBuf>,
}

impl Settings {
    /// The model's tokenizer and chat template, when its files are named: loaded now, so a
    /// file that is missing or broken stops startup with what is wrong.
    pub(super) fn tokens(&self) -> Result<Option<Arc<Tokens>>, ConfigError> {
        let files = ModelFiles {
            model_path: self.tokenizer.model_path.clone(),
            tokenizer_path: self.tokenizer.tokenizer_path.clone(),
            chat_template: self.tokenizer.chat_template.clone(),
        };
        if files.is_empty() {
            return Ok(None);
        }
        let flag = if files.tokenizer_path.is_some() {
            "tokenizer-path"
        } else if files.model_path.is_some() {
            "model-path"
        } else {
            "chat-template"
        };
        Tokens::load(&files)
            .map(|tokens| Some(Arc::new(tokens)))
            .map_err(|e| invalid(flag, e.to_string()))
    }
}
