//! A request's prompt as the ids its engine will cache, so the route stage can look them up in
//! what each engine holds (precise prefix routing). The engine tokenizes the body the gateway
//! forwards; these ids are only of use if they are the same, so the rules are the engine's
//! (vLLM's `vllm/entrypoints/openai/protocol.py` @0052bed):
//! - a chat: the template rendered with the assistant's turn primed, then tokenized without the
//!   tokenizer's own special tokens, which the template writes (`ChatCompletionRequest`'s
//!   `add_special_tokens` defaults to false);
//! - a completion's text: tokenized with them (`CompletionRequest`'s defaults to true: a BOS,
//!   where the tokenizer adds one);
//! - a completion's ids: as given.
//!
//! A message's text parts are joined by newlines, as vLLM joins them
//! (`vllm/entrypoints/chat_utils.py` @bd5ec6d, `_parse_chat_message_content_parts`). A prompt of anything else
//! (images, several prompts in one completion) has no ids here: the request is routed by the
//! approximate index, as it would be without events.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{ChatMessage, Tokens};

/// The raw JSON of a request's prompt, as the front stage found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PromptJson<'a> {
    /// A chat's `messages`.
    Messages(&'a [u8]),
    /// A completion's `prompt`.
    Completion(&'a [u8]),
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Completion {
    Text(String),
    Ids(Vec<u32>),
}

impl Tokens {
    /// The ids the engine will make of this prompt; `None` when they cannot be known here.
    pub(crate) fn routing_ids(&self, prompt: PromptJson<'_>) -> Option<Vec<u32>> {
        match prompt {
            PromptJson::Messages(raw) => {
                let messages: Vec<Message<'_>> = serde_json::from_slice(raw).ok()?;
                let chat = messages
                    .into_iter()
                    .map(|m| {
                        Some(ChatMessage {
                            role: m.role.into_owned(),
                            content: text_of(m.content)?,
                        })
                    })
                    .collect::<Option<Vec<_>>>()?;
                self.chat_ids(&chat).ok()
            }
            PromptJson::Completion(raw) => match serde_json::from_slice(raw).ok()? {
                Completion::Text(text) => self.encode(&text, true).ok(),
                Completion::Ids(ids) => Some(ids),
            },
        }
    }
}

/// A message's content as the template sees it: its text, its text parts joined by newlines;
/// `None` for any other part.
fn text_of(content: Option<&RawValue>) -> Option<String> {
    let Some(raw) = content.filter(|raw| raw.get() != "null") else {
        return Some(String::new());
    };
    match serde_json::from_str(raw.get()).ok()? {
        Content::Text(text) => Some(text),
        Content::Parts(parts) => {
            let texts = parts
                .into_iter()
                .map(|p| (p.kind == "text").then_some(p.text).flatten())
                .collect::<Option<Vec<String>>>()?;
            Some(texts.join("\n"))
        }
    }
}
