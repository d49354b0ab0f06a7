//! Deadline feasibility (seed 003): a request whose client will have given up before it can be
//! answered is dropped at the gateway, never forwarded as dead load.

use std::time::Duration;

use tokio::time::Instant;

/// What the gateway expects of the best worker for a request: its time to first token, and,
/// once measured, its time per output token.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Expected {
    pub ttft: Duration,
    pub per_token: Option<Duration>,
}

/// The time a worker may take to a first token for a prompt of `prompt_tokens`: the prompts
/// already waiting for its prefill, this one included, at its measured prefill rate (tokens per
/// second). `None` until a rate is measured.
pub fn expected_ttft(
    waiting_prefill: u64,
    prompt_tokens: u64,
    prefill_rate: f64,
) -> Option<Duration> {
    (prefill_rate > 0.0)
        .then(|| Duration::from_secs_f64((waiting_prefill + prompt_tokens) as f64 / prefill_rate))
}

/// Whether a request due by `deadline` can still be answered in full if sent now: the expected
/// time to first token, plus `tokens` at the expected time per token when that is known, must
/// fit in what is left.
pub fn feasible(now: Instant, deadline: Instant, expected: Expected, tokens: u64) -> bool {
    let left = deadline.saturating_duration_since(now);
    let generation = expected.per_token.map_or(Duration::ZERO, |per| {
        per.saturating_mul(tokens.min(u32::MAX as u64) as u32)
    });
    !left.is_zero() && expected.ttft.saturating_add(generation) <= left
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_token_waits_for_the_prefill_ahead_of_it() {
        assert_eq!(expected_ttft(3000, 1000, 8000.0), Some(500 * MS));
        assert_eq!(expected_ttft(3000, 1000, 0.0), None, "no rate measured yet");
    }

    #[test]
    fn the_first_token_and_the_generation_must_fit() {
        let now = Instant::now();
        let deadline = now + 1000 * MS;
        let ttft = Expected {
            ttft: 400 * MS,
            per_token: None,
        };
        assert!(
            feasible(now, deadline, ttft, 10_000),
            "generation not yet measured"
        );
        assert!(
            !feasible(now + 700 * MS, deadline, ttft, 0),
            "waited too long"
        );
        let measured = Expected {
            ttft: 400 * MS,
            per_token: Some(10 * MS),
        };
        assert!(feasible(now, deadline, measured, 60));
        assert!(!feasible(now, deadline, measured, 61));
        assert!(
            !feasible(deadline, deadline, Expected::default(), 0),
            "nothing left"
        );
    }
}
