//! Ingress (class tuna): one tunnel per host, its routes merged from the
//! Ingresses of the host's namespace.
//!
//! - observe: the Ingress; the Ingresses, Domains and Tunnels that share its
//!   hosts, the IngressClasses (reflector stores); the Services its backends
//!   name (`get`); the account's domains at the edge;
//! - desired: [`crate::plan::plan`] over those objects — host ownership by
//!   namespace, reserved hosts only, segment-aware Prefix/Exact, skipped rules
//!   and backends with reasons;
//! - apply: per host, publish the route table (a change swaps routes in the
//!   proxy core: no reconnect) or stop the host's tunnel when no rule is left
//!   (its token is revoked); `status.loadBalancer.ingress[].hostname` lists
//!   the hosts served; events `TunnelConnected`, `TunnelStopped`,
//!   `RoutesUpdated`, `RuleSkipped`, `BackendSkipped`, each naming the host,
//!   rule, path or backend concerned.
//!
//! Which Ingresses are ours: `spec.ingressClassName` naming an IngressClass
//! whose `spec.controller` is `k8s.tuna.am/ingress-controller` (or the
//! `--ingress-class` name), no class when one of those is the default, and the
//! legacy annotation `kubernetes.io/ingress.class` with such a name.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{
    Ingress, IngressLoadBalancerIngress, IngressLoadBalancerStatus, IngressStatus,
};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tuna_crds::{Domain, Tunnel};

use super::gateway_objects::{GatewaySnapshot, backend_services};
use super::publish::{options_for, publish_hosts, routes_summary};
use super::state::{AgentState, SETTLE_WAIT};
use crate::Error;
use crate::edge::publisher::{TunnelKey, TunnelState};
use crate::plan::ingress::{SkipReason, rule_hosts, service_names};
use crate::plan::{Inputs, Kind, ObjectRef, Plan, PlanOptions, Reason, plan};
use crate::reconcile::kit::{Deletion, KitContext, Reconciler};
use crate::reconcile::{PendingEvents, apply_status, resync};

/// The host a Domain reserves, given the base domain.
fn domain_host(d: &Domain, base_domain: &str) -> Option<String> {
    d.spec.fqdn(base_domain).map(|h| h.to_ascii_lowercase())
}

/// The host of an http Tunnel.
fn tunnel_host(t: &Tunnel, base_domain: &str) -> Option<String> {
    (t.spec.protocol == tuna_crds::TunnelProtocol::Http)
        .then(|| {
            t.spec
                .subdomain
                .as_ref()
                .map(|s| format!("{s}.{base_domain}"))
        })
        .flatten()
}

/// Plans `hosts` over the `objects` that touch them (pure; TCPEndpoints are
/// not read). Of the Gateway API objects, the caller picks the HTTPRoutes
/// that may serve one of `hosts`
/// ([`super::gateway::GatewaySnapshot::touching`]). The Ingress `me`
/// (the one being reconciled) is planned even when it names none of `hosts`:
/// rules without a host or with only wildcard hosts touch no host, and their
/// refusals (`RuleWithoutHost`, `WildcardHost`) come from the plan too.
pub fn plan_hosts(
    hosts: &BTreeSet<String>,
    me: Option<&ObjectRef>,
    objects: Inputs<'_>,
    services: &crate::plan::service::ServiceIndex,
    options: &PlanOptions,
) -> Plan {
    let touches = |i: &Ingress| {
        me.is_some_and(|me| *me == ObjectRef::of(Kind::Ingress, &i.metadata))
            || rule_hosts(i).iter().any(|h| hosts.contains(h))
    };
    let ingresses: Vec<Arc<Ingress>> = objects
        .ingresses
        .iter()
        .filter(|i| touches(i))
        .cloned()
        .collect();
    let tunnels: Vec<Arc<Tunnel>> = objects
        .tunnels
        .iter()
        .filter(|t| tunnel_host(t, &options.base_domain).is_some_and(|h| hosts.contains(&h)))
        .cloned()
        .collect();
    let domains: Vec<Arc<Domain>> = objects
        .domains
        .iter()
        .filter(|d| domain_host(d, &options.base_domain).is_some_and(|h| hosts.contains(&h)))
        .cloned()
        .collect();
    let inputs = Inputs {
        ingresses: &ingresses,
        tunnels: &tunnels,
        domains: &domains,
        tcp_endpoints: &[],
        gateway: objects.gateway,
        claims: objects.claims,
    };
    plan(&inputs, services, options)
}

