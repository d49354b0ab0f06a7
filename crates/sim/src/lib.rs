//! placeholder
pub mod config;
pub mod engine;
pub mod faults;
pub mod profile;
pub mod request;
pub mod scheduler;
