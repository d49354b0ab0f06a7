//! The decode admission window of prefill/decode disaggregation (seed 000).
//!
//! SGLang-lineage prefill engines start a bootstrap deadline when a request lands, cleared only
//! once the decode engine admits it; the decode engine admits within its running window. A burst
//! wider than the window would leave requests in the decode queue while their prefill deadlines
//! run out. So the gateway never has more disaggregated requests in flight to a decode worker
//! than its window holds: with room, a request goes now; with the window full it waits (the
//! gateway bounds the wait and sheds it when the wait runs out); a request that needs more rooms
//! than the whole window is shed at once, as is any that would wait when waiting is off. A
//! worker that reports no window is not gated.
//!
//! A room that frees goes to the most urgent tier's longest waiter, strictly: a waiter that
//! needs more rooms than are free holds the ones after it back, so a wide request is not
//! starved by narrow ones.

use std::collections::BTreeMap;

use crate::admission::Tier;

/// A waiter's place, to take it out when its wait runs out or its client leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Place(u64);

/// What became of a request asking for rooms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// The rooms are its: send it.
    Go,
    /// The window is full: it waits at this place until `Window::freed` hands it rooms.
    Wait(Place),
    /// It needs more rooms than the window has at all.
    TooWide { window: u64 },
    /// The window is full and waiting is off.
    Full,
}

/// One decode worker's window, as counted by this gateway.
#[derive(Debug, Default)]
pub struct Window {
    /// The running window the engine reports (or its spec declares); `None`: not gated.
    size: Option<u64>,
    in_flight: u64,
    /// By tier (most urgent first), then arrival: the rooms each waiter needs.
    waiting: BTreeMap<(Tier, Place), u64>,
    next: u64,
}

impl Window {
    /// The window the engine reports now. A wider window lets waiters go: they are returned,
    /// counted in flight.
    pub fn resize(&mut self, size: Option<u64>) -> Vec<Place> {
        self.size = size;
        self.hand_out()
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// A request of `tier` asks for `rooms` (its `n`); `may_wait`: `--pd-admission-wait-secs`
    /// is not 0.
    pub fn ask(&mut self, tier: Tier, rooms: u64, may_wait: bool) -> Asked {
        let rooms = rooms.max(1);
        let Some(size) = self.size else {
            self.in_flight += rooms;
            return Asked::Go;
        };
        if rooms > size {
            return Asked::TooWide { window: size };
        }
        // Waiters go first: an arrival does not overtake them.
        if self.waiting.is_empty() && self.in_flight + rooms <= size {
            self.in_flight += rooms;
            return Asked::Go;
        }
        if !may_wait {
            return Asked::Full;
        }
        let place = Place(self.next);
        self.next += 1;
        self.waiting.insert((tier, place), rooms);
        Asked::Wait(place)
    }

    /// A request that went ends (or its decode leg was admitted and left): its `rooms` free.
    /// Returns the waiters that get rooms now, in order; each is counted in flight.
    pub fn freed(&mut self, rooms: u64) -> Vec<Place> {
        self.in_flight = self.in_flight.saturating_sub(rooms.max(1));
        self.hand_out()
    }

    /// A waiter leaves without rooms (its wait ran out, its client left). Whether it was
    /// waiting; the ones behind it may go now.
    pub fn leave(&mut self, place: Place) -> (bool, Vec<Place>) {
        let before = self.waiting.len();
        self.waiting.retain(|(_, p), _| *p != place);
        let left = self.waiting.len() < before;
        (left, self.hand_out())
    }

    fn hand_out(&mut self) -> Vec<Place> {
        let mut given = Vec::new();
        let size = self.size.unwrap_or(u64::MAX);
        while let Some((&key, &rooms)) = self.waiting.iter().next() {
            if self.in_flight + rooms > size {
                break;
            }
            self.waiting.remove(&key);
            self.in_flight += rooms;
            given.push(key.1);
        }
        given
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(size: u64) -> Window {
        let mut w = Window::default();
        assert!(w.resize(Some(size)).is_empty());
        w
    }

    #[test]
    fn room_goes_now_and_a_full_window_waits() {
        let mut w = window(2);
        assert_eq!(w.ask(Tier::Agent, 1, true), Asked::Go);
        assert_eq!(w.ask(Tier::Agent, 1, true), Asked::Go);
        assert!(matches!(w.ask(Tier::Agent, 1, true), Asked::Wait(_)));
        assert_eq!(w.in_flight(), 2, "never more than the window");
    }

    #[test]
    fn a_freed_room_goes_to_the_most_urgent_tiers_longest_waiter() {
        let mut w = window(1);
        assert_eq!(w.ask(Tier::Batch, 1, true), Asked::Go);
        let Asked::Wait(batch) = w.ask(Tier::Batch, 1, true) else {
            panic!()
        };
        let Asked::Wait(first) = w.ask(Tier::Interactive, 1, true) else {
            panic!()
        };
        let Asked::Wait(second) = w.ask(Tier::Interactive, 1, true) else {
            panic!()
        };
        assert_eq!(w.freed(1), [first]);
        assert_eq!(w.freed(1), [second]);
        assert_eq!(w.freed(1), [batch]);
        assert_eq!(w.freed(1), []);
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn an_arrival_does_not_overtake_waiters() {
        let mut w = window(2);
        assert_eq!(w.ask(Tier::Agent, 2, true), Asked::Go);
        let Asked::Wait(wide) = w.ask(Tier::Agent, 2, true) else {
            panic!()
        };
        assert_eq!(w.freed(1), [], "one room is not enough for the waiter");
        assert!(
            matches!(w.ask(Tier::Agent, 1, true), Asked::Wait(_)),
            "the free room is held for the waiter ahead"
        );
        assert_eq!(w.freed(1).first(), Some(&wide));
    }

    #[test]
    fn too_wide_or_no_waiting_is_shed_at_once() {
        let mut w = window(4);
        assert_eq!(w.ask(Tier::Agent, 5, true), Asked::TooWide { window: 4 });
        assert_eq!(w.ask(Tier::Agent, 4, false), Asked::Go);
        assert_eq!(w.ask(Tier::Agent, 1, false), Asked::Full);
        assert_eq!(w.waiting(), 0);
    }

    #[test]
    fn no_window_reported_is_not_gated() {
        let mut w = Window::default();
        for _ in 0..1000 {
            assert_eq!(w.ask(Tier::Batch, 8, false), Asked::Go);
        }
    }

    #[test]
    fn a_waiter_that_leaves_lets_the_ones_behind_it_go() {
        let mut w = window(2);
        assert_eq!(w.ask(Tier::Agent, 1, true), Asked::Go);
        let Asked::Wait(wide) = w.ask(Tier::Agent, 2, true) else {
            panic!()
        };
        let Asked::Wait(narrow) = w.ask(Tier::Agent, 1, true) else {
            panic!()
        };
        assert_eq!(w.waiting(), 2, "the narrow one held behind the wide one");
        assert_eq!(w.leave(wide), (true, vec![narrow]));
        assert_eq!(w.leave(wide), (false, vec![]), "gone already");
        assert_eq!(w.in_flight(), 2);
    }

    #[test]
    fn a_window_that_widens_lets_its_waiters_go() {
        let mut w = window(1);
        assert_eq!(w.ask(Tier::Agent, 1, true), Asked::Go);
        let Asked::Wait(next) = w.ask(Tier::Agent, 1, true) else {
            panic!()
        };
        assert_eq!(w.resize(Some(2)), [next]);
        assert_eq!(w.in_flight(), 2);
    }
}
