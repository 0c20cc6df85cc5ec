//! The protocol's error type: what can go wrong reading or writing frames
//! and multiplexed streams. The agent's and the edge's own error enums carry
//! each of these as a variant of the same name (`From<tuna_protocol::Error>`),
//! so their callers match one enum.
//!
//! Not here, on purpose: [`crate::wire::Rejection`] and
//! [`crate::wire::ErrorCode`] are values the protocol carries (a refused
//! tunnel, a `Reject` frame), not failures of this process.

use crate::limits::{MAX_FRAME_LEN, MAX_HELLO_LEN};

/// Everything the protocol crate can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The peer sent bytes that are not this protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A frame longer than [`MAX_FRAME_LEN`].
    #[error(
        "frame of {0} bytes exceeds the size limit ({MAX_FRAME_LEN} bytes, {MAX_HELLO_LEN} for hello)"
    )]
    FrameTooLarge(usize),
    /// The connection ended.
    #[error("connection closed: {0}")]
    Closed(String),
    /// Socket I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP/2 multiplexing layer.
    #[error("HTTP/2 mux: {0}")]
    Mux(#[from] h2::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
