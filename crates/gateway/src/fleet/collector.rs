//! Per-worker gauges read from the fleet at scrape time, so they can never disagree with what
//! routing sees: in-flight requests, adaptive limits, circuit state, and which workers exist.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use sluice_core::health::HealthState;
use sluice_core::overload::VetoClass;

use super::atomic::Packed;

use super::{Fleet, Worker};

#[derive(Debug)]
pub(crate) struct FleetCollector(pub Arc<Fleet>);

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").finish_non_exhaustive()
    }
}

impl Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.0.snapshot();
        let workers = &snapshot.workers;
        per_worker(
            &mut encoder,
            (
                "worker_in_flight",
                "Requests in flight through this gateway, per worker",
            ),
            workers,
            |w| Some(w.in_flight() as i64),
        )?;
        per_worker(
            &mut encoder,
            ("worker_concurrency_limit", "Each worker's adaptive concurrency limit (--adaptive-concurrency): this gateway's requests in flight on it at most"),
            workers,
            |w| w.adaptive.limit().map(|limit| limit as i64),
        )?;
        per_worker(
            &mut encoder,
            (
                "worker_circuit_state",
                "Circuit breaker state per worker: 0 closed, 1 open, 2 half-open",
            ),
            workers,
            |w| Some(w.breaker.state().gauge()),
        )?;
        let mut family = encoder.encode_descriptor(
            "workers_overloaded",
            "Workers of each model kept out of routing as full (over a ceiling, busy, or at capacity)",
            None,
            MetricType::Gauge,
        )?;
        for (model, pool) in &snapshot.pools {
            let full = pool
                .workers
                .iter()
                .filter(|w| w.veto_class() == Some(VetoClass::Overload))
                .count();
            let labels = [("model", model.as_str())];
            ConstGauge::new(full as i64).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "worker_stalled",
            "1 while a worker is vetoed by liveness, by reason (unreachable, wedged, unresponsive)",
            None,
            MetricType::Gauge,
        )?;
        for w in &snapshot.workers {
            let vetoed = w.vetoes.liveness().map(|v| v.reason());
            for reason in ["unreachable", "wedged", "unresponsive"] {
                let labels = [("worker", w.id.as_str()), ("reason", reason)];
                let value = i64::from(vetoed == Some(reason));
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        encode_kv_events(&mut encoder, &snapshot.workers)?;
        encode_adapters(&mut encoder, &snapshot.workers)?;
        encode_prediction_errors(&mut encoder, &snapshot.workers)?;
        encode_identity(&mut encoder, &snapshot.workers)
    }
}

