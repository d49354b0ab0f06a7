//! State several gateway replicas share through Redis (`--redis-url`): tenant budgets and
//! concurrency caps, the gateway-wide request rate and `--max-concurrent-requests`, and each
//! replica's requests waiting for a first byte on each worker.
//!
//! Decisions stay local: a replica claims budget in chunks and holds a grant of slots, so a
//! request is admitted without a round trip unless its replica has run short (then one call,
//! bounded by `--redis-timeout-ms`). The atomic steps run in Redis as scripts, so replicas
//! claiming at once never together take more than a budget holds. One task per gateway beats
//! four times a second: it gives back what the replica does not need, renews its leases,
//! counts the live replicas, publishes its requests per worker (waiting for a first byte, and
//! in flight) and learns the others' (so the overload veto projects, and the policies weigh,
//! every replica's requests), and — while Redis is away — reconnects, then reconciles what was
//! spent apart before shared limits resume.
//!
//! ## Layout
//!
//! - `store` — the connection, the scripts, up or down, the replica count.
//! - `budget` — a shared rate budget, and its local form while Redis is away.
//! - `slots` — a shared concurrency cap, each replica's grant valid while its lease lives.

mod budget;
mod slots;
mod store;

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::warn;

pub(crate) use budget::{SharedBudget, Short};

use crate::fleet::Fleet;
pub(crate) use slots::SharedSlots;
pub use store::{SharedState, Store, StoreError};

/// How long a replica's grants and its place in the count live without renewal.
pub(crate) const LEASE: Duration = Duration::from_secs(10);

/// `--redis-url` and how to use it.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedConfig {
    pub url: String,
    /// `--redis-fail-open`: local limits (a share each) while Redis is away, instead of refusing.
    pub fail_open: bool,
    /// `--redis-timeout-ms`: the longest a request waits on Redis.
    pub timeout: Duration,
    /// How long a replica's grants outlive its last renewal (`LEASE`; shorter in tests).
    pub lease: Duration,
    /// For `rediss://`: the CAs and client certificate of `--ca-cert-paths`,
    /// `--client-cert-path` and `--client-key-path`, when given.
    pub tls: Option<RedisTls>,
}

