//! Why a message cannot be relayed, and the status a server answers it with.

/// Why a message cannot be relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The head is larger than the limit.
    #[error("message head too large")]
    HeadTooLarge,
    /// More than [`MAX_HEADERS`](crate::MAX_HEADERS) header fields.
    #[error("too many header fields")]
    TooManyHeaders,
    /// Not HTTP/1.0 or 1.1 (e.g. the HTTP/2 connection preface).
    #[error("not an HTTP/1.x message")]
    Version,
    /// Not an HTTP message head at all.
    #[error("malformed message head")]
    Malformed,
    /// A well-formed head whose fields break the rules above.
    #[error("{0}")]
    Invalid(&'static str),
    /// A body that does not follow its framing.
    #[error("{0}")]
    Body(&'static str),
}

impl Error {
    /// The status a server answers a request with this error: 431 for the
    /// size limits, 505 for another version, 400 for the rest.
    pub fn status(self) -> u16 {
        match self {
            Self::HeadTooLarge | Self::TooManyHeaders => 431,
            Self::Version => 505,
            Self::Malformed | Self::Invalid(_) | Self::Body(_) => 400,
        }
    }
}
