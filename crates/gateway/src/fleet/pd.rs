//! A worker's part in prefill/decode disaggregation: its role, and — for a decode worker — the
//! admission window the gateway keeps for it (seed 000; the decision is
//! `sluice_core::pd_window`).
//!
//! The window is counted per gateway: a request that got rooms holds them (`DecodeRooms`) until
//! its decode leg ends, and the room it frees goes to the longest waiter of the most urgent tier,
//! woken here.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use sluice_core::admission::Tier;
use sluice_core::pd_window::{Asked, Place, Window};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// What a worker does for the requests of its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub(crate) enum Role {
    /// Whole requests.
    Regular,
    /// The prompt of disaggregated requests; its bootstrap server, if it has one (SGLang).
    Prefill { bootstrap_port: Option<u16> },
    /// The answer of disaggregated requests.
    Decode,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Regular => "regular",
            Role::Prefill { .. } => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// Why a request got no rooms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// It needs more rooms than the window holds.
    TooWide { window: u64 },
    /// The window was full and waiting is off, or the wait ran out.
    Full,
}

/// A decode worker's admission window, as this gateway counts it.
#[derive(Debug)]
pub(crate) struct DecodeWindow {
    inner: parking_lot::Mutex<Inner>,
    /// The fleet's change announcements: a request starting or ending a wait is one (the
    /// window's counts are in `GET /workers`).
    announce: Arc<watch::Sender<u64>>,
}

#[derive(Debug, Default)]
struct Inner {
    window: Window,
    wake: HashMap<Place, oneshot::Sender<()>>,
}

impl Inner {
    fn wake(&mut self, places: Vec<Place>) {
        for place in places {
            if let Some(waiter) = self.wake.remove(&place) {
                // A waiter gone meanwhile left its place first (`leave`), so this one is there.
                let _ = waiter.send(());
            }
        }
    }
}

impl DecodeWindow {
    pub fn new(announce: Arc<watch::Sender<u64>>) -> Self {
        Self {
            inner: parking_lot::Mutex::default(),
            announce,
        }
    }

    fn announce(&self) {
        self.announce.send_modify(|v| *v += 1);
    }

    /// Requests in flight through the window, and waiting for it.
    pub(crate) fn counts(&self) -> (u64, usize) {
        let inner = self.inner.lock();
        (inner.window.in_flight(), inner.window.waiting())
    }

    /// Rooms for a request of `tier` and `rooms` sequences, the window being `size` now
    /// (`None`: no window known, not gated). Waits until `until` at most; `None` there: no
    /// waiting. `Ok((rooms, waited))`.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        size: Option<u64>,
        tier: Tier,
        rooms: u64,
        until: Option<Instant>,
    ) -> Result<(DecodeRooms, bool), NoRoom> {
        let rooms = rooms.max(1);
        let (asked, woken) = {
            let mut inner = self.inner.lock();
            let handed = inner.window.resize(size);
            inner.wake(handed);
            let asked = inner.window.ask(tier, rooms, until.is_some());
            let woken = match asked {
                Asked::Wait(place) => {
                    let (tx, rx) = oneshot::channel();
                    inner.wake.insert(place, tx);
                    Some(rx)
                }
                _ => None,
            };
            (asked, woken)
        };
        if woken.is_some() {
            self.announce();
        }
        // Counted in flight only once `Go` or a wake-up gave the rooms.
        let held = || DecodeRooms {
            window: self.clone(),
            rooms,
        };
        match (asked, woken, until) {
            (Asked::Go, _, _) => Ok((held(), false)),
            (Asked::TooWide { window }, _, _) => Err(NoRoom::TooWide { window }),
            (Asked::Wait(place), Some(woken), Some(until)) => {
                let waiting = Waiting {
                    window: self,
                    place,
                    held: Some(held()),
                };
                waiting.until(woken, until).await
            }
            _ => Err(NoRoom::Full),
        }
    }

    fn freed(&self, rooms: u64) {
        let handed = {
            let mut inner = self.inner.lock();
            let handed = inner.window.freed(rooms);
            let any = !handed.is_empty();
            inner.wake(handed);
            any
        };
        if handed {
            self.announce();
        }
    }
}

