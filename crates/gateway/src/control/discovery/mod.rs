//! Service discovery: workers listed by a source (a file, DNS, Kubernetes) registered,
//! re-registered and drained as the listing changes.
//!
//! Each source runs in one task. Once a second it may produce a new listing (the file changed,
//! the DNS answer is due); `Reconciler` turns the difference from the last listing into fleet
//! calls (`sluice_core::discovery::diff`) and touches only workers the source registered, so
//! workers from `--worker-urls` or the admin API are never drained by a listing that omits them.
//!
//! Auto-recovery follows discovery (seed 004): when the gateway removes a listed worker (it
//! reached Failed, or an admin deleted it), the source does not register it again at once — it
//! is held until its health endpoint answers 2xx, asked once per `--health-check-interval-secs`.
//!
//! ## Layout
//!
//! - `file` — `--discovery-file`: a JSON or TOML listing, reread when it changes, on SIGHUP and
//!   every `--discovery-check-interval-secs`.
//! - `dns` — `--discovery-dns NAME:PORT`: every address the name resolves to, re-resolved every
//!   `--discovery-check-interval-secs`; the resolver is injectable.
//! - `kubernetes` — `--service-discovery`: Ready pods matching `--selector`, watched through the
//!   API server (kube-rs's watcher: list, then watch, relisting when the watch is too old).
//! - `pods` — what both Kubernetes watchers make of a pod, and a watch's mirror of objects.
//! - `pool` — an InferencePool's Ready pods on its target ports (`sluice epp --pool-name`), the
//!   pool watched beside its namespace's pods.

mod dns;
mod file;
mod kubernetes;
mod pods;
pub mod pool;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use serde::Serialize;
use sluice_core::discovery::diff;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

pub use dns::{parse_target, DnsConfig, DnsSource, Resolve, SystemResolver};
pub use file::{parse_listing, FileConfig, FileSource, ListingError};
pub use kubernetes::{Cluster, KubeConfig, KubeError, KubeSource, Members, Selector};
pub use pods::{worker_of, Mirror, ModelFrom, BOOTSTRAP_PORT_ANNOTATION};
pub use pool::PoolRef;

use super::Control;
use crate::fleet::{Fleet, FleetError, Origin, Snapshot, Worker, WorkerSpec};
use crate::upstream;

/// A source's workers, by normalized URL.
pub(crate) type Listing = BTreeMap<String, WorkerSpec>;

/// How often a source is asked for news and removed workers are noticed.
const TEND_EVERY: Duration = Duration::from_secs(1);

/// The sources configured (`--discovery-file`, `--discovery-dns`, `--service-discovery`).
#[derive(Debug, Clone, Default)]
pub struct DiscoveryConfig {
    pub file: Option<FileConfig>,
    pub dns: Option<DnsConfig>,
    pub kubernetes: Option<KubeConfig>,
}

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("--discovery-file: {0}")]
    Listing(#[from] ListingError),
    #[error("--service-discovery: {0}")]
    Kubernetes(#[from] KubeError),
}

/// What one look at a source found.
#[derive(Debug)]
pub(crate) enum Look {
    /// Nothing new to read.
    Unchanged,
    /// The workers listed now.
    Listed(Listing),
    /// The source could not be read; the workers stay as they are.
    Failed(String),
}

/// A source of listings.
pub(crate) trait Source: Send + 'static {
    /// Written on the workers it registers.
    const ORIGIN: Origin;

    /// What it reads (a path, `NAME:PORT`), for logs and `GET /workers`.
    fn target(&self) -> String;

    /// Looks once; `asked` when SIGHUP asked to look again.
    fn poll(&mut self, asked: bool) -> impl Future<Output = Look> + Send;
}

/// What a source last did, as `GET /workers` shows it under `discovery`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SourceView {
    pub(crate) source: Origin,
    /// The file's path, or `NAME:PORT`.
    pub(crate) target: String,
    /// Workers in the listing acted on last.
    pub(crate) listed: usize,
    /// Listed workers the gateway removed, waiting for their health endpoint to answer.
    pub(crate) held: Vec<String>,
    /// Why the last look failed; cleared by the next that succeeds.
    pub(crate) error: Option<String>,
}

