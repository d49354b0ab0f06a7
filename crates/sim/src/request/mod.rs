//! OpenAI request bodies as the engine reads them: how many prompt tokens, how many choices,
//! how long each answer will be, and how it is streamed.
//!
//! Prompt tokens are taken from token-id arrays and made from text by a fixed rule: one token per
//! 4 bytes (the bytes themselves are its id), plus a few tokens of chat template around each
//! message. The ids matter only for prefix caching: two prompts that share a system prompt or a
//! conversation's history share their leading tokens, as a real tokenizer would make them share
//! (a message is tokenized on its own, so what follows it cannot change its tokens). An answer's natural length is
//! drawn from a log-normal around the profile's median, seeded by the engine seed and the request
//! itself, so the same request to the same engine always gets the same answer.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::Deserialize;

use crate::engine::SeqSpec;
use crate::model_tokens::ModelTokenizer;
use crate::scheduler::FinishReason;

/// Bytes of text per prompt token.
pub const BYTES_PER_TOKEN: usize = 4;
/// Template tokens around each chat message (two before, two after), and to prime the
/// assistant's turn; ids above any 4-byte text token's that real text would make.
const MESSAGE_OPEN: [u32; 2] = [0xFFFF_FF00, 0xFFFF_FF01];
const MESSAGE_CLOSE: [u32; 2] = [0xFFFF_FF02, 0xFFFF_FF03];
const PRIME_REPLY: [u32; 3] = [0xFFFF_FF00, 0xFFFF_FF04, 0xFFFF_FF01];
/// Spread of the natural answer length (sigma of its logarithm).
const OUTPUT_LEN_SIGMA: f64 = 0.9;

/// Which OpenAI route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completions,
}

/// What is wrong with a request body.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("{0}")]
    Malformed(String),
    #[error("{field} must be {rule}")]
    Invalid {
        field: &'static str,
        rule: &'static str,
    },
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// The fields both routes share; everything else in the body is accepted and ignored.
#[derive(Deserialize)]
struct Body {
    model: String,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<PromptInput>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    min_tokens: Option<u32>,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(flatten)]
    thinking: crate::reasoning::ThinkingFields,
    #[serde(default)]
    bootstrap_host: Option<String>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    bootstrap_room: Option<u64>,
    #[serde(default)]
    kv_transfer_params: Option<KvTransferParams>,
    #[serde(default)]
    lora_path: Option<String>,
}

/// vLLM's `kv_transfer_params` as its disaggregated proxy sends them: to the prefill engine
/// `do_remote_decode`, to the decode engine `do_remote_prefill` with where the KV waits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct KvTransferParams {
    #[serde(default)]
    pub do_remote_decode: bool,
    #[serde(default)]
    pub do_remote_prefill: bool,
    #[serde(default)]
    pub remote_host: Option<String>,
    #[serde(default)]
    pub remote_port: Option<u16>,
    #[serde(default)]
    pub remote_request_id: Option<String>,
}

/// One prompt of a request: its size, its token ids and a fingerprint of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub tokens: u32,
    pub fingerprint: u64,
    pub ids: Arc<[u32]>,
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub route: Route,
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
    /// One entry per prompt (chat has one; completions may batch several).
    pub prompts: Vec<Prompt>,
    /// Choices per prompt.
    pub n: u32,
    pub max_tokens: Option<u32>,
    pub min_tokens: u32,
    /// Generate exactly `max_tokens`, as vLLM's `ignore_eos` does (benchmarks use it).
    pub ignore_eos: bool,
    /// The request's own `seed`, mixed into the answer length.
    pub seed: Option<u64>,
    /// What it asks of a reasoning model's thinking.
    pub thinking: crate::reasoning::ThinkingAsk,
    /// SGLang's disaggregation fields, which a gateway adds: the prefill engine's bootstrap
    /// server (`bootstrap_port` is null when it has none) and the room both halves share.
    pub bootstrap_host: Option<String>,
    pub bootstrap_port: Option<u16>,
    pub bootstrap_room: Option<u64>,
    /// vLLM's disaggregation fields.
    pub kv_transfer_params: Option<KvTransferParams>,
    /// SGLang's `lora_path`: the adapter's name, when `model` does not name one.
    pub lora_path: Option<String>,
    /// The adapter the request runs under, once the engine has resolved its name.
    pub adapter: Option<crate::scheduler::Adapter>,
}

