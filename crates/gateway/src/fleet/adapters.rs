//! The LoRA adapters of this gateway's requests in flight on a worker: known the moment a request
//! is sent, where the engine's own report (`sluice_core::lora::AdapterSlots`) is as old as the
//! last load poll.
//!
//! One writer: the request path, through `Lease` (a request counts under its adapter from the
//! pick to the end of its attempt). The route stage reads it under the lock for one copy.

use std::sync::Arc;

use tokio::time::Instant;

/// Requests in flight on one worker, by adapter name, and when each adapter was last asked for
/// there (the least recently used is unloaded first, `control::adapter_loads`).
#[derive(Debug, Default)]
pub(crate) struct AdapterUse {
    counts: parking_lot::Mutex<Vec<(Arc<str>, u64)>>,
    last: parking_lot::Mutex<Vec<(Arc<str>, Instant)>>,
}

impl AdapterUse {
    /// A request for `adapter` was sent.
    pub(crate) fn enter(&self, adapter: &Arc<str>) {
        let mut counts = self.counts.lock();
        match counts.iter_mut().find(|(name, _)| name == adapter) {
            Some((_, n)) => *n += 1,
            None => counts.push((adapter.clone(), 1)),
        }
        drop(counts);
        let now = Instant::now();
        let mut last = self.last.lock();
        match last.iter_mut().find(|(name, _)| name == adapter) {
            Some((_, at)) => *at = now,
            None => last.push((adapter.clone(), now)),
        }
    }

    /// Whether a request for `adapter` is in flight.
    pub(crate) fn has(&self, adapter: &str) -> bool {
        self.counts
            .lock()
            .iter()
            .any(|(name, _)| &**name == adapter)
    }

    /// When a request for `adapter` was last sent; `None`: never, since the gateway started or
    /// the adapter was last unloaded.
    pub(crate) fn last_sent(&self, adapter: &str) -> Option<Instant> {
        self.last
            .lock()
            .iter()
            .find(|(name, _)| &**name == adapter)
            .map(|(_, at)| *at)
    }

    /// `adapter` was unloaded: its last use is forgotten.
    pub(crate) fn forget(&self, adapter: &str) {
        self.last.lock().retain(|(name, _)| &**name != adapter);
    }

    /// A request for `adapter` ended: an adapter with none left is no longer named.
    pub(crate) fn leave(&self, adapter: &Arc<str>) {
        let mut counts = self.counts.lock();
        if let Some(at) = counts.iter().position(|(name, _)| name == adapter) {
            counts[at].1 = counts[at].1.saturating_sub(1);
            if counts[at].1 == 0 {
                counts.swap_remove(at);
            }
        }
    }

    /// The adapters with requests in flight, each once.
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.counts
            .lock()
            .iter()
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Requests in flight for each adapter, for views.
    pub(crate) fn counts(&self) -> Vec<(Arc<str>, u64)> {
        self.counts.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapter_is_named_while_a_request_for_it_is_in_flight() {
        let used = AdapterUse::default();
        let (sql, med): (Arc<str>, Arc<str>) = ("sql".into(), "med".into());
        used.enter(&sql);
        used.enter(&sql);
        used.enter(&med);
        assert_eq!(used.counts(), vec![(sql.clone(), 2), (med.clone(), 1)]);
        used.leave(&med);
        used.leave(&sql);
        assert_eq!(used.names(), vec![sql.clone()]);
        used.leave(&sql);
        used.leave(&sql);
        assert!(used.names().is_empty());
    }
}
