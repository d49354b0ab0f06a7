//! Prefill/decode disaggregation as SGLang runs it (`--pd-role`).
//!
//! A gateway sends the same request to a prefill engine and a decode engine at once, both
//! carrying `bootstrap_host`, `bootstrap_port` (the prefill engine's bootstrap server) and
//! `bootstrap_room`. The prefill engine's deadline starts when its half lands; the decode engine
//! admits its half into the running window (at most `--max-num-seqs` requests, counted from
//! admission to the end of decoding), claims the room at the prefill's bootstrap server, and
//! once the prefill has computed the prompt the KV is across and the decode engine generates the
//! answer without prefilling. A burst wider than the decode window leaves requests in the decode
//! queue while their prefill deadlines run out: exactly what the gateway's decode admission
//! window (seed 000) exists to prevent.
//!
//! The claim travels over HTTP (`POST /bootstrap/{room}` on the bootstrap port, answered when
//! the KV is across or the room failed), so prefill and decode engines may live in different
//! processes, as they do in production.
//!
//! - `rooms` — the prefill side's rooms and deadlines.
//! - `bootstrap` — the bootstrap server and the decode side's claim.

pub mod bootstrap;
pub mod rooms;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use rooms::{Failure, PrefillLeg, Rooms};

/// SGLang's default bootstrap deadline is 300 s; TokenSpeed's (named in seed 000) is 120 s.
pub const DEFAULT_BOOTSTRAP_TIMEOUT_SECS: f64 = 120.0;

/// Which half of a disaggregated request the engine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PdRole {
    Prefill,
    Decode,
}

/// Where a decode engine finds the request's prefill half.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub host: String,
    pub port: u16,
    pub room: u64,
}

/// What an engine incarnation keeps for its role.
pub enum Disagg {
    Prefill(Arc<Rooms>),
    Decode(Box<DecodeSide>),
}

impl Disagg {
    /// The role's state for an engine with `window` running slots and a bootstrap deadline of
    /// `deadline` host time.
    pub fn new(role: PdRole, window: u32, deadline: Duration) -> Self {
        match role {
            PdRole::Prefill => Disagg::Prefill(Arc::new(Rooms::new(deadline))),
            PdRole::Decode => Disagg::Decode(Box::new(DecodeSide::new(window))),
        }
    }

    /// Requests waiting for a decode slot (0 on a prefill engine).
    pub fn waiting(&self) -> u64 {
        match self {
            Disagg::Decode(side) => side.waiting.load(Ordering::Relaxed),
            Disagg::Prefill(_) => 0,
        }
    }

    /// Requests holding a decode slot whose KV is still on its way (0 on a prefill engine).
    pub fn transferring(&self) -> u64 {
        match self {
            Disagg::Decode(side) => side.transferring.load(Ordering::Relaxed),
            Disagg::Prefill(_) => 0,
        }
    }
}

/// A decode engine's running window and its way to the prefill engines.
pub struct DecodeSide {
    window: Arc<Semaphore>,
    size: u32,
    waiting: AtomicU64,
    transferring: AtomicU64,
    claims: bootstrap::ClaimClient,
}

impl DecodeSide {
    fn new(size: u32) -> Self {
        Self {
            window: Arc::new(Semaphore::new(size as usize)),
            size,
            waiting: AtomicU64::new(0),
            transferring: AtomicU64::new(0),
            claims: bootstrap::ClaimClient::new(),
        }
    }

    /// Waits for `rooms` running slots (a request's choices), counted as waiting meanwhile.
    /// `None`: the request needs more slots than the window has; it could never run.
    pub async fn admit(&self, rooms: u32) -> Option<OwnedSemaphorePermit> {
        if rooms > self.size {
            return None;
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Uncount(&self.waiting);
        self.window.clone().acquire_many_owned(rooms).await.ok()
    }

    /// Claims the room at the prefill's bootstrap server; returns once the KV is across,
    /// counted as transferring meanwhile.
    pub async fn claim(&self, at: &Bootstrap) -> Result<(), Failure> {
        self.transferring.fetch_add(1, Ordering::Relaxed);
        let _transferring = Uncount(&self.transferring);
        self.claims.claim(at).await
    }
}

struct Uncount<'a>(&'a AtomicU64);

impl Drop for Uncount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
