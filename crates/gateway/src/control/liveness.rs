//! The liveness checker: one task that reads every worker's signals several times a second and
//! runs `sluice_core::liveness::judge`, so a veto lands at its threshold, not at the next poll.
//! It is the one writer of each worker's liveness veto.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_core::liveness::{judge, prefill_allowance, LivenessConfig, LivenessVeto, Observed};
use tokio::time::Instant;
use tracing::{info, warn};

use super::trial::Trials;
use crate::fleet::{Fleet, Heard, Worker};

/// How often the checker looks.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(200);

/// What the checker remembers of a worker between looks: the progress it last saw and the
/// pile at that moment (to tell a growing pile), and when the veto in force was set.
struct Seen {
    progress: u64,
    pile_at_progress: u32,
    vetoed_at: Option<Instant>,
}

/// What the judgment reads of one worker at `now`, from what its signals hold.
fn observe(
    worker: &Worker,
    heard: &Heard,
    seen: &mut Seen,
    cfg: &LivenessConfig,
    now: Instant,
) -> Observed {
    if seen.progress != heard.progress_stamp {
        seen.progress = heard.progress_stamp;
        seen.pile_at_progress = heard.pile;
    }
    let pending = worker.traffic.pending_requests() > 0;
    let mut silence = heard.silence.span(now, pending, cfg.unresponsive);
    // A token on a stream already answered is life too.
    silence.last_life = silence.last_life.max(heard.last_token);
    Observed {
        last_timeout: heard.last_timeout,
        last_contact: heard.last_contact,
        last_failure: heard.last_failure,
        last_progress: heard.last_progress,
        last_token: heard.last_token,
        pile: heard.pile,
        pile_at_progress: seen.pile_at_progress,
        pile_rule: worker.endpoint.grpc(),
        in_flight: worker.traffic.in_flight(),
        queue: worker.vetoes.load().map(|l| l.report.waiting()),
        engine_stalled_since: heard.engine_stalled_since,
        prefill_allowance: prefill_allowance(
            worker.traffic.pending_prefill_tokens(),
            worker.latency.prefill_rate().unwrap_or(0.0),
        ),
        silence,
        vetoed_at: seen.vetoed_at,
        // Only a gRPC worker's KV-event stream pushes load records.
        pushed_load: heard.pushed_load,
    }
}

/// Judges every worker every `CHECK_EVERY`, for as long as the fleet lives, and starts the
/// trials of those out awaiting progress (`trials`, unless turned off).
pub(super) async fn run_checker(
    fleet: Weak<Fleet>,
    cfg: LivenessConfig,
    mut trials: Option<Trials>,
) {
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(fleet) = fleet.upgrade() else {
            return;
        };
        let snapshot = fleet.snapshot();
        let now = Instant::now();
        let present = |key: u64| snapshot.workers.iter().any(|w| w.key == key);
        seen.retain(|key, _| present(*key));
        if let Some(trials) = &mut trials {
            trials.retain(present);
        }
        for worker in &snapshot.workers {
            let heard = worker.signals.heard();
            let entry = seen.entry(worker.key).or_insert_with(|| Seen {
                progress: heard.progress_stamp,
                pile_at_progress: heard.pile,
                vetoed_at: None,
            });
            let observed = observe(worker, &heard, entry, &cfg, now);
            let prev = worker.vetoes.liveness();
            let next = judge(prev, &observed, &cfg, now);
            if next != prev {
                entry.vetoed_at = next.map(|_| now);
                changed(&fleet, worker, prev, next, &observed, now);
            }
            if let Some(trials) = &mut trials {
                trials.consider(&fleet, worker, now);
            }
        }
    }
}

/// Publishes a liveness verdict, logs it with its numbers, and on re-admission after an outage
/// readmits the circuit the outage opened.
fn changed(
    fleet: &Fleet,
    worker: &Arc<Worker>,
    prev: Option<LivenessVeto>,
    next: Option<LivenessVeto>,
    o: &Observed,
    now: Instant,
) {
    worker.vetoes.set_liveness(next);
    if next == Some(LivenessVeto::Unresponsive) {
        // Its requests still waiting for a first byte may go elsewhere (the forward stage
        // decides, within its retry rules): nothing explains their wait.
        worker
            .vetoes
            .release_unanswered(worker.traffic.pending_requests());
    }
    let silent_ms = now.saturating_duration_since(o.last_contact).as_millis() as u64;
    let quiet_ms = now.saturating_duration_since(o.last_progress).as_millis() as u64;
    match next {
        Some(veto) => warn!(
            worker = %worker.id,
            reason = veto.reason(),
            cause = %veto,
            silent_ms,
            no_token_ms = quiet_ms,
            pile = o.pile,
            in_flight = o.in_flight,
            "worker vetoed by liveness"
        ),
        None => info!(
            worker = %worker.id,
            was = prev.map(|p| p.reason()),
            "worker re-admitted by liveness"
        ),
    }
    if next.is_none() && prev.is_some() {
        // The failures the outage caused may have opened its circuit (requests released by the
        // unresponsive rule, streams cut by a wedge): the sign of life that lifted the veto
        // lets the circuit try it again now, not a `--cb-timeout-duration-secs` later.
        worker.breaker.readmit();
    }
    fleet.announce();
}
