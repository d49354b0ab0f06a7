//! The degradation ladder's settings: the `[degradation]` table of the config file and its steps,
//! and the `[[cascade]]` tables (see docs/degradation.md). File-only: a ladder is a policy, too
//! structured for flags.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_core::admission::Tier;
use sluice_core::degrade::{PruneBudget, ReasoningSwitch};

use super::checks::invalid;
use super::ConfigError;
use crate::admit::degrade::{DegradationConfig, Scope, Step, StepKind};

/// The output cap of the clamp step when it names none (the seed's figure).
const DEFAULT_CLAMP: u64 = 512;

/// The config file's ladder: `[degradation]` and `[[cascade]]`.
#[derive(Debug, Clone, Default, clap::Args, Serialize, Deserialize, PartialEq)]
pub struct DegradationSettings {
    /// `[degradation]` (see docs/degradation.md).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degradation: Option<DegradationSpec>,
    /// `[[cascade]]` tables: step 2 of the ladder.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cascade: Vec<CascadeSpec>,
}

impl DegradationSettings {
    /// The ladder, when configured. Its reference delays default to the tiers' CoDel targets;
    /// its interval to the CoDel interval or two load-monitor intervals, whichever is longer: a
    /// fall is judged by the fleet's vetoes, which only a load report refreshes, so a level must
    /// hold until reports have seen the fleet without its step. The shedding levels hold for the
    /// CoDel interval.
    pub(super) fn validate(
        &self,
        codel: Option<[sluice_core::adaptive::CodelConfig; 3]>,
        load_interval: Duration,
    ) -> Result<Option<DegradationConfig>, ConfigError> {
        let (codel_interval, reference) = codel.map_or(
            (
                Duration::from_secs(5),
                super::adaptive::CODEL_TARGETS_MS.map(Duration::from_millis),
            ),
            |c| (c[0].interval, c.map(|t| t.target)),
        );
        let interval = codel_interval.max(load_interval * 2);
        match (&self.degradation, self.cascade.is_empty()) {
            (None, true) => Ok(None),
            (spec, _) => spec.clone().unwrap_or_default().validate(
                &self.cascade,
                [interval, codel_interval],
                reference,
            ),
        }
    }
}

/// `[degradation]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DegradationSpec {
    /// How long a level holds before it may fall a step [default: the CoDel interval, 5 s].
    #[serde(default)]
    pub interval_secs: Option<f64>,
    /// Each tier's oldest wait in the gateway queue that is level 1, interactive, agent and
    /// batch [default: the tiers' CoDel targets].
    #[serde(default)]
    pub reference_delay_ms_by_tier: Option<Vec<u64>>,
    /// Step 5: refuse tier 2 at level 5, tier 1 too at level 6.
    #[serde(default)]
    pub shed: bool,
    #[serde(default)]
    pub reasoning: Vec<ReasoningSpec>,
    #[serde(default)]
    pub prune: Vec<PruneSpec>,
    #[serde(default)]
    pub clamp: Vec<ClampSpec>,
}

/// `[[degradation.reasoning]]`: step 1 for a model.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReasoningSpec {
    pub model: String,
    /// `disable` (`chat_template_kwargs.enable_thinking = false`), `effort` or `budget`.
    pub switch: String,
    /// With `effort`: the `reasoning_effort` sent [default: `low`].
    #[serde(default)]
    pub effort: Option<String>,
    /// With `budget`: the field [default: `thinking_token_budget`] and the tokens.
    #[serde(default)]
    pub budget_field: Option<String>,
    #[serde(default)]
    pub budget_tokens: Option<u64>,
    /// The tiers it applies to [default: all].
    #[serde(default)]
    pub tiers: Option<Vec<u8>>,
}

/// `[[cascade]]`: step 2.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CascadeSpec {
    pub from: String,
    pub to: String,
    /// The tiers it applies to [default: 1 and 2: the interactive tier keeps its model].
    #[serde(default)]
    pub tiers: Option<Vec<u8>>,
}

/// `[[degradation.prune]]`: step 3.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PruneSpec {
    /// The models it applies to [default: all].
    #[serde(default)]
    pub(crate) models: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) tiers: Option<Vec<u8>>,
    /// Estimated prompt tokens the messages may come to.
    pub(crate) token_budget: u64,
    /// The last non-system messages always kept [default: 4].
    #[serde(default)]
    pub(crate) keep_last: Option<usize>,
}

/// `[[degradation.clamp]]`: step 4.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClampSpec {
    #[serde(default)]
    pub models: Option<Vec<String>>,
    #[serde(default)]
    pub tiers: Option<Vec<u8>>,
    /// [default: 512]
    #[serde(default)]
    pub max_tokens: Option<u64>,
}

