//! The `tuna-operator` library: everything the binary does, reachable from tests.
//!
//! One folder or file per concept (DESIGN.md §2), from the ground up:
//! - ground: [`manifest`] (manifests from files), [`crdgen`], [`health`],
//!   [`metrics`], [`telemetry`];
//! - [`plan`]: the pure cross-kind plan — objects in, routes, tunnels and
//!   refusals out — shared by the agent, standalone mode and `route explain`;
//! - [`edge`]: the edge as the operator sees it (API client, tunnel
//!   supervisor, streams into the proxy core);
//! - [`cluster`]: reading what the plan needs from a cluster;
//! - [`reconcile`]: the reconciler kit every kind runs on; [`role`]: what
//!   every role shares (flags, start-up, shutdown);
//! - the families, each with its role and reconcilers: [`agent`] (Tunnel,
//!   Ingress), [`reservations`] (Domain, TCPEndpoint), [`connectors`]
//!   (Connector, the connector proxy), [`csi`] (the kubeconfig volumes),
//!   [`standalone`] (no cluster);
//! - the commands on top: [`explain`] (`route explain`), [`all`] (the three
//!   roles in one process).

#![warn(missing_docs)]

pub use error::{Error, Result};

pub mod agent;
pub mod all;
pub mod cluster;
pub mod connectors;
pub mod crdgen;
pub mod csi;
pub mod edge;
pub mod error;
pub mod explain;
pub mod health;
pub mod manifest;
pub mod metrics;
pub mod plan;
pub mod reconcile;
pub mod reservations;
pub mod role;
pub mod standalone;
pub mod telemetry;
