//! Benchmark prompts, and the prefixes they share.
//!
//! A prompt is a list of parts (a system prompt, a document, the turns of a conversation, the
//! new question), each `tokens` tokens of text drawn from its own seed at 4 bytes a token. Equal
//! seeds give equal text, so two prompts that begin with the same parts begin with the same
//! bytes — and the same tokens on an engine that reads 4 bytes a token, as the simulated one
//! does — which is what a prefix cache or a cache-aware router can reuse.
//!
//! The mixes with shared prefixes (`Mix::Sessions`, `Mix::SystemPrompt`, `Mix::Rag`,
//! `Mix::Shared`) are drawn here; `sharing` states the share of prompt tokens one of them
//! repeats, the ceiling any cache could hit.

use std::collections::HashSet;

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::workload::{ShapeSource, Workload};

/// Named request mixes: their lengths, and what their prompts share (`prompts::sharing` gives
/// the figure).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    /// Prompts around 256 tokens, answers around 256; no two prompts share a prefix.
    Chat,
    /// Prompts around 4096 tokens, answers around 512; nothing shared.
    Summarize,
    /// Half chat, half summarize; nothing shared.
    Mixed,
    /// Multi-turn chat: 32 conversations open at once, each of 2 to 8 turns; every turn resends
    /// the conversation's system prompt (128-512 tokens) and history, then a new message
    /// (64-256), and names its conversation in `x-session-id`.
    Sessions,
    /// Questions (64-256 tokens) under one of 12 system prompts (1024-3072) that every tenant
    /// shares.
    SystemPrompt,
    /// RAG: short questions (32-128 tokens, answers around 128) about one of 32 documents
    /// (3072-6144 tokens), the popular ones asked about most (Zipf).
    Rag,
    /// 40% sessions, 30% system-prompt, 30% rag.
    Shared,
    /// Chat prompts (around 256 tokens) with short answers, 16 to 48 tokens: a healthy engine
    /// answers each well within a second, so a client's timeout trips only on a sick one.
    Short,
    /// Chat, with one request in twenty a long-context prompt of 32k-128k tokens (a codebase, a
    /// book) and an answer around 256; nothing shared.
    LongContext,
}

/// Bytes of prompt text per token, as the simulated engine counts them.
pub const BYTES_PER_TOKEN: usize = 4;
/// Tokens per KV block (vLLM's default), the unit a prefix cache reuses.
pub const BLOCK_TOKENS: usize = 16;

/// Whose words a part is: the message it becomes in a chat request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// A piece of a prompt: `tokens` tokens of text drawn from `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub role: Role,
    pub seed: u64,
    pub tokens: u32,
}

impl Part {
    /// Its text: three-letter words and a space, one per token.
    pub fn text(&self) -> String {
        let mut text = String::with_capacity(self.tokens as usize * BYTES_PER_TOKEN);
        for i in 0..u64::from(self.tokens) {
            let word = splitmix(self.seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            for shift in [0, 8, 16] {
                text.push(char::from(b'a' + ((word >> shift) & 0xff) as u8 % 26));
            }
            text.push(' ');
        }
        text
    }
}

/// One request's prompt, and the conversation it belongs to (a single-turn request is its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub parts: Vec<Part>,
    pub conversation: u64,
}

impl Prompt {
    pub fn tokens(&self) -> u32 {
        self.parts.iter().map(|p| p.tokens).sum()
    }

    /// The parts' text, one after the other (a completion's prompt).
    pub fn text(&self) -> String {
        self.parts.iter().map(Part::text).collect()
    }

    /// A chat request's messages, one per part.
    pub fn messages(&self) -> serde_json::Value {
        self.parts
            .iter()
            .map(|p| serde_json::json!({"role": p.role.name(), "content": p.text()}))
            .collect()
    }
}

/// A prompt and the length of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drawn {
    pub prompt: Prompt,
    pub output_tokens: u32,
}

