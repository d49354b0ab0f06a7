//! The admit stage as the request path sees it: admission (`Admit::admit`), the ladder's hard
//! shedding, then placement, in one step whose answer the forward stage consumes.
//!
//! Placement finds the model's pool (or the model the ladder cascades the request to), judges
//! whether the client's deadline can be met there, and with the gateway queue waits for a turn
//! when no worker can take the request now. A request that waited is placed again, on the fleet
//! as it is then and at the ladder's level then, and its deadline judged again: the pool it
//! waited for may have changed while it waited. The answer is a `route::Placement`: the pool,
//! what the chooser reads of the request, and the queue's turn, which the forward stage gives
//! back when it leases the first worker.

use std::sync::Arc;

use sluice_core::admission::Tier;

use super::degrade::Degrader;
use super::{Admit, Asking};
use tokio::time::Instant;

use crate::context::RequestContext;
use crate::error::{reflected, GatewayError};
use crate::fleet::{Fleet, Snapshot};
use crate::route::{Placement, RouteStage, Turn, Wants};

/// The admit stage, shared by every request: admission, the chooser it places with, the fleet
/// it places on, and the ladder.
pub struct AdmitStage {
    pub admit: Arc<Admit>,
    pub fleet: Arc<Fleet>,
    pub route: RouteStage,
    /// The degradation ladder, when steps are configured.
    pub degrade: Option<Arc<Degrader>>,
}

/// An admitted request's placement (which the forward stage consumes), and what the front stage
/// needs to write the body it sends: the request's tier and the ladder, when it may change it.
pub struct Placed<'s> {
    pub placement: Placement<'s>,
    pub tier: Tier,
    pub degrade: Option<&'s Degrader>,
}

impl AdmitStage {
    /// Admits the request in `ctx` and places it, or refuses it. `takes_model`: its route names
    /// a model, so the ladder applies to it.
    pub async fn place(
        &self,
        ctx: &mut RequestContext,
        asking: &Asking<'_>,
        wants: Wants<'_>,
        takes_model: bool,
    ) -> Result<Placed<'_>, GatewayError> {
        self.admit.admit(ctx, asking).await?;
        let tier = ctx.admission.tier.unwrap_or(Tier::Agent);
        let wants = Wants { tier, ..wants };
        let degrade = self.degrade.as_deref().filter(|_| takes_model);
        if let Some(degrade) = degrade {
            degrade
                .shed(tier)
                .inspect_err(|e| self.admit.count_rejected(ctx, e))?;
        }
        let mut turn: Option<Turn> = None;
        loop {
            let snapshot = self.fleet.snapshot();
            let (wanted, cascade) = cascaded(degrade, tier, wants, &snapshot);
            let pool = self.route.pool(&snapshot, &wanted).inspect_err(|_| {
                ctx.model = wants
                    .model
                    .map(|m| sluice_core::ModelName::new(reflected(m)));
            })?;
            ctx.model = Some(pool.model.clone());
            self.admit.feasible(ctx, &pool, wanted.prompt_tokens)?;
            if turn.is_none() {
                let asked = Instant::now();
                if let Some(called) = self.admit.wait_room(ctx, &pool, &snapshot).await? {
                    ctx.queued(asked.elapsed());
                    turn = Some(called);
                    continue;
                }
            }
            if let (Some(degrade), Some(to)) = (degrade, cascade) {
                degrade.cascaded(tier, to, &mut ctx.degraded);
                ctx.admission.hold(degrade.diverting());
            }
            self.admit.count_admitted(ctx);
            let held = self.route.held_keys(&pool, &wanted).await;
            let placement = Placement {
                request: self.route.request(&pool, &wanted, held),
                pool,
                stage: &self.route,
                turn: turn.unwrap_or_default(),
            };
            return Ok(Placed {
                placement,
                tier,
                degrade,
            });
        }
    }
}

/// `wants` sent to another model when the ladder cascades it at the level now — and only if
/// that model has workers: a cascade never turns a request that could be served into a 404.
fn cascaded<'a>(
    degrade: Option<&'a Degrader>,
    tier: Tier,
    wants: Wants<'a>,
    snapshot: &Snapshot,
) -> (Wants<'a>, Option<&'a str>) {
    let to = degrade
        .and_then(|d| {
            let from = wants.model?;
            d.cascade(tier, from, |model| {
                snapshot
                    .pools
                    .get(model)
                    .is_some_and(|pool| pool.has_room_for(tier))
            })
        })
        .filter(|to| snapshot.pools.contains_key(*to));
    let model = to.or(wants.model);
    (Wants { model, ..wants }, to)
}
