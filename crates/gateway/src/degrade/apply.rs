//! What a request gets at the level in force: refused (hard shedding), sent to another model
//! (cascade), its body rewritten (reasoning, pruning, clamping) — each step only where its scope
//! covers the request's tier and model and the level has reached it.

use bytes::Bytes;
use serde_json::Value;
use sluice_core::admission::Tier;
use sluice_core::degrade::{clamp_output, prune_context, reasoning};

use super::{Degrader, StepKind};
use crate::error::GatewayError;

/// The first level of hard shedding (tier 2), and the one that sheds tier 1 too.
const SHED_BATCH: u8 = 5;
const SHED_AGENT: u8 = 6;

/// What the ladder did to one request: the notes of `x-sluice-degraded`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub notes: Vec<String>,
}

impl Degrader {
    /// Step 5: a request of `tier` refused at arrival while the level sheds it.
    pub fn shed(&self, tier: Tier) -> Result<(), GatewayError> {
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
            return Err(GatewayError::DegradationShed {
                tier: tier.name(),
                retry_after: self.config.shed_interval,
            });
        }
        Ok(())
    }

    /// Step 2: the model a request of `tier` for `model` goes to instead, at this level.
    pub fn cascade(&self, tier: Tier, model: &str) -> Option<&str> {
        if self.level() < StepKind::Cascade(String::new()).level() {
            return None;
        }
        self.config.steps.iter().find_map(|step| match &step.kind {
            StepKind::Cascade(to) if step.scope.covers(tier, model) => Some(to.as_str()),
            _ => None,
        })
    }

    /// Counts a cascade that was taken, and its note.
    pub fn cascaded(&self, tier: Tier, to: &str, plan: &mut Plan) {
        self.count("cascade", tier);
        plan.notes.push(format!("cascade={to}"));
    }

    /// Steps 1, 3 and 4 on the body of a request of `tier` served by `model`: the body
    /// re-serialised, with `model` as its model, when a step changed it; `None` otherwise (it is
    /// then sent as it came).
    pub fn rewrite(&self, tier: Tier, model: &str, body: &[u8], plan: &mut Plan) -> Option<Bytes> {
        let level = self.level();
        let mut steps = self
            .config
            .steps
            .iter()
            .filter(|s| s.kind.level() <= level && s.scope.covers(tier, model))
            .filter(|s| !matches!(s.kind, StepKind::Cascade(_)))
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
