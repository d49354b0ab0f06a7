//! Service-level objectives: per tier, a time to first token and a time per output token that a
//! completed answer must stay within to count as served well. The gateway counts answers against
//! them (`sluice_slo_attained_total{tier}`), the status page shows the rate, and the bench judges
//! its runs by the same defaults, so "within SLO" means one thing everywhere.

use std::time::Duration;

use crate::admission::Tier;

/// One tier's objectives; `None` sets no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slo {
    /// From the request's arrival at the gateway to its first response byte.
    pub ttft: Option<Duration>,
    /// Mean time per output token after the first.
    pub tpot: Option<Duration>,
}

/// The objectives of every tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slos([Slo; 3]);

impl Default for Slos {
    /// Interactive: a first token within 2 s, then at most 100 ms a token; agent: 5 s and
    /// 100 ms; batch: no latency objective (it completes, or it does not).
    fn default() -> Self {
        let chat = |ttft_ms: u64| Slo {
            ttft: Some(Duration::from_millis(ttft_ms)),
            tpot: Some(Duration::from_millis(100)),
        };
        Self([chat(2_000), chat(5_000), Slo::default()])
    }
}

impl Slos {
    /// The objectives by tier, most urgent first.
    pub fn new(by_tier: [Slo; 3]) -> Self {
        Self(by_tier)
    }

    pub fn of(&self, tier: Tier) -> Slo {
        self.0[tier.index()]
    }

    /// The longest each tier's requests should wait in the gateway queue, most urgent first: a
    /// request still waiting when its first-token objective can no longer be met is better
    /// refused — the client hears at once and may go elsewhere — than sent to an engine that
    /// spends its time on an answer already late while requests behind it turn late too. So a
    /// tier with a first-token objective waits that objective less `ENGINE_FIRST_TOKEN` (at
    /// least half the objective), within `longest`; a tier without one (or with zero) waits
    /// `longest`.
    pub fn queue_waits(&self, longest: Duration) -> [Duration; 3] {
        Tier::ALL.map(|tier| match self.of(tier).ttft.filter(|t| !t.is_zero()) {
            Some(objective) => objective
                .saturating_sub(ENGINE_FIRST_TOKEN)
                .max(objective / 2)
                .min(longest),
            None => longest,
        })
    }
}

/// What an engine takes to a first token once a request leaves the gateway queue, left out of
/// the tier's wait there (`Slos::queue_waits`): a prompt of a few thousand tokens prefilled
/// behind the engine's own short waiting queue. The queue sends a request on only where it
/// would start at once, so this is prefill time, not queueing.
pub const ENGINE_FIRST_TOKEN: Duration = Duration::from_millis(500);

/// What the gateway saw of one answer that completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// From arrival to the first byte of the answer.
    pub ttft: Duration,
    /// From arrival to the last byte.
    pub total: Duration,
    /// Output tokens, when counted (events of a stream); a whole body's are not.
    pub tokens: Option<u64>,
}

impl Served {
    /// The mean gap between output tokens after the first; unknown for fewer than two tokens
    /// or uncounted ones.
    pub fn tpot(&self) -> Option<Duration> {
        let gaps = self.tokens?.checked_sub(1).filter(|&n| n > 0)?;
        let gaps = u32::try_from(gaps).unwrap_or(u32::MAX);
        Some(self.total.saturating_sub(self.ttft) / gaps)
    }

    /// Whether it stayed within every objective of `slo` it can be judged on.
    pub fn within(&self, slo: &Slo) -> bool {
        let ttft_ok = slo.ttft.is_none_or(|bound| self.ttft <= bound);
        let tpot_ok = match (slo.tpot, self.tpot()) {
            (Some(bound), Some(tpot)) => tpot <= bound,
            _ => true,
        };
        ttft_ok && tpot_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn served(ttft: u64, total: u64, tokens: Option<u64>) -> Served {
        Served {
            ttft: ms(ttft),
            total: ms(total),
            tokens,
        }
    }

    #[test]
    fn an_answer_is_within_when_every_objective_holds() {
        let slo = Slos::default().of(Tier::Interactive);
        assert!(served(1_900, 1_900 + 99 * 100, Some(100)).within(&slo));
        assert!(
            !served(2_100, 2_200, Some(2)).within(&slo),
            "a late first token"
        );
        assert!(
            !served(100, 100 + 99 * 101, Some(100)).within(&slo),
            "slow tokens after a quick first"
        );
    }

    #[test]
    fn what_cannot_be_measured_is_not_held_against_it() {
        let slo = Slos::default().of(Tier::Agent);
        assert_eq!(served(100, 60_000, Some(1)).tpot(), None);
        assert!(served(100, 60_000, Some(1)).within(&slo), "one token");
        assert!(served(4_000, 60_000, None).within(&slo), "a whole body");
        assert!(!served(6_000, 6_000, None).within(&slo));
    }

    #[test]
    fn a_tier_waits_in_the_queue_its_first_token_objective_less_the_engines_time() {
        let longest = Duration::from_secs(60);
        assert_eq!(
            Slos::default().queue_waits(longest),
            [ms(1_500), ms(4_500), longest],
            "interactive 2 s, agent 5 s, batch without an objective"
        );
        let tight = |ttft_ms: u64| Slo {
            ttft: Some(ms(ttft_ms)),
            tpot: None,
        };
        let slos = Slos::new([tight(600), tight(90_000), tight(0)]);
        assert_eq!(
            slos.queue_waits(longest),
            [ms(300), longest, longest],
            "at least half the objective; never past the longest wait; zero is no objective"
        );
        assert_eq!(
            Slos::default().queue_waits(ms(1_000)),
            [ms(1_000); 3],
            "a shorter longest wait holds for every tier"
        );
    }

    #[test]
    fn batch_has_no_latency_objective_by_default() {
        let slo = Slos::default().of(Tier::Batch);
        assert!(served(600_000, 900_000, Some(10)).within(&slo));
        let strict = Slos::new([
            Slo::default(),
            Slo::default(),
            Slo {
                ttft: Some(ms(10)),
                tpot: None,
            },
        ]);
        assert!(!served(11, 20, None).within(&strict.of(Tier::Batch)));
    }
}