/// Starts every configured source in `tasks`; they stop with `stop`. The discovery file is read
/// and the Kubernetes client built first: a gateway given a file it cannot use, or no
/// credentials for the API server, does not start.
pub async fn start(
    config: &DiscoveryConfig,
    fleet: &Arc<Fleet>,
    control: &Arc<Control>,
    stop: &watch::Receiver<bool>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Result<(), DiscoveryError> {
    let weak = Arc::downgrade(fleet);
    let mut slot = 0;
    if let Some(file) = &config.file {
        let (source, first) = FileSource::open(file.clone())?;
        let driver = Driver::new(source, weak.clone(), control.clone(), slot);
        tasks.spawn(driver.run(first, stop.clone()));
        slot += 1;
    }
    if let Some(dns) = &config.dns {
        let driver = Driver::new(
            DnsSource::new(dns.clone()),
            weak.clone(),
            control.clone(),
            slot,
        );
        tasks.spawn(driver.run(None, stop.clone()));
        slot += 1;
    }
    if let Some(kubernetes) = &config.kubernetes {
        let source = KubeSource::start(kubernetes.clone()).await?;
        let driver = Driver::new(source, weak, control.clone(), slot);
        tasks.spawn(driver.run(None, stop.clone()));
    }
    Ok(())
}

/// One source's task: it looks, reconciles, and alone writes the source's view (`slot`).
struct Driver<S> {
    source: S,
    target: String,
    fleet: Weak<Fleet>,
    control: Arc<Control>,
    slot: usize,
    reconciler: Reconciler,
    /// The last failure, logged once until a look succeeds.
    error: Option<String>,
    /// Listened to from the start, so a SIGHUP after startup never meets the default action
    /// (which ends the process).
    hangups: Hangups,
}

impl<S: Source> Driver<S> {
    fn new(source: S, fleet: Weak<Fleet>, control: Arc<Control>, slot: usize) -> Self {
        Self {
            target: source.target(),
            source,
            fleet,
            control,
            slot,
            reconciler: Reconciler::new(S::ORIGIN),
            error: None,
            hangups: hangups(),
        }
    }

    /// Runs until `stop` (or the fleet is gone), starting from `first` if the source was
    /// already read once.
    async fn run(mut self, first: Option<Listing>, mut stop: watch::Receiver<bool>) {
        if let (Some(listing), Some(fleet)) = (first, self.fleet.upgrade()) {
            self.reconciler.apply(&fleet, listing);
        }
        let mut tick = tokio::time::interval(TEND_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            self.show();
            let asked = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = hangup(&mut self.hangups) => true,
                _ = stop.changed() => return,
            };
            let Some(fleet) = self.fleet.upgrade() else {
                return;
            };
            let look = self.source.poll(asked).await;
            self.looked(&fleet, look);
            self.reconciler.notice_removed(&fleet);
            self.reconciler.readmit_healthy(&fleet, &self.control).await;
        }
    }

    fn looked(&mut self, fleet: &Arc<Fleet>, look: Look) {
        let (origin, target) = (S::ORIGIN.as_str(), &self.target);
        match look {
            Look::Unchanged => {}
            Look::Listed(listing) => {
                if self.error.take().is_some() {
                    info!(origin, %target, "discovery reads again");
                }
                self.reconciler.apply(fleet, listing);
            }
            Look::Failed(e) => {
                if self.error.as_ref() != Some(&e) {
                    warn!(origin, %target, error = %e, "discovery failed: the workers stay as they are");
                    self.error = Some(e);
                }
            }
        }
    }

    /// Publishes the source's view; a change wakes whoever awaits the fleet's changes.
    fn show(&self) {
        let view = SourceView {
            source: S::ORIGIN,
            target: self.target.clone(),
            listed: self.reconciler.listed.len(),
            held: self.reconciler.held.iter().cloned().collect(),
            error: self.error.clone(),
        };
        if self.control.show_source(self.slot, view) {
            if let Some(fleet) = self.fleet.upgrade() {
                fleet.announce();
            }
        }
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

/// SIGHUP, where there is one to listen to.
fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::hangup())
            .map_err(
                |e| warn!(error = %e, "SIGHUP will not reread discovery: cannot listen for it"),
            )
            .ok()
    }
    #[cfg(not(unix))]
    None
}

/// The next SIGHUP; never, without a listener.
async fn hangup(hangups: &mut Hangups) -> Option<()> {
    #[cfg(unix)]
    if let Some(signal) = hangups {
        return signal.recv().await;
    }
    let _ = hangups;
    std::future::pending().await
}

