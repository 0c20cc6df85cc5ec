//! The `tuna-operator` library: everything the binary does, reachable from tests.
//!
//! Each module is one concept (see DESIGN.md §2): `manifest` loads Kubernetes
//! manifests from files, `translate` turns objects into desired routes (pure),
//! `explain` is the `route explain` command.

pub mod cluster;
pub mod connectors;
pub mod controllers;
pub mod crdgen;
pub mod csi;
pub mod desired;
pub mod edge_api;
pub mod explain;
pub mod health;
pub mod manifest;
pub mod metrics;
pub mod publisher;
pub mod roles;
pub mod standalone;
pub mod telemetry;
pub mod translate;
pub mod transport;
