//! Where an HTTP/1.1 answer's body ends (RFC 9112 section 6): no body, a known length, chunks,
//! or the connection's close; and taking the body's data out of what was read.
//!
//! The decoder is given the bytes read so far and takes what it can use: data as it comes (a
//! frame need not wait for its whole chunk), chunk sizes and their line ends, trailers (checked
//! as header fields, then dropped: no worker sends any, and no client of a gateway relies on
//! them).
//!
//! Never looser than hyper 1.x's client (`proto/h1/role.rs`, `decoder`; `proto/h1/decode.rs`):
//! a length is digits only; an HTTP/1.0 answer may not carry Transfer-Encoding; a chunk-size
//! line starts with a hex digit, may have spaces after the size and extensions after a `;`, and
//! ends with CRLF — a bare LF anywhere in it is refused; trailer lines and the last line end
//! with CRLF, and each trailer is one field as httparse reads it. Extensions and trailers are
//! bounded over the body (`limits`), below hyper's own bounds.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use bytes::{Buf, Bytes, BytesMut};

use super::limits::{MAX_EXTENSIONS, MAX_LINE, MAX_TRAILERS, MAX_TRAILER_FIELDS};
use super::WireError;

/// How the rest of an answer's body is framed, and how far it has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Framing {
    /// Read to its end.
    Done,
    /// This many bytes left.
    Length(u64),
    Chunked(Chunked),
    /// Everything until the worker closes the connection (which then cannot be used again).
    UntilClose,
}

/// Where a chunked body stands, and what of its bounded parts it has used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Chunked {
    at: Chunk,
    /// Bytes of chunk extensions over the whole body (`MAX_EXTENSIONS`); small, since the body
    /// moves with its request.
    extension_bytes: u16,
    /// Bytes (with their CRLFs) and lines of trailers so far.
    trailer_bytes: u16,
    trailer_fields: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers,
}

/// What one step of decoding gave.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decoded {
    Data(Bytes),
    /// More must be read first.
    NeedMore,
    End,
}

impl Framing {
    /// The body's framing from the answer's head, for a request sent with `method`
    /// (RFC 9112 section 6.3). A length that cannot be trusted is an error: reading on would
    /// misread the next answer on the connection. So is Transfer-Encoding on an HTTP/1.0 answer
    /// (section 6.1: faulty framing).
    pub(super) fn of(
        method: &Method,
        status: StatusCode,
        version: Version,
        headers: &HeaderMap,
    ) -> Result<Self, WireError> {
        if *method == Method::HEAD
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Ok(Framing::Done);
        }
        if headers.contains_key(header::TRANSFER_ENCODING) {
            if version == Version::HTTP_10 {
                return Err(WireError::TransferEncodingOn10);
            }
            // Only a final `chunked` coding says where the body ends; any other runs to the close.
            let last = headers
                .get_all(header::TRANSFER_ENCODING)
                .iter()
                .next_back()
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit(',').next())
                .map(str::trim);
            return Ok(match last {
                Some(coding) if coding.eq_ignore_ascii_case("chunked") => Framing::chunked(),
                _ => Framing::UntilClose,
            });
        }
        let mut length = None;
        for value in headers.get_all(header::CONTENT_LENGTH) {
            for part in value.to_str().map_err(|_| WireError::BadLength)?.split(',') {
                let n = digits(part.trim()).ok_or(WireError::BadLength)?;
                if length.is_some_and(|seen| seen != n) {
                    return Err(WireError::BadLength);
                }
                length = Some(n);
            }
        }
        Ok(match length {
            Some(0) => Framing::Done,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        })
    }

    /// A chunked body, from its first chunk-size line.
    pub(super) fn chunked() -> Self {
        Framing::Chunked(Chunked {
            at: Chunk::Size,
            extension_bytes: 0,
            trailer_bytes: 0,
            trailer_fields: 0,
        })
    }

    /// The body's bytes left, when known.
    pub(super) fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Done => Some(0),
            Framing::Length(n) => Some(*n),
            _ => None,
        }
    }

    /// Takes what it can from `read`: data, the framing between it, or the end.
    pub(super) fn decode(&mut self, read: &mut BytesMut) -> Result<Decoded, WireError> {
        loop {
            match self {
                Framing::Done => return Ok(Decoded::End),
                Framing::Length(left) => {
                    let Some(data) = take_data(read, left) else {
                        return Ok(Decoded::NeedMore);
                    };
                    if *left == 0 {
                        *self = Framing::Done;
                    }
                    return Ok(Decoded::Data(data));
                }
                Framing::UntilClose => {
                    if read.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    return Ok(Decoded::Data(read.split().freeze()));
                }
                Framing::Chunked(chunk) => match chunk.step(read)? {
                    Step::Data(data) => return Ok(Decoded::Data(data)),
                    Step::NeedMore => return Ok(Decoded::NeedMore),
                    Step::End => *self = Framing::Done,
                    Step::Next => {}
                },
            }
        }
    }

    /// Whether the answer stands inside a line of framing (a chunk-size line with some of it
    /// read, the line end after a chunk's data, the trailers): the wait for its next byte is
    /// bounded (`limits::STALL`), where a wait between chunks is not.
    pub(super) fn mid_line(&self, read: &[u8]) -> bool {
        match self {
            Framing::Chunked(chunked) => match chunked.at {
                Chunk::Size => !read.is_empty(),
                Chunk::DataEnd | Chunk::Trailers => true,
                Chunk::Data(_) => false,
            },
            _ => false,
        }
    }

    /// The connection closed: the end of a body that runs to the close, else a cut one.
    pub(super) fn closed(&mut self) -> Result<(), WireError> {
        match self {
            Framing::Done => Ok(()),
            Framing::UntilClose => {
                *self = Framing::Done;
                Ok(())
            }
            _ => Err(WireError::Truncated),
        }
    }
}