/// One source's view of the fleet: the listing it acted on last, and the listed workers the
/// gateway removed.
struct Reconciler {
    origin: Origin,
    listed: Listing,
    /// Listed URLs with no worker registered: taken out while listed, registered again once
    /// their health endpoint answers.
    held: BTreeSet<String>,
    next_probe: Instant,
}

/// The worker registered at `url`, if any.
fn at_url<'a>(snapshot: &'a Snapshot, url: &str) -> Option<&'a Arc<Worker>> {
    snapshot.workers.iter().find(|w| w.live().spec.url == url)
}

impl Reconciler {
    fn new(origin: Origin) -> Self {
        Self {
            origin,
            listed: Listing::new(),
            held: BTreeSet::new(),
            next_probe: Instant::now(),
        }
    }

    /// The worker at `url` if this source registered it.
    fn ours(&self, snapshot: &Snapshot, url: &str) -> Option<Arc<Worker>> {
        at_url(snapshot, url)
            .filter(|w| w.origin == self.origin)
            .cloned()
    }

    fn apply(&mut self, fleet: &Arc<Fleet>, listing: Listing) {
        let changes = diff(&self.listed, &listing);
        if changes.is_empty() {
            return;
        }
        let snapshot = fleet.snapshot();
        for url in &changes.remove {
            self.held.remove(url);
            if let Some(worker) = self.ours(&snapshot, url) {
                info!(worker = %worker.id, origin = self.origin.as_str(), "no longer listed: draining");
                // It may have gone meanwhile; nothing is left to do then.
                let _ = fleet.remove(worker.id.as_str());
            }
        }
        for (url, spec) in changes.replace {
            match self.ours(&snapshot, &url) {
                Some(worker) => match fleet.replace(worker.id.as_str(), spec, self.origin) {
                    Ok(_) => info!(worker = %worker.id, "listed with a new spec: registered again"),
                    Err(e) => warn!(worker = %worker.id, error = %e, "cannot apply the new spec"),
                },
                // Held (it comes back with the new spec) or someone else's.
                None => debug!(%url, "a changed spec for a worker this source does not run"),
            }
        }
        for (_, spec) in changes.add {
            self.register(fleet, spec);
        }
        self.listed = listing;
    }

    fn register(&self, fleet: &Arc<Fleet>, spec: WorkerSpec) {
        match fleet.add(spec, self.origin) {
            Ok(_) => {}
            Err(FleetError::Exists { id, .. }) => {
                info!(worker = %id, origin = self.origin.as_str(), "listed, and already registered otherwise: left as it is")
            }
            Err(e) => warn!(error = %e, "cannot register a listed worker"),
        }
    }

    /// Holds every listed URL that has no worker any more (and lets go of those registered
    /// again meanwhile).
    fn notice_removed(&mut self, fleet: &Fleet) {
        let snapshot = fleet.snapshot();
        self.held.retain(|url| at_url(&snapshot, url).is_none());
        for url in self.listed.keys() {
            if !self.held.contains(url) && at_url(&snapshot, url).is_none() {
                info!(%url, origin = self.origin.as_str(), "a listed worker was removed: it is registered again once its health endpoint answers");
                self.held.insert(url.clone());
            }
        }
    }

    /// Registers again the held workers whose health endpoint answers, once per health-check
    /// interval.
    async fn readmit_healthy(&mut self, fleet: &Arc<Fleet>, control: &Control) {
        let now = Instant::now();
        if self.held.is_empty() || now < self.next_probe {
            return;
        }
        let health = &control.settings.health;
        self.next_probe = now + health.interval;
        let held: Vec<WorkerSpec> = self
            .held
            .iter()
            .filter_map(|url| self.listed.get(url).cloned())
            .collect();
        let probes = held.iter().map(|spec| async {
            if health.disabled {
                return true;
            }
            let (endpoint, authorization) = fleet.reach(spec);
            let answer = upstream::get(
                &control.upstream,
                &endpoint,
                authorization.as_ref(),
                &health.endpoint,
                PROBE_MAX_BYTES,
                health.timeout,
            )
            .await;
            matches!(answer, Ok((status, _)) if status.is_success())
        });
        let healthy = join_all(probes).await;
        for (spec, healthy) in held.into_iter().zip(healthy) {
            if healthy && self.held.remove(&spec.url) {
                info!(url = %spec.url, "a held worker answers its health endpoint: registering it again");
                self.register(fleet, spec);
            }
        }
    }
}

/// A health body is read and dropped.
const PROBE_MAX_BYTES: usize = 64 * 1024;
