//! The crate's one error enum.

use crate::normalize::InvalidHost;

/// The crate's error type. Almost everything that can go wrong with a spec is
/// a [`BuildIssue`](crate::BuildIssue), not an error: a table is still built from the rest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The table indexes specs with 32-bit integers to stay compact.
    #[error("{count} route specs given; a table holds at most {max}: split the configuration")]
    TooManySpecs {
        /// Specs given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// [`HostTable::build`](crate::HostTable::build) was given a host that cannot be routed.
    #[error("{host:?} cannot be a route host: {reason}")]
    InvalidHost {
        /// The host given.
        host: String,
        /// Why it is not valid.
        reason: InvalidHost,
    },
    /// [`HostTable::build`](crate::HostTable::build) was given a spec of another host.
    #[error("a spec for {spec:?} was given to the table of {host:?}")]
    OtherHost {
        /// The table's host.
        host: String,
        /// The spec's host.
        spec: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