/// One gauge per worker, `value` of each (none for a worker it says nothing of).
fn per_worker(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    workers: &[Arc<Worker>],
    value: impl Fn(&Worker) -> Option<i64>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for w in workers {
        if let Some(value) = value(w) {
            let labels = [("worker", w.id.as_str())];
            ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// What each worker is (its URL and flavor) and the health state it is in.
fn encode_identity(
    encoder: &mut DescriptorEncoder,
    workers: &[Arc<Worker>],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
            "worker_info",
            "Registered workers: id, URL and flavor (value 1); labels that do not change while the worker lives",
            None,
            MetricType::Gauge,
        )?;
    for w in workers {
        let url = w.live().spec.url.clone();
        let flavor = w
            .info()
            .map_or_else(|| "unknown".to_string(), |i| i.flavor.clone());
        let labels = [
            ("worker", w.id.as_str()),
            ("url", url.as_str()),
            ("flavor", flavor.as_str()),
        ];
        ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "worker_state",
        "Each worker's health state: 1 for the state it is in, 0 for the others",
        None,
        MetricType::Gauge,
    )?;
    for w in workers {
        let now = w.status();
        for &state in HealthState::ALL {
            let labels = [("worker", w.id.as_str()), ("state", state.as_str())];
            ConstGauge::new(i64::from(state == now)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Each worker's LoRA adapter slots as its engine last reported them, the adapters running and
/// waiting there, and this gateway's requests in flight per adapter: what routing by adapter
/// reads (`Worker::adapter_affinity`).
fn encode_adapters(
    encoder: &mut DescriptorEncoder,
    workers: &[Arc<Worker>],
) -> Result<(), std::fmt::Error> {
    let slots = |w: &Worker| w.vetoes.load().and_then(|l| l.report.adapters.clone());
    per_worker(
        encoder,
        ("worker_lora_slots", "LoRA adapters one running batch of each worker's engine may hold (vLLM max_lora, SGLang's slots_total), as it last reported"),
        workers,
        |w| slots(w)?.max.map(i64::from),
    )?;
    per_worker(
        encoder,
        ("worker_lora_slots_taken", "Adapter slots taken on each worker: the adapters its engine reports running and those of this gateway's requests in flight there"),
        workers,
        |w| {
            let names = w.adapters.names();
            let here: Vec<&str> = names.iter().map(|n| &**n).collect();
            Some(i64::from(slots(w)?.taken(&here)))
        },
    )?;
    let mut family = encoder.encode_descriptor(
        "worker_lora_adapter",
        "1 for each adapter a worker's engine reports with requests running or waiting (vLLM's lora_requests_info)",
        None,
        MetricType::Gauge,
    )?;
    for w in workers {
        let Some(slots) = slots(w) else { continue };
        for (state, names) in [("running", &slots.running), ("waiting", &slots.waiting)] {
            for adapter in names {
                let labels = [
                    ("worker", w.id.as_str()),
                    ("adapter", adapter.as_str()),
                    ("state", state),
                ];
                ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    let mut family = encoder.encode_descriptor(
        "worker_adapter_in_flight",
        "This gateway's requests in flight per worker and LoRA adapter",
        None,
        MetricType::Gauge,
    )?;
    for w in workers {
        for (adapter, n) in w.adapters.counts() {
            let labels = [("worker", w.id.as_str()), ("adapter", &*adapter)];
            ConstGauge::new(n as i64).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// How wrong each worker's latency predictions have been.
fn encode_prediction_errors(
    encoder: &mut DescriptorEncoder,
    workers: &[Arc<Worker>],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "worker_prediction_error",
        "Mean absolute percentage error (a fraction) of each worker's predicted time to first token (first tokens of 100 ms or more) and time per output token",
        None,
        MetricType::Gauge,
    )?;
    for w in workers {
        for (kind, error) in w.latency.errors() {
            if let Some(error) = error {
                let labels = [("worker", w.id.as_str()), ("kind", kind)];
                ConstGauge::new(error).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// What each worker's KV events say and did, for the workers that have sent any.
fn encode_kv_events(
    encoder: &mut DescriptorEncoder,
    workers: &[Arc<super::Worker>],
) -> Result<(), std::fmt::Error> {
    let views: Vec<_> = workers
        .iter()
        .map(|w| (w.id.as_str(), w.held.view()))
        .filter(|(_, v)| v.batches > 0)
        .collect();
    let mut family = encoder.encode_descriptor(
        "worker_kv_blocks_held",
        "KV blocks each worker's engine holds, as its KV events say (summed over its ranks)",
        None,
        MetricType::Gauge,
    )?;
    for (worker, view) in &views {
        ConstGauge::new(view.blocks as i64)
            .encode(family.encode_family(&[("worker", *worker)])?)?;
    }
    let mut family = encoder.encode_descriptor(
        "worker_kv_event_batches",
        "KV-event batches received from each worker's engine",
        None,
        MetricType::Counter,
    )?;
    for (worker, view) in &views {
        ConstCounter::new(view.batches).encode(family.encode_family(&[("worker", *worker)])?)?;
    }
    let mut family = encoder.encode_descriptor(
        "worker_kv_event_resets",
        "Times what a worker's engine was known to hold was forgotten: batches missed (gap) or a stream lost (lost)",
        None,
        MetricType::Counter,
    )?;
    for (worker, view) in &views {
        for (cause, n) in [("gap", view.gaps), ("lost", view.lost)] {
            let labels = [("worker", *worker), ("cause", cause)];
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}
