//! What the chooser reads of a request: taken once from the request as the front stage parsed it
//! and the tier admission gave it, then owned by the request's chooser for every attempt.

use sluice_core::admission::Tier;
use sluice_core::latency::Objectives;
use sluice_core::policy::RouteInput;
use sluice_core::prefix::block_hashes;

use super::HeldKeys;
use crate::tokens::PromptJson;

/// What the route stage reads of a request (the front stage parsed it, admission tiered it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wants<'a> {
    /// The routing-key header, else the `user` field: what hash policies hash.
    pub(crate) routing_key: Option<&'a [u8]>,
    /// The raw JSON of the prompt, hashed into prefix blocks for the cache-aware policy.
    pub(crate) prompt: &'a [u8],
    /// The same, for a chat or a completion: what can be tokenized as its engine will.
    pub(crate) prompt_json: Option<PromptJson<'a>>,
    /// Its estimated prompt size, counted as prefill work on the worker chosen.
    pub(crate) prompt_tokens: u64,
    /// A stream, counted in the chosen worker's pile of streams.
    pub(crate) stream: bool,
    /// `n`: the sequences it asks the engine for, each counted in the worker's load.
    pub(crate) n: u64,
    /// Its tier: a less urgent one leaves the interactive reserve alone (`Pool::reserve_for`).
    pub(crate) tier: Tier,
}

/// Bytes per prefix block: about 16 tokens, an engine's KV block.
const PREFIX_BLOCK_BYTES: usize = 64;
/// Prefix blocks hashed per request at most (32 KiB of prompt): enough to tell conversations
/// apart without hashing whole documents.
const PREFIX_MAX_BLOCKS: usize = 512;

/// What the route stage knows about one request, owned by its chooser.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteRequest {
    /// What the policy itself reads: the routing key's hash, the prefix's length in blocks.
    pub(crate) input: RouteInput,
    /// Prefix block hashes, only when the policy uses them.
    pub(crate) blocks: Vec<u64>,
    /// The prompt's keys in its engines' blocks, where their KV events flow.
    pub(crate) held: Option<HeldKeys>,
    /// The prompt's estimated size, counted as waiting for prefill on the chosen worker.
    pub(crate) prompt_tokens: u64,
    /// A streaming request, counted in the chosen worker's pile of streams.
    pub(crate) stream: bool,
    /// Its `n`, the weight of its lease.
    pub(crate) weight: u64,
    /// The share of a worker's capacity it leaves to the interactive tier (`Pool::reserve_for`):
    /// a worker that could start no more than that is full for it.
    pub(crate) reserve: f64,
    /// It goes where it starts at once when such a worker exists (`Pool::seeks_room`).
    pub(crate) seeks_room: bool,
    /// Its time to first token and per output token as they stand at placement (its tier's,
    /// its deadline's): what the `predicted` policy places it by. `None`: nothing bounds it.
    pub(crate) objectives: Option<Objectives>,
}

impl RouteRequest {
    /// `prefix`: a policy routes by prompt prefix, so the prompt is hashed.
    pub fn new(prefix: bool, wants: &Wants<'_>) -> Self {
        let blocks = if prefix {
            block_hashes(wants.prompt, PREFIX_BLOCK_BYTES, PREFIX_MAX_BLOCKS)
        } else {
            Vec::new()
        };
        Self {
            input: RouteInput {
                routing_key: wants.routing_key.map(sluice_core::policy::key_of),
                prefix_blocks: blocks.len() as u32,
            },
            blocks,
            held: None,
            prompt_tokens: wants.prompt_tokens,
            stream: wants.stream,
            weight: wants.n.max(1),
            reserve: 0.0,
            seeks_room: false,
            objectives: None,
        }
    }
}
