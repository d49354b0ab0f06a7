//! The request as every stage reads it: one immutable value, made by the front stage once the
//! request is read whole and parsed, and lent (`&Asked`) to admit, route and forward. Nothing in
//! it changes after the front stage made it; what the stages decide travels in their own
//! hand-offs (`admit::Admitted`, `route::Placement`, `forward::Answer`), and what they observe
//! goes to the request's context (`context::RequestContext`).
//!
//! ## Layout
//!
//! - `parse` — the JSON facts routing needs, read from the body without re-serialising it, and
//!   the model-routed routes.

mod parse;

use axum::http::request::Parts;
use axum::http::HeaderValue;
use bytes::Bytes;
use tokio::time::Instant;

pub use parse::{parse, parse_form, ApiRoute, RequestFacts};

use crate::http::KeyOwner;

/// When and as what a request arrived: known before its body is read.
#[derive(Debug, Clone)]
pub(crate) struct Arrival {
    /// `x-request-id`, the client's or ours: on every answer and sent to every worker.
    pub(crate) id: HeaderValue,
    /// Its route, which decides how its body is read and whether it names a model.
    pub(crate) route: ApiRoute,
    /// Its arrival: deadlines and timeouts count from here.
    pub(crate) started: Instant,
}

/// A request read whole and parsed, as every stage after the front reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// Its id, route and arrival time: what every stage's records name it by.
    pub(crate) arrival: &'a Arrival,
    /// The client's head: its headers are admission's (tenant, tier, deadline), the chooser's
    /// (routing key) and the worker's (those that may cross).
    pub(crate) parts: &'a Parts,
    /// The body as the client sent it; the worker gets it byte for byte unless the model's name
    /// or the ladder changes it (`admit::Admitted::body`).
    pub(crate) body: &'a Bytes,
    /// What routing and admission read of the body.
    pub(crate) facts: &'a RequestFacts<'a>,
    /// Whose key it came with: the tenant it belongs to, unless a trusted header says otherwise.
    pub(crate) owner: KeyOwner,
}

impl Asked<'_> {
    /// Its estimated prompt size in tokens, as admission budgets and the chooser weighs it.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        self.facts.prompt_tokens_estimate()
    }
}