/// FNV-1a: a stable fingerprint, so answer lengths do not change between builds.
fn fingerprint(bytes: &[u8], state: u64) -> u64 {
    bytes.iter().fold(state, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Text's tokens: each 4 bytes (the last padded with zeros) is one token, its id those bytes.
fn text_ids(bytes: &[u8], ids: &mut Vec<u32>) {
    ids.extend(bytes.chunks(BYTES_PER_TOKEN).map(|chunk| {
        let mut id = [0u8; BYTES_PER_TOKEN];
        id[..chunk.len()].copy_from_slice(chunk);
        u32::from_le_bytes(id)
    }));
}

fn count(ids: &[u32]) -> u32 {
    u32::try_from(ids.len()).unwrap_or(u32::MAX)
}

fn chat_prompt(
    messages: &[Message],
    tokenizer: Option<&ModelTokenizer>,
) -> Result<Prompt, RequestError> {
    if messages.is_empty() {
        return Err(RequestError::Invalid {
            field: "messages",
            rule: "a non-empty list",
        });
    }
    if let Some(tokenizer) = tokenizer {
        return Ok(token_prompt(&tokenizer.chat_ids(messages.iter().map(
            |m| {
                let text = match &m.content {
                    None => String::new(),
                    Some(Content::Text(text)) => text.clone(),
                    Some(Content::Parts(parts)) => parts
                        .iter()
                        .filter_map(|p| p.text.as_deref())
                        .collect::<Vec<_>>()
                        .join("\n"),
                };
                (m.role.as_str(), text)
            },
        ))));
    }
    let mut ids = Vec::new();
    let mut hash = FNV_OFFSET;
    let mut text = Vec::new();
    for message in messages {
        text.clear();
        text.extend_from_slice(message.role.as_bytes());
        hash = fingerprint(message.role.as_bytes(), hash);
        let parts: Vec<&str> = match &message.content {
            None => vec![],
            Some(Content::Text(text)) => vec![text.as_str()],
            Some(Content::Parts(parts)) => parts.iter().filter_map(|p| p.text.as_deref()).collect(),
        };
        for part in parts {
            text.extend_from_slice(part.as_bytes());
            hash = fingerprint(part.as_bytes(), hash);
        }
        ids.extend_from_slice(&MESSAGE_OPEN);
        text_ids(&text, &mut ids);
        ids.extend_from_slice(&MESSAGE_CLOSE);
    }
    ids.extend_from_slice(&PRIME_REPLY);
    Ok(Prompt {
        tokens: count(&ids),
        fingerprint: hash,
        ids: ids.into(),
    })
}

fn token_prompt(ids: &[u32]) -> Prompt {
    let hash = ids
        .iter()
        .fold(FNV_OFFSET, |h, id| fingerprint(&id.to_le_bytes(), h));
    Prompt {
        tokens: count(ids),
        fingerprint: hash,
        ids: ids.into(),
    }
}

fn text_prompt(text: &str, tokenizer: Option<&ModelTokenizer>) -> Prompt {
    if let Some(tokenizer) = tokenizer {
        return token_prompt(&tokenizer.text_ids(text));
    }
    let mut ids = Vec::with_capacity(text.len().div_ceil(BYTES_PER_TOKEN));
    text_ids(text.as_bytes(), &mut ids);
    Prompt {
        tokens: count(&ids),
        fingerprint: fingerprint(text.as_bytes(), FNV_OFFSET),
        ids: ids.into(),
    }
}

fn completion_prompts(
    input: PromptInput,
    tokenizer: Option<&ModelTokenizer>,
) -> Result<Vec<Prompt>, RequestError> {
    let prompts = match input {
        PromptInput::Text(text) => vec![text_prompt(&text, tokenizer)],
        PromptInput::Texts(texts) => texts.iter().map(|t| text_prompt(t, tokenizer)).collect(),
        PromptInput::Tokens(ids) => vec![token_prompt(&ids)],
        PromptInput::TokenLists(lists) => lists.iter().map(|ids| token_prompt(ids)).collect(),
    };
    if prompts.is_empty() || prompts.iter().any(|p| p.tokens == 0) {
        return Err(RequestError::Invalid {
            field: "prompt",
            rule: "non-empty",
        });
    }
    Ok(prompts)
}

impl GenerationRequest {
    /// Parses a request body for `route`, its prompt counted 4 bytes a token.
    pub fn parse(route: Route, body: &[u8]) -> Result<Self, RequestError> {
        Self::parse_with(route, body, None)
    }

    /// Parses a request body for `route`, its prompt in the model's tokens when a tokenizer
    /// is given (`--model-tokenizer`).
    pub fn parse_with(
        route: Route,
        body: &[u8],
        tokenizer: Option<&ModelTokenizer>,
    ) -> Result<Self, RequestError> {
        let body: Body =
            serde_json::from_slice(body).map_err(|e| RequestError::Malformed(e.to_string()))?;
        let prompts = match route {
            Route::Chat => {
                let messages = body.messages.ok_or(RequestError::Invalid {
                    field: "messages",
                    rule: "present",
                })?;
                vec![chat_prompt(&messages, tokenizer)?]
            }
            Route::Completions => {
                let prompt = body.prompt.ok_or(RequestError::Invalid {
                    field: "prompt",
                    rule: "present",
                })?;
                completion_prompts(prompt, tokenizer)?
            }
        };
        let n = body.n.unwrap_or(1);
        if n == 0 {
            return Err(RequestError::Invalid {
                field: "n",
                rule: "at least 1",
            });
        }
        let max_tokens = body.max_completion_tokens.or(body.max_tokens);
        if max_tokens == Some(0) {
            return Err(RequestError::Invalid {
                field: "max_tokens",
                rule: "at least 1",
            });
        }
        Ok(Self {
            route,
            model: body.model,
            stream: body.stream,
            include_usage: body.stream_options.is_some_and(|o| o.include_usage),
            prompts,
            n,
            max_tokens,
            min_tokens: body.min_tokens.unwrap_or(0),
            ignore_eos: body.ignore_eos,
            seed: body.seed,
            thinking: body.thinking.ask(),
            bootstrap_host: body.bootstrap_host,
            bootstrap_port: body.bootstrap_port,
            bootstrap_room: body.bootstrap_room,
            kv_transfer_params: body.kv_transfer_params,
            lora_path: body.lora_path,
            adapter: None,
        })
    }

    /// A request that arrives as token ids with its sampling settings already read (a gRPC
    /// worker's `Generate`): one prompt, no reasoning asks, no disaggregation.
    pub fn from_token_ids(
        model: &str,
        ids: &[u32],
        n: u32,
        max_tokens: Option<u32>,
        min_tokens: u32,
        ignore_eos: bool,
        stream: bool,
    ) -> Result<Self, RequestError> {
        if ids.is_empty() {
            return Err(RequestError::Invalid {
                field: "input_ids",
                rule: "non-empty",
            });
        }
        Ok(Self {
            route: Route::Completions,
            model: model.to_string(),
            stream,
            include_usage: false,
            prompts: vec![token_prompt(ids)],
            n: n.max(1),
            max_tokens,
            min_tokens,
            ignore_eos,
            seed: None,
            thinking: crate::reasoning::ThinkingAsk::default(),
            bootstrap_host: None,
            bootstrap_port: None,
            bootstrap_room: None,
            kv_transfer_params: None,
            lora_path: None,
            adapter: None,
        })
    }

    /// Prompt tokens over every choice, as `usage` counts them.
    pub fn prompt_tokens(&self) -> u64 {
        self.prompts
            .iter()
            .map(|p| u64::from(p.tokens) * u64::from(self.n))
            .sum()
    }

    /// The longest prompt plus the requested output, for the context-length check.
    pub fn longest_prompt(&self) -> u32 {
        self.prompts.iter().map(|p| p.tokens).max().unwrap_or(0)
    }

    /// Every choice to generate, prompt by prompt, with its answer length decided.
    pub fn choices(&self, engine_seed: u64, median: f64, max_model_len: u32) -> Vec<SeqSpec> {
        self.choices_thinking(engine_seed, median, None, max_model_len)
            .0
    }

    /// How many choices the request asks for: `n` for each prompt.
    pub fn choice_count(&self) -> usize {
        self.prompts.len() * self.n as usize
    }

    /// Every choice to generate, and how many of each one's first tokens are thinking, for a
    /// model that thinks `reasoning` tokens (median) before it answers. Thinking comes out of the
    /// same `max_tokens`.
    pub fn choices_thinking(
        &self,
        engine_seed: u64,
        median: f64,
        reasoning: Option<u32>,
        max_model_len: u32,
    ) -> (Vec<SeqSpec>, Vec<u32>) {
        let capacity = self.choice_count();
        let (mut out, mut thinking) = (Vec::with_capacity(capacity), Vec::with_capacity(capacity));
        let thinks = self.route == Route::Chat && self.thinking.enabled;
        for prompt in &self.prompts {
            let room = max_model_len.saturating_sub(prompt.tokens).max(1);
            let limit = self.max_tokens.unwrap_or(room).min(room);
            for choice in 0..self.n {
                let thought = match reasoning.filter(|_| thinks) {
                    Some(median) => {
                        let drawn = natural_length(
                            engine_seed ^ THINKING_SALT,
                            self.seed,
                            prompt.fingerprint,
                            choice,
                            f64::from(median) * self.thinking.scale,
                        );
                        self.thinking.budget.map_or(drawn, |b| drawn.min(b))
                    }
                    None => 0,
                };
                let natural = if self.ignore_eos {
                    u32::MAX
                } else {
                    natural_length(engine_seed, self.seed, prompt.fingerprint, choice, median)
                        .max(self.min_tokens)
                        .saturating_add(thought)
                };
                let (output_tokens, finish) = if natural <= limit {
                    (natural, FinishReason::Stop)
                } else {
                    (limit, FinishReason::Length)
                };
                let output_tokens = output_tokens.max(1);
                thinking.push(thought.min(output_tokens));
                out.push(SeqSpec {
                    prompt: prompt.ids.clone(),
                    prompt_tokens: prompt.tokens,
                    output_tokens,
                    finish,
                    preloaded: 0,
                    adapter: self.adapter.clone(),
                });
            }
        }
        (out, thinking)
    }
}

/// Mixed into the seed of a thinking length, so it is drawn apart from the answer's.
const THINKING_SALT: u64 = 0x7468_696e_6b69_6e67;

/// The length the model would answer with if nothing stopped it.
fn natural_length(
    engine_seed: u64,
    request_seed: Option<u64>,
    prompt: u64,
    choice: u32,
    median: f64,
) -> u32 {
    let seed = fingerprint(
        &[
            engine_seed.to_le_bytes(),
            request_seed.unwrap_or(0).to_le_bytes(),
            prompt.to_le_bytes(),
            u64::from(choice).to_le_bytes(),
        ]
        .concat(),
        FNV_OFFSET,
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    match LogNormal::new(median.max(1.0).ln(), OUTPUT_LEN_SIGMA) {
        Ok(dist) => (dist.sample(&mut rng).round() as u32).max(1),
        Err(_) => rng.random_range(1..=median.max(1.0) as u32),
    }
}

#[cfg(test)]
mod tests;
