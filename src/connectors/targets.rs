//! What the connector proxy may reach, per Connector: published by the
//! Connector reconciler, read by the authorizer on every CONNECT.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tuna_proxy::{Authority, Credential, UpstreamTarget};

/// A usable Connector, as the proxy needs it.
#[derive(Debug)]
pub struct ProxyTarget {
    /// The Connector's uid (a re-created Connector of the same name is another).
    pub uid: String,
    /// The `host:port`s clients may CONNECT to: `spec.address` and the
    /// `addressExtensions`.
    pub authorities: Vec<Authority>,
    /// Where requests go, and the CA that verifies it.
    pub upstream: Arc<UpstreamTarget>,
    /// `Bearer <token>` from the Connector's Secret.
    pub authorization: Credential,
}

/// Every Connector's target, or why it has none.
#[derive(Debug, Default)]
pub struct ProxyTargets {
    by_key: RwLock<HashMap<String, Result<Arc<ProxyTarget>, String>>>,
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl ProxyTargets {
    /// Publishes the target of `namespace/name` (or why it is not usable).
    pub fn set(&self, namespace: &str, name: &str, target: Result<ProxyTarget, String>) {
        self.by_key
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key(namespace, name), target.map(Arc::new));
    }

    /// Forgets `namespace/name` (deleted).
    pub fn remove(&self, namespace: &str, name: &str) {
        self.by_key
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key(namespace, name));
    }

    /// The target of `namespace/name`: `None` for a Connector this role does
    /// not know, `Some(Err(why))` for one that is not usable.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Result<Arc<ProxyTarget>, String>> {
        self.by_key
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key(namespace, name))
            .cloned()
    }
}
