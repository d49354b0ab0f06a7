//! The model's files for `grpc://` workers (`--model-path`, `--tokenizer-path`,
//! `--chat-template`): loaded while the configuration is validated, so a file that is missing or
//! broken stops startup naming the flag.

use std::sync::Arc;

use super::checks::invalid;
use super::{ConfigError, Settings};
use crate::tokens::{ModelFiles, Tokens};

impl Settings {
    /// The model's tokenizer and chat template, when its files are named: loaded now, so a
    /// file that is missing or broken stops startup with what is wrong.
    pub(super) fn tokens(&self) -> Result<Option<Arc<Tokens>>, ConfigError> {
        let files = ModelFiles {
            model_path: self.model_path.clone(),
            tokenizer_path: self.tokenizer_path.clone(),
            chat_template: self.chat_template.clone(),
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
