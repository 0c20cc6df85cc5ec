//! Standalone mode: the same `Tunnel`, `Domain`, `TCPEndpoint`, `Ingress` and
//! `Service` manifests served from files on a plain host, with no cluster.
//!
//! - [`desired`]: manifests → what to publish plus skipped items with reasons
//!   (pure; calls the same `crate::plan` functions as the reconcilers).
//! - [`diff`]: two desired states → the changes to apply (live reload).
//! - [`provider`]: loads and watches the `-f` paths.
//! - [`report`]: the table printed on start and on every change.
//! - [`edge`]: reservations and tunnel tokens, embedded or from a remote edge.
//! - [`runtime`]: the process — edge, agents, proxy core, watcher.
//! - [`demo`]: `--demo`, a built-in backend for the quickstart.
//! - [`cli`]: the `standalone` subcommand.

pub mod cli;
pub mod demo;
pub mod desired;
pub mod diff;
pub mod edge;
pub mod provider;
pub mod report;
pub mod runtime;

pub use desired::{
    DesiredOptions, DesiredState, PublishedBy, PublishedHost, PublishedTcp, SkippedItem,
    desired_state,
};
pub use diff::{Change, diff};
pub use provider::{FileProvider, Fingerprint, fingerprint};
pub use report::{PublicAddresses, render};
pub use runtime::{RemoteEdge, Standalone, StandaloneConfig, TunnelKey};
