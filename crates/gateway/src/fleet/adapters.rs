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
    adapters: parking_lot::Mutex<Vec<Use>>,
}

/// One adapter asked for on the worker: kept after its last request ends, for when it was used.
#[derive(Debug)]
struct Use {
    name: Arc<str>,
    in_flight: u64,
    last_sent: Instant,
}

impl AdapterUse {
    /// A request for `adapter` was sent.
    pub(crate) fn enter(&self, adapter: &Arc<str>) {
        let now = Instant::now();
        let mut adapters = self.adapters.lock();
        match adapters.iter_mut().find(|u| &u.name == adapter) {
            Some(used) => {
                used.in_flight += 1;
                used.last_sent = now;
            }
            None => adapters.push(Use {
                name: adapter.clone(),
                in_flight: 1,
                last_sent: now,
            }),
        }
    }

    /// A request for `adapter` ended.
    pub(crate) fn leave(&self, adapter: &Arc<str>) {
        if let Some(used) = self.adapters.lock().iter_mut().find(|u| &u.name == adapter) {
            used.in_flight = used.in_flight.saturating_sub(1);
        }
    }

    /// Whether a request for `adapter` is in flight.
    pub(crate) fn has(&self, adapter: &str) -> bool {
        self.adapters
            .lock()
            .iter()
            .any(|u| &*u.name == adapter && u.in_flight > 0)
    }

    /// When a request for `adapter` was last sent; `None`: never, since the gateway started or
    /// the adapter was last unloaded.
    pub(crate) fn last_sent(&self, adapter: &str) -> Option<Instant> {
        self.adapters
            .lock()
            .iter()
            .find(|u| &*u.name == adapter)
            .map(|u| u.last_sent)
    }

    /// `adapter` was unloaded: its last use is forgotten, unless a request for it is in flight.
    pub(crate) fn forget(&self, adapter: &str) {
        self.adapters
            .lock()
            .retain(|u| &*u.name != adapter || u.in_flight > 0);
    }

    /// The adapters with requests in flight, each once.
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.counts().into_iter().map(|(name, _)| name).collect()
    }

    /// Requests in flight for each adapter that has any, for views.
    pub(crate) fn counts(&self) -> Vec<(Arc<str>, u64)> {
        self.adapters
            .lock()
            .iter()
            .filter(|u| u.in_flight > 0)
            .map(|u| (u.name.clone(), u.in_flight))
            .collect()
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
        assert!(used.last_sent("sql").is_some(), "its last use is kept");
        used.forget("sql");
        assert_eq!(used.last_sent("sql"), None);
    }
}
