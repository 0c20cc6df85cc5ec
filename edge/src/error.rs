//! The crate's error type: one enum, a variant per failure, grouped by where
//! it arises.
//!
//! - **The wire protocol and the data plane** (the agent sessions, the
//!   listeners, the fleet): [`Error::Protocol`] … [`Error::Mux`]. The
//!   protocol's own failures (`tuna_protocol::Error`) arrive here as the
//!   variants of the same name.
//! - **The control plane's store and start-up** (`control`, `tls`):
//!   [`Error::Storage`] … [`Error::Internal`]; the REST API answers all of
//!   them `500 internal` (the details go to the edge's log), except that an
//!   unavailable PostgreSQL store is a `503`.
//! - **The control plane's refusals**: [`Error::Unauthorized`] …
//!   [`Error::NoAddressPool`], each answered with one status and `code`
//!   ([`Error::status_and_code`], `impl IntoResponse`); their message is
//!   what the API caller reads.
//! - **The `edge` command** (`cli`): the few failures of its own.
//!
//! Messages carry their cause (`…: {source}`), because most of them end up in
//! one log line, one status condition or one API answer.
//!
//! Not here, on purpose: [`tuna_protocol::wire::Rejection`] and
//! [`tuna_protocol::wire::ErrorCode`] are values the protocol carries (a
//! refused tunnel, a `Reject` frame), not failures of this process; the edge relay's
//! private `ResponseError` is the reason an HTTP/1.1 response could not be
//! relayed, handed to the page it picks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tuna_protocol::api::{ErrorBody, error_code};
use tuna_protocol::wire::{MAX_FRAME_LEN, MAX_HELLO_LEN, Rejection};

/// The PostgreSQL client's error; without the `postgres` feature there is
/// no client, and the variants that carry one cannot arise.
#[cfg(feature = "postgres")]
type PostgresError = tokio_postgres::Error;
#[cfg(not(feature = "postgres"))]
type PostgresError = std::convert::Infallible;

