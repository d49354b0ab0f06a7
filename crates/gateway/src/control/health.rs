//! Background health checks: each worker probed on its own schedule, the results fed to the
//! health state machine (`sluice_core::health`), and what a state change implies acted on —
//! breaker readmission on promotion, removal of failed workers when auto-recovery is on, the
//! `sluice_worker_health` gauge and one log line with the cause.
//!
//! A `grpc://` worker is probed with its servicer's `HealthCheck` (a one-token generation) instead;
//! while no worker has served the model's tokenizer, each passing probe asks for it again.
//! A probe is `GET <worker url><--health-check-endpoint>` with the worker's API key as a bearer
//! token; it passes on a 2xx within the timeout. Every worker has its own task, so a slow one
//! delays nobody else, and a semaphore keeps at most `MAX_PROBES_IN_FLIGHT` probes out at once.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_core::health::{HealthState, Probe, Thresholds};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{get, Control};
use crate::fleet::{Fleet, HealthOverrides, ProbeRecord, Worker};
use crate::upstream::{GetError, Upstream};

/// At most this many probes are out at once, fleet-wide.
pub const MAX_PROBES_IN_FLIGHT: usize = 128;

/// The gateway-wide health-check settings (the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    /// Path probed on each worker, e.g. `/health`.
    pub endpoint: String,
    pub disabled: bool,
    /// Remove a worker that reaches Failed (auto-recovery); otherwise it stays and is probed.
    pub remove_unhealthy: bool,
}

impl Default for HealthConfig {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            thresholds: Thresholds {
                failure: 3,
                success: 2,
            },
            endpoint: "/health".into(),
            disabled: false,
            remove_unhealthy: false,
        }
    }
}

/// What applies to one worker: the gateway's values with the worker's `health` block on top.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Effective {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) thresholds: Thresholds,
    pub(crate) disabled: bool,
    pub(crate) drain_settle: Duration,
}

/// Seconds already validated (finite, in range) when the spec was parsed.
fn secs(value: Option<f64>, default: Duration) -> Duration {
    value
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(default)
}

impl HealthConfig {
    pub(crate) fn for_worker(&self, o: &HealthOverrides, drain_settle: Duration) -> Effective {
        Effective {
            interval: secs(o.check_interval_secs, self.interval),
            timeout: secs(o.timeout_secs, self.timeout),
            thresholds: Thresholds {
                failure: o.failure_threshold.unwrap_or(self.thresholds.failure),
                success: o.success_threshold.unwrap_or(self.thresholds.success),
            },
            disabled: o.disable_health_check.unwrap_or(self.disabled),
            drain_settle: secs(o.drain_settle_secs, drain_settle),
        }
    }
}

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Get(#[from] GetError),
    #[error("answered {0}")]
    Status(u16),
    /// A gRPC worker's `HealthCheck` failed as a call.
    #[error("HealthCheck failed: {0}")]
    Grpc(tonic::Status),
    /// A gRPC worker's `HealthCheck` answered unhealthy, with its servicer's reason.
    #[error("HealthCheck answered unhealthy: {0}")]
    Unhealthy(String),
}

impl ProbeError {
    /// A connection-level failure (a liveness signal), as opposed to a timeout or a bad status.
    pub(crate) fn is_transport(&self) -> bool {
        match self {
            ProbeError::Get(e) => e.is_transport(),
            ProbeError::Grpc(status) => std::error::Error::source(status).is_some(),
            ProbeError::Status(_) | ProbeError::Unhealthy(_) => false,
        }
    }
}

/// A health body says nothing a status does not; this much of it is read and dropped, so the
/// connection can be reused.
const PROBE_MAX_BYTES: usize = 64 * 1024;

/// One probe: `GET` the endpoint, 2xx within `timeout`.
pub async fn probe(
    upstream: &Upstream,
    worker: &Worker,
    endpoint: &str,
    timeout: Duration,
) -> Result<(), ProbeError> {
    if worker.endpoint.grpc() {
        // The servicer's own probe (one token through the scheduler), as SMG asks it.
        let answer = upstream
            .grpc()
            .health(&worker.endpoint, timeout)
            .await
            .map_err(ProbeError::Grpc)?;
        return if answer.healthy {
            // A tokenizer none of the workers could serve at registration is asked for again
            // on every passing probe, until one has.
            if let Err(e) = upstream.grpc().fetch_tokenizer(&worker.endpoint).await {
                warn!(worker = %worker.id, error = %e, "the worker's tokenizer could not be loaded");
            }
            Ok(())
        } else {
            Err(ProbeError::Unhealthy(answer.message))
        };
    }
    let (status, _) = get(upstream, worker, endpoint, PROBE_MAX_BYTES, timeout).await?;
    if status.is_success() {
        Ok(())
    } else {
        Err(ProbeError::Status(status.as_u16()))
    }
}

