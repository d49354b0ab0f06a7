//! SMG's gRPC worker protocol, as sluice's own definitions of its wire contract.
//!
//! A `grpc://` worker is an engine behind SMG's servicer (`smg-grpc-servicer`): the gateway
//! tokenizes, sends token ids to `Generate`, reads tokens back, aborts what its client left,
//! asks `HealthCheck` for health, and subscribes to `SubscribeKvEvents`, whose batches carry
//! the engine's load record. The definitions in `proto/` follow the PyPI package
//! smg-grpc-proto 0.4.28 field for field (the version whose fields SMG 1.13 reads), keeping only
//! what sluice sends or reads; the comments there say which file each follows.
//!
//! # Layout
//! - `common` (`smg::grpc::common`): package `smg.grpc.common` — the KV-event stream, its load
//!   record, the tokenizer.
//! - `sglang` (`sglang::grpc::scheduler`): package `sglang.grpc.scheduler` — the SGLang engine's
//!   service: its messages, `sglang_scheduler_client` for the gateway and
//!   `sglang_scheduler_server` for the simulated engine.
//!
//! The modules nest as the packages do, because the generated code names another package's
//! messages by that path.

#![allow(clippy::all, clippy::unwrap_used, missing_docs)]

/// Package `smg.grpc`.
pub mod smg {
    /// Package `smg.grpc`.
    pub mod grpc {
        /// Package `smg.grpc.common`.
        pub mod common {
            include!(concat!(env!("OUT_DIR"), "/smg.grpc.common.rs"));
        }
    }
}

/// Package `sglang.grpc`.
pub mod sglang {
    /// Package `sglang.grpc`.
    pub mod grpc {
        /// Package `sglang.grpc.scheduler`.
        pub mod scheduler {
            include!(concat!(env!("OUT_DIR"), "/sglang.grpc.scheduler.rs"));
        }
    }
}

pub use sglang::grpc::scheduler as sglang_scheduler;
pub use smg::grpc::common;
