//! The crate's error type: one enum, a variant per failure, grouped by where
//! it arises.
//!
//! - **The tunnel session** ([`crate::Agent`], [`crate::AgentHandle`]):
//!   [`Error::Protocol`] … [`Error::Mux`]. The protocol's own failures
//!   (`tuna_protocol::Error`) arrive here as the variants of the same name.
//! - **The REST client's failures** ([`crate::client::TunaClient`]): the
//!   `Api*` variants say what the edge answered, sorted by what a caller does
//!   about it: adopt ([`Error::ApiAlreadyExists`], [`Error::existing`]), give
//!   up with a condition ([`Error::ApiForbidden`], [`Error::ApiInvalid`]),
//!   wait ([`Error::ApiRateLimited`]) or retry with backoff
//!   ([`Error::ApiTransient`]); [`Error::ClientConfig`] is a client that
//!   could not be built.
//!
//! Messages carry their cause (`…: {source}`), because most of them end up in
//! one log line or one status condition.
//!
//! Not here, on purpose: `tuna_protocol::wire::Rejection` and
//! `tuna_protocol::wire::ErrorCode` are values the protocol carries (a
//! refused tunnel, a `Reject` frame), not failures of this process.

use std::time::Duration;

use serde::de::DeserializeOwned;
use tuna_protocol::api::error_code;
use tuna_protocol::wire::{MAX_FRAME_LEN, MAX_HELLO_LEN, Rejection};

/// Everything the agent crate can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // The tunnel session.
    /// The peer sent bytes that are not this protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A frame longer than [`MAX_FRAME_LEN`].
    #[error(
        "frame of {0} bytes exceeds the size limit ({MAX_FRAME_LEN} bytes, {MAX_HELLO_LEN} for hello)"
    )]
    FrameTooLarge(usize),
    /// The peer refused us, with its reason.
    #[error("rejected by the peer: {0}")]
    Rejected(Rejection),
    /// The handshake did not finish within its time limit.
    #[error("handshake timed out after {0:?}")]
    HandshakeTimeout(Duration),
    /// The connection ended.
    #[error("connection closed: {0}")]
    Closed(String),
    /// A setting of the agent is unusable; the message says which.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// No tunnel with this id is attached to the agent.
    #[error("no tunnel {0:?} is attached to this agent")]
    UnknownTunnel(String),
    /// TLS setup failed (trust anchors, the server name).
    #[error("TLS: {0}")]
    Tls(String),
    /// Socket I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP/2 multiplexing layer.
    #[error("HTTP/2 mux: {0}")]
    Mux(#[from] h2::Error),

    // The REST client: what the edge answered a call of `TunaClient`.
    /// 409: the caller's account already holds this reservation; adopt it
    /// with [`Error::existing`].
    #[error("already exists: {message}")]
    ApiAlreadyExists {
        /// The server's explanation.
        message: String,
        /// The object the account holds.
        existing: Box<serde_json::Value>,
    },
    /// 401: the API key is missing, unknown or revoked.
    #[error("unauthorized: {message}")]
    ApiUnauthorized {
        /// The server's explanation.
        message: String,
    },
    /// 403: the key lacks a scope (`missing_scope`) or another account holds
    /// the name (`held_by_other_account`).
    #[error("forbidden ({code}): {message}")]
    ApiForbidden {
        /// `missing_scope` or `held_by_other_account`.
        code: String,
        /// The server's explanation.
        message: String,
    },
    /// 404: no such object in the caller's account.
    #[error("not found: {message}")]
    ApiNotFound {
        /// The server's explanation.
        message: String,
    },
    /// 422 (or 400): the request can never succeed as sent.
    #[error("invalid ({code}): {message}")]
    ApiInvalid {
        /// `invalid_name`, `port_out_of_range`, `invalid_request`, `token_expired`.
        code: String,
        /// The server's explanation.
        message: String,
    },
    /// 429: wait `retry_after` before the next call.
    #[error("rate limited, retry after {retry_after:?}: {message}")]
    ApiRateLimited {
        /// From the `Retry-After` header.
        retry_after: Option<Duration>,
        /// The server's explanation.
        message: String,
    },
    /// Network failures, timeouts and 5xx answers: retry with backoff.
    #[error("transient failure: {message}")]
    ApiTransient {
        /// What failed.
        message: String,
        /// The HTTP status, when there was an answer.
        status: Option<u16>,
    },
    /// Any other answer the contract does not define.
    #[error("unexpected answer {status}: {message}")]
    ApiUnexpected {
        /// The HTTP status.
        status: u16,
        /// The body or its `message`.
        message: String,
    },
    /// The client could not be built (bad URL, unreadable CA file).
    #[error("client configuration: {0}")]
    ClientConfig(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<tuna_protocol::Error> for Error {
    fn from(error: tuna_protocol::Error) -> Self {
        match error {
            tuna_protocol::Error::Protocol(message) => Self::Protocol(message),
            tuna_protocol::Error::FrameTooLarge(len) => Self::FrameTooLarge(len),
            tuna_protocol::Error::Closed(message) => Self::Closed(message),
            tuna_protocol::Error::Io(e) => Self::Io(e),
            tuna_protocol::Error::Mux(e) => Self::Mux(e),
            // `tuna_protocol::Error` is non-exhaustive: a failure it adds
            // later is still a failure of the protocol.
            other => Self::Protocol(other.to_string()),
        }
    }
}

impl Error {
    /// The object behind a 409, decoded as `T` (e.g.
    /// `tuna_protocol::api::Domain`).
    pub fn existing<T: DeserializeOwned>(&self) -> Option<T> {
        match self {
            Self::ApiAlreadyExists { existing, .. } => {
                serde_json::from_value((**existing).clone()).ok()
            }
            _ => None,
        }
    }

    /// The machine-readable code the edge answered a
    /// [`crate::client::TunaClient`] call with, when there was one (`None`
    /// for every other error).
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::ApiAlreadyExists { .. } => Some(error_code::ALREADY_EXISTS),
            Self::ApiUnauthorized { .. } => Some(error_code::UNAUTHORIZED),
            Self::ApiForbidden { code, .. } | Self::ApiInvalid { code, .. } => Some(code),
            Self::ApiNotFound { .. } => Some(error_code::NOT_FOUND),
            Self::ApiRateLimited { .. } => Some(error_code::RATE_LIMITED),
            _ => None,
        }
    }
}
