//! How fast a worker is making progress, as its reports and our requests show it: whether the
//! engine's own token counter stands still, and the prefill rate that stretches the wedge bound.

use std::time::Duration;

use tokio::time::Instant;

use crate::load::Stepping;

/// An earlier load report's reading of the engine's own stepping (its token counters and the
/// gauges its scheduler republishes every step), for `stalled_since`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub stepping: Option<Stepping>,
    pub at: Instant,
    /// What `stalled_since` said for that report.
    pub stalled_since: Option<Instant>,
}

/// Since when the engine has not stepped while it held requests: from the earlier of the equal
/// readings. `None` when it stepped, reports no such signal, or holds nothing.
pub fn stalled_since(
    prev: Option<&Reading>,
    stepping: Option<Stepping>,
    in_hand: bool,
) -> Option<Instant> {
    let prev = prev?;
    let still = in_hand && stepping.is_some() && prev.stepping == stepping;
    still.then(|| prev.stalled_since.unwrap_or(prev.at))
}

/// How long a worker may go without progress before it is judged wedged: `wedge`, or, when
/// longer, the time the prompts it holds for this gateway may still need in prefill, within
/// the cap — a batch that is all in prefill produces nothing and is not wedged.
pub fn wedge_bound(wedge: Duration, allowance: Duration) -> Duration {
    wedge.max(allowance.min(super::WEDGE_CAP))
}

/// The prompt length at which a prefill's attention costs as much as the rest of it: a model of
/// P parameters, L layers and width d spends 2P FLOPs a token in its weights and 2·L·d·n in causal
/// attention over n tokens, even at n = P / (L·d) — about 38k tokens for Llama 3.2 1B, 61k for
/// Llama 3.1 8B, 107k for Llama 3.3 70B. The smaller figure makes the allowance err long.
const ATTENTION_EVEN_TOKENS: f64 = 32_768.0;

/// How long prompts waiting for prefill may still take: twice their tokens at the worker's
/// learned prefill rate (`latency::LatencyModel::prefill_rate`, the estimate the latency
/// predictions read too; twice, as it is an estimate), stretched by `1 + tokens / ATTENTION_EVEN_TOKENS` since
/// attention grows with the square of a prompt and the rate was measured on shorter ones (the
/// sum of several prompts stands in for the longest, which errs long); zero until a rate is
/// measured.
pub fn prefill_allowance(pending_tokens: u64, rate: f64) -> Duration {
    if rate <= 0.0 || pending_tokens == 0 {
        return Duration::ZERO;
    }
    let tokens = pending_tokens as f64;
    let linear = 2.0 * tokens / rate;
    Duration::try_from_secs_f64(linear * (1.0 + tokens / ATTENTION_EVEN_TOKENS))
        .unwrap_or(Duration::MAX)
}

/// How long the prefill leg of a disaggregated request may stay silent before the request
/// fails over to a new pair (seed 000): `--worker-wedge-secs`, or, when longer, the time the
/// prompts waiting on the prefill worker may still take, within the wedge cap. `None`:
/// `--worker-wedge-secs 0` turned the bound off.
pub fn leg_silence_bound(wedge: Duration, allowance: Duration) -> Option<Duration> {
    (!wedge.is_zero()).then(|| wedge_bound(wedge, allowance))
}

#[cfg(test)]
mod leg_tests {
    use super::*;

    #[test]
    fn a_prefill_leg_may_be_silent_for_the_wedge_bound_or_its_prefill_within_the_cap() {
        let s = Duration::from_secs;
        assert_eq!(leg_silence_bound(s(3), s(0)), Some(s(3)));
        assert_eq!(leg_silence_bound(s(3), s(20)), Some(s(20)));
        assert_eq!(leg_silence_bound(s(3), s(1000)), Some(s(120)));
        assert_eq!(leg_silence_bound(s(0), s(20)), None, "0 turns it off");
    }
}
