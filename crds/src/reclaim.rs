//! What the edge does with a Domain's or a TCPEndpoint's reservation when
//! the resource goes.

use serde::{Deserialize, Serialize};

/// What happens to the reservation at the edge when its resource is deleted.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum ReclaimPolicy {
    /// Release the reservation when the resource is deleted (unless it was adopted:
    /// adopted reservations were made elsewhere and are never released).
    #[default]
    Delete,
    /// Keep the reservation at the edge after the resource is deleted, so that the
    /// name can be adopted again later.
    Retain,
}
