//! The least a hyper-based gateway does per request: an HTTP/1.1 server that reads each
//! request's body whole and sends it on over a kept-alive hyper client connection to one
//! upstream, streaming the answer back. No routing, admission, metrics or JSON.
//!
//! It exists to be measured beside `sluice serve` (docs/benchmarks.md, "What a request costs"):
//! the instructions it spends per request are the floor that sluice's own work sits on.
//!
//! `cargo run --release -p sluice-bench --example hyper_floor -- LISTEN_ADDR UPSTREAM...`, each
//! upstream `host:port` or `http://host:port`; client connections take them in turn, as
//! `sluice bench overhead --gateway 'floor=hyper_floor 127.0.0.1:{port} {workers}'` gives them.

// Functions stay under 60 lines (clippy.toml), test code excepted: `cargo clippy` holds it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

type Upstream = client::SendRequest<Full<Bytes>>;

#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error(transparent)]
    Http(#[from] hyper::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hyper_floor LISTEN_ADDR UPSTREAM...";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let upstreams = args
        .map(|a| a.trim_start_matches("http://").parse())
        .collect::<Result<Vec<SocketAddr>, _>>()?;
    if upstreams.is_empty() {
        return Err(usage.into());
    }
    let listener = TcpListener::bind(listen).await?;
    for turn in 0.. {
        let upstream = upstreams[turn % upstreams.len()];
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            // One upstream connection per client connection, opened on its first request.
            let sender = std::sync::Arc::new(Mutex::new(None::<Upstream>));
            let service = service_fn(move |request: Request<Incoming>| {
                let sender = sender.clone();
                proxy(request, upstream, sender)
            });
            let _ = server::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
    Ok(())
}

async fn proxy(
    request: Request<Incoming>,
    upstream: SocketAddr,
    sender: std::sync::Arc<Mutex<Option<Upstream>>>,
) -> Result<Response<Incoming>, Failed> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let request = Request::from_parts(parts, Full::new(body));
    let mut slot = sender.lock().await;
    if slot.as_ref().is_none_or(|s| s.is_closed()) {
        let stream = TcpStream::connect(upstream).await?;
        let _ = stream.set_nodelay(true);
        let (s, connection) = client::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        *slot = Some(s);
    }
    let Some(s) = slot.as_mut() else {
        unreachable!("set above")
    };
    s.ready().await?;
    Ok(s.send_request(request).await?)
}