/// Plans and applies `hosts`: publish each host's routes, or stop its tunnel.
/// Returns the plan. Other Ingresses of a host whose routes changed are
/// re-reconciled (for their events and status), except `me`; HTTPRoutes
/// that may serve one of `hosts` are planned with them (an HTTPRoute takes a
/// host no Ingress or Tunnel publishes).
async fn apply_hosts(
    state: &AgentState,
    hosts: &BTreeSet<String>,
    me: Option<&ObjectRef>,
    options: &PlanOptions,
) -> Result<Plan, Error> {
    // First: it waits until every store is filled (a plan must see every claimant).
    let book = state.claim_book().await?;
    let ingresses = state.stores.ingresses.state();
    // The Services every touching Ingress names (read once; a reconcile of
    // the Ingress itself re-reads its own). Named, not translated: the plan
    // below translates each Ingress once.
    for i in ingresses
        .iter()
        .filter(|i| rule_hosts(i).iter().any(|h| hosts.contains(h)))
    {
        let namespace = i.metadata.namespace.as_deref().unwrap_or("default");
        for name in service_names(i, &options.ingress) {
            state.services.ensure(namespace, &name).await;
        }
    }
    let gateway = GatewaySnapshot::of(state.gateway.get());
    let routes = gateway.touching(hosts);
    for (namespace, name) in routes.iter().flat_map(|r| backend_services(r)) {
        state.services.ensure(&namespace, &name).await;
    }
    let (tunnels, domains) = (state.stores.tunnels.state(), state.stores.domains.state());
    let plan = plan_hosts(
        hosts,
        me,
        Inputs {
            ingresses: &ingresses,
            tunnels: &tunnels,
            domains: &domains,
            tcp_endpoints: &[],
            gateway: gateway.inputs(&routes),
            claims: Some(&book),
        },
        &state.services.snapshot(),
        options,
    );
    // Every claimant of `hosts` was in view: their holders are recorded
    // before anything is published.
    state
        .claim_store
        .absorb(&plan, hosts, &BTreeSet::new())
        .await?;
    publish_hosts(state, hosts, &plan, me).await;
    Ok(plan)
}

/// A deleted Ingress: its hosts are planned again without it. Its claim (the
/// hosts it had rules for) is dropped only once that replan succeeded, so a
/// failed cleanup can be retried ([`retry_cleanup`]) and still knows them.
pub async fn cleanup(state: &AgentState, namespace: &str, name: &str) -> Result<(), Error> {
    let object = ObjectRef::new(Kind::Ingress, namespace, name);
    let hosts = state
        .claims
        .lock()
        .expect("claims")
        .get(&object)
        .map(|c| c.hosts().clone())
        .unwrap_or_default();
    if !hosts.is_empty() {
        let who = state.ctx.edge_info().await?.clone();
        let options = options_for(
            state,
            state.ingress_options(),
            &who.base_domain,
            state.account_hosts().await,
        );
        apply_hosts(state, &hosts, Some(&object), &options).await?;
        for host in &hosts {
            state.trigger_gateway_on(host);
        }
    }
    state.claims.lock().expect("claims").remove(&object);
    state.reported.lock().expect("reported").remove(&object);
    Ok(())
}

/// Retries the cleanup of a deleted Ingress with the kit's per-object backoff
/// until it succeeds, or until the Ingress exists again (its reconcile then
/// replans the hosts its claim still holds). The Gateway API resync also
/// sweeps every published host nothing claims any more, whatever happens here.
async fn retry_cleanup(state: Arc<AgentState>, namespace: String, name: String) {
    let key = format!("cleanup/Ingress/{namespace}/{name}");
    let backoff = &state.ctx.backoff;
    loop {
        tokio::time::sleep(backoff.fail(&key)).await;
        let back = kube::runtime::reflector::ObjectRef::new(&name).within(&namespace);
        if state.stores.ingresses.get(&back).is_some() {
            break;
        }
        match cleanup(&state, &namespace, &name).await {
            Ok(()) => {
                tracing::info!(ingress = %format_args!("{namespace}/{name}"), "deleted Ingress cleaned up after a retry");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, ingress = %format_args!("{namespace}/{name}"), "cleaning up a deleted Ingress failed again; retrying");
            }
        }
    }
    backoff.reset(&key);
}

