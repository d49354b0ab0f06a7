//! The simulator's test helpers live in `sluice_sim::testkit`, shared with the gateway's tests.
#![allow(unused_imports)]

pub use sluice_sim::testkit::*;
