//! The table: answers a worker could send, by the section of RFC 9112 they test. Each is read
//! by the wire client and by hyper's; `accepted` is what the wire client does with it, `why`
//! the reason wherever the two clients differ (an answer one refuses, or a connection one uses
//! again).

use axum::http::Method;

/// One answer of the table.
pub(super) struct Case {
    pub(crate) name: &'static str,
    /// The section of RFC 9112 it tests.
    pub(crate) section: &'static str,
    /// The bytes the worker writes after reading the request.
    pub(crate) answer: &'static [u8],
    pub(crate) method: Method,
    /// The worker closes after the answer (for answers that end only so).
    pub(crate) close: bool,
    /// The wire client reads it whole.
    pub(crate) accepted: bool,
    /// Why the clients differ on it, where they do.
    pub(crate) why: Option<&'static str>,
}

/// A POST answered on a connection the worker keeps open, accepted alike by both clients.
pub(super) const CASE: Case = Case {
    name: "",
    section: "",
    answer: b"",
    method: Method::POST,
    close: false,
    accepted: true,
    why: None,
};

const HEAD_LIMIT: &str = "a head over 64 KiB: the wire client's bound (hyper's buffer allows \
    400 KiB); an engine's head is a few hundred bytes";
const INFORMATIONAL: &str = "more than 8 informational answers: the wire client's bound (hyper \
    skips any number); none is asked for, so a worker sending them is looping";
const NOT_TRUSTED: &str = "both Transfer-Encoding and Content-Length: the wire client reads the \
    chunks, drops the length and does not use the connection again (RFC 9112 section 6.1: the \
    sender may be trying to smuggle a message); hyper keeps it";
const EXTENSIONS: &str = "over 4 KiB of chunk extensions: the wire client's bound (hyper's is \
    16 KiB over the body); no engine sends any";
const TRAILERS: &str = "over 64 trailer fields or 8 KiB of trailers: the wire client's bound \
    (hyper's is 100 fields and 16 KiB); no engine sends trailers";

macro_rules! answer {
    ($($part:expr),+ $(,)?) => {
        concat!($($part),+).as_bytes()
    };
}

