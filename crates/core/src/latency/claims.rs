//! How much of the prefix the gateway's index claims a worker holds that worker's engine then
//! finds, learned from the engine's own prefix-cache counters.
//!
//! The approximate index remembers every prompt it sent to a worker and never sees the engine
//! evict a block; under KV pressure the engine evicts within seconds, and the index goes on
//! claiming prefixes long gone (on the routing benchmark past capacity it claimed 72% of prompt
//! tokens cached where the engines found 27-29%). A TTFT predicted on such a claim is too soon,
//! by the prefill of everything evicted. The engines count what they find: vLLM's
//! `prefix_cache_queries` and `prefix_cache_hits` (prompt tokens looked up at admission and
//! those found, vllm/v1/core/kv_cache_manager.py; since vllm-project/vllm#25787, merged
//! 2025-09-26, a preempted request's lookup again is counted apart and not exported), and
//! SGLang's `cache_hit_rate` in its load report (hit tokens over the prompt tokens its
//! `PrefillAdder` admitted lately). Over the same stretch of traffic, the engine's share found
//! over the share the gateway claimed is how far a claim holds: the **credit** each claim is
//! taken at.
//!
//! The two sides are not per request: the engine counts a prompt when it admits it, the gateway
//! when it sends it, a queue's wait apart. Both are sums decayed report by report, so the
//! credit follows the traffic of the last reports and a queue's lag only blurs it. It is never
//! above 1: an engine finding more than was claimed found it on prompts nobody claimed
//! anything for, and that says nothing of the claims. Before any evidence a claim is taken
//! whole (the precise index, from the engines' KV events, is right).

/// The share of each report's sums kept at the next.
const KEEP: f64 = 0.9;
/// Claimed tokens (decayed) below which the claims are too few to judge: a block's worth.
const MIN_CLAIMED: f64 = 16.0;

/// What an engine found in its prefix cache over one report's stretch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineHits {
    /// The prompt tokens it looked up (vLLM's counter moved by them); `None` where the engine
    /// reports a rate over its own window (SGLang).
    pub tokens: Option<f64>,
    /// The share of those it found cached, 0..=1.
    pub share: f64,
}

/// One worker's claims and its engine's findings, decayed report by report.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClaimCheck {
    /// Sent since the last report: prompt tokens, and those claimed cached.
    new_prompt: u64,
    new_claimed: u64,
    prompt: f64,
    claimed: f64,
    looked_up: f64,
    found: f64,
}

impl ClaimCheck {
    /// A prompt of `prompt` tokens was sent with `claimed` of them claimed cached.
    pub fn sent(&mut self, prompt: u64, claimed: u64) {
        self.new_prompt = self.new_prompt.saturating_add(prompt);
        self.new_claimed = self.new_claimed.saturating_add(claimed.min(prompt));
    }

    /// A report came: what the engine found since the last one (`None` when it reports nothing
    /// of its prefix cache, or looked nothing up). A rate without its tokens is weighed by the
    /// prompt tokens sent over the same stretch.
    pub fn reported(&mut self, found: Option<EngineHits>) {
        let (prompt, claimed) = (self.new_prompt as f64, self.new_claimed as f64);
        self.prompt = self.prompt * KEEP + prompt;
        self.claimed = self.claimed * KEEP + claimed;
        (self.new_prompt, self.new_claimed) = (0, 0);
        self.looked_up *= KEEP;
        self.found *= KEEP;
        if let Some(hits) = found {
            let tokens = hits.tokens.unwrap_or(prompt).max(0.0);
            self.looked_up += tokens;
            self.found += tokens * hits.share.clamp(0.0, 1.0);
        }
    }

    /// The share of a claim that holds, 0..=1; `None` until both sides have evidence.
    pub fn credit(&self) -> Option<f64> {
        if self.claimed < MIN_CLAIMED || self.looked_up <= 0.0 || self.prompt <= 0.0 {
            return None;
        }
        let engine = self.found / self.looked_up;
        let claimed = self.claimed / self.prompt;
        Some((engine / claimed).clamp(0.0, 1.0))
    }

    /// The prompt tokens left to prefill of a prompt of `prompt` tokens with `claimed` claimed
    /// cached, the claim taken at its credit (whole until there is one).
    pub fn uncached(&self, prompt: u64, claimed: u64) -> u64 {
        let held = claimed.min(prompt) as f64 * self.credit().unwrap_or(1.0);
        prompt - (held.round() as u64).min(prompt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(looked_up: f64, share: f64) -> Option<EngineHits> {
        Some(EngineHits {
            tokens: Some(looked_up),
            share,
        })
    }

    #[test]
    fn a_claim_is_taken_whole_until_the_engine_has_said_what_it_found() {
        let mut check = ClaimCheck::default();
        assert_eq!(check.uncached(1000, 600), 400);
        check.sent(1000, 600);
        assert_eq!(check.uncached(1000, 600), 400, "no report yet");
        check.reported(None);
        assert_eq!(check.credit(), None, "the engine reports no prefix cache");
        assert_eq!(check.uncached(1000, 2000), 0, "never below nothing");
    }

    #[test]
    fn claims_the_engine_does_not_find_are_discounted_by_what_it_found() {
        let mut check = ClaimCheck::default();
        for _ in 0..30 {
            // The index claims 72% of each prompt; the engine finds 27%.
            check.sent(10_000, 7_200);
            check.reported(vllm(10_000.0, 0.27));
        }
        let credit = check.credit().unwrap();
        assert!((credit - 0.375).abs() < 1e-9, "{credit}");
        assert_eq!(check.uncached(1000, 720), 730);
    }

    #[test]
    fn the_credit_follows_the_engine_as_its_evictions_change() {
        let mut check = ClaimCheck::default();
        for _ in 0..30 {
            check.sent(1000, 500);
            check.reported(vllm(1000.0, 0.5));
        }
        assert!((check.credit().unwrap() - 1.0).abs() < 1e-9);
        for _ in 0..60 {
            check.sent(1000, 500);
            check.reported(vllm(1000.0, 0.1));
        }
        let credit = check.credit().unwrap();
        assert!((credit - 0.2).abs() < 0.01, "{credit}");
    }

    #[test]
    fn an_engine_finding_more_than_was_claimed_takes_claims_whole_and_no_more() {
        let mut check = ClaimCheck::default();
        for _ in 0..10 {
            check.sent(1000, 100);
            check.reported(vllm(1000.0, 0.6));
        }
        assert_eq!(check.credit(), Some(1.0));
        assert_eq!(check.uncached(1000, 100), 900);
    }

    #[test]
    fn a_rate_without_tokens_is_weighed_by_the_prompts_sent_alongside() {
        let mut check = ClaimCheck::default();
        for _ in 0..20 {
            check.sent(2000, 1000);
            check.reported(Some(EngineHits {
                tokens: None,
                share: 0.25,
            }));
        }
        let credit = check.credit().unwrap();
        assert!((credit - 0.5).abs() < 1e-9, "{credit}");
        // Reports over a stretch with nothing sent keep the evidence, decaying it evenly.
        check.reported(None);
        assert!((check.credit().unwrap() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn too_few_claimed_tokens_are_no_evidence() {
        let mut check = ClaimCheck::default();
        check.sent(1000, 8);
        check.reported(vllm(1000.0, 0.0));
        assert_eq!(check.credit(), None);
        assert_eq!(check.uncached(1000, 8), 992);
    }
}