/// A request waiting for rooms; dropped (its client left) it leaves its place.
struct Waiting<'a> {
    window: &'a Arc<DecodeWindow>,
    place: Place,
    held: Option<DecodeRooms>,
}

impl Waiting<'_> {
    async fn until(
        mut self,
        woken: oneshot::Receiver<()>,
        until: Instant,
    ) -> Result<(DecodeRooms, bool), NoRoom> {
        let got = tokio::time::timeout_at(until, woken).await;
        let held = self.held.take();
        match (got, held) {
            (Ok(Ok(())), Some(held)) => Ok((held, true)),
            (_, held) => {
                // Out of time; rooms handed in the meantime are its all the same.
                if self.leave() {
                    if let Some(held) = held {
                        held.disarm();
                    }
                    Err(NoRoom::Full)
                } else {
                    held.map(|h| (h, true)).ok_or(NoRoom::Full)
                }
            }
        }
    }

    /// Leaves the place; false when rooms were handed to it first.
    fn leave(&self) -> bool {
        let left = {
            let mut inner = self.window.inner.lock();
            inner.wake.remove(&self.place);
            let (left, handed) = inner.window.leave(self.place);
            inner.wake(handed);
            left
        };
        self.window.announce();
        left
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            if self.leave() {
                // It was still waiting: it has no rooms to free.
                held.disarm();
            }
            // Otherwise rooms were handed to it: dropping `held` frees them.
        }
    }
}

/// Rooms in a decode worker's window, freed when dropped (the decode leg ended).
#[derive(Debug)]
pub(crate) struct DecodeRooms {
    window: Arc<DecodeWindow>,
    rooms: u64,
}

impl DecodeRooms {
    /// Rooms that were never given: nothing to free.
    fn disarm(mut self) {
        self.rooms = 0;
    }
}

impl Drop for DecodeRooms {
    fn drop(&mut self) {
        if self.rooms > 0 {
            self.window.freed(self.rooms);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    fn window() -> Arc<DecodeWindow> {
        Arc::new(DecodeWindow::new(Arc::new(watch::channel(0).0)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_room_that_frees_wakes_the_waiter_and_a_wait_that_runs_out_holds_nothing() {
        let w = window();
        let (first, waited) = w.enter(Some(1), Tier::Agent, 1, None).await.unwrap();
        assert!(!waited);
        assert_eq!(
            w.enter(Some(1), Tier::Agent, 1, None).await.err(),
            Some(NoRoom::Full),
            "no waiting: shed"
        );
        let until = Instant::now() + Duration::from_secs(5);
        let waiter = tokio::spawn({
            let w = w.clone();
            async move {
                w.enter(Some(1), Tier::Agent, 1, Some(until))
                    .await
                    .map(|(r, waited)| (r.rooms, waited))
            }
        });
        tokio::task::yield_now().await;
        assert_eq!(w.counts(), (1, 1));
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok((1, true)));
        assert_eq!(w.counts(), (0, 0), "the waiter's rooms went with it");

        let (_held, _) = w.enter(Some(1), Tier::Agent, 1, None).await.unwrap();
        let out = w
            .enter(
                Some(1),
                Tier::Agent,
                1,
                Some(until + Duration::from_secs(5)),
            )
            .await;
        assert_eq!(out.err(), Some(NoRoom::Full), "the wait ran out");
        assert_eq!(w.counts(), (1, 0), "and left nothing counted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_client_leaves_gives_up_its_place() {
        let w = window();
        let (first, _) = w.enter(Some(1), Tier::Agent, 1, None).await.unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        let waiter = tokio::spawn({
            let w = w.clone();
            async move { w.enter(Some(1), Tier::Agent, 1, Some(until)).await.is_ok() }
        });
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(w.counts(), (1, 0));
        drop(first);
        assert_eq!(w.counts(), (0, 0));
        assert_eq!(
            w.enter(Some(1), Tier::Agent, 2, None).await.err(),
            Some(NoRoom::TooWide { window: 1 })
        );
    }
}
