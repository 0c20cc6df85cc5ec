//! The control plane's error type: storage and start-up failures, and every
//! refusal the REST API answers with (each maps to one status and `code`).

use std::path::PathBuf;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::{ErrorBody, error_code};

/// A control-plane failure. The REST layer turns it into `{code, message}`.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
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
        "cannot reach the PostgreSQL store {store}: {source}; check that it runs and that the URL, user and password are right"
    )]
    StoreUnreachable {
        /// The URL without its password.
        store: String,
        /// The client's error.
        #[source]
        source: tokio_postgres::Error,
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
        source: tokio_postgres::Error,
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
        source: tokio_postgres::Error,
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
    /// A file (data dir, certificate, key) could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Certificate generation or loading failed.
    #[error("TLS: {0}")]
    Tls(String),
    /// The configuration cannot work (empty port range, bad base domain).
    #[error("configuration: {0}")]
    Config(String),
    /// Something that should not happen (a store operation that panicked).
    #[error("internal: {0}")]
    Internal(String),

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
}

/// `Result` with [`ControlError`].
pub type Result<T, E = ControlError> = std::result::Result<T, E>;

impl ControlError {
    /// The HTTP status and `code` this error is answered with.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Storage { .. }
            | Self::StoreInUse { .. }
            | Self::CorruptRecord { .. }
            | Self::StoreUnreachable { .. }
            | Self::Database { .. }
            | Self::CorruptRow { .. }
            | Self::Io { .. }
            | Self::Tls(_)
            | Self::Config(_)
            | Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, error_code::INTERNAL),
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
            Self::StoreUnavailable { .. } | Self::StoreTimedOut { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                error_code::STORE_UNAVAILABLE,
            ),
        }
    }

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
}

impl IntoResponse for ControlError {
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

/// Whole seconds for `Retry-After`, rounded up and at least 1, so a client
/// that waits exactly that long finds a token in the bucket.
fn retry_after_seconds(wait: Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}
