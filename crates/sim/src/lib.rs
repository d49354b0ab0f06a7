//! placeholder
pub mod scheduler;
