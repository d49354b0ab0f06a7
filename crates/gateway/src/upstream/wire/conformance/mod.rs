//! The worker client held to hyper 1.x's client, answer by answer: each answer of the table
//! (`cases`), and answers mutated byte by byte from valid ones, is served by a scripted worker
//! on loopback and read by both clients. The rule: the wire client never accepts what hyper
//! refuses; where both accept, the status and the body are the same, and so is what the worker
//! sees of the connection afterwards (whether a second request comes on it). Where the wire
//! client refuses what hyper accepts, or keeps a connection hyper would not (or the reverse),
//! the case says why.
//!
//! ## Layout
//!
//! - `mod.rs` — the scripted worker, the two clients, the rule, the tests.
//! - `cases` — the table, by RFC 9112 section.

mod cases;

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{Method, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::{request_head, Conn};
use cases::{Case, CASES};

/// The longest a scripted exchange may take: far more than loopback needs; a client that
/// waits past it is a case that forgot to close.
const BOUND: Duration = Duration::from_secs(10);

/// What a client made of an answer.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    Answer { status: u16, body: Vec<u8> },
    Refused(String),
}

/// A client's reading of one answer, and whether the worker then saw a second request on the
/// same connection.
#[derive(Debug)]
struct Outcome {
    read: Read,
    reused: bool,
}

/// A worker on loopback that reads one request, writes `answer`, and then either closes
/// (`close`) or waits for a second request on the connection, answers it, and reports whether
/// one came.
async fn worker(answer: Vec<u8>, close: bool) -> (SocketAddr, oneshot::Receiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, verdict) = oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let mut read = Vec::new();
        if !request(&mut socket, &mut read).await || socket.write_all(&answer).await.is_err() {
            let _ = seen.send(false);
            return;
        }
        if close {
            let _ = seen.send(false);
            return;
        }
        let second = request(&mut socket, &mut read).await;
        if second {
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext")
                .await;
        }
        let _ = seen.send(second);
    });
    (addr, verdict)
}

/// Reads one request (a head, and a body of its `content-length`) off `socket`, keeping what
/// follows in `read`; false when the connection ends first.
async fn request(socket: &mut TcpStream, read: &mut Vec<u8>) -> bool {
    loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&read[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if read.len() >= end + 4 + length {
                read.drain(..end + 4 + length);
                return true;
            }
        }
        let mut buf = [0u8; 4096];
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => read.extend_from_slice(&buf[..n]),
        }
    }
}

/// The request both clients send: a small JSON body, as the gateway sends; none for GET and
/// HEAD.
fn request_for(method: &Method) -> Request<Bytes> {
    let body = if *method == Method::POST {
        Bytes::from_static(b"{\"model\":\"m\"}")
    } else {
        Bytes::new()
    };
    Request::builder()
        .method(method.clone())
        .uri("/v1/chat/completions")
        .header("host", "worker")
        .body(body)
        .unwrap()
}

/// The answer as the wire client reads it, and the connection used again as the pool would
/// (read to its end, reusable, not closed while idle).
async fn by_wire(addr: SocketAddr, method: &Method) -> (Read, Option<Conn>) {
    let (parts, body) = request_for(method).into_parts();
    let (head, _) = request_head(&parts, "worker", body.len());
    let mut conn = Conn::new(TcpStream::connect(addr).await.unwrap());
    if let Err(e) = conn.write(&head, &body).await {
        return (Read::Refused(e.to_string()), None);
    }
    let answer = match conn.read_head(method).await {
        Ok(answer) => answer,
        Err(e) => return (Read::Refused(e.to_string()), None),
    };
    let (response, mut body) = answer.body(conn, false);
    let mut data = Vec::new();
    while let Some(piece) = std::future::poll_fn(|cx| body.poll_data(cx)).await {
        match piece {
            Ok(piece) => data.extend_from_slice(&piece),
            Err(e) => return (Read::Refused(e.to_string()), None),
        }
    }
    let again = body.take_reusable().filter(|conn| !conn.is_closed());
    let read = Read::Answer {
        status: response.status().as_u16(),
        body: data,
    };
    (read, again)
}

