//! What changed between two desired states: the live-reload seam.
//!
//! Applying a diff touches only what changed: a path edit on one host swaps that
//! host's routes in the proxy core and nothing else, so tunnels stay connected
//! (DESIGN §3: route changes without reconnecting).

use super::desired::{DesiredState, HttpRouteSpec, PublishedTcp};

/// One change to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A host is new or its routes changed: replace its route table.
    HostSet {
        /// The host.
        host: String,
        /// All its routes.
        routes: Vec<HttpRouteSpec>,
    },
    /// A host is no longer published.
    HostRemoved {
        /// The host.
        host: String,
    },
    /// A TCP endpoint is new or changed (endpoint or upstream).
    TcpSet {
        /// The Tunnel, `namespace/name`.
        tunnel: String,
        /// The new state.
        tcp: PublishedTcp,
        /// The previous state, when it changed.
        previous: Option<PublishedTcp>,
    },
    /// A TCP endpoint is no longer published.
    TcpRemoved {
        /// The Tunnel, `namespace/name`.
        tunnel: String,
        /// What was published.
        previous: PublishedTcp,
    },
}

/// Changes turning `old` into `new`: removals first (so a host or port moving
/// from one object to another is freed before it is claimed again), then
/// additions, each in key order.
pub fn diff(old: &DesiredState, new: &DesiredState) -> Vec<Change> {
    let mut changes = Vec::new();
    for (tunnel, previous) in &old.tcp {
        if !new.tcp.contains_key(tunnel) {
            changes.push(Change::TcpRemoved {
                tunnel: tunnel.clone(),
                previous: previous.clone(),
            });
        }
    }
    for host in old.hosts.keys() {
        if !new.hosts.contains_key(host) {
            changes.push(Change::HostRemoved { host: host.clone() });
        }
    }
    for (host, published) in &new.hosts {
        if old.hosts.get(host).map(|p| &p.routes) != Some(&published.routes) {
            changes.push(Change::HostSet {
                host: host.clone(),
                routes: published.routes.clone(),
            });
        }
    }
    for (tunnel, tcp) in &new.tcp {
        let previous = old.tcp.get(tunnel);
        if previous != Some(tcp) {
            changes.push(Change::TcpSet {
                tunnel: tunnel.clone(),
                tcp: tcp.clone(),
                previous: previous.cloned(),
            });
        }
    }
    changes
}