/// The Ingress reconciler: no finalizer — once the Ingress is gone,
/// [`cleanup`] withdraws what it published (the agent holds it alone).
pub struct Ingresses {
    state: Arc<AgentState>,
}

impl Ingresses {
    /// The reconciler over the agent's shared state.
    pub fn new(state: Arc<AgentState>) -> Self {
        Self { state }
    }
}

impl Reconciler for Ingresses {
    type Object = Ingress;
    const KIND: &'static str = "Ingress";
    const DELETION: Deletion = Deletion::Forget;

    fn kit(&self) -> KitContext<'_> {
        self.state.ctx.kit()
    }

    async fn apply(self: Arc<Self>, ingress: Arc<Ingress>) -> Result<Action, Error> {
        apply(&ingress, &self.state).await
    }

    async fn forget(self: Arc<Self>, namespace: String, name: String) {
        if let Err(e) = cleanup(&self.state, &namespace, &name).await {
            tracing::warn!(error = %e, ingress = %format_args!("{namespace}/{name}"), "cleaning up a deleted Ingress failed; retrying with backoff");
            // Off the kit's result stream, which calls forget in line.
            tokio::spawn(retry_cleanup(Arc::clone(&self.state), namespace, name));
        }
    }
}

async fn apply(ingress: &Arc<Ingress>, state: &AgentState) -> Result<Action, Error> {
    let ctx = &state.ctx;
    let me = ObjectRef::of(Kind::Ingress, &ingress.metadata);
    let translate = state.ingress_options();
    let ours = translate.serves(ingress);
    let before = state
        .claims
        .lock()
        .expect("claims")
        .get(&me)
        .map(|c| c.hosts().clone())
        .unwrap_or_default();
    let now = if ours {
        rule_hosts(ingress)
    } else {
        BTreeSet::new()
    };
    let who = ctx.edge_info().await?.clone();
    // Re-read the Services this Ingress names (get).
    let namespace = ingress.metadata.namespace.as_deref().unwrap_or("default");
    for name in service_names(ingress, &translate) {
        state.services.refresh(namespace, &name).await;
    }
    let affected: BTreeSet<String> = before.union(&now).cloned().collect();
    let options = options_for(
        state,
        translate,
        &who.base_domain,
        state.account_hosts().await,
    );
    let plan = apply_hosts(state, &affected, Some(&me), &options).await?;
    for host in &affected {
        state.trigger_gateway_on(host);
    }
    state
        .claims
        .lock()
        .expect("claims")
        .set_hosts(&me, now.clone());
    if !ours {
        // Another controller's Ingress: nothing to report.
        return Ok(Action::await_change());
    }
    // Hosts the Ingress no longer names are walked too: their tunnel's
    // `TunnelStopped` is reported once.
    report(state, ingress, &me, &plan, &affected).await?;
    Ok(resync(ctx.resync_interval))
}

