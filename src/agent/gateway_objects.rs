//! The Gateway API objects the agent watches, as every plan reads them:
//! the reflector stores, a snapshot of them, which HTTPRoutes may serve a
//! host, and the Services their backendRefs name. Every kind's reconciler
//! plans with them (a host is decided over all kinds at once, see
//! [`crate::plan::claims`]); none of this knows the agent's state.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tuna_crds::gateway::{
    CONTROLLER_NAME, Gateway, GatewayClass, HttpRoute, ReferenceGrant, TcpRoute,
};

use crate::plan::gateway::{GROUP, hostname_matches};
use crate::plan::gateway_model::CertificateSecret;
use crate::plan::gateway_model::GatewayInputs;
use crate::reconcile::store_ready;

/// The reflector stores of the Gateway API objects.
#[derive(Clone)]
pub struct GatewayStores {
    /// GatewayClasses (all controllers).
    pub classes: Store<GatewayClass>,
    /// Gateways.
    pub gateways: Store<Gateway>,
    /// HTTPRoutes.
    pub routes: Store<HttpRoute>,
    /// ReferenceGrants (`None`: the CRD is not installed).
    pub grants: Option<Store<ReferenceGrant>>,
    /// TCPRoutes (`None`: the CRD is not installed).
    pub tcp_routes: Option<Store<TcpRoute>>,
    /// Namespaces (their labels).
    pub namespaces: Store<Namespace>,
}

impl GatewayStores {
    /// Waits until every store has listed once; false when a watch ended.
    pub async fn ready(&self) -> bool {
        let (a, b, c, d, e, f) = futures::join!(
            store_ready(&self.classes),
            store_ready(&self.gateways),
            store_ready(&self.routes),
            async {
                match &self.grants {
                    Some(g) => store_ready(g).await,
                    None => true,
                }
            },
            store_ready(&self.namespaces),
            async {
                match &self.tcp_routes {
                    Some(t) => store_ready(t).await,
                    None => true,
                }
            },
        );
        a && b && c && d && e && f
    }
}

/// The Gateway API objects at one moment (empty without the CRDs).
#[derive(Default)]
pub struct GatewaySnapshot {
    classes: Vec<Arc<GatewayClass>>,
    /// Every Gateway.
    pub gateways: Vec<Arc<Gateway>>,
    /// Every HTTPRoute.
    pub routes: Vec<Arc<HttpRoute>>,
    /// Every TCPRoute.
    pub tcp_routes: Vec<Arc<TcpRoute>>,
    /// Every ReferenceGrant.
    pub grants: Vec<Arc<ReferenceGrant>>,
    namespaces: Vec<Arc<Namespace>>,
    /// The Secrets our Gateways' listeners name as `certificateRefs`, as
    /// the agent's sync found them (empty until it ran).
    pub certificates: Vec<CertificateSecret>,
}

impl GatewaySnapshot {
    /// The objects of `stores` now (`None`: the cluster has no Gateway
    /// API, or the agent has not found it yet).
    pub fn of(stores: Option<&GatewayStores>) -> Self {
        let Some(s) = stores else {
            return Self::default();
        };
        Self {
            classes: s.classes.state(),
            gateways: s.gateways.state(),
            routes: s.routes.state(),
            tcp_routes: s.tcp_routes.as_ref().map(Store::state).unwrap_or_default(),
            grants: s.grants.as_ref().map(Store::state).unwrap_or_default(),
            namespaces: s.namespaces.state(),
            certificates: Vec::new(),
        }
    }

    /// The HTTPRoutes that may serve one of `hosts` (a superset: the plan
    /// decides): those with a parentRef to a Gateway of ours naming one of
    /// them, or a wildcard covering one, or no hostname at all.
    pub fn touching(&self, hosts: &BTreeSet<String>) -> Vec<Arc<HttpRoute>> {
        if hosts.is_empty() {
            return Vec::new();
        }
        let ours = self.our_gateways();
        self.routes
            .iter()
            .filter(|r| names_our_gateway(r, &ours) && route_may_serve(r, hosts))
            .cloned()
            .collect()
    }

