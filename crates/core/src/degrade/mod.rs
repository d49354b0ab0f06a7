//! The degradation ladder (seed 003, "load shedding should not be binary"): when demand exceeds
//! the fleet, shorten what requests ask of the engines before refusing anyone.
//!
//! ## Layout
//!
//! - `pressure` — the level, from the queue's delay, CoDel's state and the share of the fleet
//!   vetoed, with hysteresis.
//! - `rewrite` — each step's rewrite of a request body: reasoning off or capped, the model
//!   cascaded, old context pruned, the output clamped.

pub mod pressure;
pub mod rewrite;

pub use pressure::{
    cascade_stays, level_of, passes_release, room_for, Ladder, Pressure, MAX_LEVEL,
};
pub use rewrite::{
    cascade, clamp_output, prune_context, reasoning, Applied, PruneBudget, ReasoningSwitch,
};
