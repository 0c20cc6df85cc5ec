//! The one publishing step every kind's reconciler feeds: a planned host
//! becomes a tunnel with its routes at the edge (or its tunnel stops when
//! nothing publishes it), whichever kind won it. Ingresses, Tunnels and the
//! Gateway API sync each plan, then call [`publish_hosts`]; none of them
//! imports another.

use std::collections::BTreeSet;
use std::sync::Arc;

use tuna_routing::Matcher;

use super::state::{AgentState, label_value, labels, owners_of};
use crate::edge::publisher::{RouteBackend, Serving, TunnelKey, TunnelSpec};
use crate::plan::ingress::TranslateOptions;
use crate::plan::{HostPlan, HostSource, Kind, ObjectRef, Plan, PlanOptions};

/// The plan options of the agent's cluster.
pub(crate) fn options_for(
    state: &AgentState,
    ingress: TranslateOptions,
    base_domain: &str,
    account: BTreeSet<String>,
) -> PlanOptions {
    let mut options = PlanOptions::cluster(base_domain);
    options.ingress = ingress;
    options.policy = state.options.policy;
    options.account_hosts = account;
    // Every plan of the agent agrees on it: it decides where TCP listeners go.
    options.gateway_addresses = state
        .ctx
        .edge_info_now()
        .is_some_and(|who| who.gateway_addresses);
    options
}

/// A stable summary of a host's routes (what `RoutesUpdated` says).
pub fn routes_summary(host: &HostPlan) -> String {
    let mut routes: Vec<String> = host
        .routes
        .iter()
        .map(|r| {
            let backend = backend_summary(&r.backend, &r.origin.namespace);
            match &r.matcher {
                Matcher::Gateway(m) => {
                    let mut conditions = Vec::new();
                    conditions.extend(m.method.clone());
                    conditions.extend(m.headers.iter().map(|(n, v)| format!("header {n}={v}")));
                    conditions.extend(m.query.iter().map(|(n, v)| format!("query {n}={v}")));
                    let conditions = if conditions.is_empty() {
                        String::new()
                    } else {
                        format!(" [{}]", conditions.join(" "))
                    };
                    format!("{} {}{conditions} -> {backend}", r.path_type, r.path)
                }
                Matcher::Ingress => format!("{} {} -> {backend}", r.path_type, r.path),
            }
        })
        .collect();
    routes.sort();
    routes.join(", ")
}

/// `web:80` (an Ingress backend), `web:80, v2:80 (weights 9:1)` (a
/// Gateway API rule, other namespaces' Services qualified), or `500` (a rule
/// without a usable backend).
fn backend_summary(backend: &crate::plan::Backend, namespace: &str) -> String {
    if let Some(s) = &backend.service {
        return format!("{}:{}", s.name, s.port);
    }
    let Some(action) = &backend.gateway else {
        return String::new();
    };
    if action.backends.is_empty() {
        return "500".into();
    }
    let names: Vec<String> = action
        .backends
        .iter()
        .map(|b| {
            let port = b.port.map(|p| p.to_string()).unwrap_or_else(|| "?".into());
            if b.namespace == namespace {
                format!("{}:{port}", b.service)
            } else {
                format!("{}/{}:{port}", b.namespace, b.service)
            }
        })
        .collect();
    let mut out = names.join(", ");
    if action.backends.len() > 1 {
        let weights: Vec<String> = action
            .backends
            .iter()
            .map(|b| b.weight.to_string())
            .collect();
        out.push_str(&format!(" (weights {})", weights.join(":")));
    }
    out
}

/// The routes of a planned host as the publisher takes them.
fn publishable_routes(h: &HostPlan) -> Vec<tuna_routing::RouteSpec<RouteBackend>> {
    h.routes
        .iter()
        // Unresolved backends were refused by the plan already; a Gateway
        // rule carries its own (resolved or 500) backends.
        .filter_map(|r| {
            let backend = RouteBackend::of(&r.backend)?;
            Some(r.clone().map_backend(|_| backend))
        })
        .collect()
}

/// Publishes each of `hosts` as `plan` has it, or stops its tunnel when
/// nothing publishes it (a Tunnel's host is the Tunnel reconciler's).
/// Ingresses of a host whose routes changed are re-reconciled, except `me`.
pub(crate) async fn publish_hosts(
    state: &AgentState,
    hosts: &BTreeSet<String>,
    plan: &Plan,
    me: Option<&ObjectRef>,
) {
    for host in hosts {
        let key = TunnelKey::Host(host.clone());
        let tunnel_owned = owners_of(state, &key);
        match plan.hosts.get(host) {
            Some(h) if matches!(h.source, HostSource::Tunnel(_)) => {}
            Some(h) => {
                let kind = match h.source {
                    HostSource::HttpRoutes(_) => Kind::HttpRoute,
                    _ => Kind::Ingress,
                };
                let mut token_labels = state.token_labels(kind.as_str(), &h.namespace, host);
                token_labels.insert(labels::HOST.to_owned(), label_value(host));
                state.publisher.publish(
                    key,
                    TunnelSpec {
                        serving: Serving::Http {
                            host: host.clone(),
                            routes: publishable_routes(h),
                        },
                        labels: token_labels,
                        edge: Arc::clone(&state.ctx.edge),
                        edge_identity: "operator".into(),
                        keep_on_shutdown: false,
                    },
                );
                let summary = routes_summary(h);
                let changed = state
                    .host_plans
                    .lock()
                    .expect("host plans")
                    .insert(host.clone(), summary.clone())
                    .is_none_or(|old| old != summary);
                if changed {
                    for other in h.publishers() {
                        if other.kind == Kind::Ingress && Some(&other) != me {
                            let _ = state.ingress_triggers.send(
                                kube::runtime::reflector::ObjectRef::new(&other.name)
                                    .within(&other.namespace),
                            );
                        }
                    }
                }
            }
            None if tunnel_owned.is_empty() => {
                if state.publisher.state(&key).is_some() {
                    state.publisher.unpublish(&key).await;
                    tracing::info!(%host, "no route left: tunnel stopped, token revoked");
                }
                state.host_plans.lock().expect("host plans").remove(host);
            }
            None => {}
        }
    }
}
