//! Server-sent events, parsed incrementally as the HTML standard's "event stream interpretation"
//! reads them — not matched against the spellings one engine happens to use.
//!
//! Why parse: a stream's end is judged by its last event (`data: [DONE]` for OpenAI-style
//! streams), and the syntax allows much that a byte match misses: no space after the colon
//! (`data:[DONE]`), CRLF or lone CR line ends, comment lines, an event's data over several lines,
//! a leading byte-order mark, and any of these cut anywhere by the transport — mid-line, between
//! CR and LF, inside a UTF-8 sequence. The parser works on bytes, so a cut character is simply
//! completed by the next chunk.
//!
//! What it keeps is bounded by one line and one event: bytes of a line not yet ended, and the
//! data of the event being read. It allocates only when those grow past what they held before.
//! Each is capped (`MAX_EVENT_BYTES`): a stream whose line or event outgrows it is refused
//! (`Oversized`) rather than read into memory without end — a worker that never ends a line
//! would otherwise grow the gateway until it died.
//!
//! One deliberate leniency: at the end of the stream, an event whose blank line never came is
//! still delivered (`finish`), where a browser would drop it — a stream ending `data: [DONE]\n`
//! has told the client everything it needed.

/// One dispatched event, borrowed from the parser until the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The `event:` field; empty means the default type, `message`.
    pub kind: &'a [u8],
    /// The `data:` lines joined with `\n`.
    pub data: &'a [u8],
}

/// The most bytes a line, or an event's data, may hold (4 MiB). A real event is a chunk of JSON
/// of some hundred bytes to some tens of kilobytes (with log-probabilities); the cap is far past
/// that and still a bound on what one stream can make the gateway hold.
pub const MAX_EVENT_BYTES: usize = 4 << 20;

/// A line or an event past the parser's cap: the stream cannot be read on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event-stream {what} passed {limit} bytes")]
pub struct Oversized {
    /// `line` or `event`.
    pub what: &'static str,
    pub limit: usize,
}