/// Events and `status.loadBalancer` of one Ingress.
async fn report(
    state: &AgentState,
    ingress: &Ingress,
    me: &ObjectRef,
    plan: &Plan,
    hosts: &BTreeSet<String>,
) -> Result<(), Error> {
    let ctx = &state.ctx;
    let mut events = PendingEvents::default();
    // Skipped rules and backends, each once.
    let mut skipped: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
    for r in plan.refusals_of(me) {
        if r.reason == Reason::Ingress(SkipReason::OtherIngressClass) {
            continue;
        }
        let mut note = String::new();
        if let Some(rule) = r.rule {
            let _ = write!(note, "rule {rule}");
            if let Some(path) = r.path {
                let _ = write!(note, " path {path}");
            }
            if let Some(detail) = rule_detail(ingress, r.rule, r.path) {
                let _ = write!(note, " ({detail})");
            }
            note.push_str(": ");
        }
        let _ = write!(note, "{}: {}", r.reason, r.message);
        skipped
            .entry(r.reason.ingress_event())
            .or_default()
            .insert(note);
    }
    for event in ["RuleSkipped", "BackendSkipped"] {
        let notes = skipped.remove(event).unwrap_or_default();
        let known = state
            .reported
            .lock()
            .expect("reported")
            .get(me)
            .and_then(|r| r.get(event).cloned())
            .unwrap_or_default();
        for note in notes.difference(&known) {
            events.push(EventType::Warning, event, "Route", note.clone());
        }
        let mut reported = state.reported.lock().expect("reported");
        reported
            .entry(me.clone())
            .or_default()
            .insert(event.to_owned(), notes);
    }
    // Per host: routes and the tunnel's state.
    let mut serving = Vec::new();
    for host in hosts {
        let key = TunnelKey::Host(host.clone());
        let Some(h) = plan.hosts.get(host).filter(|h| h.publishers().contains(me)) else {
            if state.clear_and_was(me, &format!("tunnel {host}")) {
                events.push(
                    EventType::Warning,
                    "TunnelStopped",
                    "Publish",
                    format!("host {host} is no longer published by this Ingress"),
                );
            }
            continue;
        };
        let summary = routes_summary(h);
        if state.first_report_exclusive(me, &format!("routes {host}"), &summary) {
            events.push(
                EventType::Normal,
                "RoutesUpdated",
                "Route",
                format!("host {host}: {summary}"),
            );
        }
        let Some(mut watch) = state.publisher.state(&key) else {
            continue;
        };
        let _ = tokio::time::timeout(SETTLE_WAIT, watch.wait_for(TunnelState::is_settled)).await;
        let now = watch.borrow().clone();
        match &now {
            TunnelState::Serving { .. } => {
                serving.push(host.clone());
                if state.first_report_exclusive(me, &format!("tunnel {host}"), "connected") {
                    events.push(
                        EventType::Normal,
                        "TunnelConnected",
                        "Publish",
                        format!("host {host} is served at https://{host}"),
                    );
                }
            }
            TunnelState::Refused { code, message } => {
                let note = format!("host {host}: the edge refused the tunnel ({code}): {message}");
                if state.first_report_exclusive(me, &format!("tunnel {host}"), &note) {
                    events.push(EventType::Warning, "TunnelStopped", "Publish", note);
                }
            }
            TunnelState::Failed { message, .. } => {
                let note = format!("host {host}: {message}");
                if state.first_report_exclusive(me, &format!("tunnel {host}"), &note) {
                    events.push(EventType::Warning, "TunnelStopped", "Publish", note);
                }
            }
            _ => {}
        }
    }
    ctx.write_events(ingress, events).await;
    // status.loadBalancer.ingress[].hostname: the public hosts served.
    serving.sort();
    let status = IngressStatus {
        load_balancer: Some(IngressLoadBalancerStatus {
            ingress: Some(
                serving
                    .iter()
                    .map(|h| IngressLoadBalancerIngress {
                        hostname: Some(h.clone()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }),
    };
    let current: Vec<String> = ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|l| l.iter().filter_map(|i| i.hostname.clone()).collect())
        .unwrap_or_default();
    if current != serving {
        let api: Api<Ingress> = Api::namespaced(
            ctx.client.clone(),
            ingress.namespace().as_deref().unwrap_or("default"),
        );
        // Only the hostnames are ours to compare: the status is written
        // whole when they differ.
        apply_status(&api, ingress, None, &status).await?;
    }
    Ok(())
}

/// `host h path /api -> api:8080` of a rule/path, for event messages.
fn rule_detail(ingress: &Ingress, rule: Option<usize>, path: Option<usize>) -> Option<String> {
    let rule = ingress.spec.as_ref()?.rules.as_ref()?.get(rule?)?;
    let host = rule.host.as_deref().unwrap_or("(no host)");
    let Some(p) = path.and_then(|i| rule.http.as_ref()?.paths.get(i)) else {
        return Some(match &rule.host {
            Some(h) => format!("host {h}"),
            None => "no host".to_owned(),
        });
    };
    let backend = match (&p.backend.service, &p.backend.resource) {
        (Some(s), _) => {
            let port = s
                .port
                .as_ref()
                .map(|p| match (&p.name, p.number) {
                    (Some(n), _) => n.clone(),
                    (None, Some(n)) => n.to_string(),
                    _ => "?".into(),
                })
                .unwrap_or_else(|| "?".into());
            format!("Service {}:{port}", s.name)
        }
        (None, Some(r)) => format!("{} {}", r.kind, r.name),
        (None, None) => "no backend".into(),
    };
    Some(format!(
        "host {host} path {} -> {backend}",
        p.path.as_deref().unwrap_or("/")
    ))
}

/// Ingresses with rules for `host` (to re-reconcile on a tunnel state change).
pub fn claimants_of(state: &AgentState, host: &str) -> Vec<ObjectRef> {
    let claimants = state.claims.lock().expect("claims").claimants_of(host);
    claimants
        .into_iter()
        .filter(|o| o.kind == Kind::Ingress)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::service::{ServiceIndex, ServiceInfo};

    fn objects<K: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<K>> {
        yaml.split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| Arc::new(serde_saphyr::from_str::<K>(d).expect("test manifest")))
            .collect()
    }

    /// The documentation's Domain + Ingress: /api → api, / → web (named port).
    #[test]
    fn the_documentation_example_plans_two_routes() {
        let ingresses = objects::<Ingress>(
            "metadata: {name: my-app, namespace: default}
spec:
  ingressClassName: tuna
  rules:
  - host: my-app.a.2na.am
    http:
      paths:
      - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}",
        );
        let domains = objects::<Domain>(
            "metadata: {name: my-app, namespace: default}\nspec: {subdomain: my-app}",
        );
        let services = ServiceIndex::new(
            objects::<k8s_openapi::api::core::v1::Service>(
                "metadata: {name: api, namespace: default}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 8080}]}\n---\nmetadata: {name: web, namespace: default}\nspec: {clusterIP: 10.0.0.2, ports: [{name: http, port: 80}]}",
            )
            .iter()
            .map(|s| ServiceInfo::from_service(s)),
        );
        let hosts = rule_hosts(&ingresses[0]);
        assert_eq!(hosts, BTreeSet::from(["my-app.a.2na.am".to_owned()]));
        let plan = plan_hosts(
            &hosts,
            None,
            Inputs {
                ingresses: &ingresses,
                domains: &domains,
                ..Default::default()
            },
            &services,
            &PlanOptions::cluster("a.2na.am"),
        );
        let host = &plan.hosts["my-app.a.2na.am"];
        assert_eq!(
            routes_summary(host),
            "Prefix / -> web:http, Prefix /api -> api:8080"
        );
        assert!(plan.refusals.is_empty(), "{:?}", plan.refusals);
        // Without the Domain the host is not reserved.
        let unreserved = plan_hosts(
            &hosts,
            None,
            Inputs {
                ingresses: &ingresses,
                ..Default::default()
            },
            &services,
            &PlanOptions::cluster("a.2na.am"),
        );
        assert!(unreserved.hosts.is_empty());
        assert_eq!(unreserved.refusals[0].reason.as_str(), "HostNotReserved");
    }

    /// An Ingress whose rules name no host (none, or only wildcards) touches
    /// no host, yet its own reconcile plans it: its refusals are reported.
    #[test]
    fn an_ingress_without_hosts_is_planned_for_its_own_reconcile() {
        let ingresses = objects::<Ingress>(
            "metadata: {name: nohost, namespace: default}
spec:
  ingressClassName: tuna
  rules:
  - http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
---
metadata: {name: wild, namespace: default}
spec:
  ingressClassName: tuna
  rules:
  - host: '*.a.2na.am'
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}",
        );
        let services = ServiceIndex::default();
        let options = PlanOptions::cluster("a.2na.am");
        for (ingress, reason) in [("nohost", "RuleWithoutHost"), ("wild", "WildcardHost")] {
            let me = ObjectRef::new(Kind::Ingress, "default", ingress);
            let i = ingresses.iter().find(|i| i.name_any() == ingress).unwrap();
            let hosts = rule_hosts(i);
            assert!(hosts.is_empty());
            let plan = plan_hosts(
                &hosts,
                Some(&me),
                Inputs {
                    ingresses: &ingresses,
                    ..Default::default()
                },
                &services,
                &options,
            );
            let reasons: Vec<&str> = plan.refusals_of(&me).map(|r| r.reason.as_str()).collect();
            assert_eq!(reasons, [reason], "{ingress}");
            // Only `me` is planned, not every host-less Ingress.
            assert_eq!(plan.refusals.len(), 1, "{:?}", plan.refusals);
        }
    }

    #[test]
    fn rule_details_name_host_path_and_backend() {
        let i = objects::<Ingress>(
            "metadata: {name: a}\nspec:\n  rules:\n  - host: x.example.com\n    http: {paths: [{path: /files, pathType: Prefix, backend: {resource: {kind: Bucket, name: files}}}]}",
        );
        assert_eq!(
            rule_detail(&i[0], Some(0), Some(0)).unwrap(),
            "host x.example.com path /files -> Bucket files"
        );
    }
}