/// Everything the edge crate can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // The wire protocol and the data plane.
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
    /// A setting of the edge's listeners or fleet is unusable; the message
    /// says which.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// TLS setup failed (certificate, key, trust anchors), of the edge, its
    /// fleet's peer links, its PostgreSQL connection or its own CA.
    #[error("TLS: {0}")]
    Tls(String),
    /// Socket I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP/2 multiplexing layer.
    #[error("HTTP/2 mux: {0}")]
    Mux(#[from] h2::Error),

    // The control plane's store and start-up.
    /// The store could not be read or written.
    #[error("store {path}: {context}: {source}")]
    Storage {
        /// The database file.
        path: PathBuf,
        /// What was being done.
        context: &'static str,
        /// redb's error.
        #[source]
        source: Box<redb::Error>,
    },
    /// Another process (usually the running edge) has the store open.
    #[error(
        "the store {path} is in use by another process (is the edge running?); stop it first, or manage keys through the REST API"
    )]
    StoreInUse {
        /// The database file.
        path: PathBuf,
    },
    /// A stored record does not decode (corrupt file or a newer format).
    #[error("store {path}: record {key:?} in {table} does not decode: {source}")]
    CorruptRecord {
        /// The database file.
        path: PathBuf,
        /// Its table.
        table: &'static str,
        /// Its key.
        key: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The PostgreSQL store cannot be reached at start (`--store`).
    #[error(
        "cannot reach the PostgreSQL store {store}: {source}; check that it runs and that the URL, user, password and TLS settings (sslmode, sslrootcert) are right"
    )]
    StoreUnreachable {
        /// The URL without its password.
        store: String,
        /// The client's error.
        #[source]
        source: PostgresError,
    },
    /// 503: the PostgreSQL store is unreachable or failed transiently (a lost
    /// connection, a server shutting down, a serialisation failure); nothing
    /// was written, retry.
    #[error("PostgreSQL store {store}: {context}: {source}")]
    StoreUnavailable {
        /// The URL without its password.
        store: String,
        /// What was being done.
        context: &'static str,
        /// The client's error.
        #[source]
        source: PostgresError,
    },
    /// 503: a PostgreSQL store operation did not finish in time (a network
    /// that swallows packets); the connection is dropped and retried.
    #[error("PostgreSQL store {store}: {context}: no answer within {after:?}")]
    StoreTimedOut {
        /// The URL without its password.
        store: String,
        /// What was being done.
        context: &'static str,
        /// The bound.
        after: Duration,
    },
    /// 503: this fleet replica has not reached its PostgreSQL store for
    /// longer than `--max-store-staleness-secs`; its copy may miss
    /// revocations and releases made through other replicas, so it answers
    /// nothing from it.
    #[error(
        "this edge replica has not reached its store for {} s (more than its bound of {} s, --max-store-staleness-secs); its copy may miss changes made through other replicas: retry later or through another replica",
        stale.as_secs(),
        bound.as_secs()
    )]
    StoreStale {
        /// How long ago the copy was last known complete.
        stale: Duration,
        /// The bound it exceeds.
        bound: Duration,
    },
    /// The PostgreSQL store refused a statement (a schema it does not have,
    /// missing privileges, a constraint the decision should have kept).
    #[error("PostgreSQL store {store}: {context}: {source}")]
    Database {
        /// The URL without its password.
        store: String,
        /// What was being done.
        context: &'static str,
        /// The client's error.
        #[source]
        source: PostgresError,
    },
    /// A row of the PostgreSQL store does not decode.
    #[error("PostgreSQL store: row {key:?} of {table} does not decode: {message}")]
    CorruptRow {
        /// Its table.
        table: &'static str,
        /// Its key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A file (data dir, certificate, key, `<stdout>`) could not be read or
    /// written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The control plane's configuration cannot work (empty port range, bad
    /// base domain, a `--store` URL that does not parse).
    #[error("configuration: {0}")]
    ControlConfig(String),
    /// Something that should not happen (a store operation that panicked).
    #[error("internal: {0}")]
    Internal(String),

    // The control plane's refusals: each is one status and `code` of the REST API.
    /// 401: no key, malformed key, unknown or revoked key.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: the key lacks the scope.
    #[error("{0}")]
    MissingScope(String),
    /// 403: another account holds the reservation.
    #[error("{0}")]
    HeldByOtherAccount(String),
    /// 403: the account's quota for this kind of object is spent.
    #[error("{0}")]
    QuotaExceeded(String),
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 409: the caller's account already holds it.
    #[error("{message}")]
    AlreadyExists {
        /// The explanation.
        message: String,
        /// The existing object, as the API shows it.
        existing: Box<serde_json::Value>,
    },
    /// 422: invalid or reserved name.
    #[error("{0}")]
    InvalidName(String),
    /// 422: requested port outside the configured range.
    #[error("{0}")]
    PortOutOfRange(String),
    /// 422: malformed body or out-of-bounds field.
    #[error("{0}")]
    InvalidRequest(String),
    /// 422: renewal of an expired token.
    #[error("{0}")]
    TokenExpired(String),
    /// 429.
    #[error("rate limit exceeded; retry in {} s", retry_after_seconds(*retry_after))]
    RateLimited {
        /// How long until a request will be admitted.
        retry_after: Duration,
    },
    /// 503: no free port in the range.
    #[error("{0}")]
    PortsExhausted(String),
    /// 422: a requested Gateway address lies outside the edge's pool.
    #[error("{0}")]
    AddressOutOfPool(String),
    /// 503: every address of the Gateway pool is reserved.
    #[error("{0}")]
    AddressesExhausted(String),
    /// 501: the edge was started without `--gateway-addresses`.
    #[error("{0}")]
    NoAddressPool(String),

    // The `edge` command.
    /// A flag the edge cannot serve without (clap requires it; a caller
    /// that builds the arguments itself may not).
    #[error("{0} is required")]
    FlagRequired(&'static str),
    /// `--insecure-plaintext-api` with an `--api-listen` off loopback.
    #[error(
        "--insecure-plaintext-api is for tests on loopback only; {0} is not a loopback address"
    )]
    PlaintextApiOffLoopback(SocketAddr),
    /// The edge could not create its data dir or write its addresses file.
    #[error("{action} {}: {source}", path.display())]
    EdgeFile {
        /// `creating` or `writing`.
        action: &'static str,
        /// The folder or file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
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
    /// The HTTP status and `code` the REST API answers this error with:
    /// each refusal its own, an unavailable store `503`, anything else
    /// `500 internal`.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, error_code::UNAUTHORIZED),
            Self::MissingScope(_) => (StatusCode::FORBIDDEN, error_code::MISSING_SCOPE),
            Self::HeldByOtherAccount(_) => {
                (StatusCode::FORBIDDEN, error_code::HELD_BY_OTHER_ACCOUNT)
            }
            Self::QuotaExceeded(_) => (StatusCode::FORBIDDEN, error_code::QUOTA_EXCEEDED),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, error_code::NOT_FOUND),
            Self::AlreadyExists { .. } => (StatusCode::CONFLICT, error_code::ALREADY_EXISTS),
            Self::InvalidName(_) => (StatusCode::UNPROCESSABLE_ENTITY, error_code::INVALID_NAME),
            Self::PortOutOfRange(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                error_code::PORT_OUT_OF_RANGE,
            ),
            Self::InvalidRequest(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                error_code::INVALID_REQUEST,
            ),
            Self::TokenExpired(_) => (StatusCode::UNPROCESSABLE_ENTITY, error_code::TOKEN_EXPIRED),
            Self::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, error_code::RATE_LIMITED),
            Self::PortsExhausted(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, error_code::PORTS_EXHAUSTED)
            }
            Self::AddressOutOfPool(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                error_code::ADDRESS_OUT_OF_POOL,
            ),
            Self::AddressesExhausted(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                error_code::ADDRESSES_EXHAUSTED,
            ),
            Self::NoAddressPool(_) => (StatusCode::NOT_IMPLEMENTED, error_code::NO_ADDRESS_POOL),
            Self::StoreUnavailable { .. }
            | Self::StoreTimedOut { .. }
            | Self::StoreStale { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                error_code::STORE_UNAVAILABLE,
            ),
            // The store's and start-up's failures (and, should one reach a
            // handler, the data plane's and the command's):
            // details are for the edge's log. No wildcard, so that a new
            // refusal cannot default to a 500 unnoticed.
            Self::Storage { .. }
            | Self::StoreInUse { .. }
            | Self::CorruptRecord { .. }
            | Self::StoreUnreachable { .. }
            | Self::Database { .. }
            | Self::CorruptRow { .. }
            | Self::File { .. }
            | Self::ControlConfig(_)
            | Self::Internal(_)
            | Self::Protocol(_)
            | Self::FrameTooLarge(_)
            | Self::Rejected(_)
            | Self::HandshakeTimeout(_)
            | Self::Closed(_)
            | Self::Config(_)
            | Self::Tls(_)
            | Self::Io(_)
            | Self::Mux(_)
            | Self::FlagRequired(_)
            | Self::PlaintextApiOffLoopback(_)
            | Self::EdgeFile { .. } => (StatusCode::INTERNAL_SERVER_ERROR, error_code::INTERNAL),
        }
    }

    /// A failed redb operation on the store at `path`.
    pub(crate) fn storage<'p>(
        path: &'p std::path::Path,
        context: &'static str,
    ) -> impl FnOnce(redb::Error) -> Self + 'p {
        move |source| Self::Storage {
            path: path.to_owned(),
            context,
            source: Box::new(source),
        }
    }

    /// A failed read or write of `path`.
    pub(crate) fn file(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::File {
            path: path.to_owned(),
            source,
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if status.is_server_error() {
            // Storage details are for the edge's log, not for API callers.
            tracing::error!(error = %self, "control-plane request failed");
        }
        let message = match &self {
            _ if status == StatusCode::INTERNAL_SERVER_ERROR => {
                "internal error; see the edge's log".to_owned()
            }
            Self::StoreUnavailable { .. } | Self::StoreTimedOut { .. } => {
                "the edge's store is unavailable; retry later".to_owned()
            }
            _ => self.to_string(),
        };
        let retry_after = match &self {
            Self::RateLimited { retry_after } => Some(retry_after_seconds(*retry_after)),
            Self::StoreUnavailable { .. } | Self::StoreTimedOut { .. } => {
                Some(STORE_RETRY_AFTER_SECONDS)
            }
            Self::StoreStale { .. } => Some(STORE_STALE_RETRY_AFTER_SECONDS),
            _ => None,
        };
        let existing = match self {
            Self::AlreadyExists { existing, .. } => Some(*existing),
            _ => None,
        };
        let body = ErrorBody {
            code: code.to_owned(),
            message,
            existing,
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// `Retry-After` of a `503 store_unavailable`: a reconnect is tried at the
/// next request, so a second is enough for a server that restarts.
const STORE_RETRY_AFTER_SECONDS: u64 = 1;

/// `Retry-After` of a replica cut off from its store for longer than its
/// bound: such an outage is seldom over within a second; another replica
/// may answer at once.
const STORE_STALE_RETRY_AFTER_SECONDS: u64 = 5;

/// Whole seconds for `Retry-After`, rounded up and at least 1, so a client
/// that waits exactly that long finds a token in the bucket.
fn retry_after_seconds(wait: Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}