/// A decimal number of digits alone: `str::parse` takes a `+` sign, which no length may have.
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A whole chunk-size line at the start of `read`: the bytes it takes, the size and the bytes
/// of its extensions; `None` while it is incomplete. `1*HEXDIG *(SP / HTAB) [";" extensions]
/// CRLF`, as hyper reads it.
fn chunk_size_line(read: &[u8]) -> Result<Option<SizeLine>, WireError> {
    let digits = read.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return if read.is_empty() {
            Ok(None)
        } else {
            Err(WireError::BadChunk)
        };
    }
    let mut size: u64 = 0;
    for &b in &read[..digits] {
        let digit = u64::from((b as char).to_digit(16).unwrap_or(0));
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(digit))
            .ok_or(WireError::BadChunk)?;
    }
    let mut at = digits;
    while at < read.len() && matches!(read[at], b' ' | b'\t') {
        at += 1;
    }
    let extension_from = at;
    if at < read.len() && read[at] == b';' {
        while at < read.len() && read[at] != b'\r' {
            if read[at] == b'\n' {
                return Err(WireError::BadChunk);
            }
            at += 1;
        }
    }
    match read.get(at..at + 2) {
        Some(b"\r\n") => Ok(Some(SizeLine {
            len: at + 2,
            size,
            extension_bytes: at - extension_from,
        })),
        Some(_) => Err(WireError::BadChunk),
        None if at < read.len() && read[at] != b'\r' => Err(WireError::BadChunk),
        None => Ok(None),
    }
}

struct SizeLine {
    len: usize,
    size: u64,
    extension_bytes: usize,
}

/// Whether a trailer line (without its CRLF) is one well-formed field, as hyper reads trailers:
/// httparse's field syntax, then a valid name and value.
fn trailer_field(line: &[u8]) -> bool {
    let mut text = Vec::with_capacity(line.len() + 4);
    text.extend_from_slice(line);
    text.extend_from_slice(b"\r\n\r\n");
    let mut fields = [httparse::EMPTY_HEADER; 1];
    match httparse::parse_headers(&text, &mut fields) {
        Ok(httparse::Status::Complete((_, [field]))) => {
            HeaderName::from_bytes(field.name.as_bytes()).is_ok()
                && HeaderValue::from_bytes(field.value).is_ok()
        }
        _ => false,
    }
}

/// `count` and `more`, if the sum fits a `u16` (every bound it is held to does).
fn bounded(count: u16, more: usize) -> Option<u16> {
    u16::try_from(usize::from(count) + more).ok()
}

/// At most `left` bytes of data from `read`, none when it is empty.
fn take_data(read: &mut BytesMut, left: &mut u64) -> Option<Bytes> {
    if read.is_empty() {
        return None;
    }
    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(read.len());
    *left -= n as u64;
    Some(read.split_to(n).freeze())
}

enum Step {
    Data(Bytes),
    NeedMore,
    /// The chunk framing moved on; go again.
    Next,
    /// The last chunk and its trailers were read.
    End,
}

