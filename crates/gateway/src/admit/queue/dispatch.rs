//! The queue's dispatcher: the one task that sends waiters out as room opens, and that refuses
//! the waiters who can no longer be helped by waiting — cut by their tier's CoDel, or shed
//! because every worker of their model is over its ceiling and room stopped freeing there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::admission::drain;
use sluice_core::admission::{Ticket, Tier, Waiter};
use sluice_core::ModelName;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{Called, GatewayQueue, Waiting, TURN_BOUND};
use crate::fleet::{Fleet, Snapshot};

impl GatewayQueue {
    /// Lets each tier's CoDel judge its head, refusing the heads it drops; returns when to look
    /// again if nothing else happens.
    fn cut_standing(&self) -> Option<Instant> {
        let codel = self.codel.as_ref()?;
        let (dropped, next_look) =
            codel.cut(&mut self.waiting.lock(), |w| w.arrived, Instant::now());
        if !dropped.is_empty() {
            for waiter in dropped {
                let _ = waiter.item.turn.send(Called::Dropped);
            }
            self.count_depth();
        }
        next_look
    }

    /// With `--worker-overload-shed`, sheds the waiters whose wait has become hopeless: every
    /// candidate of their model over its ceiling and room not freeing on them in time even for
    /// the first in line (`drain::overload_hopeless`) — reports that stood still since the
    /// waiter came, with nothing ended. Judged whenever the dispatcher looks and sends no one,
    /// so at each report.
    fn shed_hopeless(&self, snapshot: &Snapshot, now: Instant) {
        if !self.config.shed {
            return;
        }
        let mut waits: HashMap<(ModelName, Tier), Option<Duration>> = HashMap::new();
        let mut waiting = self.waiting.lock();
        let shed = waiting.remove_where(|w| {
            let wait = *waits
                .entry((w.item.model.clone(), w.tier))
                .or_insert_with(|| {
                    let over = snapshot.pools.get(&w.item.model)?.over_ceilings(w.tier)?;
                    Some(drain::overload_wait(0, &over))
                });
            wait.is_some_and(|wait| {
                drain::overload_hopeless(w.tier, wait, w.item.until.saturating_duration_since(now))
            })
        });
        drop(waiting);
        if !shed.is_empty() {
            for waiter in shed {
                let _ = waiter.item.turn.send(Called::Shed);
            }
            self.count_depth();
        }
    }

    /// The waiter to send now, if any: the first with room in time for what is left of its
    /// tier's first-token objective; with `--policy predicted`, when none can still be in time,
    /// the first with room in time for a fresh request (it is late whatever it does, and the
    /// room would go unused until an arrival).
    fn next_ready(
        &self,
        snapshot: &Snapshot,
        slots_free: &impl Fn() -> bool,
    ) -> Option<(Ticket, Waiter<Waiting>)> {
        let now = Instant::now();
        let pool = |w: &Waiter<Waiting>| snapshot.pools.get(&w.item.model);
        let in_time = |w: &Waiter<Waiting>| {
            let waited = now.saturating_duration_since(w.item.arrived);
            slots_free() && pool(w).is_some_and(|p| p.has_room_after(w.tier, waited))
        };
        let late = |w: &Waiter<Waiting>| {
            slots_free()
                && pool(w).is_some_and(|p| p.gates_by_prediction() && p.has_room_for(w.tier))
        };
        let predicting = snapshot.pools.values().any(|p| p.gates_by_prediction());
        let mut waiting = self.waiting.lock();
        waiting
            .pop_first(in_time)
            .or_else(|| predicting.then(|| waiting.pop_first(late)).flatten())
    }

    /// The dispatcher: sends waiters out as room opens, until `stop`.
    pub(crate) async fn dispatch(
        self: Arc<Self>,
        fleet: Arc<Fleet>,
        slots_free: impl Fn() -> bool + Send + 'static,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut changes = fleet.changes();
        loop {
            changes.borrow_and_update();
            let codel_look = self.cut_standing();
            let snapshot = fleet.snapshot();
            let next = self.next_ready(&snapshot, &slots_free);
            if let Some((_, waiter)) = next {
                self.count_depth();
                let (ack, taken) = oneshot::channel();
                *self.in_transit.lock() = Some(waiter.item.model.clone());
                if waiter.item.turn.send(Called::Go(ack)).is_ok() {
                    self.rates.lock().dispatched(Instant::now());
                    // Until it has its worker, the room it was sent to is not counted yet.
                    tokio::select! {
                        _ = taken => {}
                        () = tokio::time::sleep(TURN_BOUND) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
                *self.in_transit.lock() = None;
                continue;
            }
            self.shed_hopeless(&snapshot, Instant::now());
            let (next_room, idle) = {
                let waiting = self.waiting.lock();
                let next_room = waiting
                    .waiters()
                    .filter_map(|w| snapshot.pools.get(&w.item.model)?.next_room())
                    .chain(codel_look)
                    .min();
                (next_room, waiting.is_empty())
            };
            let room_at = async {
                match next_room {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // With nobody waiting, a freed place or a fleet change has no one to send: only an
            // arrival (`kick`) or CoDel's next look matters. Waking on every request's end cost
            // each request 3k instructions, 5% of its path (docs/benchmarks.md).
            tokio::select! {
                () = self.kick.notified() => {}
                () = fleet.freed(), if !idle => {}
                _ = changes.changed(), if !idle => {}
                () = room_at => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}