/// Conversations open at once in the sessions mix: each request continues one of them.
const OPEN_SESSIONS: usize = 32;
/// Turns of one conversation, uniform in this range; then a new one takes its place.
const SESSION_TURNS: (u32, u32) = (2, 8);
/// System prompts shared by every tenant in the system-prompt mix.
const SYSTEM_PROMPTS: usize = 12;
/// Documents the RAG mix's questions are about, by Zipf popularity (exponent 1).
const DOCUMENTS: usize = 32;

/// A conversation in progress: its system prompt, then every turn so far.
struct Session {
    id: u64,
    history: Vec<Part>,
    turns_left: u32,
}

/// Draws a mix's prompts, reproducibly from a seed.
pub struct PromptSource {
    mix: Mix,
    rng: rand::rngs::StdRng,
    next_seed: u64,
    short: ShapeSource,
    long: ShapeSource,
    turns: ShapeSource,
    questions: ShapeSource,
    sessions: Vec<Session>,
    system_prompts: Vec<Part>,
    documents: Vec<Part>,
    popularity: Zipf<f64>,
}

pub(crate) fn chat() -> Workload {
    Workload {
        prompt_min: 128,
        prompt_max: 384,
        output_median: 256.0,
        output_sigma: 0.5,
        output_max: 512,
    }
}

fn summarize() -> Workload {
    Workload {
        prompt_min: 3072,
        prompt_max: 5120,
        output_median: 512.0,
        output_sigma: 0.5,
        output_max: 1024,
    }
}

/// The long-context mix's share of long prompts, and their lengths: up to Llama 3's 131,072
/// tokens of context less the longest chat answer and the template.
const LONG_CONTEXT_SHARE: f64 = 0.05;
const LONG_CONTEXT_TOKENS: std::ops::RangeInclusive<u32> = 32_768..=130_000;

/// A question about a document: short, and so is its answer.
fn question() -> Workload {
    Workload {
        prompt_min: 32,
        prompt_max: 128,
        output_median: 128.0,
        output_sigma: 0.5,
        output_max: 512,
    }
}

/// A user's turn, or a question under a system prompt.
fn turn() -> Workload {
    Workload {
        prompt_min: 64,
        prompt_max: 256,
        ..chat()
    }
}