/// The parser: feed it the stream's chunks in order.
#[derive(Debug, Clone)]
pub struct SseParser {
    /// A line begun in an earlier chunk and not yet ended.
    partial: Vec<u8>,
    /// The event's data so far, each line followed by `\n`.
    data: Vec<u8>,
    kind: Vec<u8>,
    /// The last chunk ended with CR: a LF starting the next one belongs to that line end.
    after_cr: bool,
    /// Past the first line (where a byte-order mark may stand).
    started: bool,
    /// The most bytes a line or an event's data may hold.
    limit: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_limit(MAX_EVENT_BYTES)
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser whose lines and events may hold at most `limit` bytes each.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            partial: Vec::new(),
            data: Vec::new(),
            kind: Vec::new(),
            after_cr: false,
            started: false,
            limit,
        }
    }

    /// Reads `chunk`, calling `on_event` for every event it completes. Past the cap on a line
    /// or an event, the stream cannot be read on: what followed is not read.
    pub fn feed(
        &mut self,
        mut chunk: &[u8],
        mut on_event: impl FnMut(Event<'_>),
    ) -> Result<(), Oversized> {
        if chunk.is_empty() {
            return Ok(()); // and a CR before it still waits for its LF
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        // Every byte of a relayed stream passes here: the line ends are looked for with SIMD.
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            let (line, rest) = chunk.split_at(end);
            let ending = if rest.starts_with(b"\r\n") { 2 } else { 1 };
            if rest == b"\r" {
                // CR at the chunk's end: a LF may follow in the next chunk.
                self.after_cr = true;
            }
            chunk = &rest[ending.min(rest.len())..];
            if self.partial.is_empty() {
                self.line(line, &mut on_event)?;
            } else {
                self.check("line", self.partial.len() + line.len())?;
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                let read = self.line(&whole, &mut on_event);
                whole.clear();
                self.partial = whole;
                read?;
            }
        }
        self.check("line", self.partial.len() + chunk.len())?;
        self.partial.extend_from_slice(chunk);
        Ok(())
    }

    /// `Oversized` when `len` bytes of a `what` are past the cap.
    fn check(&self, what: &'static str, len: usize) -> Result<(), Oversized> {
        if len > self.limit {
            return Err(Oversized {
                what,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// The stream ended: a last line without its line end is read, and an event left without its
    /// blank line is delivered (see the module docs).
    pub fn finish(&mut self, mut on_event: impl FnMut(Event<'_>)) -> Result<(), Oversized> {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut on_event)?;
        }
        self.line(b"", &mut on_event)
    }

    fn line(
        &mut self,
        mut line: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<(), Oversized> {
        self.check("line", line.len())?;
        if !self.started {
            self.started = true;
            if let Some(rest) = line.strip_prefix(BOM) {
                line = rest;
            }
        }
        if line.is_empty() {
            self.dispatch(on_event);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(()); // a comment
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                self.check("event", self.data.len() + value.len() + 1)?;
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"event" => {
                self.kind.clear();
                self.kind.extend_from_slice(value);
            }
            // `id` and `retry` concern a reconnecting browser, not a relay; unknown fields are
            // ignored, as the standard says.
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        if self.data.is_empty() {
            self.kind.clear();
            return;
        }
        let data = &self.data[..self.data.len() - 1];
        on_event(Event {
            kind: &self.kind,
            data,
        });
        self.data.clear();
        self.kind.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every event of `chunks`, as (kind, data) strings.
    fn events(chunks: &[&[u8]]) -> Vec<(String, String)> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        let mut keep = |e: Event<'_>| {
            out.push((
                String::from_utf8_lossy(e.kind).into_owned(),
                String::from_utf8_lossy(e.data).into_owned(),
            ))
        };
        for chunk in chunks {
            parser.feed(chunk, &mut keep).unwrap();
        }
        parser.finish(&mut keep).unwrap();
        out
    }

    fn data(chunks: &[&[u8]]) -> Vec<String> {
        events(chunks).into_iter().map(|(_, d)| d).collect()
    }

    // The examples of the HTML standard, "9.2.6 Interpreting an event stream".

    #[test]
    fn a_line_past_the_cap_is_refused_however_it_is_cut() {
        let mut parser = SseParser::with_limit(16);
        let mut seen = 0;
        // Ten bytes, then seven more of the same line in the next chunk: 17.
        assert_eq!(parser.feed(b"data: abcd", |_| seen += 1), Ok(()));
        assert_eq!(
            parser.feed(b"efghijk", |_| seen += 1),
            Err(Oversized {
                what: "line",
                limit: 16
            })
        );
        let mut whole = SseParser::with_limit(16);
        let long = whole.feed(b"data: 0123456789abc\n\n", |_| seen += 1);
        assert_eq!(long.map_err(|e| e.what), Err("line"), "in one chunk");
        assert_eq!(seen, 0);
    }

    #[test]
    fn an_event_past_the_cap_is_refused_and_one_within_it_is_read() {
        let mut parser = SseParser::with_limit(16);
        let mut events = Vec::new();
        let mut keep = |e: Event<'_>| events.push(e.data.to_vec());
        assert_eq!(parser.feed(b"data: 0123456789\n\n", &mut keep), Ok(()));
        // Lines within the cap, an event past it: 8 + 8 data bytes and their line ends.
        let event = parser.feed(b"data: 0123456\ndata: 0123456\ndata: x\n", &mut keep);
        assert_eq!(event.map_err(|e| e.what), Err("event"));
        assert_eq!(events, [b"0123456789".to_vec()]);
        assert!(Oversized {
            what: "event",
            limit: 16
        }
        .to_string()
        .contains("16 bytes"));
    }

    #[test]
    fn the_standards_stock_ticker_joins_data_lines() {
        assert_eq!(
            data(&[b"data: YHOO\ndata: +2\ndata: 10\n\n"]),
            ["YHOO\n+2\n10"]
        );
    }

    #[test]
    fn the_standards_comment_and_space_example() {
        let stream = b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\n\
                       data:  third event\n\n";
        assert_eq!(
            data(&[stream]),
            ["first event", "second event", " third event"],
            "one space after the colon is dropped, a second is data"
        );
    }

    #[test]
    fn the_standards_empty_data_example() {
        // The last `data:` has no blank line: a browser drops it; at the end of a stream this
        // parser delivers it (the documented leniency), as an empty event.
        assert_eq!(data(&[b"data\n\ndata\ndata\n\ndata:"]), ["", "\n", ""]);
    }

    #[test]
    fn the_standards_two_identical_events() {
        assert_eq!(data(&[b"data:test\n\ndata: test\n\n"]), ["test", "test"]);
    }

    #[test]
    fn line_ends_may_be_crlf_lf_or_cr_and_a_bom_is_dropped() {
        let expected = ["a", "b", "c"];
        assert_eq!(data(&[b"data: a\r\n\r\ndata: b\n\ndata: c\r\r"]), expected);
        assert_eq!(
            data(&[b"\xEF\xBB\xBFdata: a\n\ndata:b\n\ndata:c\n\n"]),
            expected
        );
    }

    #[test]
    fn event_types_and_unknown_fields() {
        let got = events(&[b"event: ping\ndata: 1\nretry: 10\nfoo: bar\n\ndata: 2\n\n"]);
        assert_eq!(
            got,
            [("ping".into(), "1".into()), (String::new(), "2".into())]
        );
    }

    #[test]
    fn an_event_without_data_is_not_dispatched() {
        assert_eq!(
            data(&[b"event: x\n\n: only a comment\n\n"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_cr_at_a_chunks_end_and_a_lf_at_the_next_ones_start_are_one_line_end() {
        assert_eq!(
            data(&[b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"]),
            ["a", "b"]
        );
    }

    #[test]
    fn a_character_cut_in_two_is_whole_again() {
        let text = "data: h\u{e9}llo \u{1f600}\n\n".as_bytes();
        let cut = text.iter().position(|b| *b >= 0x80).unwrap() + 1;
        assert_eq!(
            data(&[&text[..cut], &text[cut..]]),
            ["h\u{e9}llo \u{1f600}"]
        );
    }

    #[test]
    fn done_with_or_without_the_space_and_without_its_blank_line() {
        for end in [
            &b"data: [DONE]\n\n"[..],
            b"data:[DONE]\n\n",
            b"data: [DONE]\n",
            b"data: [DONE]",
        ] {
            let got = data(&[b"data: {\"x\":1}\n\n", end]);
            assert_eq!(got.last().map(String::as_str), Some("[DONE]"), "{end:?}");
        }
    }

    proptest! {
        /// However the transport cuts a stream, the same events come out.
        #[test]
        fn any_chunking_gives_the_same_events(cuts in proptest::collection::vec(0usize..200, 0..12)) {
            let stream: &[u8] = b"\xEF\xBB\xBF: hi\r\nevent: a\r\ndata: one\r\ndata:two\r\r\
                data: \xC3\xA9t\xC3\xA9\n\ndata:[DONE]\r\n\r\n";
            let whole = events(&[stream]);
            let mut at: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
            at.sort_unstable();
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in at {
                chunks.push(&stream[from..cut]);
                from = cut;
            }
            chunks.push(&stream[from..]);
            prop_assert_eq!(events(&chunks), whole);
        }
    }
}
