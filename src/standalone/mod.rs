//! Standalone mode: the same `Tunnel`, `Domain`, `TCPEndpoint`, `Ingress` and
//! `Service` manifests served from files on a plain host, with no cluster.
//!
//! - [`desired`]: manifests → what to publish plus skipped items with reasons
//!   (pure; calls the same `crate::translate` functions as the reconcilers).
//! - [`diff`]: two desired states → the changes to apply (live reload).
//! - [`provider`]: loads and watches the `-f` paths.
//! - [`report`]: the table printed on start and on every change.

pub mod desired;
pub mod diff;
pub mod provider;
pub mod report;

pub use desired::{
    DesiredOptions, DesiredState, PublishedHost, PublishedTcp, Publisher, SkippedItem,
    desired_state,
};
pub use diff::{Change, diff};
pub use provider::{FileProvider, Fingerprint, fingerprint};
pub use report::{PublicAddresses, render};
