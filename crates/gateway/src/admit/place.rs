//! The admit stage as the request path sees it: admission (`Admit::admit`), the ladder's hard
//! shedding, then the pool, in one step whose answer the route stage consumes.
//!
//! It finds the model's pool (or the pool of the model an alias names, or the ladder cascades the
//! request to), judges whether the client's deadline can be met there, and with the gateway queue
//! waits for a turn when no worker can take the request now. A request that waited is judged
//! again, on the fleet as it is then and at the ladder's level then: the pool it waited for may
//! have changed while it waited. The answer is an `Admitted`: the pool, the terms, the turn, the
//! body the worker gets, and what admission took.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_core::ModelName;
use tokio::time::Instant;

use super::body::served_body;
use super::degrade::Degrader;
use super::AdmitError;
use super::{Admit, Admitted, Asking, Decided, Turn};
use crate::context::RequestContext;
use crate::error::reflected;
use crate::fleet::{Fleet, Pool, Snapshot};
use crate::request::{Asked, RequestFacts};

/// The admit stage, shared by every request: admission, the fleet it finds pools in, the
/// models' other names, and the ladder.
pub(crate) struct AdmitStage {
    /// Tenants, tiers, deadlines, budgets, caps and the gateway queue.
    pub(crate) admit: Arc<Admit>,
    /// Where a model's pool is found, as the fleet is at the moment of asking.
    pub(crate) fleet: Arc<Fleet>,
    /// `--model-alias`: extra client-facing names, each for a served model.
    pub(crate) aliases: HashMap<String, ModelName>,
    /// The degradation ladder, when steps are configured.
    pub(crate) degrade: Option<Arc<Degrader>>,
}

impl AdmitStage {
    /// Admits `asked` to its model's pool, or refuses it; who it is and what the ladder did
    /// are written to `ctx`.
    pub(crate) async fn admit(
        &self,
        asked: &Asked<'_>,
        ctx: &mut RequestContext,
    ) -> Result<Admitted, AdmitError> {
        let facts = asked.facts;
        let asking = Asking {
            headers: &asked.parts.headers,
            owner: asked.owner,
            prompt_tokens: asked.prompt_tokens(),
            max_tokens: facts.max_tokens,
            n: facts.n,
        };
        let mut decided = self.admit.admit(ctx, &asking).await?;
        let tier = decided.tier;
        let route = asked.arrival.route;
        let degrade = self.degrade.as_deref().filter(|_| route.takes_model());
        if let Some(degrade) = degrade {
            degrade
                .shed(tier)
                .inspect_err(|e| self.admit.count_rejected(ctx, e))?;
        }
        let (pool, turn) = self.pool(ctx, &mut decided, degrade, asked).await?;
        self.admit.count_admitted(ctx);
        let served = pool.model.as_str();
        let body = if pool.adapter.is_some() && sglang_named(facts) == Some(served) {
            // Named as SGLang takes it: the worker reads the adapter from the body as it is.
            asked.body.clone()
        } else {
            degrade
                .and_then(|d| d.rewrite(tier, served, asked.body, &mut ctx.degraded))
                .unwrap_or_else(|| served_body(route, facts, asked.body, served))
        };
        Ok(Admitted {
            terms: decided.terms(),
            grants: decided.grants.take(),
            turn,
            pool,
            body,
        })
    }

