//! Gateway API InferenceObjectives: a request names one in `x-gateway-inference-objective`, and
//! the objective's priority sets the request's tier (`Tier::from_objective_priority`: above zero
//! interactive, zero agent, below zero — sheddable — batch).
//!
//! With `--pool-name` the priorities are the pool's InferenceObjectives', followed in the cluster
//! (`cluster`); `--inference-objective NAME=PRIORITY` gives them without a cluster, and for
//! objectives the cluster does not have (an objective in the cluster wins over a flag of the same
//! name: it is what the workload's owner set, and it changes without a restart). An objective
//! named nowhere is standard priority, 0, as the Inference Extension treats a request without one.

pub mod cluster;

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use sluice_core::admission::Tier;
use tokio::sync::watch;

/// The header a request names its objective in.
pub const OBJECTIVE: HeaderName = HeaderName::from_static("x-gateway-inference-objective");
/// The header the gateway's admission reads a request's tier from.
const PRIORITY: HeaderName = HeaderName::from_static("x-sluice-priority");

/// A `--inference-objective` that is not `NAME=PRIORITY`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--inference-objective '{0}': expected NAME=PRIORITY, PRIORITY a whole number (negative: sheddable)")]
pub struct ObjectiveSpecError(pub String);

/// The objectives' priorities by name.
#[derive(Debug, Clone)]
pub struct Objectives {
    /// `--inference-objective`.
    given: HashMap<String, i32>,
    /// The pool's InferenceObjectives as last listed; written by `cluster::Follower` alone.
    cluster: Arc<ArcSwap<HashMap<String, i32>>>,
    /// Counts the follower's changes, for whoever awaits one.
    changed: Arc<watch::Sender<u64>>,
}

impl Objectives {
    /// From `NAME=PRIORITY` specs; a name given twice takes its last priority.
    pub fn parse<'a>(specs: impl IntoIterator<Item = &'a str>) -> Result<Self, ObjectiveSpecError> {
        let mut by_name = HashMap::new();
        for spec in specs {
            let bad = || ObjectiveSpecError(spec.to_string());
            let (name, priority) = spec.split_once('=').ok_or_else(bad)?;
            let name = name.trim();
            if name.is_empty() {
                return Err(bad());
            }
            let priority: i32 = priority.trim().parse().map_err(|_| bad())?;
            by_name.insert(name.to_string(), priority);
        }
        Ok(Self {
            given: by_name,
            cluster: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        })
    }

    /// Changes each time the cluster's priorities are replaced.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The tier of a request naming `objective`.
    pub fn tier(&self, objective: &str) -> Tier {
        let priority = self
            .cluster
            .load()
            .get(objective)
            .or_else(|| self.given.get(objective))
            .copied()
            .unwrap_or(0);
        Tier::from_objective_priority(priority)
    }

    /// A request naming an objective asks for the objective's tier, unless it asks for one
    /// itself; either way admission never serves it more urgently than its tenant's tier.
    pub fn apply(&self, headers: &mut HeaderMap) {
        if headers.contains_key(&PRIORITY) {
            return;
        }
        let Some(objective) = headers.get(&OBJECTIVE).and_then(|v| v.to_str().ok()) else {
            return;
        };
        let tier = self.tier(objective.trim());
        headers.insert(PRIORITY, HeaderValue::from_static(tier.name()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objective_sets_the_tier_a_request_did_not_ask_for() {
        let objectives = Objectives::parse(["realtime=100", "batch-sheddable=-1"]).unwrap();
        let tier_of = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (k, v) in pairs {
                headers.insert(*k, HeaderValue::from_static(v));
            }
            objectives.apply(&mut headers);
            headers
                .get(&PRIORITY)
                .map(|v| v.to_str().unwrap().to_string())
        };
        let objective = "x-gateway-inference-objective";
        assert_eq!(
            tier_of(&[(objective, "realtime")]).as_deref(),
            Some("interactive")
        );
        assert_eq!(
            tier_of(&[(objective, "batch-sheddable")]).as_deref(),
            Some("batch")
        );
        assert_eq!(tier_of(&[(objective, "unknown")]).as_deref(), Some("agent"));
        assert_eq!(
            tier_of(&[]),
            None,
            "no objective: the tenant's tier, as sluice serve"
        );
        assert_eq!(
            tier_of(&[(objective, "batch-sheddable"), ("x-sluice-priority", "1")]).as_deref(),
            Some("1"),
            "the request's own ask stands"
        );
    }

    #[test]
    fn specs_must_name_a_whole_priority() {
        for bad in ["realtime", "=5", "x=high", "x=1.5"] {
            assert_eq!(
                Objectives::parse([bad]).unwrap_err(),
                ObjectiveSpecError(bad.to_string())
            );
        }
    }
}
