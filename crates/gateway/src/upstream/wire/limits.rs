//! Every bound the worker client puts on an answer, in one place (docs/gateway.md, "What a
//! worker's answer may be", lists them with what a worker that breaks one gets).
//!
//! A broken bound is a bad answer (`WireError::is_bad_answer`): before anything was relayed the
//! client gets a 502 and the request may go to another worker; after, the stream ends with an
//! error event. Neither the wait for an answer's first byte nor the gaps between its events are
//! bounded here: a long prefill sends nothing for minutes, and judging that silence is
//! liveness's (`--worker-unresponsive-secs`).

use std::time::Duration;

/// The longest answer head taken, informational ones each on their own (hyper's client allows
/// 400 KiB of buffer; engines' heads are a few hundred bytes).
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// The most header fields in one head (hyper's limit).
pub(super) const MAX_HEADERS: usize = 100;
/// The most informational (1xx) answers before the final one: none is asked for (no
/// `Expect: 100-continue`), so a worker sending more is looping.
pub(super) const MAX_INFORMATIONAL: usize = 8;
/// The longest chunk-size line, or trailer line.
pub(super) const MAX_LINE: usize = 4096;
/// The most bytes of chunk extensions over a whole body (hyper's client refuses 16 KiB; no
/// engine sends any).
pub(super) const MAX_EXTENSIONS: usize = 4096;
/// The most trailer bytes read (and dropped) after the last chunk, and the most trailer fields
/// (hyper's client: 16 KiB and 100; no engine sends any).
pub(super) const MAX_TRAILERS: usize = 8 * 1024;
pub(super) const MAX_TRAILER_FIELDS: usize = 64;
/// The longest wait for the next byte of a head, a chunk-size line or the trailers once they
/// have started, and for a write to make progress: a worker that starts a line and stops is
/// stuck mid-frame, and a request it does not read holds the connection.
pub(super) const STALL: Duration = Duration::from_secs(10);

/// The first read of an answer: most heads and a first event fit.
pub(super) const FIRST_READ: usize = 2048;
/// The largest read buffer a long answer grows to.
pub(super) const MAX_READ: usize = 64 * 1024;
