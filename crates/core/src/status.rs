//! What the status page shows of a worker at a glance: one state from its health, its circuit
//! and the veto in force, health first (a worker failing its checks is down whatever else holds).

use serde::Serialize;

use crate::breaker::BreakerState;
use crate::health::HealthState;
use crate::overload::VetoClass;

/// A card's look at a glance: the page styles by it and tests read it (`data-state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CardState {
    /// Takes requests.
    Ready,
    /// Healthy, but a veto keeps new requests off it (its causes are listed).
    Vetoed,
    /// Failing its probes, or its circuit is open.
    Down,
    /// Not yet verified.
    Pending,
    /// Being removed.
    Draining,
}

impl CardState {
    pub fn of(health: HealthState, circuit: BreakerState, veto: Option<VetoClass>) -> Self {
        match (health, circuit, veto) {
            (HealthState::Pending, ..) => CardState::Pending,
            (HealthState::Draining, ..) => CardState::Draining,
            (HealthState::NotReady | HealthState::Failed, ..) | (_, BreakerState::Open, _) => {
                CardState::Down
            }
            (HealthState::Ready, _, Some(_)) => CardState::Vetoed,
            (HealthState::Ready, _, None) => CardState::Ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_reads_health_first_then_the_circuit_then_vetoes() {
        use BreakerState::{Closed, HalfOpen, Open};
        use HealthState::*;
        let doubt = Some(VetoClass::Liveness);
        let full = Some(VetoClass::Overload);
        assert_eq!(CardState::of(Ready, Closed, None), CardState::Ready);
        assert_eq!(CardState::of(Ready, HalfOpen, None), CardState::Ready);
        assert_eq!(CardState::of(Ready, Closed, doubt), CardState::Vetoed);
        assert_eq!(CardState::of(Ready, Closed, full), CardState::Vetoed);
        assert_eq!(CardState::of(Ready, Open, doubt), CardState::Down);
        assert_eq!(CardState::of(NotReady, Closed, None), CardState::Down);
        assert_eq!(CardState::of(Failed, Closed, full), CardState::Down);
        assert_eq!(CardState::of(Pending, Open, None), CardState::Pending);
        assert_eq!(CardState::of(Draining, Closed, doubt), CardState::Draining);
    }
}
