//! What an exchange with a worker is, whichever client makes it: the request, and why one got
//! no answer or broke off. Below the clients (`pool`, `grpc`, `client`), which all speak it.

use std::time::Duration;

use axum::http::Request;
use bytes::Bytes;

/// A request to a worker: its body is always read whole first (the gateway routes on it).
pub type UpstreamRequest = Request<Bytes>;

/// Why a request got no answer from a worker.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("no connection within {0:?}")]
    ConnectTimeout(Duration),
    #[error("the exchange failed: {0}")]
    Exchange(#[source] ExchangeError),
    /// From the pooled client (TLS or HTTP/2 workers).
    #[error(transparent)]
    Pooled(hyper_util::client::legacy::Error),
    /// A gRPC worker's transport failed (`connect`: before anything was sent).
    #[error("gRPC transport: {status}")]
    Grpc {
        connect: bool,
        status: tonic::Status,
    },
    /// The request cannot be put to a gRPC worker as it is: the client's to change, nothing
    /// was sent. The field it names, if one, and why.
    #[error("{message}")]
    NotOnGrpc {
        param: Option<&'static str>,
        message: String,
    },
    /// No tokenizer for a gRPC worker yet: none named, none fetched from a worker.
    #[error("no tokenizer is loaded for gRPC workers")]
    NoTokenizer,
}

impl SendError {
    /// The worker could not be reached at all (nothing was sent).
    pub(crate) fn is_connect(&self) -> bool {
        match self {
            SendError::Connect(_) | SendError::ConnectTimeout(_) => true,
            SendError::Exchange(_) => false,
            SendError::Pooled(e) => e.is_connect(),
            SendError::Grpc { connect, .. } => *connect,
            SendError::NotOnGrpc { .. } | SendError::NoTokenizer => false,
        }
    }
}

impl SendError {
    /// The worker answered, but not as HTTP allows or within the client's bounds (on hyper's
    /// pooled client, a head hyper could not parse).
    pub(crate) fn is_bad_answer(&self) -> bool {
        match self {
            SendError::Exchange(e) => e.is_bad_answer(),
            SendError::Pooled(e) => std::error::Error::source(e)
                .and_then(|e| e.downcast_ref::<hyper::Error>())
                .is_some_and(|e| e.is_parse() || e.is_parse_too_large()),
            _ => false,
        }
    }
}

/// Why an exchange broke off once the request was on its way, or its answer's body did.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// On hyper's pooled client (TLS or HTTP/2 workers).
    #[error(transparent)]
    Hyper(hyper::Error),
    /// On a connection of our own (cleartext HTTP/1.1 workers).
    #[error(transparent)]
    Wire(super::wire::WireError),
    /// A gRPC worker's stream broke off.
    #[error("gRPC stream: {0}")]
    Grpc(tonic::Status),
}

impl ExchangeError {
    /// The worker's answer broke HTTP's rules or the client's bounds (`wire::limits`), where
    /// the others are a connection lost.
    pub(crate) fn is_bad_answer(&self) -> bool {
        match self {
            ExchangeError::Hyper(e) => e.is_parse() || e.is_parse_too_large(),
            ExchangeError::Wire(e) => e.is_bad_answer(),
            ExchangeError::Grpc(_) => false,
        }
    }
}