impl PromptSource {
    pub fn new(mix: Mix, seed: u64) -> Self {
        let mut source = Self {
            mix,
            rng: rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e0_4a11),
            next_seed: splitmix(seed),
            short: ShapeSource::new(chat(), seed.wrapping_add(1)),
            long: ShapeSource::new(summarize(), seed.wrapping_add(2)),
            turns: ShapeSource::new(turn(), seed.wrapping_add(3)),
            questions: ShapeSource::new(question(), seed.wrapping_add(4)),
            sessions: Vec::new(),
            system_prompts: Vec::new(),
            documents: Vec::new(),
            popularity: Zipf::new(DOCUMENTS as f64, 1.0).expect("a valid Zipf"),
        };
        source.system_prompts = (0..SYSTEM_PROMPTS)
            .map(|_| source.part(Role::System, 1024..=3072))
            .collect();
        source.documents = (0..DOCUMENTS)
            .map(|_| source.part(Role::User, 3072..=6144))
            .collect();
        source.sessions = (0..OPEN_SESSIONS).map(|_| source.session()).collect();
        source
    }

    pub fn next_prompt(&mut self) -> Drawn {
        match self.mix {
            Mix::Chat => self.distinct(false),
            Mix::Short => {
                let mut drawn = self.distinct(false);
                drawn.output_tokens = 16 + drawn.output_tokens % 33;
                drawn
            }
            Mix::Summarize => self.distinct(true),
            Mix::Mixed => {
                let long = self.rng.random_bool(0.5);
                self.distinct(long)
            }
            Mix::Sessions => self.next_turn(),
            Mix::SystemPrompt => self.under_system_prompt(),
            Mix::Rag => self.about_document(),
            Mix::LongContext => {
                if self.rng.random_bool(LONG_CONTEXT_SHARE) {
                    let output = self.short.next_shape().output_tokens;
                    let part = self.part(Role::User, LONG_CONTEXT_TOKENS);
                    self.single(vec![part], output)
                } else {
                    self.distinct(false)
                }
            }
            Mix::Shared => match self.rng.random_range(0..10) {
                0..4 => self.next_turn(),
                4..7 => self.under_system_prompt(),
                _ => self.about_document(),
            },
        }
    }

    fn fresh_seed(&mut self) -> u64 {
        self.next_seed = splitmix(self.next_seed);
        self.next_seed
    }

    fn part(&mut self, role: Role, tokens: std::ops::RangeInclusive<u32>) -> Part {
        let tokens = self.rng.random_range(tokens);
        Part {
            role,
            seed: self.fresh_seed(),
            tokens,
        }
    }

    fn single(&mut self, parts: Vec<Part>, output_tokens: u32) -> Drawn {
        let conversation = self.fresh_seed();
        Drawn {
            prompt: Prompt {
                parts,
                conversation,
            },
            output_tokens,
        }
    }

    /// A prompt shared with nothing (the chat, summarize and mixed mixes).
    fn distinct(&mut self, long: bool) -> Drawn {
        let shape = if long {
            self.long.next_shape()
        } else {
            self.short.next_shape()
        };
        let own = Part {
            role: Role::User,
            seed: self.fresh_seed(),
            tokens: shape.prompt_tokens,
        };
        self.single(vec![own], shape.output_tokens)
    }

    fn session(&mut self) -> Session {
        let system = self.part(Role::System, 128..=512);
        Session {
            id: self.fresh_seed(),
            history: vec![system],
            turns_left: self.rng.random_range(SESSION_TURNS.0..=SESSION_TURNS.1),
        }
    }

    /// The next turn of an open conversation: its whole history, then the new message; the
    /// answer joins the history for the turn after.
    fn next_turn(&mut self) -> Drawn {
        let at = self.rng.random_range(0..self.sessions.len());
        let shape = self.turns.next_shape();
        let user = Part {
            role: Role::User,
            seed: self.fresh_seed(),
            tokens: shape.prompt_tokens,
        };
        let answer = Part {
            role: Role::Assistant,
            seed: self.fresh_seed(),
            tokens: shape.output_tokens,
        };
        let session = &mut self.sessions[at];
        session.history.push(user);
        let prompt = Prompt {
            parts: session.history.clone(),
            conversation: session.id,
        };
        session.history.push(answer);
        session.turns_left -= 1;
        if session.turns_left == 0 {
            self.sessions[at] = self.session();
        }
        Drawn {
            prompt,
            output_tokens: shape.output_tokens,
        }
    }

    /// A question under one of the system prompts every tenant shares.
    fn under_system_prompt(&mut self) -> Drawn {
        let system = self.system_prompts[self.rng.random_range(0..SYSTEM_PROMPTS)];
        let shape = self.turns.next_shape();
        let own = Part {
            role: Role::User,
            seed: self.fresh_seed(),
            tokens: shape.prompt_tokens,
        };
        self.single(vec![system, own], shape.output_tokens)
    }

    /// A question about a document, the popular ones asked about most.
    fn about_document(&mut self) -> Drawn {
        let rank = self.popularity.sample(&mut self.rng) as usize;
        let document = self.documents[rank.clamp(1, DOCUMENTS) - 1];
        let shape = self.questions.next_shape();
        let own = Part {
            role: Role::User,
            seed: self.fresh_seed(),
            tokens: shape.prompt_tokens,
        };
        self.single(vec![document, own], shape.output_tokens)
    }
}

