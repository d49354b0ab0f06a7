//! Deadline feasibility (seed 003): a request whose client will have given up before it can be
//! answered is dropped at the gateway, never forwarded as dead load.

use std::time::Duration;

use tokio::time::Instant;

/// What the gateway expects of the best worker for a request (its latency model's prediction,
/// `latency::LatencyModel`): its time to first token, and, once measured, its time per output
/// token.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Expected {
    pub ttft: Duration,
    pub per_token: Option<Duration>,
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
