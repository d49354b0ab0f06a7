//! Priority tiers (seed 003, layer 1): 0 interactive, 1 agent, 2 batch. A lower number is more
//! urgent; between tiers the order is strict.

use std::fmt;

/// A request's priority tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Synchronous, user-facing chat: strict latency guarantees.
    Interactive = 0,
    /// Interactive agent tool-calling loops: standard priority.
    Agent = 1,
    /// Evaluation, indexing, batch summarization: queued or refused first under load.
    Batch = 2,
}

/// Why a priority header's value is not a tier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a tier: use 0, 1, 2, interactive, agent or batch")]
pub struct UnknownTier(pub String);

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Interactive, Tier::Agent, Tier::Batch];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::Interactive => "interactive",
            Tier::Agent => "agent",
            Tier::Batch => "batch",
        }
    }

    /// `x-sluice-priority`: `0`, `1`, `2` or the tiers' names, in any case.
    pub fn parse(value: &str) -> Result<Tier, UnknownTier> {
        match value.trim().to_ascii_lowercase().as_str() {
            "0" | "interactive" => Ok(Tier::Interactive),
            "1" | "agent" => Ok(Tier::Agent),
            "2" | "batch" => Ok(Tier::Batch),
            _ => Err(UnknownTier(value.to_string())),
        }
    }

    /// SMG's `x-smg-priority` classes mapped onto the tiers: `system` and `interactive` to 0,
    /// `default` to 1, `bulk` to 2. Like SMG, an unknown class reads as `default`.
    pub fn from_smg_class(value: &str) -> Tier {
        match value.trim().to_ascii_lowercase().as_str() {
            "system" | "interactive" => Tier::Interactive,
            "bulk" => Tier::Batch,
            _ => Tier::Agent,
        }
    }

    /// A Gateway API InferenceObjective's priority mapped onto the tiers: above zero is more
    /// urgent than the default (interactive), zero is the default, standard priority (agent),
    /// and a negative priority is sheddable (batch), as the Inference Extension calls it.
    pub fn from_objective_priority(priority: i32) -> Tier {
        match priority {
            1.. => Tier::Interactive,
            0 => Tier::Agent,
            _ => Tier::Batch,
        }
    }

    /// The tier a request gets: the one it asked for, but never more urgent than its tenant's.
    pub fn clamped(asked: Option<Tier>, tenant: Tier) -> Tier {
        asked.map_or(tenant, |asked| asked.max(tenant))
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objective_priorities_above_zero_are_interactive_and_negative_ones_batch() {
        let tiers: Vec<Tier> = [100, 1, 0, -1, i32::MIN]
            .into_iter()
            .map(Tier::from_objective_priority)
            .collect();
        assert_eq!(
            tiers,
            [
                Tier::Interactive,
                Tier::Interactive,
                Tier::Agent,
                Tier::Batch,
                Tier::Batch
            ]
        );
    }

    #[test]
    fn numbers_and_names_in_any_case() {
        assert_eq!(Tier::parse("0"), Ok(Tier::Interactive));
        assert_eq!(Tier::parse(" Agent "), Ok(Tier::Agent));
        assert_eq!(Tier::parse("BATCH"), Ok(Tier::Batch));
        assert_eq!(Tier::parse("3"), Err(UnknownTier("3".into())));
        assert_eq!(Tier::parse("urgent"), Err(UnknownTier("urgent".into())));
    }

    #[test]
    fn smgs_classes_map_onto_the_tiers() {
        assert_eq!(Tier::from_smg_class("SYSTEM"), Tier::Interactive);
        assert_eq!(Tier::from_smg_class("interactive"), Tier::Interactive);
        assert_eq!(Tier::from_smg_class("default"), Tier::Agent);
        assert_eq!(Tier::from_smg_class("Bulk"), Tier::Batch);
        assert_eq!(Tier::from_smg_class("whatever"), Tier::Agent);
    }

    #[test]
    fn a_request_may_ask_for_less_urgency_never_more() {
        assert_eq!(Tier::clamped(None, Tier::Agent), Tier::Agent);
        assert_eq!(Tier::clamped(Some(Tier::Batch), Tier::Agent), Tier::Batch);
        assert_eq!(
            Tier::clamped(Some(Tier::Interactive), Tier::Agent),
            Tier::Agent
        );
    }
}
