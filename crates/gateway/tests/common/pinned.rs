//! Engines whose reported load is pinned (`Fault::Report`), and a gateway that polls them fast:
//! what the overload and interactive-reserve tests share.

use std::time::Duration;

use super::*;

/// Polls every 50 ms.
pub fn fast_load(c: &mut Config) {
    c.control.load.interval = Duration::from_millis(50);
    c.control.load.min_interval = Duration::from_millis(10);
    c.control.load.poll_timeout = Duration::from_millis(500);
    c.route.shedding.retry_after = Duration::from_secs(10);
    c.access.keys.admin = Some(ADMIN_KEY.into());
}

/// Seed 000's rule as it reads, without the gateway queue the defaults add: a request every
/// worker vetoes is steered (or, with shedding, refused) at once rather than held.
pub fn steer_at_once(c: &mut Config) {
    c.admission.queue = None;
}

pub fn pin_waiting(waiting: u64) -> Fault {
    Fault::Report {
        rank: None,
        waiting: Some(waiting),
        running: None,
        kv_usage: None,
    }
}

/// Waits until `/workers` shows worker `id` vetoed as overloaded (its last report reached a
/// ceiling), or not.
pub async fn until_overloaded(s: &Setup, id: &str, what: &str, yes: bool) {
    s.until_worker(id, what, |w| w["vetoes"]["overloaded"] == yes)
        .await;
}

/// Waits until every worker's last report reached a ceiling.
pub async fn until_all_overloaded(s: &Setup) {
    s.until_workers("all vetoed", |workers| {
        workers.iter().all(|w| w["vetoes"]["overloaded"] == true)
    })
    .await;
}

/// Pins the first engine's queue at the default ceiling (8) and waits for its veto.
pub async fn overload_first_worker(s: &Setup) -> String {
    let id = s.worker_id(0).await;
    s.fault(0, pin_waiting(8)).await;
    until_overloaded(s, &id, "vetoed", true).await;
    id
}

/// One engine under `fault` from the start, behind a gateway tuned by `tune` whose polls are an
/// hour apart: the only regular report is the first, as soon as it is ready; any other is early.
pub async fn reported_once(fault: Fault, tune: impl FnOnce(&mut Config)) -> Setup {
    let sims = SimFleet::start(FleetConfig::local(1, instant(Flavor::Vllm)))
        .await
        .unwrap();
    sims.engine(0).unwrap().fault(fault).await.unwrap();
    let mut config = Config::local(&sims.urls());
    fast_load(&mut config);
    config.control.load.interval = Duration::from_secs(3600);
    tune(&mut config);
    serve(sims, config).await
}

/// Reports of `running` requests holding `kv_usage` of the cache, and no queue.
pub fn pin_load(running: u64, kv_usage: f64) -> Fault {
    Fault::Report {
        rank: None,
        waiting: Some(0),
        running: Some(running),
        kv_usage: Some(kv_usage),
    }
}

pub fn pin_kv(kv_usage: f64) -> Fault {
    Fault::Report {
        rank: None,
        waiting: None,
        running: None,
        kv_usage: Some(kv_usage),
    }
}
