//! Edge admission (seed 003, layer 1): who is asking, how urgent it is, whether its budget holds
//! it, and in what order waiting requests go.
//!
//! ## Layout
//!
//! - `tier` — the priority tiers and the headers that ask for them.
//! - `bucket` — token and request buckets, reserved from at admission and settled at the end.
//! - `queue` — the gateway queue's order: strict tiers, weighted fair tenants, earliest deadline.
//! - `drain` — the queue's drain rate, expected waits, hopeless waits and when to come back.
//! - `deadline` — whether a request can still answer within its client's deadline.
//! - `shared` — a replica's share of budgets and caps several replicas spend together.

pub mod bucket;
pub mod deadline;
pub mod drain;
pub mod queue;
pub mod shared;
pub mod tier;

pub use bucket::{reset_text, tokens_used, Bucket, Level, Refusal, Spent};
pub use queue::{FairQueue, Pushed, Ticket, Waiter};
pub use tier::{Tier, UnknownTier};