async fn wire_outcome(case: &Case) -> Outcome {
    let (addr, verdict) = worker(case.answer.to_vec(), case.close).await;
    let (read, again) = by_wire(addr, &case.method).await;
    if let Some(mut conn) = again {
        let (parts, body) = request_for(&Method::GET).into_parts();
        let (head, _) = request_head(&parts, "worker", body.len());
        if conn.write(&head, &body).await.is_ok() {
            let _ = conn.read_head(&Method::GET).await;
        }
    }
    Outcome {
        read,
        reused: verdict.await.unwrap_or(false),
    }
}

/// The answer as hyper's client reads it on a connection of its own, and a second request
/// sent on that connection when hyper says it is ready for one.
async fn hyper_outcome(case: &Case) -> Outcome {
    let (addr, verdict) = worker(case.answer.to_vec(), case.close).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driving = tokio::spawn(conn);
    let read = match sender
        .send_request(request_for(&case.method).map(Full::new))
        .await
    {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.into_body().collect().await {
                Ok(body) => Read::Answer {
                    status,
                    body: body.to_bytes().to_vec(),
                },
                Err(e) => Read::Refused(e.to_string()),
            }
        }
        Err(e) => Read::Refused(e.to_string()),
    };
    if matches!(read, Read::Answer { .. }) && sender.ready().await.is_ok() {
        let _ = sender
            .send_request(request_for(&Method::GET).map(Full::new))
            .await;
    }
    drop(sender);
    driving.abort();
    let _ = driving.await;
    Outcome {
        read,
        reused: verdict.await.unwrap_or(false),
    }
}

/// Both clients' outcomes for `case`.
async fn both(case: &Case) -> (Outcome, Outcome) {
    let run = async { (wire_outcome(case).await, hyper_outcome(case).await) };
    tokio::time::timeout(BOUND, run)
        .await
        .unwrap_or_else(|_| panic!("{}: a client waited past {BOUND:?}", case.name))
}

/// What breaks the rule in one case's outcomes, if anything.
fn judged(case: &Case, wire: &Outcome, hyper: &Outcome) -> Option<String> {
    let name = format!("{} (section {})", case.name, case.section);
    let differs = match (&wire.read, &hyper.read) {
        (Read::Answer { .. }, Read::Refused(e)) => {
            return Some(format!(
                "{name}: the wire client accepted what hyper refused ({e})"
            ))
        }
        (w @ Read::Answer { .. }, h @ Read::Answer { .. }) if w != h => {
            return Some(format!(
                "{name}: read as {w:?} by the wire client, {h:?} by hyper"
            ))
        }
        (Read::Answer { .. }, Read::Answer { .. }) => wire.reused != hyper.reused,
        (Read::Refused(_), Read::Answer { .. }) => true,
        (Read::Refused(_), Read::Refused(_)) => false,
    };
    let accepted = matches!(wire.read, Read::Answer { .. });
    if accepted != case.accepted {
        return Some(format!(
            "{name}: the table says the wire client {} it, it {} ({:?})",
            if case.accepted { "accepts" } else { "refuses" },
            if accepted { "accepted" } else { "refused" },
            wire.read
        ));
    }
    match (differs, case.why) {
        (true, None) => Some(format!(
            "{name}: the clients differ (wire {wire:?}, hyper {hyper:?}) and the table says not why"
        )),
        (false, Some(_)) => Some(format!(
            "{name}: the table gives a reason for a difference there is not (wire {wire:?}, hyper {hyper:?})"
        )),
        _ => None,
    }
}

