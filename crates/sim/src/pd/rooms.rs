//! A prefill engine's bootstrap rooms: where its half of a disaggregated request meets the
//! decode engine's half.
//!
//! Both halves name the same room (the gateway's `bootstrap_room`) and either may arrive
//! first. The prefill half lands, then waits for the decode engine to claim the room (which it
//! does once it has admitted the request into its running window); past the bootstrap deadline
//! the prefill fails the request, as SGLang does. Once claimed, the prefill computes the prompt
//! and the claim returns when the KV is across. A claim whose connection drops (the decode
//! engine aborted) aborts the prefill's computation; a prefill that fails or is aborted fails the
//! claim. Finished rooms are kept for one deadline so a late claim learns the room failed
//! instead of waiting for a prefill that will never land.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Why a room did not carry its KV across.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("the decode engine did not admit the request before the bootstrap deadline")]
    BootstrapTimeout,
    #[error("the prefill request was aborted")]
    PrefillAborted,
    #[error("the decode engine left the room")]
    DecodeGone,
    #[error("the prefill engine's bootstrap server cannot be reached")]
    Unreachable,
    #[error("the bootstrap room is already in use")]
    Taken,
}

impl Failure {
    /// The word the bootstrap server answers a failed claim with.
    pub fn code(self) -> &'static str {
        match self {
            Failure::BootstrapTimeout => "bootstrap_timeout",
            Failure::PrefillAborted => "prefill_aborted",
            Failure::DecodeGone => "decode_gone",
            Failure::Unreachable => "unreachable",
            Failure::Taken => "taken",
        }
    }

    pub fn from_code(code: &str) -> Self {
        match code {
            "bootstrap_timeout" => Failure::BootstrapTimeout,
            "prefill_aborted" => Failure::PrefillAborted,
            "decode_gone" => Failure::DecodeGone,
            "taken" => Failure::Taken,
            _ => Failure::Unreachable,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prefill {
    Absent,
    Waiting,
    Computing,
    Done,
    Failed(Failure),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decode {
    Absent,
    Claimed,
    Gone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    prefill: Prefill,
    decode: Decode,
}

struct Room {
    state: watch::Sender<State>,
}

/// The rooms of one prefill engine incarnation.
pub struct Rooms {
    rooms: parking_lot::Mutex<HashMap<u64, Arc<Room>>>,
    /// Rooms whose prefill ended, oldest first, to forget one deadline later.
    ended: parking_lot::Mutex<VecDeque<(Instant, u64)>>,
    /// The bootstrap deadline in host time (engine time over the time scale).
    deadline: Duration,
    /// The next room of the engine's own naming (vLLM's requests), above any gateway's 63-bit
    /// room.
    next: std::sync::atomic::AtomicU64,
}

impl Rooms {
    pub fn new(deadline: Duration) -> Self {
        Self {
            rooms: parking_lot::Mutex::default(),
            ended: parking_lot::Mutex::default(),
            deadline,
            next: std::sync::atomic::AtomicU64::new(1 << 63),
        }
    }

    /// A room no gateway names (for a vLLM prefill, whose answer tells the decode engine).
    pub fn fresh(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Rooms known now (open or recently ended).
    pub fn len(&self) -> usize {
        self.rooms.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn room(&self, id: u64) -> Arc<Room> {
        self.forget_ended();
        self.rooms
            .lock()
            .entry(id)
            .or_insert_with(|| {
                let (state, _) = watch::channel(State {
                    prefill: Prefill::Absent,
                    decode: Decode::Absent,
                });
                Arc::new(Room { state })
            })
            .clone()
    }

    fn ended(&self, id: u64) {
        self.ended.lock().push_back((Instant::now(), id));
    }

    fn forget_ended(&self) {
        let now = Instant::now();
        let mut ended = self.ended.lock();
        while let Some(&(at, id)) = ended.front() {
            if now.duration_since(at) < self.deadline {
                break;
            }
            ended.pop_front();
            self.rooms.lock().remove(&id);
        }
    }

    /// Room `id` with one half entered by `enter`, which gives `None` when that half is there
    /// already (a room is entered once from each side).
    fn enter(
        &self,
        id: u64,
        enter: impl FnOnce(&mut State) -> Option<()>,
    ) -> Result<Arc<Room>, Failure> {
        let room = self.room(id);
        let mut entered = None;
        room.state.send_modify(|s| entered = enter(s));
        entered.map(|()| room).ok_or(Failure::Taken)
    }

    /// The prefill half lands in room `id`; its deadline starts now.
    pub fn land(self: &Arc<Self>, id: u64) -> Result<PrefillLeg, Failure> {
        let room = self.enter(id, |s| {
            (s.prefill == Prefill::Absent).then(|| s.prefill = Prefill::Waiting)
        })?;
        Ok(PrefillLeg {
            rooms: self.clone(),
            id,
            room,
            deadline: Instant::now() + self.deadline,
        })
    }

    /// The decode half claims room `id` and waits for its KV: `Ok` once the prefill is done.
    /// Dropping the future leaves the room (the prefill is aborted if it is computing).
    pub async fn claim(self: &Arc<Self>, id: u64) -> Result<(), Failure> {
        let room = self.enter(id, |s| {
            (s.decode == Decode::Absent).then(|| s.decode = Decode::Claimed)
        })?;
        let guard = ClaimGuard {
            room: room.clone(),
            settled: false,
        };
        let mut state = room.state.subscribe();
        // A prefill that never lands fails the claim after one deadline.
        let landed_by = Instant::now() + self.deadline;
        let outcome = loop {
            let s = *state.borrow_and_update();
            match s.prefill {
                Prefill::Done => break Ok(()),
                Prefill::Failed(why) => break Err(why),
                Prefill::Absent => {
                    if tokio::time::timeout_at(landed_by, state.changed())
                        .await
                        .is_err()
                    {
                        self.ended(id);
                        break Err(Failure::BootstrapTimeout);
                    }
                }
                Prefill::Waiting | Prefill::Computing => {
                    if state.changed().await.is_err() {
                        break Err(Failure::PrefillAborted);
                    }
                }
            }
        };
        guard.settle();
        outcome
    }
}

/// Marks a claim's decode half gone if the claim is dropped before it settles.
struct ClaimGuard {
    room: Arc<Room>,
    settled: bool,
}

impl ClaimGuard {
    fn settle(mut self) {
        self.settled = true;
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.settled {
            self.room.state.send_modify(|s| s.decode = Decode::Gone);
        }
    }
}

/// The prefill half of a room, from landing to done; dropped before done, it fails the room
/// as aborted.
pub struct PrefillLeg {
    rooms: Arc<Rooms>,
    id: u64,
    room: Arc<Room>,
    deadline: Instant,
}

impl PrefillLeg {
    /// Waits for the decode engine's claim; fails the room at the bootstrap deadline.
    pub async fn claimed(&self) -> Result<(), Failure> {
        let mut state = self.room.state.subscribe();
        let outcome = loop {
            match state.borrow_and_update().decode {
                Decode::Claimed => break Ok(()),
                Decode::Gone => break Err(Failure::DecodeGone),
                Decode::Absent => {}
            }
            match tokio::time::timeout_at(self.deadline, state.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in the room, which this leg holds.
                Ok(Err(_)) => break Err(Failure::DecodeGone),
                Err(_) => break Err(Failure::BootstrapTimeout),
            }
        };
        match outcome {
            Ok(()) => self.set(Prefill::Computing),
            Err(why) => self.set(Prefill::Failed(why)),
        }
        outcome
    }

    /// Resolves if the decode half leaves while the prefill computes.
    pub async fn decode_gone(&self) {
        let mut state = self.room.state.subscribe();
        let _ = state.wait_for(|s| s.decode == Decode::Gone).await;
    }

    /// The KV is across: the claim returns.
    pub fn done(self) {
        self.set(Prefill::Done);
    }

    fn set(&self, to: Prefill) {
        let mut first_end = false;
        self.room.state.send_modify(|s| {
            let ended = matches!(s.prefill, Prefill::Done | Prefill::Failed(_));
            if !ended {
                s.prefill = to;
                first_end = matches!(to, Prefill::Done | Prefill::Failed(_));
            }
        });
        if first_end {
            self.rooms.ended(self.id);
        }
    }
}

impl Drop for PrefillLeg {
    fn drop(&mut self) {
        self.set(Prefill::Failed(Failure::PrefillAborted));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rooms() -> Arc<Rooms> {
        Arc::new(Rooms::new(Duration::from_secs(10)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_returns_once_the_prefill_is_done_whichever_lands_first() {
        let rooms = rooms();
        let claim = tokio::spawn({
            let rooms = rooms.clone();
            async move { rooms.claim(7).await }
        });
        tokio::task::yield_now().await;
        let leg = rooms.land(7).unwrap();
        leg.claimed().await.unwrap();
        assert!(!claim.is_finished());
        leg.done();
        assert_eq!(claim.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unclaimed_prefill_fails_at_the_deadline_and_a_late_claim_learns_it() {
        let rooms = rooms();
        let leg = rooms.land(1).unwrap();
        let started = Instant::now();
        assert_eq!(leg.claimed().await, Err(Failure::BootstrapTimeout));
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(rooms.claim(1).await, Err(Failure::BootstrapTimeout));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_dropped_while_the_prefill_computes_is_seen_as_gone() {
        let rooms = rooms();
        let leg = rooms.land(2).unwrap();
        let claim = tokio::spawn({
            let rooms = rooms.clone();
            async move { rooms.claim(2).await }
        });
        leg.claimed().await.unwrap();
        claim.abort();
        leg.decode_gone().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_prefill_fails_the_claim_and_rooms_are_forgotten_a_deadline_later() {
        let rooms = rooms();
        let leg = rooms.land(3).unwrap();
        let claim = tokio::spawn({
            let rooms = rooms.clone();
            async move { rooms.claim(3).await }
        });
        leg.claimed().await.unwrap();
        drop(leg);
        assert_eq!(claim.await.unwrap(), Err(Failure::PrefillAborted));
        assert_eq!(rooms.land(3).err(), Some(Failure::Taken));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(rooms.land(4).is_ok());
        assert_eq!(rooms.len(), 1, "room 3 is forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_for_a_prefill_that_never_lands_fails_after_one_deadline() {
        let rooms = rooms();
        assert_eq!(rooms.claim(5).await, Err(Failure::BootstrapTimeout));
    }
}