/// The share of prompt tokens, over `prompts` in order, that lie in full blocks an earlier
/// prompt already began with: what a cache without limit, in front of one engine, would hit.
pub fn sharing<'a>(prompts: impl IntoIterator<Item = &'a Prompt>) -> f64 {
    let block_bytes = BLOCK_TOKENS * BYTES_PER_TOKEN;
    let mut seen: HashSet<u64> = HashSet::new();
    let (mut total, mut repeated) = (0u64, 0u64);
    for prompt in prompts {
        let text = prompt.text();
        total += u64::from(prompt.tokens());
        let mut chain = 0u64;
        for block in text.as_bytes().chunks_exact(block_bytes) {
            chain = sluice_core::hash::chain_hash(chain, block);
            if !seen.insert(chain) {
                repeated += BLOCK_TOKENS as u64;
            }
        }
    }
    if total == 0 {
        0.0
    } else {
        repeated as f64 / total as f64
    }
}

/// The splitmix64 step: a well-spread 64-bit value from any input.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(mix: Mix, n: usize, seed: u64) -> Vec<Drawn> {
        let mut source = PromptSource::new(mix, seed);
        (0..n).map(|_| source.next_prompt()).collect()
    }

    #[test]
    fn a_part_is_its_tokens_times_four_bytes_and_the_same_seed_the_same_text() {
        let part = Part {
            role: Role::User,
            seed: 7,
            tokens: 100,
        };
        assert_eq!(part.text().len(), 400);
        assert_eq!(
            part.text(),
            Part {
                tokens: 100,
                ..part
            }
            .text()
        );
        assert_ne!(part.text(), Part { seed: 8, ..part }.text());
        assert!(part.text().is_ascii());
    }

    #[test]
    fn mixes_are_reproducible_from_their_seed() {
        for mix in [Mix::Chat, Mix::Sessions, Mix::Shared] {
            assert_eq!(draw(mix, 200, 3), draw(mix, 200, 3));
            assert_ne!(draw(mix, 200, 3), draw(mix, 200, 4));
        }
    }

    #[test]
    fn distinct_prompts_share_nothing() {
        for mix in [Mix::Chat, Mix::Summarize, Mix::Mixed] {
            let drawn = draw(mix, 300, 1);
            assert_eq!(sharing(drawn.iter().map(|d| &d.prompt)), 0.0, "{mix:?}");
        }
    }

    #[test]
    fn a_session_resends_its_history_and_keeps_its_id() {
        let drawn = draw(Mix::Sessions, 2000, 2);
        let mut by_session: std::collections::HashMap<u64, Vec<&Prompt>> = Default::default();
        for d in &drawn {
            by_session
                .entry(d.prompt.conversation)
                .or_default()
                .push(&d.prompt);
        }
        let mut multi_turn = 0;
        for turns in by_session.values() {
            for pair in turns.windows(2) {
                let (before, after) = (&pair[0].parts, &pair[1].parts);
                assert_eq!(
                    after.len(),
                    before.len() + 2,
                    "its answer, then a new message"
                );
                assert_eq!(after[..before.len()], before[..]);
                assert_eq!(after[before.len()].role, Role::Assistant);
                multi_turn += 1;
            }
            assert!(turns.len() <= SESSION_TURNS.1 as usize);
        }
        assert!(multi_turn > 1000, "{multi_turn}");
    }

    #[test]
    fn each_shared_mix_repeats_most_of_its_prompt_tokens() {
        for (mix, at_least) in [
            (Mix::Sessions, 0.6),
            (Mix::SystemPrompt, 0.8),
            (Mix::Rag, 0.9),
            (Mix::Shared, 0.7),
        ] {
            let drawn = draw(mix, 2000, 5);
            let share = sharing(drawn.iter().map(|d| &d.prompt));
            assert!(share >= at_least && share < 1.0, "{mix:?}: {share}");
        }
    }

    #[test]
    fn popular_documents_are_asked_about_most() {
        let drawn = draw(Mix::Rag, 3000, 9);
        let mut counts: std::collections::HashMap<u64, usize> = Default::default();
        for d in &drawn {
            *counts.entry(d.prompt.parts[0].seed).or_default() += 1;
        }
        let mut counts: Vec<usize> = counts.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        assert!(counts.len() > DOCUMENTS / 2, "{counts:?}");
        assert!(counts[0] > 5 * counts[counts.len() / 2], "{counts:?}");
    }
}