/// Certificates for a Redis reached over TLS, as PEM.
#[derive(Clone, PartialEq)]
pub struct RedisTls {
    /// CAs trusted instead of the system's.
    pub roots: Option<Vec<u8>>,
    /// The client certificate and key shown to a Redis that asks for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("roots", &self.roots.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// Why `--redis-url` cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("--redis-url: {0}")]
pub struct SharedError(#[from] redis::RedisError);

/// How often the shared state's task beats.
const BEAT: Duration = Duration::from_millis(250);
/// How often the replica renews its lease at most (and at least four times per lease).
const HEARTBEAT: Duration = Duration::from_secs(1);

/// The shared state of one gateway replica.
pub(crate) struct Shared {
    store: Arc<Store>,
    budgets: Mutex<Vec<Arc<SharedBudget>>>,
    caps: Mutex<Vec<Arc<SharedSlots>>>,
    /// Called when a beat grew a grant: room for requests waiting in the gateway queue.
    on_room: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The shared state of `config`, not connected yet (`connect`), its metrics registered.
    pub fn new(config: &SharedConfig, registry: &mut Registry) -> Result<Arc<Self>, SharedError> {
        let client = match &config.tls {
            None => redis::Client::open(config.url.as_str())?,
            Some(tls) => redis::Client::build_with_tls(
                config.url.as_str(),
                redis::TlsCertificates {
                    client_tls: tls
                        .identity
                        .clone()
                        .map(|(cert, key)| redis::ClientTlsConfig {
                            client_cert: cert,
                            client_key: key,
                        }),
                    root_cert: tls.roots.clone(),
                },
            )?,
        };
        Ok(Arc::new(Self {
            store: Arc::new(Store::new(client, config, registry)),
            budgets: Mutex::default(),
            caps: Mutex::default(),
            on_room: Mutex::default(),
        }))
    }

    /// A budget of `capacity` per `period`, shared under `name`.
    pub(crate) fn budget(&self, name: &str, capacity: u64, period: Duration) -> Arc<SharedBudget> {
        let budget = Arc::new(SharedBudget::new(
            self.store.clone(),
            name,
            capacity,
            period,
        ));
        self.budgets.lock().push(budget.clone());
        budget
    }

    /// A concurrency cap of `cap`, shared under `name`.
    pub(crate) fn slots(&self, name: &str, cap: u64) -> Arc<SharedSlots> {
        let slots = Arc::new(SharedSlots::new(self.store.clone(), name, cap));
        self.caps.lock().push(slots.clone());
        slots
    }

    /// Calls `f` whenever a beat may have opened room under a cap.
    pub(crate) fn on_room(&self, f: impl Fn() + Send + Sync + 'static) {
        self.on_room.lock().push(Box::new(f));
    }

    /// Changes whenever Redis goes away or comes back.
    pub fn changes(&self) -> watch::Receiver<SharedState> {
        self.store.changes()
    }

    /// Connects before the gateway serves, so its first requests see the shared limits; if
    /// Redis does not answer, the gateway starts on local limits and the task keeps trying.
    pub(crate) async fn connect(&self) {
        if !self.rejoin(true).await {
            self.store.fell_back_at_start();
            warn!("Redis does not answer at startup: limits are local until it does");
        }
    }

    /// Connects (if need be), reconciles and resumes the shared limits. Whether it did.
    async fn rejoin(&self, first: bool) -> bool {
        if !self.store.connected() && !self.store.connect().await {
            return false;
        }
        if self.store.heartbeat().await.is_err() {
            return false;
        }
        let budgets: Vec<_> = self.budgets.lock().clone();
        for budget in budgets {
            if !budget.reconcile().await {
                return false;
            }
        }
        let caps: Vec<_> = self.caps.lock().clone();
        for cap in caps {
            if !cap.renew(0).await {
                return false;
            }
        }
        self.store.came_back(first);
        true
    }

    /// Beats until `stop`, sharing the pending requests on `fleet`'s workers.
    pub(crate) async fn run(self: Arc<Self>, fleet: Weak<Fleet>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(BEAT);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let heartbeat = (self.store.lease() / 4).min(HEARTBEAT);
        let mut next_heartbeat = Instant::now();
        let mut next_connect = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let now = Instant::now();
            let Some(fleet) = fleet.upgrade() else {
                return;
            };
            if !self.store.up() {
                forget_elsewhere(&fleet);
                if now < next_connect {
                    continue;
                }
                next_connect = now + HEARTBEAT;
                if !self.rejoin(false).await {
                    continue;
                }
                self.room();
            }
            if now >= next_heartbeat {
                next_heartbeat = now + heartbeat;
                let _ = self.store.heartbeat().await;
            }
            self.beat(now).await;
            self.share_traffic(&fleet).await;
        }
    }

    /// Tells Redis this replica's requests on each worker (with no first byte yet, and in flight)
    /// and learns the others': the projected queues and the policies' loads count every
    /// replica's requests, not this one's alone.
    async fn share_traffic(&self, fleet: &Fleet) {
        let snapshot = fleet.snapshot();
        if snapshot.workers.is_empty() {
            return;
        }
        let mine: Vec<(&str, u64, u64)> = snapshot
            .workers
            .iter()
            .map(|w| {
                let t = &w.traffic;
                (w.id.as_str(), t.pending_requests(), t.in_flight())
            })
            .collect();
        let Ok(others) = self.store.share(&mine).await else {
            forget_elsewhere(fleet);
            return;
        };
        let mut changed = false;
        for (worker, (pending, in_flight)) in snapshot.workers.iter().zip(others) {
            changed |= worker.traffic.set_elsewhere(pending, in_flight);
        }
        if changed {
            fleet.announce();
        }
    }

    /// Gives back surplus budget and renews every grant (the headroom topped up, the lease
    /// extended).
    async fn beat(&self, now: Instant) {
        let budgets: Vec<_> = self.budgets.lock().clone();
        for budget in budgets {
            budget.give_back(now).await;
        }
        let caps: Vec<_> = self.caps.lock().clone();
        let mut grew = false;
        for cap in caps {
            let before = cap.has_free();
            if cap.renew(0).await && !before && cap.has_free() {
                grew = true;
            }
        }
        if grew {
            self.room();
        }
    }

    fn room(&self) {
        for f in self.on_room.lock().iter() {
            f();
        }
    }
}

/// With Redis away nothing is known of the other replicas' requests: they count as none, as
/// before sharing (a stale count would keep vetoing a worker they have left).
fn forget_elsewhere(fleet: &Fleet) {
    let mut changed = false;
    for worker in &fleet.snapshot().workers {
        changed |= worker.traffic.set_elsewhere(0, 0);
    }
    if changed {
        fleet.announce();
    }
}