fn tiers(
    setting: &'static str,
    given: &Option<Vec<u8>>,
    default: &[Tier],
) -> Result<Vec<Tier>, ConfigError> {
    match given {
        None => Ok(default.to_vec()),
        Some(list) if list.is_empty() => Err(invalid(setting, "tiers: give at least one")),
        Some(list) => list
            .iter()
            .map(|n| match n {
                0 => Ok(Tier::Interactive),
                1 => Ok(Tier::Agent),
                2 => Ok(Tier::Batch),
                _ => Err(invalid(setting, format!("tier {n}: tiers are 0, 1 and 2"))),
            })
            .collect(),
    }
}

fn scope(
    setting: &'static str,
    models: Option<Vec<String>>,
    given: &Option<Vec<u8>>,
    default: &[Tier],
) -> Result<Scope, ConfigError> {
    Ok(Scope {
        models,
        tiers: tiers(setting, given, default)?,
    })
}

impl ReasoningSpec {
    /// How this step switches reasoning down.
    fn switch(&self) -> Result<ReasoningSwitch, ConfigError> {
        Ok(match self.switch.as_str() {
            "disable" => ReasoningSwitch::Disable,
            "effort" => {
                ReasoningSwitch::Effort(self.effort.clone().unwrap_or_else(|| "low".into()))
            }
            "budget" => ReasoningSwitch::Budget {
                field: self
                    .budget_field
                    .clone()
                    .unwrap_or_else(|| "thinking_token_budget".into()),
                tokens: self.budget_tokens.ok_or_else(|| {
                    invalid(
                        "degradation.reasoning",
                        "switch = \"budget\" needs budget_tokens",
                    )
                })?,
            },
            other => {
                return Err(invalid(
                    "degradation.reasoning",
                    format!("switch \"{other}\": one of disable, effort, budget"),
                ))
            }
        })
    }
}

impl DegradationSpec {
    /// The ladder's steps in the order they are taken: reasoning switched, cascades, prompts
    /// pruned, answers clamped.
    fn steps(&self, cascades: &[CascadeSpec]) -> Result<Vec<Step>, ConfigError> {
        let mut steps = Vec::new();
        for r in &self.reasoning {
            let switch = r.switch()?;
            steps.push(Step {
                scope: scope(
                    "degradation.reasoning",
                    Some(vec![r.model.clone()]),
                    &r.tiers,
                    &Tier::ALL,
                )?,
                kind: StepKind::Reasoning(switch),
            });
        }
        for c in cascades {
            if c.from == c.to {
                return Err(invalid(
                    "cascade",
                    format!("'{}' cascades to itself", c.from),
                ));
            }
            steps.push(Step {
                scope: scope(
                    "cascade",
                    Some(vec![c.from.clone()]),
                    &c.tiers,
                    &[Tier::Agent, Tier::Batch],
                )?,
                kind: StepKind::Cascade(c.to.clone()),
            });
        }
        for p in &self.prune {
            steps.push(Step {
                scope: scope("degradation.prune", p.models.clone(), &p.tiers, &Tier::ALL)?,
                kind: StepKind::Prune(PruneBudget {
                    tokens: p.token_budget,
                    keep_last: p.keep_last.unwrap_or(4),
                }),
            });
        }
        for c in &self.clamp {
            let cap = c.max_tokens.unwrap_or(DEFAULT_CLAMP);
            if cap == 0 {
                return Err(invalid(
                    "degradation.clamp",
                    "max_tokens must be at least 1",
                ));
            }
            steps.push(Step {
                scope: scope("degradation.clamp", c.models.clone(), &c.tiers, &Tier::ALL)?,
                kind: StepKind::Clamp(cap),
            });
        }
        Ok(steps)
    }

    /// The ladder, when any step is configured; `None` leaves the request path as it was.
    pub(super) fn validate(
        &self,
        cascades: &[CascadeSpec],
        [default_interval, shed_interval]: [Duration; 2],
        reference: [Duration; 3],
    ) -> Result<Option<DegradationConfig>, ConfigError> {
        let steps = self.steps(cascades)?;
        let interval = match self.interval_secs {
            None => default_interval,
            Some(secs) => Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(
                        "degradation.interval_secs",
                        "must be a positive number of seconds",
                    )
                })?,
        };
        let references = self.references().unwrap_or(Ok(reference))?;
        if steps.is_empty() && !self.shed {
            return Ok(None);
        }
        Ok(Some(DegradationConfig {
            steps,
            shed: self.shed,
            interval,
            shed_interval: shed_interval.min(interval),
            references,
        }))
    }
}

impl DegradationSpec {
    /// `reference_delay_ms_by_tier`, when given: three positive delays.
    fn references(&self) -> Option<Result<[Duration; 3], ConfigError>> {
        let given = self.reference_delay_ms_by_tier.as_ref()?;
        Some(match given.as_slice() {
            [a, b, c] if given.iter().all(|ms| *ms > 0) => {
                Ok([*a, *b, *c].map(Duration::from_millis))
            }
            _ => Err(invalid(
                "degradation.reference_delay_ms_by_tier",
                "must be three positive delays in milliseconds: interactive, agent, batch",
            )),
        })
    }
}
