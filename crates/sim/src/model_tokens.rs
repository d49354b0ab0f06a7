//! Prompts in the simulated model's own tokens (`--model-tokenizer`), as a real engine counts
//! and caches them with its model's tokenizer: the files `vocab::write_model_dir` writes, so a
//! gateway given those files (`--model-path`) makes the same ids of a prompt as the engine, which
//! precise prefix routing needs. Without it the engine counts 4 bytes of text a token.
//!
//! The rules are vLLM's (`vllm/entrypoints/openai/protocol.py` @0052bed): a chat is the template
//! rendered with the assistant's turn primed, tokenized without the tokenizer's own special
//! tokens (the template writes them); a completion's text is tokenized with them (this
//! tokenizer adds none); a message's text parts are joined by newlines
//! (`vllm/entrypoints/chat_utils.py` @bd5ec6d).

use crate::vocab::{Vocab, BEGIN_OF_TEXT, END_HEADER, END_OF_TURN, START_HEADER};

/// The simulated model's tokenizer.
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer").finish_non_exhaustive()
    }
}

/// The tokenizer could not be built from the vocabulary's own `tokenizer.json`.
#[derive(Debug, thiserror::Error)]
#[error("the simulated model's tokenizer: {0}")]
pub struct TokenizerError(String);

impl ModelTokenizer {
    pub fn new() -> Result<Self, TokenizerError> {
        let json = Vocab::new().tokenizer_json().to_string();
        let tokenizer: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e: tokenizers::Error| TokenizerError(e.to_string()))?;
        Ok(Self { tokenizer })
    }

    /// A chat as `vocab::CHAT_TEMPLATE` renders it, with the reply primed, in ids.
    pub fn chat_ids<'a>(&self, messages: impl Iterator<Item = (&'a str, String)>) -> Vec<u32> {
        let mut text = String::from(BEGIN_OF_TEXT);
        for (role, content) in messages {
            text.push_str(&format!(
                "{START_HEADER}{role}{END_HEADER}\n\n{}{END_OF_TURN}",
                content.trim()
            ));
        }
        text.push_str(&format!("{START_HEADER}assistant{END_HEADER}\n\n"));
        self.encode(&text, false)
    }

    /// A completion's text in ids.
    pub fn text_ids(&self, text: &str) -> Vec<u32> {
        self.encode(text, true)
    }

    fn encode(&self, text: &str, special: bool) -> Vec<u32> {
        // Byte-level BPE tokenizes any text; an error would be the tokenizer's own bug.
        self.tokenizer
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_and_a_text_tokenize_in_the_models_words() {
        let tokenizer = ModelTokenizer::new().unwrap();
        let ids = tokenizer.text_ids(" abc abd");
        assert_eq!(ids.len(), 2, "each prompt word is one token");
        let chat = tokenizer.chat_ids([("user", " abc abd ".to_string())].into_iter());
        let vocab = Vocab::new();
        assert_eq!(chat[0], vocab.bos());
        assert!(
            chat.len() > ids.len() + 4,
            "the template's tokens around it"
        );
    }
}