    /// The Gateways of our GatewayClasses, as `(namespace, name)`: a route
    /// whose parentRefs name none of them is never served by us, so its
    /// backendRefs cost no Service read.
    pub fn our_gateways(&self) -> BTreeSet<(String, String)> {
        let classes: BTreeSet<&str> = self
            .classes
            .iter()
            .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        self.gateways
            .iter()
            .filter(|g| classes.contains(g.spec.gateway_class_name.as_str()))
            .map(|g| {
                (
                    g.metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                    g.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// The plan inputs with `routes` as the HTTPRoutes.
    pub fn inputs<'a>(&'a self, routes: &'a [Arc<HttpRoute>]) -> GatewayInputs<'a> {
        GatewayInputs {
            classes: &self.classes,
            gateways: &self.gateways,
            http_routes: routes,
            tcp_routes: &self.tcp_routes,
            grants: &self.grants,
            namespaces: &self.namespaces,
            certificates: Some(&self.certificates),
        }
    }
}

/// Whether `route` may serve one of `hosts` (see [`GatewaySnapshot::touching`]).
pub fn route_may_serve(route: &HttpRoute, hosts: &BTreeSet<String>) -> bool {
    let names = route.spec.hostnames.as_deref().unwrap_or_default();
    names.is_empty()
        || names.iter().any(|n| {
            if n.starts_with("*.") {
                hosts.iter().any(|h| hostname_matches(n, h))
            } else {
                hosts.contains(n) || hosts.contains(&n.to_ascii_lowercase())
            }
        })
}

/// Whether a parentRef `(group, kind, namespace, name)` of a route in
/// `route_namespace` names one of `gateways` (see [`GatewaySnapshot::our_gateways`]).
fn names_gateway(
    (group, kind, namespace, name): (Option<&str>, Option<&str>, Option<&str>, &str),
    route_namespace: &str,
    gateways: &BTreeSet<(String, String)>,
) -> bool {
    group.unwrap_or(GROUP) == GROUP
        && kind.unwrap_or("Gateway") == "Gateway"
        && gateways.contains(&(
            namespace.unwrap_or(route_namespace).to_owned(),
            name.to_owned(),
        ))
}

/// Whether an HTTPRoute has a parentRef to one of `gateways`.
pub fn names_our_gateway(route: &HttpRoute, gateways: &BTreeSet<(String, String)>) -> bool {
    refs_name_our_gateway(
        &route.metadata,
        route.spec.parent_refs.iter().flatten(),
        gateways,
    )
}

/// Whether a TCPRoute has a parentRef to one of `gateways` (its parentRefs
/// in the HTTPRoute's shape, as the plan reads them).
pub fn tcp_names_our_gateway(route: &TcpRoute, gateways: &BTreeSet<(String, String)>) -> bool {
    let refs: Vec<_> = route
        .spec
        .parent_refs
        .iter()
        .flatten()
        .map(crate::plan::tcproute::parent_ref)
        .collect();
    refs_name_our_gateway(&route.metadata, &refs, gateways)
}

fn refs_name_our_gateway<'a>(
    meta: &kube::api::ObjectMeta,
    refs: impl IntoIterator<Item = &'a tuna_crds::gateway::httproutes::HttpRouteParentRefs>,
    gateways: &BTreeSet<(String, String)>,
) -> bool {
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    refs.into_iter().any(|p| {
        names_gateway(
            (
                p.group.as_deref(),
                p.kind.as_deref(),
                p.namespace.as_deref(),
                &p.name,
            ),
            namespace,
            gateways,
        )
    })
}

/// The core Services the backendRefs of `route` name: `(namespace, name)`.
pub fn backend_services(route: &HttpRoute) -> Vec<(String, String)> {
    let namespace = route.namespace().unwrap_or_else(|| "default".into());
    let mut out: Vec<(String, String)> = route
        .spec
        .rules
        .iter()
        .flatten()
        .flat_map(|r| r.backend_refs.iter().flatten())
        .filter(|b| {
            b.group.as_deref().unwrap_or("").is_empty()
                && b.kind.as_deref().unwrap_or("Service") == "Service"
        })
        .map(|b| {
            (
                b.namespace.clone().unwrap_or_else(|| namespace.clone()),
                b.name.clone(),
            )
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The core Services the first rule of a TCPRoute names (the one used).
pub fn tcp_backend_services(route: &TcpRoute) -> Vec<(String, String)> {
    let namespace = route.namespace().unwrap_or_else(|| "default".into());
    route
        .spec
        .rules
        .first()
        .into_iter()
        .flat_map(|r| &r.backend_refs)
        .filter(|b| {
            b.group.as_deref().unwrap_or("").is_empty()
                && b.kind.as_deref().unwrap_or("Service") == "Service"
        })
        .map(|b| {
            (
                b.namespace.clone().unwrap_or_else(|| namespace.clone()),
                b.name.clone(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(yaml: &str) -> HttpRoute {
        serde_saphyr::from_str(yaml).expect("test HTTPRoute")
    }

    fn hosts(h: &[&str]) -> BTreeSet<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn routes_touch_their_hosts_wildcards_and_everything_without_hostnames() {
        let exact = route("metadata: {name: a, namespace: d}\nspec: {hostnames: [Shop.a.2na.am]}");
        let wild = route("metadata: {name: a, namespace: d}\nspec: {hostnames: ['*.a.2na.am']}");
        let none = route("metadata: {name: a, namespace: d}\nspec: {}");
        assert!(route_may_serve(&exact, &hosts(&["shop.a.2na.am"])));
        assert!(!route_may_serve(&exact, &hosts(&["api.a.2na.am"])));
        assert!(route_may_serve(&wild, &hosts(&["x.y.a.2na.am"])));
        assert!(!route_may_serve(&wild, &hosts(&["a.2na.am"])));
        assert!(route_may_serve(&none, &hosts(&["anything.example"])));
    }

    #[test]
    fn backend_services_are_core_services_in_their_namespaces() {
        let r = route(
            "metadata: {name: a, namespace: d}
spec:
  rules:
  - backendRefs: [{name: web, port: 80}, {name: web, port: 81}, {name: other, namespace: o, port: 80}]
  - backendRefs: [{name: bucket, group: example.com, kind: Bucket}]",
        );
        assert_eq!(
            backend_services(&r),
            [("d".into(), "web".into()), ("o".into(), "other".into())]
        );
    }
}
