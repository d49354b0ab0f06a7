//! What a request gets at the level in force: refused (hard shedding), sent to another model
//! (cascade), its body rewritten (reasoning, pruning, clamping) — each step only where its scope
//! covers the request's tier and model and the level has reached it.

use bytes::Bytes;
use serde_json::Value;
use sluice_core::admission::Tier;
use sluice_core::degrade::{cascade_stays, clamp_output, prune_context, reasoning};

use super::{Degrader, Step, StepKind, CASCADE};
use crate::admit::AdmitError;
use crate::context::Degraded;

/// The first level of hard shedding (tier 2), and the one that sheds tier 1 too.
const SHED_BATCH: u8 = 5;
const SHED_AGENT: u8 = 6;

impl Degrader {
    /// Step 5: a request of `tier` refused at arrival while the level sheds it.
    pub(crate) fn shed(&self, tier: Tier) -> Result<(), AdmitError> {
        if !self.config.shed {
            return Ok(());
        }
        let level = self.level();
        let shed = match tier {
            Tier::Batch => level >= SHED_BATCH,
            Tier::Agent => level >= SHED_AGENT,
            Tier::Interactive => false,
        };
        if shed {
            self.count("shed", tier);
            return Err(AdmitError::DegradationShed {
                tier: tier.name(),
                retry_after: self.config.shed_interval,
            });
        }
        Ok(())
    }

    /// Step 2: the model a request of `tier` for `model` goes to instead, at this level; `room`
    /// says whether a model has room for it now (beyond the interactive reserve, as it is less
    /// urgent). While the cascade is being undone, a request of the share released stays on
    /// `model` if `model` has room: a share given back is never one that would wait. At any
    /// level, a request stays on `model` when `model` has room and the model cascaded to has
    /// none: the cascade relieves the model asked for, and a request it moved from room to
    /// none would wait there or be shed.
    pub(crate) fn cascade(
        &self,
        tier: Tier,
        model: &str,
        room: impl Fn(&str) -> bool,
    ) -> Option<&str> {
        let level = self.level();
        if level < CASCADE {
            return None;
        }
        let to = self.config.steps.iter().find_map(|step| match &step.kind {
            StepKind::Cascade(to) if step.scope.covers(tier, model) => Some(to.as_str()),
            _ => None,
        })?;
        let released = level == CASCADE && self.passes_top_step();
        if cascade_stays(released, || room(to), || room(model)) {
            return None;
        }
        Some(to)
    }

    /// Counts a cascade that was taken, and its note.
    pub(crate) fn cascaded(&self, tier: Tier, to: &str, plan: &mut Degraded) {
        self.count("cascade", tier);
        plan.notes.push(format!("cascade={to}"));
    }

    /// Steps 1, 3 and 4 on the body of a request of `tier` served by `model`: the body
    /// re-serialised, with `model` as its model, when a step changed it; `None` otherwise (it is
    /// then sent as it came).
    pub(crate) fn rewrite(
        &self,
        tier: Tier,
        model: &str,
        body: &[u8],
        plan: &mut Degraded,
    ) -> Option<Bytes> {
        let level = self.level();
        let applies =
            |s: &&Step| s.scope.covers(tier, model) && !matches!(s.kind, StepKind::Cascade(_));
        let top_applies = self
            .config
            .steps
            .iter()
            .filter(applies)
            .any(|s| s.kind.level() == level);
        let level = if top_applies && self.passes_top_step() {
            level - 1
        } else {
            level
        };
        let mut steps = self
            .config
            .steps
            .iter()
            .filter(applies)
            .filter(|s| s.kind.level() <= level)
            .peekable();
        steps.peek()?;
        let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        let mut changed = false;
        for step in steps {
            let applied = match &step.kind {
                StepKind::Reasoning(switch) => reasoning(&mut object, switch),
                StepKind::Prune(budget) => prune_context(&mut object, *budget),
                StepKind::Clamp(cap) => clamp_output(&mut object, *cap),
                StepKind::Cascade(_) => None,
            };
            if let Some(note) = applied {
                self.count(step.kind.name(), tier);
                plan.notes.push(note);
                changed = true;
            }
        }
        if !changed {
            return None;
        }
        object.insert("model".into(), Value::String(model.into()));
        serde_json::to_vec(&object).ok().map(Bytes::from)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    use prometheus_client::registry::Registry;
    use sluice_core::degrade::ReasoningSwitch;

    use super::*;
    use crate::admit::degrade::{DegradationConfig, Scope};

    fn ladder() -> Arc<Degrader> {
        let scope = Scope {
            models: None,
            tiers: vec![Tier::Agent],
        };
        let steps = vec![
            Step {
                scope: scope.clone(),
                kind: StepKind::Reasoning(ReasoningSwitch::Disable),
            },
            Step {
                scope,
                kind: StepKind::Cascade("small".into()),
            },
        ];
        let config = DegradationConfig {
            steps,
            shed: false,
            interval: Duration::from_secs(5),
            shed_interval: Duration::from_secs(5),
            references: [Duration::from_millis(200); 3],
        };
        Degrader::new(config, &mut Registry::default())
    }

    #[test]
    fn a_released_level_lets_its_share_of_requests_pass_its_own_step_only() {
        let d = ladder();
        let room = |_: &str| true;
        d.level.store(2, Ordering::Relaxed);
        assert_eq!(d.cascade(Tier::Agent, "big", room), Some("small"));
        d.released.store(2, Ordering::Relaxed);
        let taken: Vec<bool> = (0..4)
            .map(|_| d.cascade(Tier::Agent, "big", room).is_some())
            .collect();
        assert_eq!(taken, [false, false, true, true], "half pass the cascade");
        let without_room: Vec<bool> = (0..4)
            .map(|_| d.cascade(Tier::Agent, "big", |_| false).is_some())
            .collect();
        assert_eq!(
            without_room, [true; 4],
            "none passes while the big model has no room"
        );
        assert_eq!(
            d.cascade(Tier::Interactive, "big", room),
            None,
            "not its tier"
        );
        // A full target keeps requests on the big model only while it has room.
        d.released.store(0, Ordering::Relaxed);
        let only_big = |m: &str| m == "big";
        assert_eq!(d.cascade(Tier::Agent, "big", only_big), None);
        let only_small = |m: &str| m == "small";
        assert_eq!(d.cascade(Tier::Agent, "big", only_small), Some("small"));
        assert_eq!(
            d.cascade(Tier::Agent, "big", |_| false),
            Some("small"),
            "neither has room: the cascade holds"
        );
        d.released.store(2, Ordering::Relaxed);
        // The step below the released one applies to every request.
        let body = br#"{"model":"big","messages":[]}"#;
        for _ in 0..2 {
            let mut notes = Degraded::default();
            assert!(d.rewrite(Tier::Agent, "big", body, &mut notes).is_some());
            assert_eq!(notes.notes, ["reasoning=off"]);
        }
        // At level 1 released by a half, the reasoning step itself passes half the requests.
        d.level.store(1, Ordering::Relaxed);
        let rewritten: Vec<bool> = (0..4)
            .map(|_| {
                d.rewrite(Tier::Agent, "big", body, &mut Degraded::default())
                    .is_some()
            })
            .collect();
        assert_eq!(rewritten.iter().filter(|r| **r).count(), 2);
    }
}