#[tokio::test]
async fn the_wire_client_is_never_looser_than_hyper_on_the_table_of_answers() {
    assert!(CASES.len() >= 60, "{} cases", CASES.len());
    let mut broken = Vec::new();
    for case in CASES {
        let (wire, hyper) = both(case).await;
        broken.extend(judged(case, &wire, &hyper));
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// Valid answers the property test starts from: each framing, informational answers, an
/// HTTP/1.0 answer, a body-less status.
const SEEDS: [&[u8]; 6] = [
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"id\":\"a\"}\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6;x=y\r\ndata: \r\n4\r\nab\n\n\r\n0\r\nx-t: 1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: [DONE]\n\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\nabc",
    b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
];

/// Bytes that matter to HTTP/1.1's syntax, most mutations draw from.
const TELLING: &[u8] = b"\r\n \t:;,0159aAfF+-\"\x00\x7f\x80\xff";

/// Where in an answer a mutation lands: anywhere, or next to one of its syntax bytes (a
/// colon, a line end, a space, a digit), where the rules are and a loose parser slips.
#[derive(Debug, Clone, Copy)]
enum Place {
    Anywhere(usize),
    Near { nth: usize, offset: i8 },
}

impl Place {
    fn index(self, answer: &[u8], room: usize) -> usize {
        let at = match self {
            Place::Anywhere(at) => at,
            Place::Near { nth, offset } => {
                let syntax: Vec<usize> = answer
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b":\r\n ;,".contains(b) || b.is_ascii_digit())
                    .map(|(i, _)| i)
                    .collect();
                match syntax.len() {
                    0 => nth,
                    n => syntax[nth % n].saturating_add_signed(isize::from(offset)),
                }
            }
        };
        at % room.max(1)
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(Place, u8),
    Insert(Place, u8),
    Delete(Place),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        3 => proptest::sample::select(TELLING),
        1 => any::<u8>(),
    ];
    let place = prop_oneof![
        1 => any::<usize>().prop_map(Place::Anywhere),
        3 => (any::<usize>(), -1i8..=1).prop_map(|(nth, offset)| Place::Near { nth, offset }),
    ];
    prop_oneof![
        (place.clone(), byte.clone()).prop_map(|(at, b)| Mutation::Replace(at, b)),
        (place.clone(), byte).prop_map(|(at, b)| Mutation::Insert(at, b)),
        place.prop_map(Mutation::Delete),
    ]
}

fn mutated(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut answer = seed.to_vec();
    for m in mutations {
        match *m {
            Mutation::Replace(at, b) if !answer.is_empty() => {
                let at = at.index(&answer, answer.len());
                answer[at] = b;
            }
            Mutation::Insert(at, b) => {
                let at = at.index(&answer, answer.len() + 1);
                answer.insert(at, b);
            }
            Mutation::Delete(at) if !answer.is_empty() => {
                let at = at.index(&answer, answer.len());
                answer.remove(at);
            }
            _ => {}
        }
    }
    answer
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Whatever a few bytes of a valid answer become, the wire client accepts it only if hyper
    /// does, and then reads the same status and body. (The worker closes after each answer,
    /// so that an answer made longer than it is ends; the connection's reuse is the table's.)
    #[test]
    fn a_mutated_answer_is_accepted_only_as_hyper_accepts_it(
        seed in 0..SEEDS.len(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let answer: &'static [u8] = mutated(SEEDS[seed], &mutations).leak();
        let case = Case { name: "mutated", answer, close: true, ..cases::CASE };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (wire, hyper) = runtime.block_on(both(&case));
        match (&wire.read, &hyper.read) {
            (Read::Answer { .. }, Read::Refused(e)) => {
                prop_assert!(false, "accepted {:?}, which hyper refused ({e})", String::from_utf8_lossy(answer));
            }
            (w @ Read::Answer { .. }, h @ Read::Answer { .. }) => {
                prop_assert_eq!(w, h, "{:?}", String::from_utf8_lossy(answer));
            }
            _ => {}
        }
    }
}
