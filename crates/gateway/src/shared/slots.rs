//! A concurrency cap every replica shares (a tenant's `max_concurrent`, the gateway's
//! `--max-concurrent-requests`).
//!
//! Each replica holds a grant in Redis — its running requests, and some headroom on a large cap
//! — that counts only while the replica's lease lives (renewed by its heartbeat): a replica that
//! dies stops renewing, and its slots come back to the others when the lease runs out
//! (`SharedConfig::lease`). A request takes a free slot of the grant without a round trip; when
//! there is none, one bounded call asks for more. Every beat sets the grant back to what is
//! running (and the headroom). While Redis is away, a replica admits up to its share of the cap.

use std::sync::Arc;

use parking_lot::Mutex;
use sluice_core::admission::shared::{share, Grant};

/// A replica's headroom is this fraction of its share of a cap.
const CHUNK_OF_SHARE: u64 = 8;

use super::budget::Short;
use super::store::Store;

/// One shared cap.
#[derive(Debug)]
pub(crate) struct SharedSlots {
    store: Arc<Store>,
    key: String,
    cap: u64,
    grant: Mutex<Grant>,
    /// One renewal at a time, so an answer computed from an older count never overwrites a
    /// newer grant.
    renewing: tokio::sync::Mutex<()>,
}

/// Why no slot was taken.
pub(crate) type Full = Short;

impl SharedSlots {
    pub fn new(store: Arc<Store>, name: &str, cap: u64) -> Self {
        Self {
            key: store.key(name),
            store,
            cap,
            grant: Mutex::new(Grant::default()),
            renewing: tokio::sync::Mutex::new(()),
        }
    }

    /// Free slots a replica keeps: an eighth of its share, none on a small cap (where an idle
    /// replica's headroom would keep the others from slots they need).
    fn headroom(&self) -> u64 {
        self.cap / (CHUNK_OF_SHARE * u64::from(self.store.replicas()))
    }

    /// Takes a slot without waiting: from the grant, or (Redis away) the local share.
    pub(crate) fn try_enter(&self) -> Result<bool, Full> {
        let mut grant = self.grant.lock();
        if self.store.up() {
            return Ok(grant.enter());
        }
        if !self.store.fail_open {
            return Err(Short::Unavailable);
        }
        if grant.in_use < share(self.cap, self.store.replicas()) {
            grant.in_use += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Takes a slot, asking Redis for a larger grant (one bounded call) when the grant is full.
    /// `Ok(false)`: the cap is reached.
    pub(crate) async fn enter(&self) -> Result<bool, Full> {
        if self.try_enter()? {
            return Ok(true);
        }
        if !self.store.up() {
            return Ok(false);
        }
        // Holding the renewal, so the slot asked for is not given away by a beat in between.
        let renewing = self.renewing.lock().await;
        if self.try_enter()? {
            return Ok(true);
        }
        drop(renewing);
        self.renew(1).await;
        self.try_enter()
    }

    pub(crate) fn leave(&self) {
        self.grant.lock().leave();
    }

    /// Whether a slot is free now, without asking Redis.
    pub(crate) fn has_free(&self) -> bool {
        let grant = self.grant.lock();
        if self.store.up() {
            grant.in_use < grant.granted
        } else {
            self.store.fail_open && grant.in_use < share(self.cap, self.store.replicas())
        }
    }

    /// Requests running under the cap on this replica.
    pub(crate) fn in_use(&self) -> u64 {
        self.grant.lock().in_use
    }

    /// Sets the grant to the running requests, `more` about to start and the headroom, as far
    /// as the cap allows (and renews the lease). Whether Redis answered.
    pub(crate) async fn renew(&self, more: u64) -> bool {
        let _renewing = self.renewing.lock().await;
        let (want, floor) = {
            let grant = self.grant.lock();
            (grant.wanted(more, self.headroom()), grant.in_use)
        };
        match self.store.grant(&self.key, self.cap, want, floor).await {
            Ok(granted) => {
                self.grant.lock().granted = granted;
                true
            }
            Err(_) => false,
        }
    }
}