impl Chunked {
    fn step(&mut self, read: &mut BytesMut) -> Result<Step, WireError> {
        match &mut self.at {
            Chunk::Size => match chunk_size_line(read)? {
                Some(line) => {
                    self.extension_bytes = bounded(self.extension_bytes, line.extension_bytes)
                        .filter(|&n| usize::from(n) <= MAX_EXTENSIONS)
                        .ok_or(WireError::BadChunk)?;
                    read.advance(line.len);
                    self.at = if line.size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(line.size)
                    };
                    Ok(Step::Next)
                }
                None if read.len() < MAX_LINE => Ok(Step::NeedMore),
                None => Err(WireError::BadChunk),
            },
            Chunk::Data(left) => {
                let Some(data) = take_data(read, left) else {
                    return Ok(Step::NeedMore);
                };
                if *left == 0 {
                    self.at = Chunk::DataEnd;
                }
                Ok(Step::Data(data))
            }
            Chunk::DataEnd => {
                if read.len() < 2 {
                    return Ok(Step::NeedMore);
                }
                if &read[..2] != b"\r\n" {
                    return Err(WireError::BadChunk);
                }
                read.advance(2);
                self.at = Chunk::Size;
                Ok(Step::Next)
            }
            Chunk::Trailers => self.trailer(read),
        }
    }

    /// One trailer line, or the empty line that ends the body.
    fn trailer(&mut self, read: &mut BytesMut) -> Result<Step, WireError> {
        let Some(end) = read.iter().position(|&b| b == b'\n') else {
            if read.len() >= MAX_LINE {
                return Err(WireError::BadChunk);
            }
            return Ok(Step::NeedMore);
        };
        // Every line ends with CRLF; a bare LF is refused, as hyper does.
        let Some(line) = read[..end].strip_suffix(b"\r") else {
            return Err(WireError::BadChunk);
        };
        if line.is_empty() {
            read.advance(end + 1);
            return Ok(Step::End);
        }
        self.trailer_bytes = bounded(self.trailer_bytes, end + 1)
            .filter(|&n| usize::from(n) <= MAX_TRAILERS)
            .ok_or(WireError::BadChunk)?;
        self.trailer_fields = self.trailer_fields.saturating_add(1);
        if !trailer_field(line) || usize::from(self.trailer_fields) > MAX_TRAILER_FIELDS {
            return Err(WireError::BadChunk);
        }
        read.advance(end + 1);
        Ok(Step::Next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use proptest::prelude::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    fn framing(status: u16, pairs: &[(&'static str, &'static str)]) -> Result<Framing, WireError> {
        Framing::of(
            &Method::POST,
            StatusCode::from_u16(status).unwrap(),
            Version::HTTP_11,
            &headers(pairs),
        )
    }

    /// Feeds `input` to a decoder in pieces of `cut` bytes, then the close; what it gave.
    fn decode_all(mut framing: Framing, input: &[u8], cut: usize) -> Result<Vec<u8>, WireError> {
        let mut read = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(cut.max(1)) {
            read.extend_from_slice(piece);
            loop {
                match framing.decode(&mut read)? {
                    Decoded::Data(data) => out.extend_from_slice(&data),
                    Decoded::NeedMore => break,
                    Decoded::End => return Ok(out),
                }
            }
        }
        framing.closed()?;
        Ok(out)
    }

    #[test]
    fn the_head_says_how_the_body_is_framed() {
        assert_eq!(
            framing(200, &[("content-length", "12")]).unwrap(),
            Framing::Length(12)
        );
        assert_eq!(
            framing(200, &[("content-length", "0")]).unwrap(),
            Framing::Done
        );
        assert_eq!(
            framing(
                200,
                &[("transfer-encoding", "chunked"), ("content-length", "3")]
            )
            .unwrap(),
            Framing::chunked()
        );
        assert_eq!(
            framing(200, &[("transfer-encoding", "gzip")]).unwrap(),
            Framing::UntilClose
        );
        assert_eq!(framing(200, &[]).unwrap(), Framing::UntilClose);
        assert_eq!(
            framing(204, &[("content-length", "5")]).unwrap(),
            Framing::Done
        );
        assert_eq!(
            framing(304, &[("transfer-encoding", "chunked")]).unwrap(),
            Framing::Done
        );
        let head = Framing::of(
            &Method::HEAD,
            StatusCode::OK,
            Version::HTTP_11,
            &headers(&[("content-length", "9")]),
        );
        assert_eq!(head.unwrap(), Framing::Done);
    }

    #[test]
    fn a_length_that_cannot_be_trusted_is_refused() {
        for bad in [
            &[("content-length", "-1")][..],
            &[("content-length", "12a")],
            &[("content-length", "3"), ("content-length", "4")],
            &[("content-length", "3, 4")],
            &[("content-length", "+5")],
            &[("content-length", "")],
            &[("content-length", "99999999999999999999999")],
        ] {
            assert!(
                matches!(framing(200, bad), Err(WireError::BadLength)),
                "{bad:?}"
            );
        }
        assert_eq!(
            framing(200, &[("content-length", "3, 3")]).unwrap(),
            Framing::Length(3)
        );
    }

    #[test]
    fn an_http_1_0_answer_with_transfer_encoding_has_faulty_framing() {
        let of = |version| {
            Framing::of(
                &Method::POST,
                StatusCode::OK,
                version,
                &headers(&[("transfer-encoding", "chunked"), ("content-length", "5")]),
            )
        };
        assert!(matches!(
            of(Version::HTTP_10),
            Err(WireError::TransferEncodingOn10)
        ));
        assert_eq!(of(Version::HTTP_11).unwrap(), Framing::chunked());
    }

    #[test]
    fn chunks_with_extensions_and_trailers_give_their_data() {
        let input = b"5;name=value\r\nhello\r\n1 \t\r\n \r\nA\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n";
        let out = decode_all(Framing::chunked(), input, 3).unwrap();
        assert_eq!(out, b"hello 0123456789");
    }

    #[test]
    fn a_body_cut_before_its_end_is_an_error() {
        let cut = decode_all(Framing::Length(10), b"short", 64);
        assert!(matches!(cut, Err(WireError::Truncated)));
        let cut = decode_all(Framing::chunked(), b"5\r\nhel", 64);
        assert!(matches!(cut, Err(WireError::Truncated)));
        let ended = decode_all(Framing::UntilClose, b"all of it", 4).unwrap();
        assert_eq!(ended, b"all of it");
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for bad in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloXX0\r\n\r\n",
            &[b'1'; MAX_LINE + 1],
            // An empty line where a size is due is no last chunk: "world" is not a trailer.
            b"5\r\nhello\r\n\r\n5\r\nworld\r\n0\r\n\r\n",
            // A bare LF inside an extension, after a size, or ending a trailer or the last line.
            b"5;a\nXX\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"0\r\nx-t: 1\n\r\n",
            b"0\r\n\n",
            // A size with a sign, a space inside it, an overflow; a trailer that is no field.
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            b"0\r\nnot a field\r\n\r\n",
            b"0\r\nbad name: 1\r\n\r\n",
        ] {
            let out = decode_all(Framing::chunked(), bad, 64);
            assert!(matches!(out, Err(WireError::BadChunk)), "{bad:?}");
        }
    }

    #[test]
    fn a_length_body_stops_at_its_length() {
        let mut framing = Framing::Length(4);
        let mut read = BytesMut::from(&b"abcdHTTP/1.1"[..]);
        assert_eq!(
            framing.decode(&mut read).unwrap(),
            Decoded::Data(Bytes::from_static(b"abcd"))
        );
        assert_eq!(framing, Framing::Done);
        assert_eq!(framing.decode(&mut read).unwrap(), Decoded::End);
        assert_eq!(
            &read[..],
            b"HTTP/1.1",
            "what follows is left for the next answer"
        );
    }

    fn chunked(body: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = body;
        let mut sizes = sizes.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap()).clamp(1, rest.len());
            out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    proptest! {
        /// However the worker cuts its chunks and however the reads split them, the data comes
        /// out whole and in order, and nothing after the body is taken.
        #[test]
        fn chunked_bodies_come_out_whole(
            body in proptest::collection::vec(any::<u8>(), 0..2048),
            sizes in proptest::collection::vec(1usize..300, 1..8),
            cut in 1usize..64,
        ) {
            let mut input = chunked(&body, &sizes);
            let framed = input.len();
            input.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            let mut framing = Framing::chunked();
            let mut read = BytesMut::new();
            let mut out = Vec::new();
            let mut fed = 0;
            'feed: for piece in input.chunks(cut) {
                read.extend_from_slice(piece);
                fed += piece.len();
                loop {
                    match framing.decode(&mut read).unwrap() {
                        Decoded::Data(data) => out.extend_from_slice(&data),
                        Decoded::NeedMore => break,
                        Decoded::End => break 'feed,
                    }
                }
            }
            prop_assert_eq!(&out, &body);
            prop_assert_eq!(framing, Framing::Done);
            prop_assert_eq!(fed - read.len(), framed);
        }
    }
}
