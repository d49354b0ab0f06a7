//! A worker's counts and judgements as the request path moves them through `Lease`.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use sluice_core::admission::drain::{AtReport, Starts};
use sluice_core::load::LoadReport;
use sluice_core::overload::{QueueGate, VetoClass};
use sluice_core::WorkerId;
use tokio::time::Instant;

use super::breaker::WorkerBreaker;
use super::lease::Lease;
use super::spec::WorkerSpec;
use super::veto::EngineLoad;
use super::worker::*;
use crate::metrics::Metrics;

fn worker() -> Arc<Worker> {
    let metrics = Metrics::register(&mut Registry::default());
    let changed = Arc::new(tokio::sync::watch::channel(0).0);
    let breaker = Arc::new(WorkerBreaker::new(
        "w",
        None,
        metrics.clone(),
        changed.clone(),
    ));
    let spec = WorkerSpec::from_url("http://127.0.0.1:1", None).unwrap();
    let metrics = metrics.for_worker("w", "round_robin");
    Arc::new(Worker::new(
        WorkerId::new("w"),
        spec,
        Origin::Api,
        false,
        breaker,
        metrics,
        Notices {
            freed: Arc::default(),
            changed,
        },
    ))
}

fn lease(w: &Arc<Worker>) -> Lease {
    let mut lease = Lease::acquire(w, 1).unwrap();
    lease.prefilling(100);
    lease
}

#[test]
fn a_lease_of_n_sequences_counts_and_gives_back_n() {
    let w = worker();
    let lease = Lease::acquire(&w, 3).unwrap();
    assert_eq!(w.in_flight(), 3);
    drop(lease);
    assert_eq!(w.in_flight(), 0, "it left 1 of 3 before");
}

#[test]
fn under_a_limit_a_lease_takes_a_place_or_none() {
    let w = worker();
    w.adaptive.set_limit(2);
    let first = Lease::acquire(&w, 1).unwrap();
    assert!(Lease::acquire(&w, 2).is_none(), "n=2 would pass the limit");
    let second = Lease::acquire(&w, 1).unwrap();
    assert!(w.at_limit(1));
    assert!(Lease::acquire(&w, 1).is_none());
    assert_eq!(w.in_flight(), 2, "a refused lease leaves nothing behind");
    drop((first, second));
    assert!(
        Lease::acquire(&w, 5).is_some(),
        "an idle worker takes any request"
    );
}

/// A load report of `waiting` under a waiting ceiling of 4, taken with `pending` requests
/// unanswered.
fn reported(w: &Worker, waiting: u64, pending: u64) {
    let report = EngineLoad {
        report: LoadReport::default(),
        source: "/metrics",
        at: Instant::now(),
        overload: None,
        busy: false,
        silent_since: None,
        kv_per_request: None,
        starts: Starts::first(AtReport::new(0, (0, 0), Instant::now())),
    };
    let gate = QueueGate {
        waiting,
        pending_at_report: pending,
        ceiling: Some(4),
        kv_full: false,
        room: Some(0),
    };
    w.vetoes.report(report, gate);
}

#[test]
fn leases_count_requests_without_a_first_byte_and_the_queue_veto_follows_them() {
    let w = worker();
    let mut started = lease(&w);
    let mut held: Vec<Lease> = (0..2).map(|_| lease(&w)).collect();
    assert_eq!(w.traffic.pending_requests(), 3);
    assert_eq!(w.traffic.pending_prefill_tokens(), 300);
    // A report: 4 waiting (the ceiling) while 3 of ours had no first byte.
    reported(&w, 4, w.traffic.pending_requests());
    assert_eq!(w.veto_class(), Some(VetoClass::Overload));
    started.first_byte();
    started.first_byte();
    assert_eq!(w.traffic.pending_requests(), 2, "counted once");
    assert_eq!(
        w.veto_class(),
        None,
        "one started: the queue is under its ceiling"
    );
    let next = lease(&w);
    assert_eq!(w.veto_class(), Some(VetoClass::Overload), "and full again");
    drop(next);
    held.pop();
    assert_eq!(
        w.traffic.pending_requests(),
        1,
        "a lease dropped before its first byte"
    );
    drop((started, held));
    assert_eq!(w.traffic.pending_requests(), 0);
    assert_eq!(w.traffic.pending_prefill_tokens(), 0);
    assert_eq!(w.in_flight(), 0);
}

#[test]
fn the_other_replicas_pending_requests_fill_the_projected_queue_too() {
    let w = worker();
    // A report: 2 waiting under a ceiling of 4, nobody's request pending then.
    reported(&w, 2, w.traffic.pending_everywhere());
    let mine = lease(&w);
    assert_eq!(w.veto_class(), None, "3 of 4");
    assert!(w.traffic.set_elsewhere(1, 1));
    assert_eq!(w.load_everywhere(), 2, "its request and the other's");
    assert_eq!(
        w.veto_class(),
        Some(VetoClass::Overload),
        "another replica's request makes 4"
    );
    assert!(!w.traffic.set_elsewhere(1, 1), "unchanged");
    w.traffic.set_elsewhere(0, 0);
    assert_eq!(w.veto_class(), None);
    drop(mine);
}