/// Probes one worker for as long as it is registered: at once, then every interval (its own,
/// re-read each round, so a PATCH applies from the next probe).
pub(super) async fn run_prober(fleet: Weak<Fleet>, worker: Arc<Worker>, control: Arc<Control>) {
    loop {
        let Some(effective) = fleet.upgrade().map(|f| control.health_of(&f, &worker)) else {
            return;
        };
        if worker.status() == HealthState::Draining {
            return;
        }
        let round = Instant::now();
        if effective.disabled {
            if let Some(fleet) = fleet.upgrade() {
                checks_disabled(&fleet, &worker);
            }
        } else {
            let result = {
                let Ok(_permit) = control.probe_permits.acquire().await else {
                    return;
                };
                let endpoint = &control.settings.health.endpoint;
                probe(&control.upstream, &worker, endpoint, effective.timeout).await
            };
            let Some(fleet) = fleet.upgrade() else {
                return;
            };
            worker.health.set_last_probe(ProbeRecord {
                error: result.as_ref().err().map(ToString::to_string),
                at: Instant::now(),
            });
            // `/workers` shows the last probe: waiters on the fleet's changes may look again.
            fleet.announce();
            match &result {
                Err(e) if e.is_transport() => worker.signals.transport_failure(Instant::now()),
                Err(ProbeError::Get(e)) if e.is_timeout() => worker.signals.timeout(Instant::now()),
                Err(ProbeError::Status(_)) => worker.signals.contact(Instant::now()),
                _ => {}
            }
            let probe = match result {
                Ok(()) => Probe::Pass,
                Err(_) => Probe::Fail,
            };
            probed(&fleet, &control, &worker, probe, effective.thresholds);
        }
        tokio::time::sleep_until(round + effective.interval).await;
    }
}

/// A probe of `worker` ended: the state machine moves, and a worker that reached Failed is
/// removed when auto-recovery is on.
fn probed(
    fleet: &Arc<Fleet>,
    control: &Control,
    worker: &Arc<Worker>,
    probe: Probe,
    thresholds: Thresholds,
) {
    if probe == Probe::Pass {
        worker.signals.contact(Instant::now());
    }
    fleet.metrics().count_health_check(probe == Probe::Pass);
    let Some(t) = worker
        .health
        .change(|h| h.probe(probe, thresholds, Instant::now()))
    else {
        return;
    };
    fleet.health_changed(worker, t);
    if t.to == HealthState::Failed && control.settings.health.remove_unhealthy {
        info!(worker = %worker.id, "removing the failed worker (--remove-unhealthy-workers)");
        fleet.remove_now(worker);
    }
}

/// Probing is off for `worker`: nothing but probes could bring a NotReady or Failed worker back,
/// so it is Ready again.
fn checks_disabled(fleet: &Fleet, worker: &Worker) {
    if let Some(t) = worker.health.change(|h| h.checks_disabled(Instant::now())) {
        fleet.health_changed(worker, t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_block_overrides_field_by_field() {
        let gateway = HealthConfig {
            disabled: true,
            ..HealthConfig::default()
        };
        let settle = Duration::from_secs(5);
        let plain = gateway.for_worker(&HealthOverrides::default(), settle);
        assert_eq!(plain.interval, Duration::from_secs(60));
        assert_eq!(
            plain.thresholds,
            Thresholds {
                failure: 3,
                success: 2
            }
        );
        assert!(plain.disabled);
        assert_eq!(plain.drain_settle, settle);
        let own = HealthOverrides {
            check_interval_secs: Some(0.5),
            failure_threshold: Some(7),
            disable_health_check: Some(false),
            drain_settle_secs: Some(0.0),
            ..HealthOverrides::default()
        };
        let e = gateway.for_worker(&own, settle);
        assert_eq!(e.interval, Duration::from_millis(500));
        assert_eq!(e.timeout, Duration::from_secs(5), "unset: the flag's value");
        assert_eq!(
            e.thresholds,
            Thresholds {
                failure: 7,
                success: 2
            }
        );
        assert!(
            !e.disabled,
            "a worker may turn probes on under --disable-health-check"
        );
        assert!(e.drain_settle.is_zero());
    }
}
