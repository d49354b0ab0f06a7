//! Tokens in the gateway, for workers that take token ids (`grpc://`): the model's tokenizer
//! and chat template, loaded once at startup from the model's own files, and a per-request
//! decoder that turns streamed ids back into text.
//!
//! Tokenizing a prompt is CPU work that grows with the prompt (a long one takes milliseconds), so
//! callers run `Tokens::chat_ids` and `Tokens::prompt_ids` off the runtime's threads.
//!
//! ## Layout
//! - `files` — where a model's tokenizer and chat template are, from SMG's `--model-path`,
//!   `--tokenizer-path` and `--chat-template`; the typed error a missing or broken file is.
//! - `template` — the chat template, rendered by minijinja with the Python string methods
//!   Hugging Face templates call.
//! - `decode` — incremental, UTF-8-safe detokenization with stop sequences.
//! - `routed` — a request's prompt as the engine's ids, for precise prefix routing.

mod decode;
mod files;
mod routed;
mod template;

use std::sync::Arc;

pub use decode::{Decoded, Detokenizer};
pub use files::{ModelFiles, TokensError};
pub(crate) use routed::PromptJson;
pub use template::{ChatMessage, ChatTemplate};

/// The model's tokens where several parts read them (the gRPC client, the route stage): set at
/// startup from the model's files, or later from the first worker that serves them.
#[derive(Debug, Clone, Default)]
pub struct SharedTokens(Arc<arc_swap::ArcSwapOption<Tokens>>);

impl SharedTokens {
    pub fn new(tokens: Option<Arc<Tokens>>) -> Self {
        Self(Arc::new(arc_swap::ArcSwapOption::new(tokens)))
    }

    pub(crate) fn get(&self) -> Option<Arc<Tokens>> {
        self.0.load_full()
    }

    pub fn is_set(&self) -> bool {
        self.0.load().is_some()
    }

    pub(crate) fn set(&self, tokens: Arc<Tokens>) {
        self.0.store(Some(tokens));
    }
}

/// A model's tokenizer and chat template.
pub struct Tokens {
    tokenizer: Arc<tokenizers::Tokenizer>,
    template: Option<ChatTemplate>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("vocab_size", &self.vocab_size())
            .field("chat_template", &self.template.is_some())
            .finish()
    }
}

impl Tokens {
    /// Loads what `files` names; every failure names the file and what is wrong with it.
    pub fn load(files: &ModelFiles) -> Result<Self, TokensError> {
        let found = files.locate()?;
        let tokenizer = tokenizers::Tokenizer::from_file(&found.tokenizer).map_err(|e| {
            TokensError::Tokenizer {
                path: found.tokenizer.clone(),
                reason: e.to_string(),
            }
        })?;
        let template = found
            .template
            .map(|t| ChatTemplate::new(&t.source, t.bos_token, t.eos_token, &t.origin))
            .transpose()?;
        Ok(Self {
            tokenizer: Arc::new(tokenizer),
            template,
        })
    }

    /// A chat's prompt as ids: the template applied with the assistant's turn primed, then
    /// tokenized with the special tokens the template wrote.
    pub fn chat_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, TokensError> {
        let template = self.template.as_ref().ok_or(TokensError::NoTemplate)?;
        let text = template.render(messages)?;
        self.prompt_ids(&text)
    }

    /// A text prompt as ids, as the engine's own tokenizer would make them.
    pub fn prompt_ids(&self, text: &str) -> Result<Vec<u32>, TokensError> {
        self.encode(text, false)
    }

    /// `text` as ids, with the tokenizer's own special tokens (a BOS) when `special`.
    fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, TokensError> {
        let encoding = self
            .tokenizer
            .encode(text, special)
            .map_err(|e| TokensError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// A decoder for one answer.
    pub fn detokenizer(&self, stop: Vec<String>) -> Detokenizer {
        Detokenizer::new(self.tokenizer.clone(), stop)
    }

    /// Every id the tokenizer knows, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}

#[cfg(test)]
mod tests;