pub(super) static CASES: &[Case] = &[
    // Section 4: the status line.
    Case { name: "a plain 200 with a length", section: "4", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "an empty reason phrase", section: "4", answer: b"HTTP/1.1 200 \r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "no reason phrase and no space", section: "4", answer: b"HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "a reason phrase with obs-text", section: "4", answer: b"HTTP/1.1 200 \xc3\xa9t\xc3\xa9\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "a four-digit status", section: "4", answer: b"HTTP/1.1 2000 OK\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a two-digit status", section: "4", answer: b"HTTP/1.1 20 OK\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a status with a letter", section: "4", answer: b"HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a status past 599", section: "4", answer: b"HTTP/1.1 600 Odd\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "a 500 with a body", section: "4", answer: b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nfail", ..CASE },
    Case { name: "version HTTP/2.0", section: "2.3", answer: b"HTTP/2.0 200 OK\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "version HTTP/1.2", section: "2.3", answer: b"HTTP/1.2 200 OK\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a lower-case protocol name", section: "2.3", answer: b"http/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "two spaces after the version", section: "4", answer: b"HTTP/1.1  200 OK\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "not HTTP at all", section: "2.1", answer: b"SSH-2.0-OpenSSH\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "an empty line before the status line", section: "2.2", answer: b"\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "bare LF line ends in the head", section: "2.2", answer: b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok", ..CASE },
    Case { name: "a bare CR ending the status line", section: "2.2", answer: b"HTTP/1.1 200 OK\rcontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a head cut by the close", section: "2.2", answer: b"HTTP/1.1 200 OK\r\ncontent-len", close: true, accepted: false, ..CASE },
    Case { name: "nothing, then the close", section: "9.6", answer: b"", close: true, accepted: false, ..CASE },
    // Section 5: fields.
    Case { name: "a field with an empty value", section: "5", answer: b"HTTP/1.1 200 OK\r\nx-a:\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "spaces around a value", section: "5.1", answer: b"HTTP/1.1 200 OK\r\nx-a:   v  \t\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "a space before the colon", section: "5.1", answer: b"HTTP/1.1 200 OK\r\nx-a : v\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a separator in a field name", section: "5.1", answer: b"HTTP/1.1 200 OK\r\nx(a): v\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "an empty field name", section: "5.1", answer: b"HTTP/1.1 200 OK\r\n: v\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a line without a colon", section: "5", answer: b"HTTP/1.1 200 OK\r\nno colon here\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "obs-fold", section: "5.2", answer: b"HTTP/1.1 200 OK\r\nx-a: one\r\n two\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "whitespace before the first field", section: "2.2", answer: b"HTTP/1.1 200 OK\r\n x-a: v\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a control byte in a value", section: "5.5", answer: b"HTTP/1.1 200 OK\r\nx-a: a\x01b\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a NUL in a value", section: "5.5", answer: b"HTTP/1.1 200 OK\r\nx-a: a\x00b\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a bare CR in a value", section: "5.5", answer: b"HTTP/1.1 200 OK\r\nx-a: a\rb\r\ncontent-length: 2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "obs-text in a value", section: "5.5", answer: b"HTTP/1.1 200 OK\r\nx-a: \xff\xfe\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "a head over 64 KiB", section: "5", answer: &HUGE_HEAD, accepted: false, why: Some(HEAD_LIMIT), ..CASE },
    Case { name: "101 header fields", section: "5", answer: FIELDS_101, accepted: false, ..CASE },
    // Section 6.2-6.3: Content-Length.
    Case { name: "a zero length", section: "6.2", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", ..CASE },
    Case { name: "a length with leading zeros", section: "6.2", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 002\r\n\r\nok", ..CASE },
    Case { name: "a length with a plus sign", section: "6.2", answer: b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a negative length", section: "6.2", answer: b"HTTP/1.1 200 OK\r\ncontent-length: -2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a hexadecimal length", section: "6.2", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 0x2\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "an empty length", section: "6.2", answer: b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a length past u64", section: "6.2", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a length list of equal values", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok", ..CASE },
    Case { name: "a length list of different values", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2, 3\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a length list with an empty member", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2,\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "two equal length fields", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "two different length fields", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok", accepted: false, ..CASE },
    Case { name: "a body shorter than its length", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", close: true, accepted: false, ..CASE },
    Case { name: "bytes after a body of known length", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", ..CASE },
    Case { name: "a second answer nobody asked for", section: "9.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno", ..CASE },
    // Section 6.1, 7: Transfer-Encoding.
    Case { name: "chunked", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "Chunked in capitals", section: "6.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: CHUNKED\r\n\r\n2\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "gzip then chunked", section: "6.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "chunked in a second field", section: "6.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "chunked not last: to the close", section: "6.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\nraw bytes", close: true, ..CASE },
    Case { name: "a coding other than chunked: to the close", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\n\r\nraw bytes", close: true, ..CASE },
    Case { name: "chunked and a length", section: "6.1", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", why: Some(NOT_TRUSTED), ..CASE },
    Case { name: "chunked on HTTP/1.0", section: "6.1", answer: b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "chunked and a length on HTTP/1.0", section: "6.1", answer: b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\nok", close: true, accepted: false, ..CASE },
    // Section 7.1: chunks.
    Case { name: "an upper-case hex size", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n", ..CASE },
    Case { name: "a size with leading zeros", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0002\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "spaces after a size", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2 \t\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "a space before a size", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n 2\r\nok\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "a size with a sign", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n+2\r\nok\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "a size past u64", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1ffffffffffffffff\r\nok\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "a size that is no number", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "a bare LF after a size", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\nok\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "an extension", section: "7.1.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;name=value\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "a quoted extension", section: "7.1.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;n=\"a;b\"\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "an extension after spaces", section: "7.1.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2 ;n\r\nok\r\n0\r\n\r\n", ..CASE },
    Case { name: "a bare LF in an extension", section: "7.1.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;a\nXX\r\nok\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "an extension on the last chunk", section: "7.1.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0;end\r\n\r\n", ..CASE },
    Case { name: "over 4 KiB of extensions", section: "7.1.1", answer: MANY_EXTENSIONS, accepted: false, why: Some(EXTENSIONS), ..CASE },
    Case { name: "data without its CRLF", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "an empty line where a size is due", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n\r\n5\r\nworld\r\n0\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "chunks cut by the close", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel", close: true, accepted: false, ..CASE },
    Case { name: "no last chunk before the close", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n", close: true, accepted: false, ..CASE },
    Case { name: "a trailer", section: "7.1.2", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n", ..CASE },
    Case { name: "a trailer that is no field", section: "7.1.2", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nnot a field\r\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "a trailer ended by a bare LF", section: "7.1.2", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\n\r\n", close: true, accepted: false, ..CASE },
    Case { name: "the last line a bare LF", section: "7.1", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\n", close: true, accepted: false, ..CASE },
    Case { name: "65 trailer fields", section: "7.1.2", answer: MANY_TRAILERS, accepted: false, why: Some(TRAILERS), ..CASE },
    // Section 6.3: answers without a body, and bodies to the close.
    Case { name: "204 with a length", section: "6.3", answer: b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", ..CASE },
    Case { name: "204 with chunked", section: "6.3", answer: b"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n", ..CASE },
    Case { name: "304 with a length", section: "6.3", answer: b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n", ..CASE },
    Case { name: "HEAD with a length", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n", method: Method::HEAD, ..CASE },
    Case { name: "HEAD with chunked", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", method: Method::HEAD, ..CASE },
    Case { name: "a GET answered with a length", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", method: Method::GET, ..CASE },
    Case { name: "no length: to the close", section: "6.3", answer: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\ndata: [DONE]\n\n", close: true, ..CASE },
    Case { name: "HTTP/1.0 with a length", section: "9.3", answer: b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "HTTP/1.0 to the close", section: "6.3", answer: b"HTTP/1.0 200 OK\r\n\r\nall of it", close: true, ..CASE },
    Case { name: "HTTP/1.0 keep-alive", section: "9.3", answer: b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", why: Some("an HTTP/1.0 answer that asks to keep the connection: hyper uses it again, the wire client closes every HTTP/1.0 connection (no engine answers in HTTP/1.0)"), ..CASE },
    // Section 9: the connection.
    Case { name: "connection: close", section: "9.6", answer: b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "Connection: Close in capitals", section: "9.6", answer: b"HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "close among other tokens", section: "9.6", answer: b"HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    // Section 15.2 (RFC 9110) and 9112's 1xx handling.
    Case { name: "100 Continue before the answer", section: "4", answer: b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "103 Early Hints with fields", section: "4", answer: b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", ..CASE },
    Case { name: "8 informational answers", section: "4", answer: answer!("HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"), ..CASE },
    Case { name: "9 informational answers", section: "4", answer: answer!("HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 102 Processing\r\n\r\n", "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"), accepted: false, why: Some(INFORMATIONAL), ..CASE },
    Case { name: "101 nobody asked for", section: "9.9", answer: b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n", close: true, accepted: false, why: Some("a 101 to a request that asked for no upgrade: hyper's connection gives it to the caller as an answer with no body (taking the upgrade is the caller's part); the wire client, which never asks for one, refuses it"), ..CASE },
];

/// A 200 whose one field makes the head 70 KiB (a static: clippy keeps large arrays out of
/// consts, which are copied where used).
static HUGE_HEAD: [u8; HUGE_HEAD_LEN] = repeated(
    b"HTTP/1.1 200 OK\r\nx-big: ",
    b"v",
    b"\r\ncontent-length: 2\r\n\r\nok",
);
const HUGE_HEAD_LEN: usize = 70 * 1024 + 50;

/// A 200 with 100 fields of `x-f: 1` and its length: 101 fields.
const FIELDS_101: &[u8] = {
    const START: &[u8] = b"HTTP/1.1 200 OK\r\n";
    const FIELD: &[u8] = b"x-f: 1\r\n";
    const END: &[u8] = b"content-length: 2\r\n\r\nok";
    const OUT: [u8; START.len() + 100 * FIELD.len() + END.len()] = repeated(START, FIELD, END);
    &OUT
};

/// A chunked 200 whose chunks carry 5 KiB of extensions, 50 bytes at a time.
const MANY_EXTENSIONS: &[u8] = {
    const START: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
    const CHUNK: &[u8] = b"1;xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\na\r\n";
    const END: &[u8] = b"0\r\n\r\n";
    const OUT: [u8; START.len() + 100 * CHUNK.len() + END.len()] = repeated(START, CHUNK, END);
    &OUT
};

/// A chunked 200 with 65 trailer fields (1 KiB of them).
const MANY_TRAILERS: &[u8] = {
    const START: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n";
    const FIELD: &[u8] = b"x-t: 1\r\n";
    const END: &[u8] = b"\r\n";
    const OUT: [u8; START.len() + 65 * FIELD.len() + END.len()] = repeated(START, FIELD, END);
    &OUT
};

/// `start`, then `middle` as often as fits, then `end`, in `N` bytes.
const fn repeated<const N: usize>(start: &[u8], middle: &[u8], end: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut at = 0;
    let mut i = 0;
    while i < start.len() {
        out[at] = start[i];
        at += 1;
        i += 1;
    }
    while at + middle.len() <= N - end.len() {
        let mut j = 0;
        while j < middle.len() {
            out[at] = middle[j];
            at += 1;
            j += 1;
        }
    }
    let mut k = 0;
    while k < end.len() {
        out[at] = end[k];
        at += 1;
        k += 1;
    }
    out
}
