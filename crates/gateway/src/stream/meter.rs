//! Reading what a response used, for tenants whose token budget is settled at the end: the
//! `usage` block when the engine sends one (the last event of a stream that asked for it, the
//! end of a JSON body), else a stream's events counted, one token each.

use serde::Deserialize;

use crate::context::Usage;

/// A non-streaming body is read for its `usage` up to this size; past it the reservation stands.
const MAX_BODY: usize = 1 << 20;

#[derive(Deserialize)]
struct WithUsage {
    usage: Option<UsageBlock>,
}

#[derive(Deserialize)]
struct UsageBlock {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// The `usage` of one JSON object, if it has one.
fn usage_of(json: &[u8]) -> Option<Usage> {
    let block = serde_json::from_slice::<WithUsage>(json).ok()?.usage?;
    Some(Usage {
        prompt: block.prompt_tokens,
        completion: block.completion_tokens,
    })
}

/// A metered response, read as it passes.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    chunks: u64,
    usage: Option<Usage>,
    /// A non-streaming body, kept while it stays under `MAX_BODY`.
    body: Option<Vec<u8>>,
}

impl Meter {
    pub fn new(sse: bool) -> Self {
        Self {
            body: (!sse).then(Vec::new),
            ..Self::default()
        }
    }

    /// One event of a stream.
    pub(crate) fn event(&mut self, data: &[u8]) {
        if data == b"[DONE]" {
            return;
        }
        self.chunks += 1;
        if memmem(data, b"\"usage\"") {
            if let Some(usage) = usage_of(data) {
                self.usage = Some(usage);
            }
        }
    }

    /// A piece of a non-streaming body.
    pub fn body(&mut self, chunk: &[u8]) {
        if let Some(body) = &mut self.body {
            if body.len() + chunk.len() > MAX_BODY {
                self.body = None;
            } else {
                body.extend_from_slice(chunk);
            }
        }
    }

    /// What the response used (`None` when it did not say), and its events.
    pub(crate) fn read(&mut self) -> (Option<Usage>, u64) {
        if let Some(body) = self.body.take() {
            self.usage = usage_of(&body);
        }
        (self.usage, self.chunks)
    }
}

fn memmem(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streams_usage_event_or_its_count() {
        let mut m = Meter::new(true);
        m.event(br#"{"choices":[{"delta":{"content":"a"}}]}"#);
        m.event(br#"{"choices":[{"delta":{"content":"b"}}],"usage":null}"#);
        assert_eq!(m.read(), (None, 2));
        m.event(
            br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}"#,
        );
        m.event(b"[DONE]");
        assert_eq!(
            m.read(),
            (
                Some(Usage {
                    prompt: 7,
                    completion: 2
                }),
                3
            )
        );
    }

    #[test]
    fn a_bodys_usage_across_chunks() {
        let mut m = Meter::new(false);
        m.body(br#"{"id":"x","choices":[],"usa"#);
        m.body(br#"ge":{"prompt_tokens":5,"completion_tokens":11}}"#);
        assert_eq!(
            m.read(),
            (
                Some(Usage {
                    prompt: 5,
                    completion: 11
                }),
                0
            )
        );
        let mut huge = Meter::new(false);
        huge.body(&vec![b' '; MAX_BODY + 1]);
        assert_eq!(
            huge.read(),
            (None, 0),
            "too big to read: the reservation stands"
        );
    }
}