    /// The pool serving the model asked for (or the one the ladder cascades it to), once the
    /// deadline can be met there and, with the gateway queue, it has room; and the turn, if it
    /// waited for one.
    async fn pool(
        &self,
        ctx: &mut RequestContext,
        decided: &mut Decided,
        degrade: Option<&Degrader>,
        asked: &Asked<'_>,
    ) -> Result<(Arc<Pool>, Turn), AdmitError> {
        let model = asked.facts.model.as_deref();
        let tier = decided.tier;
        let mut turn: Option<Turn> = None;
        loop {
            let snapshot = self.fleet.snapshot();
            let model = sglang_adapter(&snapshot, asked.facts).or(model);
            let cascade = cascaded(degrade, tier, model, &snapshot);
            let pool = self
                .serving(&snapshot, cascade.or(model))
                .inspect_err(|_| ctx.model = model.map(|m| ModelName::new(reflected(m))))?;
            ctx.model = Some(pool.model.clone());
            self.admit
                .feasible(ctx, decided, &pool, asked.prompt_tokens())?;
            if turn.is_none() {
                let waiting = Instant::now();
                if let Some(called) = self.admit.wait_room(ctx, decided, &pool, &snapshot).await? {
                    ctx.queued(waiting.elapsed());
                    turn = Some(called);
                    continue;
                }
            }
            if let (Some(degrade), Some(to)) = (degrade, cascade) {
                degrade.cascaded(tier, to, &mut ctx.degraded);
                decided.grants.hold(degrade.diverting());
            }
            return Ok((pool, turn.unwrap_or_default()));
        }
    }

    /// The pool serving `model` (or the model an alias names), or the answer for why there is
    /// none. A request without a model goes to the only pool, when there is one.
    fn serving(&self, snapshot: &Snapshot, model: Option<&str>) -> Result<Arc<Pool>, AdmitError> {
        let model = model.map(|m| self.aliases.get(m).map_or(m, ModelName::as_str));
        let Some(model) = model else {
            let mut pools = snapshot.pools.values();
            return match (pools.next(), pools.next()) {
                (Some(only), None) if snapshot.unresolved == 0 => Ok(only.clone()),
                _ => Err(AdmitError::ModelRequired {
                    served: snapshot.pools.len().max(1),
                }),
            };
        };
        if let Some(pool) = snapshot.pools.get(model) {
            return Ok(pool.clone());
        }
        if snapshot.unresolved > 0 {
            // A worker that has not answered yet may serve it: not a 404.
            return Err(AdmitError::NoAvailableWorkers {
                model: ModelName::new(reflected(model)),
                detail: format!(
                    " ({} registered worker(s) have not answered yet)",
                    snapshot.unresolved
                ),
            });
        }
        Err(AdmitError::ModelNotFound {
            model: reflected(model),
        })
    }
}

/// The LoRA adapter a request names SGLang's way, when a pool is that adapter's and the model
/// asked for is not a pool of its own (unless `lora_path` names one).
fn sglang_adapter<'a>(snapshot: &Snapshot, facts: &'a RequestFacts<'_>) -> Option<&'a str> {
    let model = facts.model.as_deref()?;
    if snapshot.pools.contains_key(model) && facts.lora_path.is_none() {
        return None;
    }
    let named = sglang_named(facts)?;
    snapshot
        .pools
        .get(named)
        .filter(|pool| pool.adapter.is_some())
        .map(|_| named)
}

/// The adapter a request names as SGLang reads it: `model` as `base:adapter`, else the body's
/// `lora_path` (python/sglang/srt/entrypoints/openai/serving_base.py, `_resolve_lora_path`).
/// Such a body goes on as the client wrote it, for SGLang to read.
fn sglang_named<'a>(facts: &'a RequestFacts<'_>) -> Option<&'a str> {
    match facts.model.as_deref()?.split_once(':') {
        Some((_, adapter)) => Some(adapter.trim()),
        None => facts.lora_path.as_deref(),
    }
}

/// The model the ladder cascades a request for `model` to at the level now — only if that model
/// has workers: a cascade never turns a request that could be served into a 404.
fn cascaded<'a>(
    degrade: Option<&'a Degrader>,
    tier: sluice_core::admission::Tier,
    model: Option<&str>,
    snapshot: &Snapshot,
) -> Option<&'a str> {
    let from = model?;
    degrade?
        .cascade(tier, from, |model| {
            snapshot
                .pools
                .get(model)
                .is_some_and(|pool| pool.has_room_for(tier))
        })
        .filter(|to| snapshot.pools.contains_key(*to))
}
